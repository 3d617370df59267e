"""The HTTP API through FastAPI's TestClient, on the tiny BERT's datastore: answers, validation, documents, health."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bertknn import BertKNN
from bertknn.query.pipeline import Query
from bertknn.serving.batching import MicroBatcher
from bertknn.serving.service import create_app
from tests.conftest import index_keys

from ..tolerances import assert_ranking_close

BASE = "http://localhost"  # the service answers loopback Host names only, not TestClient's "testserver"
ILSA = {"text": "Ilsa Varnhold was born in [MASK] .", "subject": "Ilsa Varnhold"}
QUESTIONS = [
    ILSA,
    {"text": "Quellbrook is a town in [MASK] .", "subject": "Quellbrook"},
    {"text": "Paris is the capital of [MASK] .", "subject": None},
]


@pytest.fixture()
def client(built):
    with TestClient(create_app(built), base_url=BASE) as c:
        yield c


@pytest.fixture()
def writable_client(built):
    with TestClient(create_app(built, writable=True), base_url=BASE) as c:
        yield c


FIELDS = (
    *("question", "subject", "documents", "retrieval", "bert", "knn", "bert_knn", "evidence", "superseded"),
    "linked",
)


def _as_json(prediction) -> dict:
    """A Prediction as the API returns it: its documented fields, spans as JSON lists."""
    out = {name: value for name, value in prediction.to_dict().items() if name in FIELDS}
    for neighbours in [*out["evidence"].values(), out["superseded"]]:
        for n in neighbours:
            n["span"] = list(n["span"])
    return out


def test_predict_returns_the_library_answer(client, built):
    response = client.post("/predict", json={**ILSA, "top_k": 5, "evidence": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body == _as_json(built.predict(ILSA["text"], ILSA["subject"], top_k=5, evidence=2))
    assert len(body["bert"]) == len(body["knn"]) == len(body["bert_knn"]) == 5
    neighbour = next(iter(body["evidence"].values()))[0]
    a, b = neighbour["span"]
    assert neighbour["title"] == "Ilsa Varnhold" and neighbour["sentence"][a:b].lower() == neighbour["token"]


def test_options_reach_the_model(client, built):
    options = {"n_docs": 1, "k": 4, "temperature": 2.0, "lam": 0.9}
    body = client.post("/predict", json={"text": QUESTIONS[2]["text"], "options": options}).json()
    expected = built.predict(QUESTIONS[2]["text"], top_k=10, evidence=3, **options)
    assert body == _as_json(expected)
    assert body["bert_knn"] != _as_json(built.predict(QUESTIONS[2]["text"]))["bert_knn"]
    vote = {"doc_temperature": 0.05, "lam_by": "entropy", "lam": 0.9, "mixture": "linear"}  # beyond the paper
    body = client.post("/predict", json={"text": QUESTIONS[2]["text"], "options": vote}).json()
    assert body == _as_json(built.predict(QUESTIONS[2]["text"], top_k=10, evidence=3, **vote))


def test_batch_equals_singles(client):
    response = client.post("/predict/batch", json={"questions": QUESTIONS, "top_k": 4})
    assert response.status_code == 200, response.text
    batch = response.json()["predictions"]
    assert len(batch) == len(QUESTIONS)
    for question, got in zip(QUESTIONS, batch):
        single = client.post("/predict", json={**question, "top_k": 4}).json()
        assert got["question"] == question["text"] and got["documents"] == single["documents"]
        for name in ("bert", "knn", "bert_knn"):  # padding in a batch: the model's tolerance
            ranked = [[(t["token"], t["probability"]) for t in answer[name]] for answer in (got, single)]
            assert_ranking_close(*ranked)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "Ilsa Varnhold was born in Lisbon ."}, "has no [MASK]"),
        ({"text": "[MASK] was born in [MASK] ."}, "2 [MASK] tokens"),
        ({"text": "x " * 600 + "[MASK] ."}, "at most 1000 characters"),
        ({"text": ""}, "at least 1 character"),
        ({**ILSA, "top_k": 0}, "greater than or equal to 1"),
        ({**ILSA, "top_k": 1000}, "less than or equal to 100"),
        ({**ILSA, "evidence": 21}, "less than or equal to 20"),
        ({**ILSA, "options": {"lam": 5}}, "lam must be a number in [0, 1], not 5"),
        ({**ILSA, "options": {"n_docs": 2, "temperature": -1}}, "temperature must be a number > 0"),
        ({**ILSA, "options": {"k": 0}}, "k must be a whole number >= 1, not 0"),
        ({**ILSA, "options": {"k": 20_000}}, "less than or equal to 10000"),  # the service's own cap
        ({**ILSA, "options": {"beam": 3}}, "Extra inputs are not permitted"),
        ({**ILSA, "options": {"doc_temperature": -1}}, "doc_temperature must be a number >= 0"),
        ({**ILSA, "options": {"lam_by": "max"}}, "lam_by must be one of constant, entropy"),
        ({**ILSA, "options": {"mixture": "cubic"}}, "mixture must be one of linear, log-linear, not 'cubic'"),
        ({"subject": "Ilsa Varnhold"}, "Field required"),
    ],
)
def test_bad_requests_say_what_is_wrong(client, body, message):
    response = client.post("/predict", json=body)
    assert response.status_code == 422
    assert message in response.text


def test_bad_batches_name_the_question(client):
    questions = [ILSA, {"text": "no mask here"}]
    response = client.post("/predict/batch", json={"questions": questions})
    assert response.status_code == 422 and "question 2: the question has no [MASK]" in response.text
    response = client.post("/predict/batch", json={"questions": [ILSA] * 65})
    assert response.status_code == 422 and "at most 64 items" in response.text
    assert client.post("/predict/batch", json={"questions": []}).status_code == 422


def test_documents_are_refused_when_read_only(client):
    response = client.post("/documents", json={"id": "n1", "title": "New", "text": "New was born in Oslo."})
    assert response.status_code == 403 and "--writable" in response.json()["detail"]
    response = client.delete("/documents/d1")
    assert response.status_code == 403 and "--writable" in response.json()["detail"]


def test_health_counts_the_store(client, built):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["writable"] is False
    assert health["documents"] == built.store.n_documents == 5
    assert health["contexts"] == built.store.size > 0
    assert health["layer"] == built.store.manifest.layer and health["model"] == Path(built.encoder.name).name
    assert health["hparams"] == built.hparams and health["datastore"] == built.store.path.name


def test_openapi_lists_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/predict", "/predict/batch", "/documents", "/documents/{doc_id}", "/health", "/examples"} <= set(paths)
    assert paths["/predict"]["post"]["requestBody"]


def test_page_and_examples_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and 'id="ask-form"' in page.text and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200 and client.get("/static/style.css").status_code == 200
    examples = client.get("/examples").json()
    assert examples and all(e["question"].count("[MASK]") == 1 for e in examples)


class _Gated:
    """A BertKNN whose first predict_batch call waits for `release`: the test queues jobs while it runs."""

    def __init__(self, knn: BertKNN) -> None:
        self.knn, self.entered, self.release = knn, threading.Event(), threading.Event()

    def refresh(self) -> bool:
        return self.knn.refresh()

    def predict_batch(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(60)
        return self.knn.predict_batch(*args, **kwargs)


def test_requests_waiting_together_share_one_model_call(built):
    """The worker takes all queued jobs, one predict_batch call per settings; a bad job fails alone."""
    gated = _Gated(built)
    batcher = MicroBatcher(gated, threading.Lock(), max_batch=32)
    try:
        first = batcher.submit(built.preprocess([ILSA["text"]], [ILSA["subject"]]), 3, 1, built.settings)
        assert gated.entered.wait(60)  # the worker is in its first call: what follows waits in the queue
        rest = [
            batcher.submit(built.preprocess([q["text"]], [q["subject"]]), 3, 1, built.settings) for q in QUESTIONS[1:]
        ]
        other = batcher.submit(
            built.preprocess([ILSA["text"]], [ILSA["subject"]]), 3, 1, built.settings.replace(lam=0.9)
        )
        bad = batcher.submit([Query("bad", None, [101, 10**6, 102], 1)], 3, 1, built.settings)  # no such token
        gated.release.set()
        answers = [f.result(timeout=60)[0] for f in (first, *rest)]
        assert [a.question for a in answers] == [q["text"] for q in QUESTIONS]
        assert other.result(timeout=60)[0].bert_knn != answers[0].bert_knn
        with pytest.raises(IndexError):
            bad.result(timeout=60)
        # the first job; then the two good jobs and the bad one together (that call fails, so each is retried
        # alone: 3 more calls); and the lam=0.5 job
        assert batcher.calls == 1 + 1 + 3 + 1
    finally:
        batcher.close()


def test_unbatched_worker_answers_one_at_a_time(built):
    batcher = MicroBatcher(built, threading.Lock(), max_batch=1)
    try:
        futures = [
            batcher.submit(built.preprocess([q["text"]], [q["subject"]]), 3, 1, built.settings) for q in QUESTIONS
        ]
        assert [f.result(timeout=60)[0].question for f in futures] == [q["text"] for q in QUESTIONS]
        assert batcher.calls == len(QUESTIONS)
    finally:
        batcher.close()


def test_added_document_answers_then_removal_forgets(writable_client):
    question = {"text": "Brannoc Vey was born in [MASK] .", "subject": "Brannoc Vey", "top_k": 3}
    before = writable_client.post("/predict", json=question).json()
    assert before["documents"] != ["Brannoc Vey"]
    doc = {"id": "n1", "title": "Brannoc Vey", "text": "Brannoc Vey was born in Oslo. He builds boats."}
    response = writable_client.post("/documents", json=doc)
    assert response.status_code == 201, response.text
    assert response.json()["contexts_added"] > 0 and response.json()["documents"] == 6
    after = writable_client.post("/predict", json=question).json()
    assert after["documents"] == ["Brannoc Vey"] and after["knn"][0]["token"] == "oslo"
    assert after["evidence"]["oslo"][0]["sentence"] == "Brannoc Vey was born in Oslo."
    assert writable_client.get("/health").json()["documents"] == 6

    assert writable_client.delete("/documents/n1").status_code == 200
    gone = writable_client.post("/predict", json=question).json()
    assert gone["documents"] != ["Brannoc Vey"] and "oslo" not in gone["evidence"]
    assert writable_client.get("/health").json()["documents"] == 5  # removed documents are not counted


def test_faiss_retrieval_option(built):
    with TestClient(create_app(built), base_url=BASE) as c:
        response = c.post("/predict", json={**ILSA, "options": {"retrieval": "faiss"}})
        assert response.status_code == 422 and "no FAISS index" in response.json()["detail"]
    index_keys(built.store, "Flat")
    knn = BertKNN(built.encoder, built.store)
    with TestClient(create_app(knn), base_url=BASE) as c:
        answer = c.post("/predict", json={**ILSA, "options": {"retrieval": "faiss", "k": 4}}).json()
    expected = knn.predict(ILSA["text"], ILSA["subject"], retrieval="faiss", k=4)
    assert answer["retrieval"] == "faiss" and answer["knn"] == [
        {"token": t.token, "probability": pytest.approx(t.probability), "id": t.id, "pieces": list(t.pieces)}
        for t in expected.knn
    ]


def test_document_errors_map_to_status_codes(writable_client):
    duplicate = {"id": "d1", "title": "Again", "text": "Again was born in Oslo."}
    assert writable_client.post("/documents", json=duplicate).status_code == 409
    assert writable_client.post("/documents", json={"id": "n2", "title": "T", "text": ""}).status_code == 422
    response = writable_client.delete("/documents/no-such-id")
    assert response.status_code == 404 and response.json()["detail"]


def test_fill_mask_format_on_request(client, built):
    response = client.post("/predict", json={**ILSA, "top_k": 3, "fill_mask": True})
    assert response.status_code == 200, response.text
    expected = built.predict(ILSA["text"], ILSA["subject"], top_k=3)
    for method in ("bert", "knn", "bert_knn"):
        got, want = response.json()["fill_mask"][method], expected.fill_mask(built.encoder.tokenizer, method)
        assert [(a["token"], a["token_str"], a["sequence"]) for a in got] == [
            (a["token"], a["token_str"], a["sequence"]) for a in want
        ]
        assert [a["score"] for a in got] == pytest.approx([a["score"] for a in want])
    assert "fill_mask" not in client.post("/predict", json=ILSA).json()


def test_a_document_added_with_aliases_is_linked_from_a_question_naming_it_by_one(writable_client):
    doc = {"id": "n1", "title": "Brannoc Vey", "text": "Brannoc Vey was born in Oslo.", "aliases": ["Bran the Boatman"]}
    assert writable_client.post("/documents", json=doc).status_code == 201
    answer = writable_client.post("/predict", json={"text": "Bran the Boatman was born in [MASK] ."}).json()
    assert answer["subject"] == "Brannoc Vey" and answer["documents"] == ["Brannoc Vey"]
    assert answer["linked"] == {"subject": "Brannoc Vey", "text": "Bran the Boatman", "span": [0, 16], "by": "alias"}
    off = writable_client.post(
        "/predict", json={"text": "Bran the Boatman was born in [MASK] .", "options": {"link": False}}
    )
    assert off.json()["linked"] is None and off.json()["subject"] is None
    bad = writable_client.post("/documents", json={**doc, "id": "n2", "aliases": "Bran"})
    assert bad.status_code == 422 and "aliases" in bad.text


OPENAPI_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "openapi.json"


def test_the_documented_openapi_schema_is_the_service_s(writable_client):
    """docs/reference/openapi.json (the docs site's service reference) equals the running service's schema; where it
    does not, the test writes the new schema there and fails, so the change is seen and committed."""
    schema = writable_client.get("/openapi.json").json()
    written = json.dumps(schema, indent=1, sort_keys=True) + "\n"
    if not OPENAPI_DOC.exists() or OPENAPI_DOC.read_text(encoding="utf-8") != written:
        OPENAPI_DOC.write_text(written, encoding="utf-8")
        pytest.fail(f"the service's OpenAPI schema changed: {OPENAPI_DOC} rewritten, commit it")
    assert {"/predict", "/predict/batch", "/documents", "/health"} <= set(schema["paths"])
