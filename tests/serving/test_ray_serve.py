"""The sharded datastore served on Ray Serve (src/bertknn/serving/ray_serve.py; a real local cluster, 2 CPUs): answers
equal one process searching every shard, IR questions asked only of the shards owning their documents, health,
refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from bertknn.query.pipeline import BertKNN  # noqa: E402
from tests.conftest import index_keys  # noqa: E402

from .. import ray_cluster  # noqa: E402
from ..tolerances import assert_ranking_close  # noqa: E402

cluster, built = ray_cluster.cluster, ray_cluster.built  # module-scoped: this file's Ray cluster and its build


@pytest.fixture(scope="module")
def served(built):
    """The sharded datastore (with a FAISS index per shard) on Ray Serve: 2 replicas per shard, on a free port."""
    import socket
    import urllib.request

    from ray import serve

    from bertknn.index.faiss_index import ShardedFaiss
    from bertknn.model.runtime import Runtime
    from bertknn.serving import ray_serve

    path, _, _ = built
    local = BertKNN.load(path / "sharded")
    if not isinstance(local.faiss, ShardedFaiss):  # no FAISS index yet: make one here
        index_keys(local.store, "Flat")
        local.refresh()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    runtime = Runtime(threads=1)
    ray_serve.run(str(path / "sharded"), "127.0.0.1", port, runtime, replicas=2, blocking=False)

    def ask(question: str, subject: str | None, retrieval: str) -> dict:
        body = {"text": question, "subject": subject, "options": {"retrieval": retrieval}}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/predict", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    yield BertKNN.load(path / "sharded"), ask, port
    serve.shutdown()


QUESTIONS = [
    ("Town 12 lies near [MASK] .", "Town 12"),
    ("Town 47 lies near [MASK] .", None),
    ("The people of Town 31 built a [MASK] .", None),
]


@pytest.mark.parametrize("retrieval", ["ir", "faiss", "ir+faiss"])
def test_ray_serve_answers_equal_one_process_searching_every_shard(served, retrieval):
    local, ask, _ = served
    for question, subject in QUESTIONS:
        remote, here = ask(question, subject, retrieval), local.predict(question, subject=subject, retrieval=retrieval)
        assert remote["documents"] == here.documents and remote["knn"]
        for ranking in ("knn", "bert_knn"):  # the question batched otherwise there: the model's tolerance
            expected = [(t.token, t.probability) for t in getattr(here, ranking)]
            assert_ranking_close([(t["token"], t["probability"]) for t in remote[ranking]], expected)


def test_an_ir_question_is_searched_only_by_the_shards_owning_its_documents(served):
    from ray import serve

    from bertknn.serving.ray_serve import APP_NAME, ServedShards, shard_deployment

    local, _, _ = served
    routed = BertKNN.load(local.store.path)
    handles = [serve.get_deployment_handle(shard_deployment(i), app_name=APP_NAME) for i in range(4)]
    routed.serve_shards_on(ServedShards(routed.store, handles))
    assert routed.faiss.ntotal == local.store.size
    for question, subject in [*QUESTIONS, ("Town 40 lies near [MASK] .", "Town 40")]:
        docs = local.search().documents(question, subject, local.settings.n_docs)
        owners = np.bincount(np.searchsorted(local.store.doc_starts, docs, side="right") - 1, minlength=4)
        before = list(routed.remote_shards.asked)
        a, b = routed.predict(question, subject=subject), local.predict(question, subject=subject)
        assert a.documents == b.documents  # the shards' replicas search in other batches: the model's tolerance
        assert_ranking_close([(t.token, t.probability) for t in a.knn], [(t.token, t.probability) for t in b.knn])
        assert [n - m for n, m in zip(routed.remote_shards.asked, before)] == (owners > 0).tolist()
    assert routed.remote_shards.asked[1] == 0 < routed.remote_shards.asked[2]  # Town 40's document is in shard 2


def test_shards_that_do_not_answer_in_time_give_a_clean_503(served):
    """Shard calls given no time at all (as when a node is lost and its replicas are not back): the search raises
    ShardUnavailable naming the shard, the service answers 503 with Retry-After, and the batch is not retried
    question by question."""
    from fastapi.testclient import TestClient
    from ray import serve

    from bertknn.query.search import ShardUnavailable
    from bertknn.serving.ray_serve import APP_NAME, ServedShards, shard_deployment
    from bertknn.serving.service import create_app

    local, _, _ = served
    routed = BertKNN.load(local.store.path)
    handles = [serve.get_deployment_handle(shard_deployment(i), app_name=APP_NAME) for i in range(4)]
    routed.serve_shards_on(ServedShards(routed.store, handles))  # the FAISS index's size is asked with time to answer
    routed.remote_shards.wait_s = 0.0
    with pytest.raises(ShardUnavailable, match=r"^shard 0 of the datastore gave no answer within 0 s .* try again"):
        routed.predict(*QUESTIONS[0], retrieval="faiss")
    with TestClient(create_app(routed), base_url="http://localhost") as client:
        batch = {"questions": [{"text": q, "subject": s} for q, s in QUESTIONS], "options": {"retrieval": "faiss"}}
        response = client.post("/predict/batch", json=batch)
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert response.json()["detail"].startswith("shard 0 of the datastore gave no answer within 0 s")
        assert client.app.state.batcher.calls == 1


def test_ray_serve_health_counts_every_shard(served):
    import urllib.request

    local, _, port = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60) as response:
        health = json.loads(response.read())
    local.refresh()
    assert health["documents"] == local.store.documents.count_live() and health["contexts"] == local.store.size > 0
    assert health["datastore"] == "sharded"


def test_ray_serve_refuses_more_shard_replicas_than_the_cluster_has_cpus_for(built):
    from bertknn.model.runtime import Runtime
    from bertknn.serving import ray_serve

    with pytest.raises(ValueError, match="too few CPUs for the ingress \\(1\\) and 400 shard replicas: use fewer"):
        ray_serve.run(str(built[0] / "sharded"), "127.0.0.1", 1, Runtime(threads=1), replicas=100, blocking=False)
