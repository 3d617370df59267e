"""The service and other writers: commits of another process are taken in, adds do not stall questions, a busy
datastore answers 503, never 500."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from bertknn import BertKNN
from bertknn.serving import service as svc
from bertknn.serving.service import create_app
from bertknn.store.datastore import Datastore
from bertknn.store.writer import DatastoreWriter
from bertknn.text import CorpusError, parse_document
from tests.conftest import held_elsewhere

from ..conftest import full_after

BASE = "http://localhost"
FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
ASK = {"text": "Zorblat Quenmire was born in [MASK] .", "subject": "Zorblat Quenmire", "top_k": 1}


@pytest.fixture()
def writable(built):
    with TestClient(create_app(built, writable=True), base_url=BASE) as client:
        yield client


def _knn_top(response) -> str | None:
    assert response.status_code == 200, response.text
    knn = response.json()["knn"]
    return knn[0]["token"] if knn else None


def test_another_process_commits_are_answered_and_writes_go_on(writable, built):
    assert _knn_top(writable.post("/predict", json=ASK)) != "tallinn"
    other = BertKNN.load(built.store.path, str(built.encoder.name))  # as `bertknn add` in another process
    other.add_documents([FRESH])
    assert _knn_top(writable.post("/predict", json=ASK)) == "tallinn"
    assert writable.get("/health").json()["documents"] == 6
    more = {"id": "n2", "title": "Ruxana Pell", "text": "Ruxana Pell was born in Riga."}
    assert writable.post("/documents", json=more).status_code == 201  # no clash with the other's document
    other.remove_documents(["n1"])
    body = writable.post("/predict", json=ASK).json()
    assert "Zorblat Quenmire" not in body["documents"]
    assert writable.delete("/documents/n2").status_code == 200
    assert other.refresh() and other.store.documents.states(["n2"]) == {}


def test_an_add_does_not_stall_questions(writable, monkeypatch):
    embedding, release = threading.Event(), threading.Event()
    real = DatastoreWriter.append

    def slow_chunk(self, *args, **kwargs):
        embedding.set()
        assert release.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DatastoreWriter, "append", slow_chunk)
    adding = threading.Thread(target=lambda: writable.post("/documents", json=FRESH))
    adding.start()
    try:
        assert embedding.wait(60)
        began = time.monotonic()
        assert _knn_top(writable.post("/predict", json=ASK)) != "tallinn"  # not published yet
        assert time.monotonic() - began < 10  # answered while the add is still embedding
    finally:
        release.set()
        adding.join(60)
    assert _knn_top(writable.post("/predict", json=ASK)) == "tallinn"


def test_a_write_while_another_process_writes_gets_503(writable, built, monkeypatch):
    monkeypatch.setattr(svc, "SERVICE_WAIT_S", 0.2)
    with held_elsewhere(built.store.path):
        response = writable.post("/documents", json=FRESH)
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert "one writer at a time" in response.json()["detail"]
        assert writable.delete("/documents/d1").status_code == 503
        assert writable.post("/predict", json=ASK).status_code == 200  # questions are not blocked by a writer
    assert writable.post("/documents", json=FRESH).status_code == 201


def test_concurrent_adds_through_the_service_all_land(writable):
    docs = [{"id": f"c{i}", "title": f"Person {i}", "text": f"Person {i} was born in Riga."} for i in range(4)]
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda d=d: codes.append(writable.post("/documents", json=d).status_code)) for d in docs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(codes) == [201] * 4
    assert writable.get("/health").json()["documents"] == 9


def test_posting_the_same_document_again_is_not_a_conflict(writable):
    first = writable.post("/documents", json=FRESH)
    assert first.status_code == 201 and first.json()["already_there"] is False and first.json()["contexts_added"] > 0
    again = writable.post("/documents", json=FRESH)  # a client retrying after a timeout
    assert again.status_code == 200
    assert again.json() == {
        "id": "n1",
        "contexts_added": 0,
        "already_there": True,
        "message": "document 'n1' was there already (same id and text): nothing was added",
        "documents": 6,
        "contexts": first.json()["contexts"],
    }
    other = writable.post("/documents", json={**FRESH, "text": "Zorblat Quenmire sells cars."})
    assert other.status_code == 409 and "with other text" in other.json()["detail"]
    assert writable.get("/health").json()["documents"] == 6


def test_a_document_without_target_words_is_added_with_no_contexts(writable):
    """Found by fuzzing: text whose words are all symbols or several wordpieces appended an empty array (a 500)."""
    before = writable.get("/health").json()["contexts"]
    added = writable.post("/documents", json={"id": "s1", "title": "6\U000647e7", "text": '1\U0006e59e "#'})
    assert added.status_code == 201, added.text
    assert added.json()["contexts_added"] == 0 and added.json()["contexts"] == before
    assert writable.delete("/documents/s1").status_code == 200


@pytest.mark.parametrize("doc_id", [True, False, None, 1.5, 1.0, [], ["n1"], {"id": "n1"}, "", 2**64, "a\x1bb"])
def test_an_id_the_corpus_reader_refuses_is_refused_alike(writable, doc_id):
    doc = {**FRESH, "id": doc_id}
    with pytest.raises(CorpusError) as refused:
        parse_document(doc, "the document")
    response = writable.post("/documents", json=doc)
    assert response.status_code == 422
    assert [e["msg"] for e in response.json()["detail"]] == [f"Value error, {refused.value}"]
    assert writable.get("/health").json()["documents"] == 5


def test_an_integer_id_is_stored_as_the_corpus_reader_stores_it(writable):
    response = writable.post("/documents", json={**FRESH, "id": 2**63})
    assert response.status_code == 201 and response.json()["id"] == str(2**63)
    assert writable.delete(f"/documents/{2**63}").status_code == 200


def test_error_details_name_no_server_path(writable, built, monkeypatch):
    server = str(built.store.path.parent)  # the store's name may be shown, where it lies not
    monkeypatch.setattr(svc, "SERVICE_WAIT_S", 0.2)
    with held_elsewhere(built.store.path):  # another process's writer, before the service's first write opened one
        busy = writable.delete("/documents/d1")
    assert busy.status_code == 503 and busy.json()["detail"].startswith("store is being written by")
    missing = writable.delete("/documents/no-such-id")
    assert missing.status_code == 404
    assert "no document with id 'no-such-id' in store" in missing.json()["detail"]
    conflict = writable.post("/documents", json={**FRESH, "id": "d1"})
    assert conflict.status_code == 409 and "are in store with other text" in conflict.json()["detail"]
    assert not [r.text for r in (missing, conflict, busy) if server in r.text]


@pytest.mark.parametrize("up", [0, 1, 2])
def test_a_relative_datastore_path_is_shown_by_its_name(built, monkeypatch, up):
    here = [built.store.path, built.store.path.parent, built.store.path.parent.parent][up]
    given = [".", "./store", f"{built.store.path.parent.name}/store"][up]
    monkeypatch.chdir(here)
    knn = BertKNN(built.encoder, Datastore(given))
    with TestClient(create_app(knn, writable=True), base_url=BASE) as client:
        health = client.get("/health")
        missing = client.delete("/documents/no-such-id")
    assert health.json()["datastore"] == "store"
    assert missing.status_code == 404 and "in store;" in missing.json()["detail"]
    assert not [r.text for r in (health, missing) if built.store.path.parent.name in r.text]


def test_a_full_disk_answers_507_naming_the_file_and_a_retry_adds(writable, built, monkeypatch):
    monkeypatch.setattr(svc, "SERVICE_WAIT_S", 1.0)
    full_after(monkeypatch, 100, lambda path: path.name.endswith(".tmp"))  # no file written whole fits
    full = writable.post("/documents", json=FRESH)
    detail = full.json()["detail"]
    assert full.status_code == 507 and detail.startswith("no space left for store/"), detail
    assert "the write needs" in detail and str(built.store.path.parent) not in full.text
    monkeypatch.undo()
    again = writable.post("/documents", json=FRESH)
    assert again.status_code == 201 and again.json()["contexts_added"] > 0
    assert _knn_top(writable.post("/predict", json=ASK)) == "tallinn"
