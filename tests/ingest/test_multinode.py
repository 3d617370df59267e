"""Ray across nodes, simulated on one machine: `ray.cluster_utils.Cluster` starts a head node without CPUs (the
driver's) and two worker nodes, each its own raylet and object store, so that work is placed on other nodes, objects
travel between object stores and a node can be lost. The demo corpus is built, indexed and served on Ray there and
compared with a single process's build; Ray's state API says where each task and actor ran. Each cluster is made and
torn down by its own fixture (`Cluster.shutdown`: only the processes it started). Two minutes of a cluster of its own:
in the slower group (marked smoke) that CI runs after the suite."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from bertknn.ingest import distributed  # noqa: E402
from bertknn.store.shards import ShardedDatastore  # noqa: E402
from tests.conftest import index_keys  # noqa: E402

from .. import ray_cluster  # noqa: E402
from ..ray_cluster import DEMO, ask, free_port, nodes_cluster, same_entries, state_address, teardown  # noqa: E402
from ..tolerances import assert_ranking_close  # noqa: E402

pytestmark = [pytest.mark.smoke, pytest.mark.nodes]
single = ray_cluster.single  # module-scoped: the demo corpus built in one process


@pytest.fixture(scope="module")
def nodes():
    """A head without CPUs and two worker nodes of NODE_CPUS CPUs, this process its driver."""
    cluster, workers = nodes_cluster(dashboard=True)
    yield cluster, workers
    teardown(cluster)


def _where(kind: str, name: str, at_least: int = 1, wait_s: float = 30) -> list[str]:
    """The node ids where tasks (kind "task") or actors ("actor") whose name contains `name` ran, from Ray's state
    API; task events reach it a little after the task ends, so it is asked until `at_least` are there."""
    from ray.util.state import list_actors, list_tasks

    deadline, where = time.monotonic() + wait_s, {"address": state_address(), "limit": 10_000, "detail": True}
    while True:
        if kind == "task":
            found = [t.node_id for t in list_tasks(**where) if name in t.name and t.node_id]
        else:
            found = [a.node_id for a in list_actors(**where) if name in a.class_name and a.node_id]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(1)


def test_a_build_index_and_service_on_two_nodes_equal_one_process(nodes, single, tmp_path, tiny_model_dir):
    from ray import serve

    from bertknn.model.runtime import Runtime
    from bertknn.serving import ray_serve

    _, workers = nodes
    worker_ids = {node.node_id for node in workers}
    out = tmp_path / "sharded"
    top = distributed.build(DEMO, out, str(tiny_model_dir), workers=2, shard_docs=11)
    assert [s["documents"] for s in top["shards"]] == [11, 11, 11, 10]
    same_entries(out, single)
    # the output directory was checked from both nodes (a task pinned to each); the build's and the FAISS fill's work
    # ran on worker nodes, on both or on one as Ray placed it: Ray Data can leave its second key-stage actor pending
    # while the CPU-stage tasks hold the CPUs, and Ray can run the 4 short fill tasks on one node; the Serve replicas
    # below need both nodes' CPUs
    assert set(_where("task", "_sees", 2)) == worker_ids
    key_nodes = set(_where("actor", "KeyStage", 1))
    assert key_nodes and key_nodes <= worker_ids
    assert set(_where("task", "_register", 4)) <= worker_ids

    store = ShardedDatastore(out)
    index_keys(store, "Flat", on_ray=True)
    fill_nodes = set(_where("task", "_fill_shard", 4))
    assert fill_nodes and fill_nodes <= worker_ids
    port = free_port()
    ray_serve.run(str(out), "127.0.0.1", port, Runtime(threads=1), replicas=1, blocking=False)
    try:
        # the ingress (1 CPU) and 4 shards (0.5 CPU each) fit in neither node's 2 CPUs alone: both nodes serve
        assert set(_where("actor", "ServeReplica", 5)) == worker_ids
        local = single
        for question, subject in [
            ("Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold"),
            ("Quellbrook is a town in [MASK] .", None),
            ("Korvane Industries was founded in [MASK] .", None),
        ]:
            for retrieval in ("ir", "faiss"):
                if retrieval == "faiss" and local.faiss is None:
                    from bertknn.ingest.ingester import Writer

                    Writer(local.store, local.encoder).index_keys("Flat")
                    local.refresh()
                status, _, remote = ask(port, question, subject, retrieval)
                assert status == 200, remote
                here = local.predict(question, subject=subject, retrieval=retrieval, top_k=5)
                assert remote["documents"] == here.documents and remote["knn"], (question, retrieval)
                for ranking in ("knn", "bert_knn"):  # the question batched otherwise there: the model's tolerance
                    expected = [(t.token, t.probability) for t in getattr(here, ranking)]
                    assert_ranking_close([(t["token"], t["probability"]) for t in remote[ranking][:5]], expected)
                top_word = here.knn[0].token
                assert [e["sentence"] for e in remote["evidence"][top_word]] == [
                    n.sentence for n in here.evidence[top_word][:3]
                ]
    finally:
        serve.shutdown()


def test_an_output_directory_a_node_cannot_read_is_refused_before_anything_is_written(
    nodes, tmp_path, tiny_model_dir, monkeypatch
):
    """The driver's check file lands where the workers do not look (as on a directory that is not shared): the
    build stops at once, naming the directory and the nodes, with no shard input or shard written."""
    real, elsewhere = distributed.atomic.write_text, tmp_path / "driver-only"
    elsewhere.mkdir()
    monkeypatch.setattr(distributed.atomic, "write_text", lambda path, text: real(elsewhere / Path(path).name, text))
    out = tmp_path / "sharded"
    with pytest.raises(ValueError, match=f"cannot read the output directory {out}: it must be on storage every node"):
        distributed.build(DEMO, out, str(tiny_model_dir), workers=2, shard_docs=11)
    assert not (out / "inputs").exists() and not (out / "shards").exists()
