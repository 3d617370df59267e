"""The service over a sharded datastore: every endpoint answers as over one datastore (no 5xx), and its counts
follow the adds and removes made through it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bertknn import BertKNN
from bertknn.serving.service import create_app
from bertknn.store import datastore
from bertknn.store.records import Staged
from bertknn.store.shards import ShardedDatastore

from ..conftest import SMALL_DOCS, writable
from ..sharded_store import make_sharded, reader_counts, true_counts
from ..tolerances import assert_ranking_close

BASE = "http://localhost"
ILSA = {"text": "Ilsa Varnhold was born in [MASK] .", "subject": "Ilsa Varnhold"}
PARIS = {"text": "Paris is the capital of [MASK] .", "subject": "Paris"}
FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}


@pytest.fixture()
def sharded(tmp_path, encoder) -> BertKNN:
    """The small corpus in two shards: d1-d3, then d4-d5."""
    path = make_sharded(tmp_path / "sharded", encoder, [SMALL_DOCS[:3], SMALL_DOCS[3:]])
    return writable(encoder, ShardedDatastore(path))


@pytest.fixture()
def client(sharded):
    with TestClient(create_app(sharded, writable=True), base_url=BASE) as c:
        yield c


def _tokens(ranking: list[dict]) -> list[str]:
    return [t["token"] for t in ranking]


def test_every_endpoint_answers_on_a_sharded_store(client, sharded):
    answered = []

    def call(method: str, url: str, **kwargs):
        response = client.request(method, url, **kwargs)
        answered.append((method, url, response.status_code, response.text[:200]))
        return response

    health = call("GET", "/health").json()
    assert (
        health["status"] == "ok"
        and health["datastore"] == "sharded"
        and health["layer"] == sharded.store.manifest.layer
    )
    assert health["documents"] == 5 and health["contexts"] == sharded.store.size > 0 and health["writable"] is True
    answer = call("POST", "/predict", json={**ILSA, "top_k": 3})
    assert answer.status_code == 200 and answer.json()["documents"] == ["Ilsa Varnhold"]
    served = [(t["token"], t["probability"]) for t in answer.json()["bert_knn"]]  # maybe batched with others there
    assert_ranking_close(served, [(t.token, t.probability) for t in sharded.predict(**ILSA, top_k=3).bert_knn])
    batch = call("POST", "/predict/batch", json={"questions": [ILSA, PARIS], "top_k": 3})  # one question per shard
    assert batch.status_code == 200
    assert [p["documents"] for p in batch.json()["predictions"]] == [["Ilsa Varnhold"], ["Paris"]]
    faiss = call("POST", "/predict", json={**ILSA, "options": {"retrieval": "faiss"}})
    assert faiss.status_code == 422 and "no FAISS index" in faiss.json()["detail"]
    page = call("GET", "/")
    assert page.status_code == 200 and 'id="ask-form"' in page.text
    assert call("GET", "/static/app.js").status_code == 200
    docs = call("GET", "/docs")
    assert docs.status_code == 200 and "swagger-ui" in docs.text
    assert "/documents" in call("GET", "/openapi.json").json()["paths"]
    assert call("GET", "/examples").status_code == 200

    added = call("POST", "/documents", json=FRESH)
    assert added.status_code == 201 and added.json()["contexts_added"] > 0 and added.json()["documents"] == 6
    again = call("POST", "/documents", json=FRESH)
    assert again.status_code == 200 and again.json()["already_there"] is True and again.json()["documents"] == 6
    assert call("POST", "/documents", json={**FRESH, "text": "Zorblat Quenmire sells cars."}).status_code == 409
    assert call("POST", "/documents", json={**SMALL_DOCS[0], "text": "Ilsa sings."}).status_code == 409
    first_shard = call("POST", "/documents", json=SMALL_DOCS[0])  # unchanged, in the shard before the last
    assert first_shard.status_code == 200 and first_shard.json()["already_there"] is True
    new = call(
        "POST", "/predict", json={"text": "Zorblat Quenmire was born in [MASK] .", "subject": "Zorblat Quenmire"}
    )
    assert new.json()["documents"] == ["Zorblat Quenmire"]
    assert call("DELETE", "/documents/n1").status_code == 200
    assert call("DELETE", "/documents/d4").status_code == 200  # a document of the other shard
    gone = call("DELETE", "/documents/d4")
    assert gone.status_code == 404 and gone.json()["detail"] == "document 'd4' was removed before from sharded"
    assert call("GET", "/health").json()["documents"] == 4
    assert call("POST", "/predict", json={**PARIS, "top_k": 3}).json()["documents"] != ["Paris"]
    assert all(code < 500 for *_, code, _ in answered), [a for a in answered if a[2] >= 500]


def test_counts_follow_adds_and_removes(client, sharded):
    path = sharded.store.path
    assert client.post("/documents", json=FRESH).status_code == 201
    assert client.delete("/documents/d1").status_code == 200  # a document of the first shard
    after = reader_counts(ShardedDatastore(path))
    assert after == true_counts(ShardedDatastore(path))
    assert after[:3] == (6, sharded.store.size, 5) and after[3][1][2] == 3  # d1 is hidden, not renumbered
    assert client.get("/health").json()["documents"] == 5
    sharded.remove_documents(["d2"])  # the library's (and `bertknn remove`'s) path
    sharded.add_documents([{"id": "n2", "title": "Ruxana Pell", "text": "Ruxana Pell was born in Riga."}])
    assert reader_counts(ShardedDatastore(path)) == true_counts(ShardedDatastore(path))
    assert ShardedDatastore(path).manifest["live_documents"] == 5


def test_adding_other_text_under_an_id_of_an_earlier_shard_is_refused(sharded):
    """As one datastore refuses a live id given other text, so does a sharded one whose id lies in an earlier shard
    (adds go to the last): `skip_existing` (what `bertknn add` uses) skips only the same document."""
    size = sharded.store.size
    assert sharded.add_documents([SMALL_DOCS[0]], skip_existing=True) == 0
    assert sharded.writer.staged == Staged(unchanged=("d1",))  # the same document, in an earlier shard: skipped
    with pytest.raises(datastore.DatastoreError, match=r"\['d1'\] are in .* with other text; remove them first"):
        sharded.add_documents([{**SMALL_DOCS[0], "text": "Ilsa Varnhold sings."}], skip_existing=True)
    assert sharded.store.size == size and sharded.store.documents.states(["d1"]) == {"d1": "live"}
