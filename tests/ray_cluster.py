"""What the Ray tests (tests/build/test_distributed.py, tests/serving/test_ray_serve.py) share: the town documents
they build on, and two module-scoped fixtures that each of those files takes in with
`cluster, built = ray_cluster.cluster, ray_cluster.built`, so that each file starts (and shuts down) its own local
cluster of 2 CPUs and makes its own build, whichever files a pytest worker runs."""

from __future__ import annotations

import pytest

from .conftest import write_corpus

ray = pytest.importorskip("ray")

from bertknn.build import distributed  # noqa: E402
from bertknn.query.pipeline import BertKNN  # noqa: E402

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
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
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
