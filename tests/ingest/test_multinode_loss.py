"""A worker node lost mid-build and one lost while serving, each on a simulated cluster of its own
(`ray.cluster_utils.Cluster`: a head without CPUs, two worker nodes, each its own raylet and object store), made and
torn down by its test: the build completes on the node left, or a rerun does, and nothing is lost; the service answers
clean 503s until the lost shards are back, then answers as before. In the slower group (marked smoke) that CI runs
after the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from bertknn.ingest import distributed  # noqa: E402
from bertknn.model.runtime import Runtime  # noqa: E402
from bertknn.serving import ray_serve  # noqa: E402
from bertknn.store.datastore import read_committed  # noqa: E402
from bertknn.store.shards import ShardedDatastore  # noqa: E402
from tests.conftest import index_keys  # noqa: E402

from .. import ray_cluster  # noqa: E402
from ..ray_cluster import (  # noqa: E402
    DEMO,
    NODE_CPUS,
    ask,
    free_port,
    nodes_cluster,
    same_entries,
    state_address,
    teardown,
)
from ..tolerances import assert_ranking_close  # noqa: E402

pytestmark = pytest.mark.nodes
single = ray_cluster.single  # module-scoped: the demo corpus built in one process

WAIT_S = 240


def _complete_shards(out: Path) -> int:
    done = 0
    for manifest in (out / "shards").glob("shard-*/manifest.json"):
        try:  # the status is committed to the shard's SQLite (`read_committed`)
            done += read_committed(manifest.parent).complete
        except (OSError, ValueError):
            continue
    return done


@pytest.mark.smoke  # two minutes of a cluster of its own: in the slower group CI runs after the suite
def test_a_worker_node_lost_mid_build_loses_nothing(single, tmp_path, tiny_model_dir):
    """A worker node removed (its raylet and workers killed) once a shard is complete: the build finishes on the
    node left, or, where it cannot, a rerun does; the shards equal the single build's and verify finds them sound."""
    cluster, workers = nodes_cluster(dashboard=False)
    try:
        out = tmp_path / "sharded"
        command = [
            str(Path(sys.executable).with_name("bertknn")),
            *("build", str(DEMO), "--out", str(out), "--model", str(tiny_model_dir), "--engine", "ray"),
            *("--address", cluster.address, "--workers", "2", "--shard-docs", "3"),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + WAIT_S
        while _complete_shards(out) < 1 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, f"the build ended before a node could be lost:\n{first.stdout.read()[-3000:]}"
        lost_at = _complete_shards(out)
        cluster.remove_node(workers[1], allow_graceful=False)
        try:
            first.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        output = first.stdout.read()
        print(f"node lost with {lost_at} of 15 shards complete; the build then exited {first.returncode}")
        if first.returncode != 0:  # the lost node's work did not come back on its own: a rerun finishes the build
            rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=WAIT_S, check=False)
            assert rerun.returncode == 0, f"{output[-3000:]}\n--- rerun\n{rerun.stdout[-3000:]}{rerun.stderr[-3000:]}"
        assert 1 <= lost_at < 15 and _complete_shards(out) == 15
        same_entries(out, single)
        checked = subprocess.run([command[0], "verify", str(out)], env=env, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        teardown(cluster)


LIMIT_S = 5  # the service's time limit per question (request_timeout_s), which the shard calls share
QUESTION = ("Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold", "faiss")  # FAISS: every shard is asked


def _replicas() -> dict[str, list[str]]:
    """The node ids of the live replicas of each deployment of the service, from Ray's state API."""
    from ray.util.state import list_actors

    placed: dict[str, list[str]] = {}
    for actor in list_actors(address=state_address(), filters=[("state", "=", "ALIVE")], limit=10_000, detail=True):
        if actor.class_name.startswith(f"ServeReplica:{ray_serve.APP_NAME}:"):
            placed.setdefault(actor.class_name.rsplit(":", 1)[1], []).append(actor.node_id)
    return placed


def _until(check, wait_s: float, what: str):
    """`check()`'s first true result, asked every second for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {wait_s} s"
        time.sleep(1)
    return found


def _asking(port: int, log: list, stop: threading.Event) -> None:
    """Ask QUESTION again and again until `stop`: (start, seconds taken, status or the connection error, headers,
    body) each time."""
    while not stop.is_set():
        start = time.monotonic()
        try:
            status, headers, body = ask(port, *QUESTION, timeout=LIMIT_S + 30)
        except OSError as err:
            status, headers, body = type(err).__name__, {}, {}
        log.append((start, time.monotonic() - start, status, headers, body))
        time.sleep(0.2)


def _ranked(answer: dict) -> list[tuple]:
    return [(t["token"], t["probability"]) for t in answer["bert_knn"][:5]]


@pytest.mark.smoke  # two minutes of a cluster of its own: in the slower group CI runs after the suite
def test_a_worker_node_lost_while_serving_answers_503_until_its_shards_are_back(tmp_path, tiny_model_dir):
    """The service on two worker nodes: the ingress (1 CPU) and 4 shard replicas of half a CPU, 3 of their 4 CPUs.
    The node without the ingress is lost: of its shards, those that fit come back on the node left (Serve's replica
    recovery) and the others wait for room; meanwhile every question gets an answer or a 503 with Retry-After within
    the time limit, never a hang or a 500. A node added gives them room: the questions are answered as before.
    The questions go through Serve's HTTP proxy on the head node (`proxy_location="HeadOnly"`), which is not lost:
    here every node's proxy would listen on the one address, and a question taken by the lost node's proxy loses its
    connection when that process dies, some seconds after the node (as a lost machine cuts its own connections)."""
    from ray import serve

    cluster, workers = nodes_cluster(dashboard=True)
    log, stop = [], threading.Event()
    client = None
    try:
        out = tmp_path / "sharded"
        distributed.build(DEMO, out, str(tiny_model_dir), workers=2, shard_docs=11)
        index_keys(ShardedDatastore(out), "Flat")
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        ray_serve.run(str(out), "127.0.0.1", port, Runtime(threads=1), blocking=False, request_timeout_s=LIMIT_S)
        status, _, before = ask(port, *QUESTION)
        assert status == 200, before
        placed = _replicas()
        (kept,) = placed["Ingress"]
        lost = next(node for node in workers if node.node_id != kept)
        shards = sorted(name for name in placed if name != "Ingress")
        # the ingress's node has room for 2 shards at most: the other node holds 2 or more
        assert len(shards) == 4 and sum(lost.node_id in placed[name] for name in shards) >= 2

        client = threading.Thread(target=_asking, args=(port, log, stop))
        client.start()
        time.sleep(1)
        cluster.remove_node(lost, allow_graceful=False)
        lost_at = time.monotonic()

        # once Ray has seen the node go, the node left fills up (the ingress and 2 shards) and the other 2 shards
        # wait for room: every question needs them
        def settled() -> bool:
            placed = _replicas()
            gone = not any(lost.node_id in nodes for nodes in placed.values())
            return gone and sum(placed.get(name) == [kept] for name in shards) == 2

        _until(settled, 90, "the lost node's replicas gone, 2 shards on the node left")
        status, headers, body = ask(port, *QUESTION, timeout=LIMIT_S + 30)
        assert status == 503 and headers["retry-after"] == "5", (headers, body)

        added = cluster.add_node(num_cpus=NODE_CPUS)
        _until(lambda: ask(port, *QUESTION, timeout=LIMIT_S + 30)[0] == 200, 120, "answered after a node was added")
        status, _, after = ask(port, *QUESTION)
        assert status == 200 and after["documents"] == before["documents"], after
        assert_ranking_close(_ranked(after), _ranked(before))  # replicas batch otherwise: the model's tolerance
        assert after["evidence"] == before["evidence"]
        placed = _replicas()
        assert all(len(placed[name]) == 1 for name in shards) and placed["Ingress"] == [kept]
        assert sorted(placed[name][0] for name in shards) == sorted([kept, kept, added.node_id, added.node_id])
    finally:
        stop.set()
        if client is not None:
            client.join()
        serve.shutdown()
        teardown(cluster)
    statuses = [status for _, _, status, _, _ in log]
    print(f"{len(log)} questions while the node was lost and came back:", {s: statuses.count(s) for s in set(statuses)})
    assert 503 in statuses and statuses[-1] == 200
    for start, took, status, headers, body in log:
        when = f"asked {start - lost_at:+.1f} s from the loss, answered {status} after {took:.1f} s"
        assert status in (200, 503) and took < LIMIT_S + 10, when  # no hang, no 500, no connection lost
        if status == 503:
            assert headers["retry-after"] == "5" and ("shard" in body["detail"] or "time limit" in body["detail"])
