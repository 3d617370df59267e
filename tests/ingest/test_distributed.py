"""The datastore built on Ray (src/bertknn/ingest/distributed.py; a real local cluster, 2 CPUs): shards equal to a
single-process build, the sharded datastore read as one (IR scores, predictions, add, remove), a key-stage worker
killed mid-shard, a driver killed mid-build, FAISS filled on Ray, refusals. The three tests that make builds of their
own are in the slower group (marked smoke) that CI runs after the suite."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ..conftest import write_corpus
from ..tolerances import FLOAT16_KEYS_RTOL, assert_neighbours_close, assert_ranking_close

ray = pytest.importorskip("ray")

from bertknn.index.retrieval import TfidfIndex  # noqa: E402
from bertknn.ingest import distributed  # noqa: E402
from bertknn.query.pipeline import BertKNN  # noqa: E402
from bertknn.store import evidence  # noqa: E402
from bertknn.store.datastore import DatastoreError, read_committed  # noqa: E402
from bertknn.store.manifest import Manifest  # noqa: E402
from bertknn.store.shards import SHARDS_FILE, ShardedDatastore  # noqa: E402
from tests.conftest import index_keys  # noqa: E402

from .. import ray_cluster  # noqa: E402
from ..ray_cluster import towns  # noqa: E402

cluster, built = ray_cluster.cluster, ray_cluster.built  # module-scoped: this file's Ray cluster and its build


def key_stage_processes() -> list[int]:
    """PIDs of the key-stage actors of this process's cluster (Ray names them ray::MapWorker(MapBatches(KeyStage))):
    children of its raylet, so that a build of another cluster on the machine (a bench CI runs beside) is left alone."""
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"KeyStage" not in (proc / "cmdline").read_bytes():
                continue
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == raylet:  # the parent's pid
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_shards_hold_exactly_the_single_build_s_entries(built):
    path, top, single = built
    assert [s["documents"] for s in top["shards"]] == [15, 15, 15, 5]
    assert [s["first_document"] for s in top["shards"]] == [0, 15, 30, 45]
    sharded = ShardedDatastore(path / "sharded")
    every = np.arange(single.store.size)
    assert sharded.size == top["entries"] == single.store.size and sharded.n_documents == 50
    np.testing.assert_array_equal(sharded.values[every], np.asarray(single.store.values))
    # keys: the same contexts, batched per shard instead of over the whole corpus: float32 batching noise, which can
    # round an element to the next float16 (2e-3 at these states' scale)
    np.testing.assert_allclose(sharded.keys[every], np.asarray(single.store.keys), atol=2e-3)
    assert sharded.documents.provenance(every.tolist()) == single.store.documents.provenance(every.tolist())
    assert sharded.documents.ranges([44, 3, 45]) == single.store.documents.ranges([44, 3, 45])
    assert (
        [d for d, _ in sharded.documents.find_titles("town 31")]
        == [d for d, _ in single.store.documents.find_titles("town 31")]
        == [31]
    )
    # every shard holds the evidence vectors of its entries' texts, counted as its entries use them
    assert sharded.evidence.model == single.store.evidence.model is not None
    for shard in sharded.shards:
        ids = shard.evidence.ids(list(range(shard.size)))
        assert dict(shard.db.execute("SELECT id, refs FROM evidence")) == Counter(ids.ravel().tolist())
    rows = single.store.documents.provenance(every.tolist())
    texts = sorted(set(evidence.entry_texts((e.sentence, e.span, e.title) for e in rows)))
    assert sorted(sharded.evidence.vectors(texts)) == texts


def test_ir_scores_over_shards_equal_one_index_over_all(built):
    path, _, single = built
    sharded = BertKNN.load(path / "sharded")
    assert sharded.index.n_docs == single.index.n_docs == 50
    for query in ("Town 31", "bridge river", "Oslo", "people of Town 7 built"):
        (d1, s1), (d2, s2) = sharded.index.scores(query), single.index.scores(query)
        assert d1.tolist() == d2.tolist() and len(d1)
        np.testing.assert_allclose(s1, s2, rtol=1e-9)  # float64 sums of the same counts (scipy, no BLAS): 1e-9
        assert sharded.index.top(query, 3) == single.index.top(query, 3)


def test_the_sharded_datastore_answers_adds_and_removes_like_one(built, tmp_path):
    path, _, single = built
    knn = BertKNN.load(path / "sharded")
    for question, subject in (("Town 33 lies near [MASK] .", "Town 33"), ("The people built a [MASK] .", None)):
        a, b = knn.predict(question, subject=subject), single.predict(question, subject=subject)
        assert a.documents == b.documents
        ranked = [[(t.token, t.probability) for t in p.bert_knn] for p in (a, b)]
        assert_ranking_close(*ranked, rtol=FLOAT16_KEYS_RTOL)  # keys batched otherwise, stored as float16
    fresh = {"id": "new", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn."}
    added = knn.add_documents([fresh])
    assert added > 0 and knn.store.n_documents == 51 and knn.store.shards[-1].n_documents == 6
    assert knn.predict("Zorblat Quenmire was born in [MASK] .", subject="Zorblat Quenmire").documents == [
        "Zorblat Quenmire"
    ]
    with pytest.raises(Exception, match="already in the datastore"):
        knn.add_documents([{"id": "t3", "title": "Again", "text": "Again."}])
    with pytest.raises(Exception, match="no document with id 'nope'"):
        knn.remove_documents(["t3", "nope"])
    assert knn.store.documents.states(["t3"]) == {"t3": "live"}  # nothing removed
    assert knn.remove_documents(["t3", "new"]) == (["t3", "new"], [])
    knn.refresh()
    assert "Town 3" not in knn.predict("Town 3 lies near [MASK] .", subject="Town 3").documents
    assert knn.remove_documents(["t3"]) == ([], ["t3"])


def test_a_rerun_after_the_build_returns_the_top_manifest_and_refuses_another_corpus(built, tiny_model_dir):
    path, top, _ = built
    written = (path / "sharded" / "shards.json").read_bytes()
    again = distributed.build(path / "towns.jsonl", path / "sharded", str(tiny_model_dir), shard_docs=15)
    assert (path / "sharded" / "shards.json").read_bytes() == written  # written once, by the build
    assert [row["path"] for row in again["shards"]] == [row["path"] for row in top["shards"]]
    now = ShardedDatastore(path / "sharded")  # with what the tests before added and removed
    assert (again["documents"], again["entries"]) == (now.n_documents, now.size)
    other = write_corpus(path / "other.jsonl", towns(3))
    with pytest.raises(ValueError, match="another corpus"):
        distributed.build(other, path / "sharded", str(tiny_model_dir), shard_docs=15)


@pytest.mark.smoke  # a build of its own: in the slower group CI runs after the suite
def test_a_key_stage_worker_killed_mid_shard_is_retried_and_nothing_is_lost(cluster, tmp_path, tiny_model_dir):
    corpus = write_corpus(tmp_path / "towns.jsonl", towns(240, sentences=12))
    out = tmp_path / "sharded"
    killed: list[int] = []
    built = threading.Event()

    def kill_one_mid_shard() -> None:  # until the build returns: a loaded machine may take minutes to register
        while not built.is_set() and not killed:
            for shard in sorted((out / "shards").glob("shard-*")) if (out / "shards").is_dir() else []:
                try:  # the status is committed to the shard's SQLite (`read_committed`)
                    manifest = read_committed(shard)
                except (OSError, DatastoreError):
                    manifest = Manifest()
                keys = shard / "keys.f16"
                if manifest.get("status") == "lazy" and keys.is_file() and keys.stat().st_size > 0:  # keys coming
                    alive = key_stage_processes()
                    if alive:
                        os.kill(alive[0], signal.SIGKILL)
                        killed.append(alive[0])
                        return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_one_mid_shard)
    killer.start()
    try:
        top = distributed.build(corpus, out, str(tiny_model_dir), workers=1, shard_docs=60)
    finally:
        built.set()
        killer.join()
    assert killed, "no key-stage worker was caught mid-shard"
    single = BertKNN.build(corpus, tmp_path / "single", str(tiny_model_dir))
    sharded = ShardedDatastore(out)
    every = np.arange(single.store.size)
    assert top["entries"] == sharded.size == single.store.size  # nothing lost, nothing duplicated
    np.testing.assert_array_equal(sharded.values[every], np.asarray(single.store.values))
    assert sharded.documents.provenance(every.tolist()) == single.store.documents.provenance(every.tolist())
    np.testing.assert_allclose(sharded.keys[every], np.asarray(single.store.keys), atol=2e-3)
    whole = TfidfIndex.build(single.store.documents.texts())
    assert BertKNN.load(out).index.top("Town 101 bridge", 3) == whole.top("Town 101 bridge", 3)


DRIVER = """
import sys, ray
from bertknn.ingest import distributed
ray.init(address="local", num_cpus=2, log_to_driver=False, include_dashboard=False, _temp_dir=sys.argv[4])
distributed.build(sys.argv[1], sys.argv[2], sys.argv[3], workers=1, shard_docs=60)
"""


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL every process whose command line holds `text` (the killed driver's own Ray cluster, by its
    temporary directory: `ray stop` would end every Ray cluster on the machine)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            continue


@pytest.mark.smoke  # a build of its own: in the slower group CI runs after the suite
def test_a_driver_killed_mid_build_and_rerun_redoes_only_the_shards_not_committed(cluster, tmp_path, tiny_model_dir):
    corpus = write_corpus(tmp_path / "towns.jsonl", towns(240, sentences=12))
    out = tmp_path / "sharded"
    temp = tempfile.mkdtemp(prefix="rk", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(corpus), str(out), str(tiny_model_dir), temp])
    shards = out / "shards"
    deadline = time.time() + 300
    while time.time() < deadline and driver.poll() is None:
        done = [p for p in shards.glob("shard-*") if distributed._complete(p, 60)] if shards.is_dir() else []
        if done:
            break
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    kill_processes_mentioning(temp)
    shutil.rmtree(temp, ignore_errors=True)
    assert not (out / SHARDS_FILE).exists(), "the driver finished before it was killed"
    committed = {
        p.name: (p / "keys.f16").stat().st_mtime_ns for p in shards.glob("shard-*") if distributed._complete(p, 60)
    }
    assert 1 <= len(committed) < 4
    top = distributed.build(corpus, out, str(tiny_model_dir), workers=1, shard_docs=60)
    for name, mtime in committed.items():  # not rebuilt
        assert (shards / name / "keys.f16").stat().st_mtime_ns == mtime
    single = BertKNN.build(corpus, tmp_path / "single", str(tiny_model_dir))
    sharded = ShardedDatastore(out)
    every = np.arange(single.store.size)
    assert top["entries"] == sharded.size == single.store.size
    assert sharded.documents.provenance(every.tolist()) == single.store.documents.provenance(every.tolist())
    np.testing.assert_array_equal(sharded.values[every], np.asarray(single.store.values))


@pytest.mark.smoke  # a build of its own: in the slower group CI runs after the suite
def test_faiss_over_shards_returns_what_one_index_over_all_keys_returns(cluster, tmp_path, tiny_model_dir):

    path = tmp_path
    corpus = write_corpus(path / "towns.jsonl", towns(50))
    distributed.build(corpus, path / "sharded", str(tiny_model_dir), workers=2, shard_docs=15)
    single = BertKNN.build(corpus, path / "single", str(tiny_model_dir))
    sharded = ShardedDatastore(path / "sharded")
    # trained once on the same sample of all keys: the same quantizer; 2 of 4 lists probed
    in_turn = index_keys(sharded, "IVF4,Flat", train_size=sharded.size, nprobe=2)
    for shard in sharded.shards:
        for file in shard.path.glob("faiss*"):
            file.unlink()
    over_shards = index_keys(sharded, "IVF4,Flat", train_size=sharded.size, nprobe=2, on_ray=True)
    one = index_keys(single.store, "IVF4,Flat", train_size=single.store.size, nprobe=2)
    for a, b in zip(in_turn.parts, over_shards.parts, strict=True):  # filled in turn or by parallel Ray tasks
        np.testing.assert_array_equal(a.index.reconstruct_n(0, a.ntotal), b.index.reconstruct_n(0, b.ntotal))
    assert over_shards.ntotal == one.ntotal == single.store.size
    knn = BertKNN.load(path / "sharded")
    _, states = knn.encoder.query(["Town 12 lies near [MASK] .", "The people built a [MASK] ."])
    hidden = np.array([3, 20])  # documents no search may return, in two shards
    for state in states:
        for rerank in (0, 8):
            got, got_d = over_shards.search(state, 10, hidden, rerank)
            want, want_d = one.search(state, 10, hidden, rerank)
            # one index drops hidden entries from its 10 x rerank candidates; each shard drops them from its own
            # candidates, so the shards may fill up to k where one index returned fewer: the same, then more
            assert len(got) >= len(want) >= 9
            assert_neighbours_close(got[: len(want)], got_d[: len(want)], want, want_d)  # float32 sums otherwise
    assert knn.faiss is not None and knn.predict("Town 12 lies near [MASK] .", retrieval="faiss").knn


def test_index_on_ray_fills_every_shard_of_any_datastore(built, tmp_path):
    """`--engine ray` fills each shard in a Ray task: a sharded store's shards, a one-directory store's one shard
    (a store is its own one shard: no caller asks which it has)."""
    from typer.testing import CliRunner

    from bertknn.cli import app

    path, _, single = built
    for command in ("index", "serve"):
        refused = CliRunner().invoke(app, [command, str(single.store.path), "--engine", "spark"])
        assert refused.exit_code == 2 and "--engine is local or ray" in " ".join(refused.output.split())
    done = CliRunner().invoke(app, ["index", str(path / "sharded"), "--engine", "ray", "--factory", "Flat"])
    assert done.exit_code == 0, done.output
    assert "the faiss.index of each shard" in " ".join(done.output.split())
    assert all((path / "sharded" / s["path"] / "faiss.index").is_file() for s in built[1]["shards"])
    one = shutil.copytree(single.store.path, tmp_path / "one")
    done = CliRunner().invoke(app, ["index", str(one), "--engine", "ray", "--factory", "Flat"])
    assert done.exit_code == 0, done.output
    assert str(one / "faiss.index") in "".join(done.output.split()) and (one / "faiss.index").is_file()


def test_a_rerun_with_another_corpus_or_shard_size_is_refused_before_anything_is_written(tmp_path, tiny_model_dir):
    corpus = write_corpus(tmp_path / "towns.jsonl", towns(5))
    begun = tmp_path / "out" / "shards" / "shard-00000"
    begun.mkdir(parents=True)
    (begun / "manifest.json").write_text(json.dumps({"corpus": {"sha256": "another"}}))
    with pytest.raises(ValueError, match="holds shards of another corpus or model"):
        distributed.build(corpus, tmp_path / "out", str(tiny_model_dir), shard_docs=2)
    from bertknn.model.encoder import Encoder

    manifest = distributed.builder.manifest(Encoder.load(str(tiny_model_dir)), None, 1, False)
    manifest |= {"corpus": {"sha256": distributed.open_corpus(corpus).fingerprint()}, "shard_docs": 3}
    (begun / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="holds shards of 3 documents"):
        distributed.build(corpus, tmp_path / "out", str(tiny_model_dir), shard_docs=2)
    assert not (tmp_path / "out" / "inputs").exists()


def test_a_gpu_build_is_checked_against_the_cluster_not_the_driver(cluster, tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from bertknn.cli import app

    corpus = write_corpus(tmp_path / "towns.jsonl", towns(3))
    args = ["build", str(corpus), "--out", str(tmp_path / "out"), "--model", str(tiny_model_dir), "--engine", "ray"]
    refused = CliRunner().invoke(app, [*args, "--device", "cuda"])  # the driver has no GPU either: not what is said
    assert refused.exit_code == 2 and "the Ray cluster has no GPU; use --device cpu" in " ".join(refused.output.split())
    assert not (tmp_path / "out" / "inputs").exists()


def test_a_ray_build_with_a_key_codec_stores_codes_in_every_shard_and_prunes_shard_by_shard(built, tmp_path):
    from typer.testing import CliRunner

    from bertknn.cli import app
    from bertknn.ingest.prune import prune

    path, top, single = built
    out = shutil.copytree(path / "sharded", tmp_path / "sharded")  # a finished Ray build: the rerun converts its keys
    args = ["build", str(path / "towns.jsonl"), "--out", str(out), "--engine", "ray", "--device", "cpu"]
    done = CliRunner().invoke(app, [*args, "--model", single.encoder.name, "--shard-docs", "15", "--key-codec", "SQ8"])
    assert done.exit_code == 0, done.output
    store = ShardedDatastore(out)
    assert [s.manifest.key_codec for s in store.shards] == ["SQ8"] * len(top["shards"])
    assert all((s.path / "keys.codes").stat().st_size == s.size * s.dim for s in store.shards)
    pruned = prune(out, tmp_path / "pruned", float("inf"))
    assert [s.manifest.key_codec for s in pruned.shards] == ["SQ8"] * len(top["shards"]) and pruned.size < store.size
    hidden = set(store.documents.hidden().tolist())  # the module's build may have had documents removed
    ranges = store.documents.ranges([d for d in range(store.n_documents) if d not in hidden])
    assert pruned.counts_of(np.arange(pruned.size)).sum() == sum(end - start for start, end in ranges)
    assert BertKNN(single.encoder, pruned).predict("Town 6 lies near [MASK] .").knn


def test_without_an_address_ray_starts_a_cluster_of_its_own_not_the_one_recorded_last():
    """`ray start` (and Ray's test clusters) record the latest cluster in <Ray's temp dir>/ray_current_cluster, and a
    bare `ray.init()` joins it, a stale one too: the builds, `index` and `serve` without --address start a local
    cluster instead, as their help says. A process of its own, with Ray's temp dir of its own (RAY_TMPDIR)."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must stay under 108 bytes
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nothing listens there
        script = (
            "import ray\nfrom bertknn.ingest.distributed import start_ray\nstart_ray(None)\n"
            "print(ray.get_runtime_context().gcs_address)\nray.shutdown()\n"
        )
        env = os.environ | {"RAY_TMPDIR": str(temp), "RAY_ADDRESS": ""}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-1] != "127.0.0.1:1"
    finally:
        shutil.rmtree(temp, ignore_errors=True)
