"""The web page in a real browser: headless Chromium (Debian's, driven by Selenium) against uvicorn on loopback.

Without Chromium and chromedriver the tests are skipped, except under CI (CI=true), where they fail: `.ci/run`
installs both, so CI always runs them. The smoke group (`--smoke`, run by CI) also takes the documentation's screenshot
of the page, on the demo datastore with the default model, so that the picture cannot go stale.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from bertknn.serving.service import create_app

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the `browser` fixture skips (or, under CI, fails) and says why
    webdriver = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 60
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "assets" / "page.png"


def _missing() -> str | None:
    if not (CHROMIUM and CHROMEDRIVER):
        return "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
    if webdriver is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through the system chromedriver (no download: Selenium Manager is never asked)."""
    missing = _missing()
    if missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests must run under CI: {missing}")
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1100",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@contextlib.contextmanager
def _serving(reader) -> Iterator[str]:
    """The service over `reader` on a free loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(reader), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    server.should_exit = True
    thread.join(WAIT_S)
    sock.close()


@pytest.fixture()
def server(built):
    """The service over the tiny BERT's datastore."""
    with _serving(built) as url:
        yield url


def _ask(driver, url: str, question: str, subject: str = "") -> None:
    driver.get(url)
    WebDriverWait(driver, WAIT_S).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#examples button")))
    for field, value in (("question", question), ("subject", subject)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "ask").click()


def test_question_shows_three_rankings_and_highlighted_evidence(browser, server):
    _ask(browser, server, "Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold")
    marks = WebDriverWait(browser, WAIT_S).until(
        ec.visibility_of_all_elements_located((By.CSS_SELECTOR, "#evidence .doc mark"))
    )
    rankings = {
        name: [
            li.find_element(By.CLASS_NAME, "token").text
            for li in browser.find_elements(By.CSS_SELECTOR, f"#ranking-{name} li")
        ]
        for name in ("bert", "knn", "bert_knn")
    }
    assert len(rankings["bert"]) == 10 and rankings["knn"], rankings  # kNN: the 5 words of the titled document
    # the sentence weights put the kNN's mass on the word said in a sentence like the question ("was born in
    # Lisbon"), which the mixture ranks first
    assert rankings["bert_knn"][0] == rankings["knn"][0] == "lisbon"
    assert {m.text.lower() for m in marks} <= set(rankings["knn"])
    assert browser.find_element(By.CSS_SELECTOR, "#evidence .doc h3").text == "Ilsa Varnhold"
    assert "Documents searched: Ilsa Varnhold" in browser.find_element(By.ID, "documents").text
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert not browser.find_element(By.ID, "linked").is_displayed()  # a subject was given: nothing linked


def test_a_question_without_a_subject_shows_the_subject_found_in_it(browser, server):
    _ask(browser, server, "Ilsa Varnhold was born in [MASK] .")
    linked = WebDriverWait(browser, WAIT_S).until(ec.visibility_of_element_located((By.ID, "linked")))
    assert linked.text == 'Subject: Ilsa Varnhold (found in the question: "Ilsa Varnhold", title)'
    assert "Documents searched: Ilsa Varnhold" in browser.find_element(By.ID, "documents").text


def test_example_button_asks_its_question(browser, server):
    browser.get(server)
    example = WebDriverWait(browser, WAIT_S).until(ec.element_to_be_clickable((By.CSS_SELECTOR, "#examples button")))
    question = example.text
    example.click()
    WebDriverWait(browser, WAIT_S).until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#ranking-bert_knn li")))
    assert browser.find_element(By.ID, "question").get_attribute("value") == question


def test_question_without_mask_shows_the_api_error(browser, server):
    _ask(browser, server, "Ilsa Varnhold was born in Lisbon .")
    error = WebDriverWait(browser, WAIT_S).until(ec.visibility_of_element_located((By.ID, "error")))
    assert "the question has no [MASK]" in error.text
    assert not browser.find_element(By.ID, "result").is_displayed()


@pytest.mark.smoke
def test_the_documentation_screenshot_is_taken_of_the_demo(browser):
    """docs/assets/page.png: the page answering a demo question with the default model (the guide shows it)."""
    from bertknn.demo import build_demo
    from bertknn.model.runtime import Runtime

    with _serving(build_demo(runtime=Runtime(threads=1))) as url:
        _ask(browser, url, "Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold")
        WebDriverWait(browser, WAIT_S).until(
            ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#evidence .doc h3"), "Ilsa Varnhold")
        )
        assert browser.find_element(By.CSS_SELECTOR, "#ranking-bert_knn li .token").text == "lisbon"
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT)) and SCREENSHOT.stat().st_size > 10_000
