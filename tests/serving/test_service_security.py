"""The service exposed to a network: write token, Host checking, size and time limits, malformed requests (never
a 5xx, fuzzed with hypothesis), no paths in /health, offline /docs, ids with "/" and the `serve` command's checks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
from urllib.parse import quote

import pytest
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bertknn.cli import main as cli
from bertknn.model.runtime import Runtime
from bertknn.query.pipeline import BertKNN
from bertknn.serving.schemas import PredictRequest
from bertknn.serving.security import allowed_hosts_for, is_loopback
from bertknn.serving.service import create_app

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://localhost"
ILSA = {"text": "Ilsa Varnhold was born in [MASK] .", "subject": "Ilsa Varnhold"}
DOC = {"id": "n1", "title": "Brannoc Vey", "text": "Brannoc Vey was born in Oslo."}
FUZZ_EXAMPLES = int(os.environ.get("BERTKNN_FUZZ_EXAMPLES", "200"))


@pytest.fixture()
def client(built):
    with TestClient(create_app(built), base_url=BASE) as c:
        yield c


@pytest.fixture()
def secured(built):
    """A writable app that wants the token, with raise_server_exceptions off: a server error is seen as a 500."""
    with TestClient(create_app(built, writable=True, token=TOKEN), base_url=BASE, raise_server_exceptions=False) as c:
        yield c


# 1. writes need the token


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer ñ".encode()},
    ],
)
def test_writes_without_the_right_token_get_401(secured, headers):
    for response in (
        secured.post("/documents", json=DOC, headers=headers),
        secured.delete("/documents/d1", headers=headers),
    ):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["detail"]
    assert secured.get("/health").json()["documents"] == 5  # nothing was written


def test_writes_with_the_token_and_reads_without(secured):
    assert secured.post("/predict", json=ILSA).status_code == 200
    assert secured.post("/documents", json=DOC, headers=AUTH).status_code == 201
    assert secured.delete("/documents/n1", headers=AUTH).status_code == 200


def test_an_empty_token_is_refused(built):
    with pytest.raises(ValueError, match="token"):
        create_app(built, writable=True, token="")


def test_loopback_hosts():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.com"))


runner = CliRunner()


@pytest.fixture()
def served(monkeypatch, built):
    """Run `bertknn serve` on the built datastore with uvicorn.run replaced: yields the captured (app, host)."""
    monkeypatch.setattr(cli.console, "width", 300)
    monkeypatch.delenv("BERTKNN_TOKEN", raising=False)
    captured = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **_: captured.update(app=app, host=host))

    def serve(*args: str, env: dict | None = None):
        argv = ["serve", str(built.store.path), "--backend", "torch", "--threads", "1", *args]
        return runner.invoke(cli.app, argv, env=env), captured

    yield serve
    Runtime(threads=1).apply()


def test_serve_refuses_a_writable_network_bind_without_token(served):
    result, captured = served("--host", "0.0.0.0", "--writable")
    assert result.exit_code == 2 and not captured
    assert "--token" in result.output and "BERTKNN_TOKEN" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_serve_on_the_network_warns_allows_its_names_and_takes_the_token_from_env(served):
    result, captured = served("--host", "0.0.0.0", "--writable", env={"BERTKNN_TOKEN": TOKEN})
    assert result.exit_code == 0, result.output
    assert "warning" in result.output and "reachable from the network" in result.output
    assert socket.gethostname() in result.output and "--allowed-host" in result.output
    with TestClient(captured["app"], base_url=f"http://{socket.gethostname()}") as c:
        assert c.get("/health").status_code == 200
        assert c.post("/documents", json=DOC).status_code == 401
        assert c.post("/documents", json=DOC, headers=AUTH).status_code == 201
    with TestClient(captured["app"], base_url="http://evil.example") as c:
        assert c.get("/health").status_code == 400


def test_serve_on_loopback_does_not_warn_and_takes_allowed_hosts(served):
    result, captured = served("--allowed-host", "api.example", "--allowed-host", "localhost", "--token", TOKEN)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    for host, code in (("api.example", 200), ("localhost", 200), ("127.0.0.1", 400)):
        with TestClient(captured["app"], base_url=f"http://{host}") as c:
            assert c.get("/health").status_code == code, host


# 2. the Host header


@pytest.mark.parametrize(
    ("host", "code"),
    [("localhost:8000", 200), ("127.0.0.1", 200), ("[::1]:8000", 200), ("evil.example", 400), ("testserver", 400)],
)
def test_a_loopback_app_answers_only_loopback_host_names(client, host, code):
    assert client.get("/health", headers={"Host": host}).status_code == code


def test_allowed_hosts_replace_the_default(built):
    with TestClient(create_app(built, allowed_hosts=["api.example", "::1"]), base_url="http://api.example") as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health", headers={"Host": "[::1]"}).status_code == 200
        assert c.get("/health", headers={"Host": "localhost"}).status_code == 400


def test_network_binds_allow_the_machine_names():
    assert allowed_hosts_for("127.0.0.1") == ["localhost", "127.0.0.1", "::1"]
    hosts = allowed_hosts_for("0.0.0.0")
    assert {"localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname(), socket.getfqdn()} <= set(hosts)


# 3. size limits


def test_a_body_over_the_limit_is_refused_by_its_length(built):
    with TestClient(create_app(built, max_body_bytes=1000), base_url=BASE) as c:
        assert c.post("/predict", json=ILSA).status_code == 200
        response = c.post("/predict", json={**ILSA, "subject": "x" * 2000})
        assert response.status_code == 413 and "1,000 bytes" in response.json()["detail"]


def _asgi_post(app, path: str, chunks: list[bytes]) -> tuple[int, bytes, int]:
    """POST `chunks` as a streamed body without Content-Length; returns (status, body, chunks read by the app)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    pending, sent, read = list(chunks), [], 0

    async def receive():
        nonlocal read
        if not pending:
            await asyncio.sleep(3600)  # a client still connected
        read += 1
        return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), read


