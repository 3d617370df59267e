"""A sharded datastore read as one (src/bertknn/store/shards.py): `ShardedDatastore` answers every read with global
document and entry numbers as one datastore of the same documents does (titles, evidence, documents_of, find_titles,
keys, renumbered values, states), splits and merges per shard, and takes its counts from the shards (shards.json
holds none)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertknn import BertKNN
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.shards import SHARDS_FILE, ShardedDatastore, is_sharded, open_store
from bertknn.store.writers import open_writer

from ..conftest import SMALL_DOCS, writable, write_corpus
from ..sharded_store import make_sharded, reader_counts, true_counts

# a sixth document in the last shard holds words of several wordpieces that the first shard holds too: the shards
# number them apart, the sharded datastore as one
VARNHOLD = {
    "id": "d6",
    "title": "Quellbrook Varnhold",
    "text": "Quellbrook Varnhold was born in Quellbrook. Ilsa Varnhold taught him the cello.",
}
DOCS = [*SMALL_DOCS, VARNHOLD]
GROUPS = [DOCS[:2], DOCS[2:3], DOCS[3:]]  # d1-d2, d3, d4-d6


@pytest.fixture(scope="module")
def stores(tmp_path_factory, encoder) -> tuple[Datastore, ShardedDatastore]:
    """The six documents in one datastore, and in three shards (not to be changed: module-scoped)."""
    path = tmp_path_factory.mktemp("shards")
    single = BertKNN.build(write_corpus(path / "corpus.jsonl", DOCS), path / "single", encoder).store
    return single, ShardedDatastore(make_sharded(path / "sharded", encoder, GROUPS))


@pytest.fixture()
def fresh(tmp_path, encoder) -> tuple[Datastore, ShardedDatastore]:
    """The same, to change."""
    single = BertKNN.build(write_corpus(tmp_path / "corpus.jsonl", DOCS), tmp_path / "single", encoder).store
    return single, ShardedDatastore(make_sharded(tmp_path / "sharded", encoder, GROUPS))


def test_counts_and_offsets_are_the_shards_in_order(stores):
    single, sharded = stores
    sizes = [s.size for s in sharded.shards]
    assert [s.n_documents for s in sharded.shards] == [2, 1, 3]
    assert sharded.doc_starts.tolist() == [0, 2, 3, 6]
    assert sharded.entry_starts.tolist() == [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    assert (sharded.n_documents, sharded.size) == (6, single.size) and single.size == sum(sizes)
    starts = [single.documents.ranges([d])[0][0] for d in (0, 2, 3)]  # where each shard's first document begins
    assert sharded.entry_starts[:3].tolist() == starts
    assert sharded.documents.count_live() == single.documents.count_live() == 6
    assert (
        sharded.manifest.complete,
        sharded.manifest.lazy,
        sharded.documents.pending(),
        sharded.documents.pending([0, 1]),
    ) == (
        True,
        False,
        [],
        [],
    )
    assert (sharded.manifest.layer, sharded.dim, sharded.manifest.key_dtype) == (
        single.manifest.layer,
        single.dim,
        single.manifest.key_dtype,
    )
    assert sharded.version == tuple(s.version for s in sharded.shards)
    assert sharded.keys.shape == (single.size, single.dim) and len(sharded.values) == single.size


def test_titles_evidence_ranges_and_owners_equal_one_datastore_s(stores):
    single, sharded = stores
    every = list(range(single.size))
    assert (
        sharded.documents.titles([5, 0, 2, 3])
        == single.documents.titles([5, 0, 2, 3])
        == [DOCS[i]["title"] for i in (5, 0, 2, 3)]
    )
    assert sharded.documents.provenance(every) == single.documents.provenance(every)
    picked = [single.size - 1, 0, sharded.entry_starts[2], sharded.entry_starts[1] - 1, 0]
    assert sharded.documents.provenance(picked) == single.documents.provenance(
        picked
    )  # in the order asked, across shards
    assert [e.entry for e in sharded.documents.provenance(picked)] == picked
    assert sharded.documents.ranges([5, 0, 3, 2]) == single.documents.ranges([5, 0, 3, 2])
    np.testing.assert_array_equal(sharded.documents.of(np.array(every)), single.documents.of(np.array(every)))
    np.testing.assert_array_equal(sharded.documents.of(np.array(picked)), single.documents.of(np.array(picked)))
    for title, doc in [("dante alighieri", 2), ("paris", 3), ("quellbrook varnhold", 5), ("ilsa varnhold", 0)]:
        assert (
            [d for d, _ in sharded.documents.find_titles(title)]
            == [d for d, _ in single.documents.find_titles(title)]
            == [doc]
        )
    assert sharded.documents.find_titles("nobody at all") == []
    with pytest.raises(DatastoreError, match=rf"has no item {single.size} \(it holds {single.size}\)"):
        sharded.documents.provenance([0, single.size])


def test_keys_and_renumbered_values_equal_one_datastore_s(stores):
    single, sharded = stores
    every = np.arange(single.size)
    # the same contexts, embedded in other batches: float16 keys equal up to batching noise
    np.testing.assert_allclose(sharded.keys[every], np.asarray(single.keys), atol=2e-3)
    np.testing.assert_array_equal(sharded.keys[5:9], sharded.keys[np.arange(5, 9)])  # a slice reads the same rows
    np.testing.assert_array_equal(sharded.values[every], np.asarray(single.values))
    np.testing.assert_array_equal(sharded.values[3:20], np.asarray(single.values[3:20]))
    assert sharded.lexicon.words(None) == single.lexicon.words(None)
    last = sharded.shards[2]
    local = np.asarray(last.values)
    renumbered = np.flatnonzero(local != sharded.values[sharded.entry_starts[2] + np.arange(last.size)])
    assert len(renumbered), "the last shard numbers its words of several wordpieces apart"
    for entry in renumbered:  # each renumbered value is the same word in the last shard's lexicon and the store's
        value = int(sharded.values[sharded.entry_starts[2] + entry : sharded.entry_starts[2] + entry + 1][0])
        assert last.lexicon.words([int(local[entry])])[int(local[entry])] == sharded.lexicon.words([value])[value]
    vocab = min(single.lexicon.words(None))  # lexicon numbers follow the vocabulary; vocabulary ids stay as they are
    assert all(v == s for v, s in zip(local, sharded.values[sharded.entry_starts[2] :]) if v < vocab)
    with pytest.raises(DatastoreError, match=r"holds no word for values \[1\]"):
        sharded.lexicon.words([1])


def test_split_documents_gives_each_shard_its_own_numbers():
    class Starts:  # only the offsets: split_documents reads nothing else
        doc_starts = np.array([0, 2, 3, 6])

    split = ShardedDatastore.split_documents(Starts(), np.array([5, 0, 3, 1, 2]))
    assert [s.tolist() for s in split] == [[0, 1], [0], [2, 0]]
    assert [s.tolist() for s in ShardedDatastore.split_documents(Starts(), None)] == [[], [], []]


def test_split_documents_of_the_store_s_hidden_documents(fresh):
    single, sharded = fresh
    for store in (single, sharded):
        with open_writer(store) as writer:
            writer.remove(["d2", "d6"])
        store.reopen_if_changed()
    assert sharded.documents.hidden().tolist() == single.documents.hidden().tolist() == [1, 5]
    assert [s.tolist() for s in sharded.split_documents(sharded.documents.hidden())] == [[1], [], [2]]


def test_merge_nearest_merges_each_shard_s_nearest_by_global_entry(stores):
    _, sharded = stores
    a, b = (int(s) for s in sharded.entry_starts[1:3])
    found = [
        (np.array([4, 0]), np.array([1.0, 3.0])),
        (np.array([2]), np.array([0.5])),
        (np.array([1, 7, 0]), np.array([3.0, 2.0, 1.0])),
    ]
    entries, dist = sharded.merge_nearest(found, 4)
    # by distance: 0.5 (shard 1, 2), then the tie at 1.0 (shard 0's 4 before shard 2's 0: the lower global entry),
    # then 2.0 (shard 2, 7)
    assert entries.tolist() == [a + 2, 4, b + 0, b + 7]
    assert dist.tolist() == [0.5, 1.0, 1.0, 2.0] and dist.dtype == np.float32
    entries, dist = sharded.merge_nearest(found, 10)  # fewer than k: all of them
    assert entries.tolist() == [a + 2, 4, b + 0, b + 7, 0, b + 1]
    assert dist.tolist() == [0.5, 1.0, 1.0, 2.0, 3.0, 3.0]
    empty = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * 3
    assert [x.tolist() for x in sharded.merge_nearest(empty, 5)] == [[], []]


def test_states_and_removals_across_shards_equal_one_datastore_s(fresh):
    single, sharded = fresh
    ids = ["d1", "d3", "d5", "d6", "nope"]
    assert (
        sharded.documents.states(ids)
        == single.documents.states(ids)
        == {"d1": "live", "d3": "live", "d5": "live", "d6": "live"}
    )
    unknown = pytest.raises(DatastoreError, match=r"no document with id 'nope' in .*; nothing was removed")
    with unknown, open_writer(sharded) as writer:
        writer.remove(["d1", "nope"])
    assert sharded.documents.states(["d1"]) == {"d1": "live"}
    with open_writer(sharded) as writer:
        assert writer.remove(["d5", "d1"]) == (["d1", "d5"], [])  # shard by shard
    with open_writer(single) as writer:
        writer.remove(["d5", "d1"])
    for store in (single, sharded):
        store.reopen_if_changed()
    assert sharded.documents.states(ids) == single.documents.states(ids) == {"d3": "live", "d6": "live"}
    assert sharded.documents.hidden().tolist() == single.documents.hidden().tolist() == [0, 4]
    assert sharded.documents.count_live() == single.documents.count_live() == 4
    assert sharded.documents.find_titles("ilsa varnhold") == single.documents.find_titles("ilsa varnhold") == []
    assert sharded.documents.live_digests(["d3", "d1"]) == single.documents.live_digests(["d3", "d1"])
    with open_writer(sharded) as writer:
        assert writer.remove(["d1", "d3"]) == (["d3"], ["d1"])  # removed before: reported, not refused
    top = ShardedDatastore(sharded.path).manifest  # a new reader's counts are the shards'
    assert (top["documents"], top["live_documents"]) == (6, 3)


def test_open_store_tells_a_sharded_datastore_from_one(stores, tmp_path):
    single, sharded = stores
    assert is_sharded(sharded.path) and not is_sharded(single.path)
    assert type(open_store(sharded.path)) is ShardedDatastore and type(open_store(single.path)) is Datastore
    assert open_store(sharded.path).size == sharded.size
    broken = tmp_path / "broken"
    broken.mkdir()
    for content, problem in [("{not json", "Expecting"), ('{"shards": []}', "it lists no shards"), ("{}", "'shards'")]:
        (broken / SHARDS_FILE).write_text(content, encoding="utf-8")
        with pytest.raises(DatastoreError, match=r"shards\.json is damaged \(.*\); rerun the sharded build") as err:
            ShardedDatastore(broken)
        assert problem in str(err.value)


# --- shards.json is written once; the counts are the shards' ---


@pytest.fixture()
def sharded(tmp_path, encoder) -> BertKNN:
    """The small corpus in two shards: d1-d3, then d4-d5."""
    path = make_sharded(tmp_path / "sharded", encoder, [SMALL_DOCS[:3], SMALL_DOCS[3:]])
    return writable(encoder, ShardedDatastore(path))


def test_writes_leave_shards_json_as_built_and_readers_count_from_the_shards(sharded):
    """Adds and removes commit to the shards only: shards.json keeps its bytes, and every reader (the writer's own,
    a new one) shows the shards' counts and offsets."""
    path = sharded.store.path
    built = (path / SHARDS_FILE).read_bytes()
    assert set(json.loads(built)["shards"][0]) == {"path"} and "documents" not in json.loads(built)
    sharded.remove_documents(["d4"])
    sharded.add_documents([{"id": "n2", "title": "Ruxana Pell", "text": "Ruxana Pell was born in Riga."}])
    assert (path / SHARDS_FILE).read_bytes() == built
    for store in (sharded.store, ShardedDatastore(path)):
        assert reader_counts(store) == true_counts(store)
        assert reader_counts(store)[:3] == (6, store.size, 5) and reader_counts(store)[3][1][2] == 3  # d4 hidden


def test_counts_a_shards_json_written_before_kept_are_ignored(sharded):
    """A shards.json from before (counts and offsets in it, here stale ones) is read for its shards only."""
    path = sharded.store.path
    top = json.loads((path / SHARDS_FILE).read_text(encoding="utf-8"))
    rows = [{**row, "first_document": 7, "first_entry": 9, "documents": 1, "entries": 2} for row in top["shards"]]
    (path / SHARDS_FILE).write_text(json.dumps({**top, "documents": 99, "entries": 1, "shards": rows}), "utf-8")
    store = ShardedDatastore(path)
    assert reader_counts(store) == true_counts(store) and store.n_documents == 5
    assert [row["first_document"] for row in store.manifest["shards"]] == [0, 3]
