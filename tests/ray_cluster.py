"""What the Ray tests (tests/ingest/test_distributed.py, tests/serving/test_ray_serve.py) share: the town documents
they build on, and two module-scoped fixtures that each of those files takes in with
`cluster, built = ray_cluster.cluster, ray_cluster.built`, so that each file starts (and shuts down) its own local
cluster of 2 CPUs and makes its own build, whichever files a pytest worker runs. Below them, what the simulated clusters
of several nodes share (tests/ingest/test_multinode.py, test_multinode_loss.py)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from .conftest import write_corpus

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

import bertknn  # noqa: E402
from bertknn.ingest import distributed  # noqa: E402
from bertknn.query.pipeline import BertKNN  # noqa: E402
from bertknn.store.shards import ShardedDatastore  # noqa: E402

DEMO = Path(bertknn.__file__).parent / "data" / "demo_corpus.jsonl"
NODE_CPUS = 2  # each simulated worker node's; the head has none, so no task or actor runs beside the driver

CITIES = ["Oslo", "Riga", "Lisbon", "Porto", "Tallinn", "Vienna", "Bergen"]


def towns(n: int, sentences: int = 3) -> list[dict]:
    return [
        {
            "id": f"t{i}",
            "title": f"Town {i}",
            "text": " ".join(
                [f"Town {i} lies near {CITIES[i % len(CITIES)]}."]
                + [f"In {1000 + i + j} the people of Town {i} built a bridge over river {j}." for j in range(sentences)]
            ),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of this file's own: `address="local"` starts one even where another is recorded as the latest
    (/tmp/ray/ray_current_cluster, written by `ray start` and by the multi-node tests' clusters, which CI runs beside
    this one), which a bare `ray.init()` would connect to."""
    ray.init(address="local", num_cpus=2, log_to_driver=False, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def built(cluster, tmp_path_factory, tiny_model_dir):
    """The same 50 documents built on Ray (4 shards of up to 15) and in one process."""
    path = tmp_path_factory.mktemp("ray")
    corpus = write_corpus(path / "towns.jsonl", towns(50))
    top = distributed.build(corpus, path / "sharded", str(tiny_model_dir), workers=2, shard_docs=15)
    single = BertKNN.build(corpus, path / "single", str(tiny_model_dir))
    return path, top, single


# --- several nodes on one machine (tests/ingest/test_multinode*.py) ---


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nodes_cluster(dashboard: bool) -> tuple[Cluster, list]:
    """The head (its dashboard, which the state API asks, on a free port when wanted) and two worker nodes."""
    head = {"num_cpus": 0, "include_dashboard": dashboard} | ({"dashboard_port": free_port()} if dashboard else {})
    cluster = Cluster(initialize_head=True, head_node_args=head)
    workers = [cluster.add_node(num_cpus=NODE_CPUS) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster, workers


def ask(port: int, question: str, subject: str | None, retrieval: str, timeout: float = 60) -> tuple[int, dict, dict]:
    """POST /predict to the service at `port` (3 evidence sentences): the status, headers (names in lower case) and
    JSON body, an HTTP error's too."""
    body = {"text": question, "subject": subject, "evidence": 3, "options": {"retrieval": retrieval}}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.loads(err.read())


def state_address() -> str:
    """The address of the cluster this process is connected to, for Ray's state API: without it the API asks the
    cluster started last on this machine, which may be another test's (CI runs tests in two processes at once)."""
    return ray.get_runtime_context().gcs_address


def teardown(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_model_dir):
    """The demo corpus built in one process: what the cluster's builds must equal."""
    return BertKNN.build(DEMO, tmp_path_factory.mktemp("single") / "store", str(tiny_model_dir))


def same_entries(sharded_dir: Path, single: BertKNN) -> None:
    """The sharded datastore holds exactly the single build's entries (keys up to float32 batching noise)."""
    sharded, every = ShardedDatastore(sharded_dir), np.arange(single.store.size)
    assert sharded.size == single.store.size and sharded.n_documents == single.store.n_documents
    np.testing.assert_array_equal(sharded.values[every], np.asarray(single.store.values))
    np.testing.assert_allclose(sharded.keys[every], np.asarray(single.store.keys), atol=2e-3)
    assert sharded.documents.provenance(every.tolist()) == single.store.documents.provenance(every.tolist())