def test_a_streamed_body_over_the_limit_is_refused(built):
    app = create_app(built, max_body_bytes=1000)
    body = json.dumps({**ILSA, "subject": "x" * 5000}).encode()
    status, content, read = _asgi_post(app, "/predict", [body[i : i + 400] for i in range(0, len(body), 400)])
    assert status == 413 and b"1,000 bytes" in content
    assert read == 3  # 1,200 bytes: refused without reading the rest
    with TestClient(app, base_url=BASE) as c:  # httpx sends a generator chunked
        response = c.post("/predict", content=iter([body]), headers={"Content-Type": "application/json"})
        assert "content-length" not in response.request.headers and response.status_code == 413


def test_a_document_over_the_character_limit_is_refused(built):
    app = create_app(built, writable=True, token=TOKEN, max_document_chars=100)
    with TestClient(app, base_url=BASE) as c:
        doc = {"id": "big", "title": "T" * 10, "text": ["a" * 50, "b" * 41]}
        response = c.post("/documents", json=doc, headers=AUTH)
        assert response.status_code == 413 and "100 characters" in response.json()["detail"]
        assert c.post("/documents", json={**doc, "text": ["Big was born in Oslo."]}, headers=AUTH).status_code == 201


# 4. a time limit per request


def test_a_prediction_not_ready_in_time_gets_503_and_is_skipped(built, monkeypatch):
    predict_batch, release, asked, answered = built.predict_batch, threading.Event(), [], threading.Event()

    def slow(texts, *args, **kwargs):
        asked.append(texts[0].text)
        if texts[0].text == ILSA["text"]:
            assert release.wait(30)
        try:
            return predict_batch(texts, *args, **kwargs)
        finally:
            answered.set()

    monkeypatch.setattr(built, "predict_batch", slow)
    paris = {"text": "Paris is the capital of [MASK] ."}
    with TestClient(create_app(built, request_timeout_s=0.5), base_url=BASE) as c:
        first = c.post("/predict", json=ILSA)  # the worker is stuck in its call
        assert first.status_code == 503 and "0.5 s" in first.json()["detail"] and first.headers["Retry-After"] == "5"
        queued = {"text": "Quellbrook is a town in [MASK] ."}
        assert c.post("/predict/batch", json={"questions": [queued]}).status_code == 503
        release.set()
        assert answered.wait(30)
        assert c.post("/predict", json=paris).status_code == 200
    assert asked == [ILSA["text"], paris["text"]]  # the queued job given up on never ran


