"""FAISS search over the whole datastore, and adding or removing documents in place (atomic, resumable)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn import BertKNN, DatastoreError, builder, cli
from bertknn import pipeline as pl
from bertknn.cli import app
from bertknn.datastore import Datastore
from bertknn.faiss_index import INDEX_FILE, FaissIndex, auto_factory, auto_train_size
from bertknn.knn import knn_distribution
from bertknn.text import CorpusError

from .conftest import write_corpus

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
QUESTION, SUBJECT = "Zorblat Quenmire was born in [MASK] .", "Zorblat Quenmire"


def brute_force(store: Datastore, query: np.ndarray, k: int, hidden: set[int] = frozenset()):
    """The k nearest of all entries of live documents, by a direct computation over every key."""
    keys = np.asarray(store.keys, np.float64)
    dist = ((keys - query) ** 2).sum(1)
    owners = store.documents_of(np.arange(store.size))
    dist[np.isin(owners, list(hidden))] = np.inf
    order = np.lexsort((np.arange(store.size), dist))[:k]
    return order[np.isfinite(dist[order])], dist[order]


@pytest.mark.parametrize(("factory", "nprobe"), [("Flat", 1), ("IVF4,Flat", 4), ("IVF4,PQ8x4", 4)])
def test_faiss_search_reranked_equals_brute_force(built, factory, nprobe):
    index = FaissIndex.build(built.store, factory, train_size=built.store.size, nprobe=nprobe)
    assert index.index.ntotal == built.store.size
    _, states = built.encoder.query(["Dante was born in [MASK] .", "Paris is the capital of [MASK] ."])
    for state in states:
        ids, dist = index.search(state, 10, rerank=built.store.size)  # every key is a candidate: exact
        want, want_dist = brute_force(built.store, state, 10)
        assert ids.tolist() == want.tolist()
        np.testing.assert_allclose(dist, want_dist, rtol=1e-5)


def test_faiss_build_resumes_after_an_interruption(built):
    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        FaissIndex.build(built.store, "IVF4,Flat", train_size=built.store.size, chunk=10, progress=stop)
    assert FaissIndex.load(built.store).ntotal == 10  # one chunk saved
    resumed = FaissIndex.build(built.store, "IVF4,Flat", train_size=built.store.size, chunk=10)
    assert resumed.ntotal == built.store.size and len(resumed.parts) == 1
    with pytest.raises(DatastoreError, match="has a FAISS index 'IVF4,Flat'"):
        FaissIndex.build(built.store, "Flat")


@pytest.mark.parametrize(
    ("size", "dim", "factory", "train"),
    [
        (19_999, 768, "Flat", 19_999),
        (20_000, 768, "IVF512,PQ64", 20_000),
        (1_000_000, 768, "IVF4096,PQ64", 204_800),
        (1_000_000, 384, "IVF4096,PQ32", 204_800),
        (900_000_000, 768, "IVF131072,PQ64", 6_553_600),
        (50_000, 32, "IVF1024,PQ2", 50_000),
    ],
)
def test_auto_factory_and_train_size_follow_the_datastore_size(size, dim, factory, train):
    assert auto_factory(size, dim) == factory
    assert auto_train_size(faiss.index_factory(dim, factory), size) == train


def test_auto_index_is_exact_on_a_small_datastore_and_resumes_with_its_settings(built):
    index = FaissIndex.build(built.store)  # auto: Flat below 20k keys
    assert index.settings["factory"] == "Flat" and index.settings["train_size"] == built.store.size
    assert FaissIndex.build(built.store).settings == index.settings  # "auto" takes the index being resumed


def test_bad_factory_string_and_too_few_training_keys(built):
    with pytest.raises(ValueError, match="bad FAISS factory string 'Bogus7'"):
        FaissIndex.build(built.store, "Bogus7")
    with pytest.raises(ValueError, match="cannot train FAISS index 'IVF4096,Flat'"):
        FaissIndex.build(built.store, "IVF4096,Flat", train_size=50)
    assert not (built.store.path / INDEX_FILE).exists()


def test_predict_paths_say_which_was_used_and_match_brute_force(built):
    FaissIndex.build(built.store, "Flat")
    knn = BertKNN(built.encoder, built.store)
    ir = knn.predict(QUESTION.replace("Zorblat Quenmire", "Dante"), subject="Dante Alighieri")
    whole = knn.predict("Dante was born in [MASK] .", retrieval="faiss", k=8)
    both = knn.predict(  # the paper's vote: the retrieval-aware one ranks FAISS's other documents below Dante's
        "Dante was born in [MASK] .", subject="Dante Alighieri", retrieval="ir+faiss", k=8, doc_temperature=0
    )
    assert (ir.retrieval, whole.retrieval, both.retrieval) == ("ir", "faiss", "ir+faiss")
    _, states = knn.encoder.query(["Dante was born in [MASK] ."])
    ids, dist = brute_force(knn.store, states[0], 8)
    expected = knn_distribution(np.asarray(knn.store.values[ids]), dist, 6.0, knn.encoder.vocab_size)
    np.testing.assert_allclose(whole.p_knn, expected, atol=1e-6)
    np.testing.assert_allclose(both.p_knn, expected, atol=1e-6)  # the whole store already holds the IR documents
    owners = list(dict.fromkeys(knn.store.documents_of(ids).tolist()))
    assert whole.documents == knn.store.titles(owners)  # the documents the neighbours come from, nearest first
    with pytest.raises(ValueError, match="retrieval must be one of ir, faiss, ir\\+faiss"):
        knn.predict("Dante was born in [MASK] .", retrieval="web")


def test_faiss_path_needs_an_index(built):
    with pytest.raises(DatastoreError, match="has no FAISS index: create one with `bertknn index"):
        built.predict("Dante was born in [MASK] .", retrieval="faiss")


def _answers(knn: BertKNN, retrieval: str) -> tuple[str, list[str]]:
    p = knn.predict(QUESTION, subject=SUBJECT, retrieval=retrieval, top_k=3)
    return p.knn[0].token if p.knn else "", p.documents


@pytest.mark.parametrize("retrieval", ["ir", "faiss"])
def test_fresh_fact_answerable_after_add_and_gone_after_remove(built, retrieval):
    FaissIndex.build(built.store, "Flat")
    knn = BertKNN(built.encoder, built.store)
    before, docs_before = _answers(knn, retrieval)
    assert before != "tallinn" and "Zorblat Quenmire" not in docs_before
    size = knn.store.size
    added = knn.add_documents([FRESH])
    assert added == knn.store.size - size > 0 and knn.faiss.ntotal == knn.store.size
    after, docs_after = _answers(knn, retrieval)
    assert after == "tallinn" and "Zorblat Quenmire" in docs_after
    reopened = BertKNN.load(built.store.path, str(built.encoder.name))  # the change is on disk
    assert _answers(reopened, retrieval)[0] == "tallinn"
    knn.remove_document("n1")
    gone, docs_gone = _answers(knn, retrieval)
    assert gone != "tallinn" and "Zorblat Quenmire" not in docs_gone
    knn.add_documents([FRESH])  # a removed id is free again
    assert _answers(knn, retrieval)[0] == "tallinn"


@pytest.mark.parametrize("crash_at", ["embed", "ensure_index", "faiss", "publish"])
def test_a_crash_mid_add_leaves_the_old_state_and_a_rerun_completes(built, monkeypatch, crash_at):
    FaissIndex.build(built.store, "Flat")
    knn = BertKNN(built.encoder, built.store)
    reference = knn.predict(QUESTION, subject=SUBJECT, top_k=3)
    targets = {
        "embed": (builder, "embed"),
        "ensure_index": (pl, "ensure_index"),
        "faiss": (FaissIndex, "update"),
        "publish": (type(knn.store), "publish"),
    }

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(*targets[crash_at], crash)
        with pytest.raises(KeyboardInterrupt):
            knn.add_documents([FRESH])
    for reader in (knn, BertKNN.load(built.store.path, str(built.encoder.name))):  # in process, and reopened
        p = reader.predict(QUESTION, subject=SUBJECT, top_k=3)
        assert p.documents == reference.documents and "Zorblat Quenmire" not in p.documents
        assert _answers(reader, "faiss")[0] != "tallinn"
    rerun = BertKNN.load(built.store.path, str(built.encoder.name))
    rerun.add_documents([FRESH], skip_existing=True)
    assert _answers(rerun, "ir")[0] == "tallinn" and _answers(rerun, "faiss")[0] == "tallinn"
    assert rerun.faiss.ntotal == rerun.store.size and rerun.index.n_docs == rerun.store.n_documents == 6


def test_add_refuses_duplicates_and_bad_documents_changing_nothing(built):
    size, n = built.store.size, built.store.n_documents
    with pytest.raises(DatastoreError, match=r"already in the datastore: \['d1'\]"):
        built.add_documents([{"id": "d1", "title": "x", "text": "Again."}])
    with pytest.raises(CorpusError, match="document 1: missing 'title'"):
        built.add_documents([{"id": "n9", "text": "No title."}])
    with pytest.raises(CorpusError, match="duplicate document id"):
        built.add_documents([FRESH, FRESH])
    with pytest.raises(DatastoreError, match="no document with id 'nope'"):
        built.remove_document("nope")
    assert (built.store.size, built.store.n_documents) == (size, n)


def test_cli_index_add_remove(tmp_path, built, monkeypatch):
    monkeypatch.setattr(cli.console, "width", 200)  # no wrapped lines
    runner = CliRunner()
    store = str(built.store.path)
    more = write_corpus(tmp_path / "more.jsonl", [FRESH])
    result = runner.invoke(app, ["index", store, "--factory", "Flat", "--threads", "1"])
    assert result.exit_code == 0 and "FAISS index 'Flat'" in result.output, result.output
    result = runner.invoke(app, ["add", store, str(more), "--threads", "1"])
    assert result.exit_code == 0 and "added 1 documents" in result.output, result.output
    result = runner.invoke(app, ["add", store, str(more), "--threads", "1"])
    assert result.exit_code == 0 and "added 0 documents" in result.output and "1 were there already" in result.output
    ask = ["ask", store, QUESTION, "--subject", SUBJECT, "--retrieval", "faiss", "--threads", "1"]
    assert "tallinn" in runner.invoke(app, ask).output
    result = runner.invoke(app, ["remove", store, "--doc", "n1"])
    assert result.exit_code == 0 and "removed 1 document(s)" in result.output, result.output
    result = runner.invoke(app, ["remove", store, "--doc", "n1"])  # a rerun finishes at once
    assert result.exit_code == 0 and "removed 0 document(s)" in result.output and "before: n1" in result.output
    result = runner.invoke(app, ["remove", store, "--doc", "d1", "--doc", "nope"])  # all or nothing
    assert result.exit_code == 2 and "no document with id 'nope'" in result.output
    assert built.store.states(["d1"]) == {"d1": "live"}


# --- the FAISS index in parts: adds append, parts merge (issue 14 §3) ---


def _vectors(index: FaissIndex) -> np.ndarray:
    return np.concatenate([p.index.reconstruct_n(0, p.index.ntotal) for p in index.parts if p.index.ntotal])


def test_an_add_appends_a_part_and_leaves_faiss_index_as_it_was(built):
    FaissIndex.build(built.store, "IVF4,Flat", train_size=built.store.size, nprobe=4)
    base = built.store.path / INDEX_FILE
    before = base.stat()
    knn = BertKNN(built.encoder, built.store)
    knn.add_documents([FRESH])
    knn.add_documents([{"id": "n2", "title": "Vel Arbo", "text": "Vel Arbo was born in Riga. He sells maps."}])
    after = base.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    parts = sorted(p.name for p in built.store.path.glob("faiss_add_*"))
    assert len(parts) == 2 and knn.faiss.ntotal == knn.store.size
    reader = FaissIndex.load(Datastore(built.store.path))  # another process sees base and parts
    assert [p.name for p in reader.parts[1:]] == parts
    np.testing.assert_array_equal(_vectors(reader), np.asarray(knn.store.keys, np.float32))
    _, states = built.encoder.query([QUESTION, "Vel Arbo was born in [MASK] ."])
    for state in states:
        ids, dist = reader.search(state, 10, rerank=reader.ntotal)  # every key a candidate: exact
        want, want_dist = brute_force(knn.store, state, 10)
        assert ids.tolist() == want.tolist()
        np.testing.assert_allclose(dist, want_dist, rtol=1e-5)


@pytest.mark.parametrize("factory", ["Flat", "IVF4,PQ8x4", "HNSW8"])
def test_parts_merge_as_they_pile_up_and_a_finished_build_is_one_file(built, factory):
    seen = []

    def count(done, total):
        seen.append(len(list(built.store.path.glob("faiss_add_*"))))

    index = FaissIndex.build(built.store, factory, train_size=built.store.size, chunk=1, progress=count)
    assert len(seen) == built.store.size > 20 and max(seen) < 10  # merged ten at a time, never ten apart
    assert len(index.parts) == 1 and not list(built.store.path.glob("faiss_add_*"))
    whole = faiss.read_index(str(built.store.path / INDEX_FILE))
    assert whole.ntotal == built.store.size
    if factory != "IVF4,PQ8x4":  # PQ codes are lossy; Flat and HNSW keep the keys
        np.testing.assert_array_equal(whole.reconstruct_n(0, whole.ntotal), np.asarray(built.store.keys, np.float32))


def test_a_merge_interrupted_before_deleting_its_parts_loads_the_merged_index(built):
    def stop(done, total):
        if done == 15:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        FaissIndex.build(built.store, "Flat", chunk=3, progress=stop)
    parts = FaissIndex.load(built.store)
    assert parts.ntotal == 15 and len(parts.parts) == 6  # the empty faiss.index and five parts of 3
    leftovers = {p.name: p.read_bytes() for p in built.store.path.glob("faiss_add_*")}
    resumed = FaissIndex.build(built.store, "Flat", chunk=3)  # merges everything into faiss.index
    for name, data in leftovers.items():  # as if it had died before deleting what the merge replaced
        (built.store.path / name).write_bytes(data)
    loaded = FaissIndex.load(built.store)
    assert len(loaded.parts) == 1 and loaded.ntotal == resumed.ntotal == built.store.size
    loaded.update()  # the next writer deletes them
    assert not list(built.store.path.glob("faiss_add_*"))
