"""Several writers on one datastore: two `bertknn add` at the same moment, and a writable `bertknn serve` under load
while another process (`bertknn add`) writes to the same store.

(a) Of two simultaneous adds at most one may fail, saying that another process is writing, and its rerun succeeds.
(b) Client threads ask (/predict, /predict/batch), add (POST /documents) and remove (DELETE /documents/{id}) for
~15 s (60 s with `--long`) while the CLI adds documents: no 5xx (a write may get 409/503 while the other process
holds the writer lock: counted apart and retried), every document added is answerable, every one removed is gone,
and the service takes in what the other process committed.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from ..conftest import write_corpus
from .conftest import TORCH, Result, born_docs, city, make_docs

BUSY_WORDS = ("being written", "one writer at a time", "busy", "try again")
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def base(tmp_path_factory, cli, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("concurrency")
    corpus = write_corpus(root / "corpus.jsonl", make_docs(20, 10, seed=4, prefix="doc"))
    result = cli.run(["build", corpus, "--out", root / "store", "--model", tiny_model_dir, *TORCH])
    assert result.rc == 0, result.describe()
    return root / "store"


@pytest.fixture(scope="module", autouse=True)
def record(figures):
    yield
    if FIGURES:
        text = "\n".join(f"- {name}: `{json.dumps(f)}`" for name, f in FIGURES.items())
        figures.add("concurrent writers (test_concurrency.py)", FIGURES, text)


def busy(text: str) -> bool:
    return any(word in text for word in BUSY_WORDS)


def answers(store: Path, docs: list[dict]) -> dict[str, str]:
    """The top kNN answer (k=1) to "TITLE was born in [MASK] ." for each document, asked in this process."""
    from bertknn.query.pipeline import BertKNN

    knn = BertKNN.load(store, runtime="torch")
    found = {}
    for doc in docs:
        p = knn.predict(f"{doc['title']} was born in [MASK] .", subject=doc["title"], k=1, top_k=3)
        found[doc["id"]] = p.knn[0].token if p.knn else ""
    return found


def test_two_simultaneous_adds_one_writer_at_a_time(cli, base, tmp_path, long):
    store = tmp_path / "store"
    shutil.copytree(base, store)
    rounds = 10 if long else 3
    stats = Counter()
    problems, docs = [], []
    for r in range(rounds):
        pair = [born_docs([100 + 2 * r], "Alpha"), born_docs([101 + 2 * r], "Beta")]
        files = [write_corpus(tmp_path / f"{name}-{r}.jsonl", d) for name, d in zip("ab", pair)]
        docs += [d for batch in pair for d in batch]
        procs = [cli.start(["add", store, f, *TORCH]) for f in files]  # forked back to back: the same moment
        results: list[Result] = [p.wait() for p in procs]
        stats["rounds"] += 1
        stats["tracebacks"] += sum(r.traceback for r in results)
        failed = [(f, r) for f, r in zip(files, results) if r.rc != 0]
        stats["both_succeeded" if not failed else "one_failed" if len(failed) == 1 else "both_failed"] += 1
        if len(failed) == 2:
            problems.append(f"round {r}: both adds failed: {[x.describe() for _, x in failed]}")
        for file, result in failed:
            if not busy(result.text) or result.traceback:
                problems.append(
                    f"round {r}: the failed add does not say another process is writing: {result.describe()}"
                )
            rerun = cli.run(["add", store, file, *TORCH])
            stats["reruns"] += 1
            stats["tracebacks"] += rerun.traceback
            if rerun.rc != 0:
                stats["failed_reruns"] += 1
                problems.append(f"round {r}: the rerun failed: {rerun.describe()}")
    got = answers(store, docs)
    wrong = {d["id"]: got[d["id"]] for d in docs if got[d["id"]] != city(int(d["id"].split("-")[1]))}
    stats["documents"], stats["unanswerable"] = len(docs), len(wrong)
    verify = cli.run(["verify", store])
    stats["verify_rc"] = verify.rc
    FIGURES["two simultaneous adds"] = dict(stats)
    print(dict(stats))
    assert problems == []
    assert wrong == {}, f"documents not answerable after the adds (id: top kNN answer): {wrong}"
    assert verify.rc == 0, verify.describe()
    assert stats["tracebacks"] == 0


class Load:
    """Client threads against the service: what they asked, what they got, and what they found wrong."""

    def __init__(self, url: str, deadline: float, seed: int) -> None:
        self.url, self.deadline, self.seed = url, deadline, seed
        self.lock = threading.Lock()
        self.uids = itertools.count(1000)
        self.status: Counter = Counter()  # "METHOD path status"
        self.busy: Counter = Counter()  # writes answered 409/503 because another writer held the lock
        self.errors: list[str] = []
        self.live: dict[str, dict] = {}  # added through the service and not removed
        self.removed: dict[str, dict] = {}
        self.checks = 0
        self.coin = random.Random(seed)  # /predict or /predict/batch for one question

    def error(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)

    def call(self, client: httpx.Client, method: str, path: str, label: str, **kwargs) -> httpx.Response | None:
        """One request; a write answered 409/503 for a busy writer lock is retried. None after an error."""
        for _ in range(200):
            try:
                response = client.request(method, path, **kwargs)
            except httpx.HTTPError as err:
                self.error(f"{method} {label}: {type(err).__name__}: {err}")
                return None
            with self.lock:
                self.status[f"{method} {label} {response.status_code}"] += 1
            write = method != "POST" or label == "/documents"
            if write and response.status_code in (409, 503) and busy(response.text):
                with self.lock:
                    self.busy[f"{method} {label} {response.status_code}"] += 1
                time.sleep(0.05)
                continue
            return response
        self.error(f"{method} {label}: still busy after 200 tries")
        return None

    def predict(self, client: httpx.Client, docs: list[dict]) -> list[dict] | None:
        """Ask "TITLE was born in [MASK] ." (subject TITLE, k=1) for each document; the predictions or None."""
        questions = [{"text": f"{d['title']} was born in [MASK] .", "subject": d["title"]} for d in docs]
        options = {"k": 1}
        with self.lock:
            single = len(docs) == 1 and self.coin.random() < 0.5
        if single:
            r = self.call(client, "POST", "/predict", "/predict", json={**questions[0], "top_k": 3, "options": options})
            if r is None or r.status_code != 200:
                self.error(f"/predict: {r and r.status_code}: {r and r.text[:300]}")
                return None
            return [r.json()]
        r = self.call(
            client,
            "POST",
            "/predict/batch",
            "/predict/batch",
            json={"questions": questions, "top_k": 3, "options": options},
        )
        if r is None or r.status_code != 200:
            self.error(f"/predict/batch: {r and r.status_code}: {r and r.text[:300]}")
            return None
        return r.json()["predictions"]

    def check_live(self, client: httpx.Client, docs: list[dict], when: str) -> None:
        for start in range(0, len(docs), 64):
            part = docs[start : start + 64]
            predictions = self.predict(client, part)
            for doc, p in zip(part, predictions or []):
                self.checks += 1
                top = p["knn"][0]["token"] if p["knn"] else None
                if top != doc["city"]:
                    self.error(
                        f"{when}: {doc['title']} (born in {doc['city']}) answered {top!r}, documents {p['documents']}"
                    )

    def check_removed(self, client: httpx.Client, docs: list[dict], when: str) -> None:
        for start in range(0, len(docs), 64):
            part = docs[start : start + 64]
            for doc, p in zip(part, self.predict(client, part) or []):
                self.checks += 1
                if doc["title"] in p["documents"]:
                    self.error(f"{when}: removed {doc['title']} still among the documents {p['documents']}")

    def add(self, client: httpx.Client, mine: list[dict]) -> None:
        with self.lock:
            uid = next(self.uids)
        doc = born_docs([uid])[0]
        r = self.call(client, "POST", "/documents", "/documents", json=doc)
        if r is None or r.status_code != 201:
            self.error(f"POST /documents {doc['id']}: {r and r.status_code}: {r and r.text[:300]}")
            return
        doc = {**doc, "city": city(uid)}
        self.check_live(client, [doc], "just added")
        mine.append(doc)
        with self.lock:
            self.live[doc["id"]] = doc

    def remove(self, client: httpx.Client, mine: list[dict], rng: random.Random) -> None:
        doc = mine.pop(rng.randrange(len(mine)))
        with self.lock:
            del self.live[doc["id"]]
        r = self.call(client, "DELETE", f"/documents/{doc['id']}", "/documents/{id}")
        if r is None or r.status_code != 200:
            self.error(f"DELETE /documents/{doc['id']} (a live document): {r and r.status_code}: {r and r.text[:300]}")
            return
        with self.lock:
            self.removed[doc["id"]] = doc
        self.check_removed(client, [doc], "just removed")

    def client(self, n: int, base_docs: list[dict]) -> None:
        rng = random.Random(self.seed + n)
        mine: list[dict] = []
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while time.monotonic() < self.deadline:
                op = rng.random()
                if op < 0.3:
                    self.add(client, mine)
                elif op < 0.45 and mine:
                    self.remove(client, mine, rng)
                elif op < 0.7:
                    self.check_live(client, [rng.choice(mine)] if mine else [], "asked again")
                    self.predict(client, [rng.choice(base_docs)])
                else:
                    docs = rng.sample(mine, min(len(mine), 3))
                    self.check_live(client, docs, "asked in a batch")
                    self.predict(client, rng.sample(base_docs, 3))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_add(cli, store: Path, corpus: Path, stats: Counter, problems: list[str], refused: bool) -> None:
    """`bertknn add` in another process: with `refused`, while the service holds the datastore's writer (opened at
    its first write, held until it stops), told which process holds it and exit 2 with nothing written; else done."""
    result = cli.run(["add", store, corpus, "--wait", "0.5", *TORCH])
    stats["cli_add_runs"] += 1
    stats["tracebacks"] += result.traceback
    stats["cli_add_busy"] += result.rc == 2 and busy(result.text)
    if refused and not (result.rc == 2 and busy(result.text) and "bertknn serve" in result.text):
        problems.append(f"CLI add beside the writing service: {result.describe()}")
    elif not refused and result.rc != 0:
        problems.append(f"CLI add after the service stopped: {result.describe()}")


def test_service_writes_with_another_process_writing(cli, base, tmp_path, long, rng):
    store = tmp_path / "store"
    shutil.copytree(base, store)
    base_docs = [{"id": d["id"], "title": d["title"]} for d in make_docs(20, 10, seed=4, prefix="doc")]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = cli.start(["serve", store, "--writable", "--port", port, *TORCH], exec_=True)
    stats: Counter = Counter()
    problems: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.popen.poll() is None, f"the service exited: {server.wait().text[-3000:]}"
            assert time.monotonic() < deadline, "the service did not answer /health within 120 s"
            time.sleep(0.2)
        seconds, threads = (60, 8) if long else (15, 4)
        load = Load(url, time.monotonic() + seconds, rng.randrange(1 << 30))
        workers = [threading.Thread(target=load.client, args=(n, base_docs)) for n in range(threads)]
        for w in workers:
            w.start()
        other = [{**d, "city": city(int(d["id"].split("-")[1]))} for d in born_docs(range(5000, 5006), "Other")]
        time.sleep(seconds / 4)
        cli_add(cli, store, write_corpus(tmp_path / "other.jsonl", other), stats, problems, refused=True)
        for w in workers:
            w.join()
        with httpx.Client(base_url=url, timeout=120) as client:
            load.check_live(client, list(load.live.values()), "after the load")
            load.check_removed(client, list(load.removed.values()), "after the load")
            load.check_removed(client, other, "refused to the CLI during the load")
            load.add(client, [])  # the service still writes after the other process was refused
    finally:
        server.popen.send_signal(signal.SIGINT)
        try:
            server.popen.wait(30)
        except Exception:
            server.kill()
        served = server.wait()
    cli_add(cli, store, write_corpus(tmp_path / "other.jsonl", other), stats, problems, refused=False)  # lock free
    verify = cli.run(["verify", store])
    server_errors = {k: v for k, v in load.status.items() if int(k.rsplit(" ", 1)[1]) >= 500}
    write_503 = {k: v for k, v in load.busy.items() if k.endswith(" 503")}
    for k in write_503:
        server_errors[k] -= write_503[k]  # 503 to a write while another writer holds the lock: not an error
    server_errors = {k: v for k, v in server_errors.items() if v}
    figures = {
        "seconds": seconds,
        "client_threads": threads,
        "responses": dict(sorted(load.status.items())),
        "busy_writes_retried": dict(load.busy),
        "server_errors": server_errors,
        "documents_added_by_service": len(load.live) + len(load.removed),
        "documents_removed_by_service": len(load.removed),
        "answer_checks": load.checks,
        "wrong_or_failed": len(load.errors),
        "cli_add_runs": stats["cli_add_runs"],
        "cli_add_busy": stats["cli_add_busy"],
        "tracebacks": stats["tracebacks"] + served.traceback,
        "verify_rc": verify.rc,
        "first_errors": [*problems, *load.errors][:8],
    }
    FIGURES["service under load with another process writing"] = figures
    print(json.dumps(figures))
    assert not served.traceback, served.text[-3000:]
    assert problems == []
    assert server_errors == {}, load.errors[:10]
    assert load.errors == [], f"{len(load.errors)} wrong or failed answers, first: {load.errors[:10]}"
    assert verify.rc == 0, verify.describe()
    assert stats["tracebacks"] == 0
