"""FAISS search over the whole datastore (src/bertknn/index/faiss_index.py): building, factory strings, the automatic
factory and training size, search against brute force, and the index in parts that adds append and merges fold."""

from __future__ import annotations

import math

import faiss
import numpy as np
import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.index import faiss_files
from bertknn.index.faiss_files import INDEX_FILE, auto_factory, auto_train_size
from bertknn.index.faiss_index import FaissIndex
from bertknn.query.knn import knn_distribution
from bertknn.store.datastore import Datastore
from bertknn.store.integrity import Checksums
from bertknn.store.writers import open_writer
from tests.conftest import index_keys

from ..conftest import writable
from ..tolerances import assert_neighbours_close

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
QUESTION = "Zorblat Quenmire was born in [MASK] ."


def brute_force(store: Datastore, query: np.ndarray, k: int, hidden: set[int] = frozenset()):
    """The k nearest of all entries of live documents, by a direct computation over every key."""
    keys = np.asarray(store.keys, np.float64)
    dist = ((keys - query) ** 2).sum(1)
    owners = store.documents.of(np.arange(store.size))
    dist[np.isin(owners, list(hidden))] = np.inf
    order = np.lexsort((np.arange(store.size), dist))[:k]
    return order[np.isfinite(dist[order])], dist[order]


@pytest.mark.parametrize(("factory", "nprobe"), [("Flat", 1), ("IVF4,Flat", 4), ("IVF4,PQ8x4", 4)])
def test_faiss_search_reranked_equals_brute_force(built, factory, nprobe):
    index = index_keys(built.store, factory, train_size=built.store.size, nprobe=nprobe)
    assert index.index.ntotal == built.store.size
    _, states = built.encoder.query(["Dante was born in [MASK] .", "Paris is the capital of [MASK] ."])
    for state in states:
        ids, dist = index.search(state, 10, rerank=built.store.size)  # every key is a candidate: exact
        want, want_dist = brute_force(built.store, state, 10)
        assert_neighbours_close(ids, dist, want, want_dist)  # float32 distances against float64 ones


def test_faiss_build_resumes_after_an_interruption(built):
    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        index_keys(built.store, "IVF4,Flat", train_size=built.store.size, chunk=10, progress=stop)
    assert FaissIndex.load(built.store).ntotal == 10  # one chunk saved
    resumed = index_keys(built.store, "IVF4,Flat", train_size=built.store.size, chunk=10)
    assert resumed.ntotal == built.store.size and len(resumed.parts) == 1
    with pytest.raises(DatastoreError, match="has a FAISS index 'IVF4,Flat'"):
        index_keys(built.store, "Flat")


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
    index = index_keys(built.store)  # auto: Flat below 20k keys
    assert index.settings["factory"] == "Flat" and index.settings["train_size"] == built.store.size
    assert index_keys(built.store).settings == index.settings  # "auto" takes the index being resumed


def test_bad_factory_string_and_too_few_training_keys(built):
    with pytest.raises(ValueError, match="bad FAISS factory string 'Bogus7'"):
        index_keys(built.store, "Bogus7")
    with pytest.raises(ValueError, match="cannot train FAISS index 'IVF4096,Flat'"):
        index_keys(built.store, "IVF4096,Flat", train_size=50)
    assert not (built.store.path / INDEX_FILE).exists()


def test_predict_paths_say_which_was_used_and_match_brute_force(built):
    index_keys(built.store, "Flat")
    knn = BertKNN(built.encoder, built.store, sentence_temperature=0)  # the vote of the keys alone, as brute force's
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
    owners = list(dict.fromkeys(knn.store.documents.of(ids).tolist()))
    assert whole.documents == knn.store.documents.titles(
        owners
    )  # the documents the neighbours come from, nearest first
    with pytest.raises(ValueError, match="retrieval must be one of ir, faiss, ir\\+faiss"):
        knn.predict("Dante was born in [MASK] .", retrieval="web")


def test_faiss_path_needs_an_index(built):
    with pytest.raises(DatastoreError, match="has no FAISS index: create one with `bertknn index"):
        built.predict("Dante was born in [MASK] .", retrieval="faiss")


# --- the FAISS index in parts: adds append, parts merge ---


def _vectors(index: FaissIndex) -> np.ndarray:
    return np.concatenate([p.index.reconstruct_n(0, p.index.ntotal) for p in index.parts if p.index.ntotal])


def test_an_add_appends_a_part_and_leaves_faiss_index_as_it_was(built):
    index_keys(built.store, "IVF4,Flat", train_size=built.store.size, nprobe=4)
    base = built.store.path / INDEX_FILE
    before = base.stat()
    knn = writable(built.encoder, built.store)
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
        assert_neighbours_close(ids, dist, want, want_dist)  # float32 distances against float64 ones


@pytest.mark.parametrize("factory", ["Flat", "IVF4,PQ8x4", "HNSW8"])
def test_parts_merge_as_they_pile_up_and_a_finished_build_is_one_file(built, factory):
    seen = []

    def count(done, total):  # the committed parts per level (floor(log10(size))) after each chunk of one key
        levels = [int(math.log10(p.stop - p.first) + 1e-9) for p in built.store.parts("faiss")]
        seen.append(max(levels.count(level) for level in levels))
        assert len(list(built.store.path.glob("faiss*.index"))) == len(levels) + 1  # and the trained index: no other

    index = index_keys(built.store, factory, train_size=built.store.size, chunk=1, progress=count)
    assert len(seen) == built.store.size > 20 and max(seen) == 9  # ten parts of one level are merged at once
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
        index_keys(built.store, "Flat", chunk=3, progress=stop)
    parts = FaissIndex.load(built.store)
    assert parts.ntotal == 15 and len(parts.parts) == 5  # the five parts of 3 committed before the interruption
    leftovers = {p.name: p.read_bytes() for p in built.store.path.glob("faiss_add_*")}
    resumed = index_keys(built.store, "Flat", chunk=3)  # merges everything into faiss.index
    for name, data in leftovers.items():  # as if it had died before deleting what the merge replaced
        (built.store.path / name).write_bytes(data)
    loaded = FaissIndex.load(built.store)
    assert len(loaded.parts) == 1 and loaded.ntotal == resumed.ntotal == built.store.size
    with open_writer(built.store) as writer:
        FaissIndex.load(writer.store).update()  # the next writer deletes them
    assert not list(built.store.path.glob("faiss_add_*"))


def test_a_truncated_faiss_file_is_named_with_its_size_and_the_repair_that_rebuilds_it(built):
    """FAISS reports a short read with an errno left over from an earlier call ("No such file or directory"): verify's
    check and a reader whose checksums do not cover the file (a writer dropped them to rewrite it) say instead that
    the file is truncated, with its size, and that `bertknn repair` rebuilds it."""
    index_keys(built.store, "Flat")
    path, file = built.store.path, built.store.path / INDEX_FILE
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    (found,) = faiss_files.problems(path)
    sums = Checksums(path)
    sums.forget([INDEX_FILE])
    sums.save()
    with pytest.raises(DatastoreError) as loading, Datastore(path) as store:
        FaissIndex.load(store)
    for message in (found, str(loading.value)):
        assert f"{file} is damaged (truncated: its {file.stat().st_size:,} bytes end before" in message, message
        assert f"`bertknn repair {path}` rebuilds the FAISS index" in message, message
        assert "No such file or directory" not in message and "read error" not in message, message