def test_serve_takes_the_time_limit_from_the_command_line(served, monkeypatch):
    predict_batch, release = BertKNN.predict_batch, threading.Event()

    def slow(self, *args, **kwargs):
        assert release.wait(30)
        return predict_batch(self, *args, **kwargs)

    monkeypatch.setattr(BertKNN, "predict_batch", slow)
    result, captured = served("--request-timeout", "0.25")
    assert result.exit_code == 0, result.output
    with TestClient(captured["app"], base_url=BASE) as c:
        late = c.post("/predict", json=ILSA)
        release.set()
    assert late.status_code == 503 and "time limit of 0.25 s" in late.json()["detail"]
    assert served("--request-timeout", "0")[0].exit_code == 2


# 5. malformed requests: 4xx, never 5xx

SURROGATE = "\\ud800"  # as it stands in raw JSON


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/predict", '{"text": "a [MASK]", "options": {"lam": NaN}}'),
        ("/predict", '{"text": "a [MASK]", "options": {"temperature": Infinity}}'),
        ("/predict", '{"text": "a [MASK]", "options": {"lam": -Infinity}}'),
        ("/predict", '{"text": "a [MASK]", "top_k": NaN}'),
        ("/predict", '{"text": "a [MASK]", "options": {"temperature": 1e999}}'),
        ("/predict", f'{{"text": "a [MASK] {SURROGATE}"}}'),
        ("/predict", f'{{"text": "a [MASK]", "subject": "{SURROGATE}"}}'),
        ("/predict", f'{{"text": "a [MASK]", "options": {{"{SURROGATE}": 1}}}}'),
        ("/predict", f'{{"text": "a [MASK]", "{SURROGATE}x": 1}}'),
        ("/predict/batch", f'{{"questions": [{{"text": "a [MASK]", "subject": "{SURROGATE}"}}]}}'),
        ("/predict/batch", '{"questions": [{"text": "a [MASK]"}], "options": {"lam": NaN}}'),
        ("/documents", f'{{"id": "{SURROGATE}", "title": "T", "text": "T was born in Oslo."}}'),
        ("/documents", f'{{"id": "x", "title": "{SURROGATE}", "text": ["{SURROGATE}"]}}'),
        ("/documents", '{"id": NaN, "title": "T", "text": "x"}'),
    ],
)
def test_unencodable_and_non_finite_values_get_422(secured, path, raw):
    response = secured.post(path, content=raw.encode(), headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert all(set(e) == {"loc", "msg", "type"} for e in errors), errors


def test_a_lone_surrogate_in_the_question_is_named(secured):
    raw = f'{{"text": "Ilsa was born in [MASK] {SURROGATE}", "subject": "Ilsa"}}'.encode()
    response = secured.post("/predict", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "text"] and "unicode" in error["msg"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_docs": 0}, "n_docs must be a whole number >= 1, not 0"),  # Settings' bounds: its message
        ({"n_docs": 101}, "less than or equal to 100"),
        ({"k": 10_001}, "less than or equal to 10000"),
        ({"k": 10**30}, "less than or equal to 10000"),
        ({"lam": float("nan")}, "finite number"),
        ({"lm_words": -1}, "lm_words must be a whole number >= 0"),
        ({"word_bonus": 0}, "word_bonus must be a number > 0"),
        ({"word_bonus": float("inf")}, "finite number"),
        ({"sentence_temperature": -0.01}, "sentence_temperature must be a number >= 0"),
        ({"sentence_temperature": float("nan")}, "finite number"),
        ({"sentence_floor": 0.5}, "Extra inputs are not permitted"),  # part of the method, no option
    ],
)
def test_options_are_bounded_and_finite(client, options, message):
    response = client.post(
        "/predict", content=json.dumps({**ILSA, "options": options}), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422 and message in response.text


@pytest.mark.parametrize(
    ("path", "body", "loc", "message"),
    [
        ("/predict", {"top_k": True}, ["body", "top_k"], "a valid integer"),
        ("/predict", {"top_k": "2"}, ["body", "top_k"], "a valid integer"),
        ("/predict", {"evidence": False}, ["body", "evidence"], "a valid integer"),
        ("/predict", {"fill_mask": "yes"}, ["body", "fill_mask"], "a valid boolean"),
        ("/predict", {"fill_mask": 1}, ["body", "fill_mask"], "a valid boolean"),
        ("/predict", {"options": {"n_docs": True}}, ["body", "options", "n_docs"], "a valid integer"),
        ("/predict", {"options": {"k": "5"}}, ["body", "options", "k"], "a valid integer"),
        ("/predict", {"options": {"entity_filter": "yes"}}, ["body", "options", "entity_filter"], "a valid boolean"),
        ("/predict", {"options": {"entity_filter": 0}}, ["body", "options", "entity_filter"], "a valid boolean"),
        ("/predict", {"options": {"lam": True}}, ["body", "options", "lam"], "a valid number"),
        ("/predict", {"options": {"lam": "0.5"}}, ["body", "options", "lam"], "a valid number"),
        ("/predict", {"options": {"retrieval": 1}}, ["body", "options", "retrieval"], "a valid string"),
        ("/predict/batch", {"top_k": True}, ["body", "top_k"], "a valid integer"),
        ("/predict/batch", {"options": {"n_docs": True}}, ["body", "options", "n_docs"], "a valid integer"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_422_naming_the_field(client, path, body, loc, message):
    """No lax conversions: `true` is no number, "yes" no boolean, "2" no number."""
    questions = {"questions": [ILSA]} if path == "/predict/batch" else ILSA
    response = client.post(path, json={**questions, **body})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == loc and message in error["msg"]


def test_numbers_of_either_json_form_are_taken():
    """JSON has one number type: 1 for a float setting, 3.0 for a whole one."""
    body = {**ILSA, "top_k": 3.0, "options": {"lam": 1, "n_docs": 2.0, "entity_filter": False}}
    req = PredictRequest.model_validate(body)
    assert req.top_k == 3 and req.options.lam == 1.0 and req.options.n_docs == 2 and req.options.entity_filter is False


def test_a_request_of_the_right_types_answers(client):
    body = {**ILSA, "top_k": 1, "evidence": 0, "fill_mask": True, "options": {"lam": 0.5, "entity_filter": True}}
    response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["bert_knn"]) == 1 and response.json()["fill_mask"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
QUESTION_TEXT = st.builds(lambda a, b: f"{a} [MASK] {b}", st.text(max_size=30), st.text(max_size=30))
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "n_docs": JSON_VALUES | st.integers(),
        "k": JSON_VALUES | st.integers(),
        "temperature": st.floats(),
        "lam": st.floats(),
        "retrieval": st.sampled_from(["ir", "faiss", "ir+faiss", "x"]),
        "doc_temperature": st.floats(),
        "mixture": st.sampled_from(["linear", "log-linear", "x"]),
        "lm_words": JSON_VALUES | st.integers(),
        "word_bonus": st.floats(),
        "sentence_temperature": st.floats(),
    },
)
EXTRA_FIELDS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=2)


def _with_extra(fields: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    """Bodies with the given fields, sometimes with random extra ones."""
    return st.builds(lambda extra, body: {**extra, **body}, st.just({}) | EXTRA_FIELDS, fields)


QUESTION = st.fixed_dictionaries(
    {"text": QUESTION_TEXT | JSON_VALUES}, optional={"subject": st.text(max_size=30) | JSON_VALUES}
)
PREDICT = _with_extra(
    st.fixed_dictionaries(
        {"text": QUESTION_TEXT | JSON_VALUES},
        optional={
            "subject": st.text(max_size=30) | JSON_VALUES,
            "top_k": st.integers() | JSON_VALUES,
            "evidence": st.integers() | JSON_VALUES,
            "options": OPTIONS | JSON_VALUES,
        },
    )
)
BATCH = _with_extra(
    st.fixed_dictionaries(
        {"questions": st.lists(QUESTION, max_size=3) | JSON_VALUES},
        optional={"top_k": st.integers(), "options": OPTIONS},
    )
)
SENTENCE = st.text(max_size=20).map(lambda name: f"{name} was born in Oslo.")
DOCUMENT = _with_extra(
    st.fixed_dictionaries(
        {
            "id": st.text(min_size=1, max_size=20) | st.integers() | JSON_VALUES,
            "title": st.text(min_size=1, max_size=20) | JSON_VALUES,
            "text": SENTENCE | st.text(max_size=80) | st.lists(st.text(max_size=40), max_size=3) | JSON_VALUES,
        }
    )
)


def _raw(value) -> bytes:
    """JSON as a client may send it, NaN and Infinity included."""
    return json.dumps(value).encode()


def _with_surrogate(body: bytes, i: int) -> bytes:
    """`body` with a lone surrogate escape after its i-th double quote: inside a string, or breaking the JSON."""
    quotes = [m.end() for m in re.finditer(rb'"', body)]
    if not quotes:
        return body
    at = quotes[i % len(quotes)]
    return body[:at] + b"\\udc80" + body[at:]


REQUESTS = st.one_of(
    st.tuples(st.just("/predict"), PREDICT.map(_raw)),
    st.tuples(st.just("/predict/batch"), BATCH.map(_raw)),
    st.tuples(st.just("/documents"), DOCUMENT.map(_raw)),
    st.tuples(st.sampled_from(["/predict", "/predict/batch", "/documents"]), JSON_VALUES.map(_raw)),
    st.tuples(st.sampled_from(["/predict", "/predict/batch", "/documents"]), st.binary(max_size=200)),
)


def test_fuzzed_requests_never_get_a_server_error(secured):
    """Random JSON bodies, raw bytes and fields (with lone surrogates mixed in) and random ids to delete."""

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        request=REQUESTS,
        surrogate=st.none() | st.integers(0, 20),
        doc_id=st.text(max_size=20),
        auth=st.sampled_from([True, True, False]),
    )
    def check(request, surrogate, doc_id, auth):
        path, body = request
        if surrogate is not None:
            body = _with_surrogate(body, surrogate)
        headers = {"Content-Type": "application/json", **(AUTH if auth else {})}
        response = secured.post(path, content=body, headers=headers)
        assert response.status_code < 500, (path, body, response.text)
        response = secured.delete(f"/documents/{quote(doc_id)}", headers=headers)
        assert response.status_code < 500, (doc_id, response.text)

    check()


# 6. /health, 7. /docs, 8. ids with "/"


def test_health_shows_the_datastore_name_not_its_path(client, built):
    health = client.get("/health").json()
    assert health["datastore"] == built.store.path.name
    assert str(built.store.path.parent) not in json.dumps(health)


def test_docs_load_nothing_from_outside(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert not re.search(r"https?://", page.text), page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(assets) == 3 and all(a.startswith("/docs-assets/") for a in assets)
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    assert "url: '/openapi.json'" in page.text and client.get("/openapi.json").status_code == 200
    assert client.get("/redoc").status_code == 404


def test_an_id_with_a_slash_can_be_deleted(secured):
    response = secured.post("/documents", json={**DOC, "id": "a/b"}, headers=AUTH)
    assert response.status_code == 201, response.text
    response = secured.delete("/documents/a/b", headers=AUTH)
    assert response.status_code == 200 and response.json()["id"] == "a/b"
    assert secured.get("/health").json()["documents"] == 5


BRANNOC = {"text": "Brannoc Vey was born in [MASK] .", "subject": "Brannoc Vey"}


@pytest.mark.parametrize("doc_id", ["nl\nid", "tab\tid", "ls\u2028id", "a/\tb\nc\n"])
def test_any_id_the_service_adds_it_can_delete(secured, doc_id):
    assert secured.post("/documents", json={**DOC, "id": doc_id}, headers=AUTH).status_code == 201
    assert "Brannoc Vey" in secured.post("/predict", json=BRANNOC).json()["documents"]
    response = secured.delete(f"/documents/{quote(doc_id)}", headers=AUTH)
    assert response.status_code == 200 and response.json()["id"] == doc_id
    assert secured.get("/health").json()["documents"] == 5
    assert "Brannoc Vey" not in secured.post("/predict", json=BRANNOC).json()["documents"]


def test_deleting_an_id_with_a_trailing_newline_leaves_the_id_without_it(secured):
    for doc_id in ("n1", "n1\n"):
        assert secured.post("/documents", json={**DOC, "id": doc_id}, headers=AUTH).status_code == 201
    response = secured.delete("/documents/n1%0A", headers=AUTH)
    assert response.status_code == 200 and response.json()["id"] == "n1\n"
    assert secured.get("/health").json()["documents"] == 6  # "n1" is still there
    assert secured.delete("/documents/n1", headers=AUTH).status_code == 200


@pytest.mark.parametrize("date", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"])
def test_a_document_dated_outside_years_1_to_9999_in_utc_is_422(secured, date):
    response = secured.post("/documents", json={**DOC, "date": date}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert f"'date' '{date}' converted to UTC falls outside the years 1 to 9999" in response.text
    assert secured.get("/health").json()["documents"] == 5
