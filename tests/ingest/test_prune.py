"""Pruning (ingest/prune.py): the greedy merge against a brute force, a pruned copy's entries, counts, keys, provenance
and vote, adds and removes on it, a resumed pruning, compressed and sharded stores, damage, the CLI and its refusals,
the service."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn import BertKNN, DatastoreError
from bertknn.cli import app
from bertknn.ingest import prune as prune_module
from bertknn.ingest.prune import merge, prune
from bertknn.query.knn import knn_distribution, vote
from bertknn.query.settings import PAPER
from bertknn.store.datastore import Datastore
from bertknn.store.shards import ShardedDatastore
from bertknn.store.verify import verify

from ..conftest import SMALL_DOCS, writable, write_corpus
from ..sharded_store import make_sharded
from ..tolerances import assert_ranking_close

QUESTION = "Quellbrook is a town in [MASK] ."
REPEATING = [  # documents that use their words more than once: what pruning merges
    *SMALL_DOCS,
    {
        "id": "r1",
        "title": "Quellbrook harbour",
        "text": "The harbour of Quellbrook is in Norway. The harbour is old. Ships from Norway use the harbour of the "
        "town. The town is in Norway and the town is small.",
    },
    {"id": "r2", "title": "Orsk", "text": "Orsk is a town. Orsk is a town in Russia. Orsk lies in Russia, by a river."},
]
FRESH = {"id": "n1", "title": "Veltmark", "text": "Veltmark is a town in Estonia. Veltmark lies near Tallinn."}


def _brute_merge(keys, values, counts, radius):
    """The rule written out: entries in order; one not merged yet is kept and takes in every later unmerged entry of
    its value within `radius` (squared L2); its key becomes the count-weighted mean of the keys it took in."""
    merged, members = [False] * len(values), {i: [i] for i in range(len(values))}
    for i in range(len(values)):
        if merged[i]:
            continue
        for j in range(i + 1, len(values)):
            if not merged[j] and values[j] == values[i] and float(np.sum((keys[i] - keys[j]) ** 2)) <= radius:
                merged[j] = True
                members[i].append(j)
    kept = [i for i in range(len(values)) if not merged[i]]
    total = [sum(int(counts[j]) for j in members[i]) for i in kept]
    means = [sum(keys[j].astype(np.float64) * counts[j] for j in members[i]) / n for i, n in zip(kept, total)]
    return kept, total, np.array(means)


@pytest.mark.parametrize("radius", [0.0, 0.5, 2.0, np.inf])
def test_merge_equals_the_rule_written_out(radius):
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(6, 8)).astype(np.float32)
    which = rng.integers(0, 6, 300)
    keys = centres[which] + rng.normal(scale=0.3, size=(300, 8)).astype(np.float32)
    keys[10] = keys[3]  # an exact duplicate: merged even at radius 0 when the values agree
    values = (which % 3 + 100 * (rng.random(300) < 0.2)).astype(np.int32)
    counts = rng.integers(1, 4, 300)
    kept, total, means = merge(keys, values, counts, radius)
    want_kept, want_total, want_means = _brute_merge(keys, values, counts, radius)
    assert kept.tolist() == want_kept and total.tolist() == want_total
    assert np.allclose(means, want_means, atol=1e-5)
    assert np.array_equal(means[total == counts[kept]], keys[kept][total == counts[kept]])  # alone: its own key
    assert total.sum() == counts.sum()  # every context is still counted once
    if radius == np.inf:  # one entry per value is left
        assert len(kept) == len(np.unique(values))


@pytest.fixture()
def built(tmp_path, encoder):
    """A BertKNN over documents that repeat their words, with the tiny BERT."""
    return BertKNN.build(write_corpus(tmp_path / "repeating.jsonl", REPEATING), tmp_path / "store", encoder)


def _entries(store):
    return [(p.doc_id, p.sentence, p.span) for p in store.documents.provenance(list(range(store.size)))]


def test_a_pruned_copy_keeps_each_document_s_first_entries_with_their_provenance_and_counts(built, tmp_path):
    src = built.store
    pruned = prune(src.path, tmp_path / "pruned", np.inf)  # every document keeps one entry per word
    assert pruned.manifest["status"] == "complete" and pruned.manifest.pruned == {
        "radius": np.inf,
        "from_entries": src.size,
    }
    source_rows, kept, means = _entries(src), [], []
    for a, b in src.documents.ranges(list(range(src.n_documents))):
        values = np.asarray(src.values[a:b])
        rows, counts, mean = merge(np.asarray(src.keys[a:b], np.float32), values, np.ones(b - a, int), np.inf)
        kept += [(a + r, c) for r, c in zip(rows.tolist(), counts.tolist())]
        means.append(mean)
    assert pruned.size == len(kept) < src.size
    assert _entries(pruned) == [source_rows[e] for e, _ in kept]
    assert pruned.counts_of(np.arange(pruned.size)).tolist() == [c for _, c in kept]
    assert [p.count for p in pruned.documents.provenance([0, 1])] == [c for _, c in kept[:2]]
    assert np.array_equal(pruned.values[:], src.values[[e for e, _ in kept]])
    assert np.array_equal(pruned.keys[:], np.concatenate(means).astype(np.float16))  # each the mean of its group
    assert verify(pruned.path).problems == [] and src.size == Datastore(src.path).size  # the source unchanged


def test_a_pruned_store_votes_with_its_counts(built, tmp_path):
    pruned = BertKNN(built.encoder, prune(built.store.path, tmp_path / "pruned", np.inf))
    s = PAPER.replace(k=64)
    prediction = pruned.predict(QUESTION, top_k=5, evidence=3, settings=s)
    found = prediction.neighbours
    counts = pruned.store.counts_of(found.entries)
    assert counts.max() > 1  # the question meets merged entries
    words = pruned.words(found)
    want = knn_distribution(words.index(found.values), found.distances, s.temperature, words.size, np.log(counts))
    assert np.allclose(vote(pruned.store, found, s, words), want)
    shown = [n for ns in prediction.evidence.values() for n in ns]
    by_distance = {float(d): int(c) for d, c in zip(found.distances, counts)}
    assert shown and all(n.count == by_distance[n.distance] for n in shown)


def test_a_radius_of_zero_keeps_distinct_keys_and_answers_as_the_source(built, tmp_path):
    pruned = BertKNN(built.encoder, prune(built.store.path, tmp_path / "pruned", 0.0))
    keys, values = np.asarray(built.store.keys[:], np.float32), built.store.values[:]
    ranges = built.store.documents.ranges(list(range(built.store.n_documents)))
    distinct = sum(len({(keys[e].tobytes(), int(values[e])) for e in range(a, b)}) for a, b in ranges)
    assert pruned.store.size == distinct  # only a document's repeats of one context with one word merge
    a, b = built.predict(QUESTION, top_k=5), pruned.predict(QUESTION, top_k=5)
    # the same keys searched in a store of another size (BLAS blocks otherwise): the model's tolerance
    assert_ranking_close([(w.token, w.probability) for w in a.bert_knn], [(w.token, w.probability) for w in b.bert_knn])


def test_adds_and_removes_on_a_pruned_store(built, tmp_path):
    path = tmp_path / "pruned"
    prune(built.store.path, path, np.inf).close()
    reader = writable(built.encoder, Datastore(path))
    size = reader.store.size
    added = reader.add_documents([FRESH])
    assert reader.store.size == size + added
    assert reader.store.counts_of(np.arange(size, size + added)).tolist() == [1] * added  # an add keeps every context
    assert (path / "counts.i32").stat().st_size == 4 * (size + added)
    assert reader.predict("Veltmark is a town in [MASK] .", subject="Veltmark", top_k=3).knn[0].token == "estonia"
    reader.remove_document("n1")
    assert reader.predict("Veltmark is a town in [MASK] .", subject="Veltmark", top_k=3).documents != ["Veltmark"]
    assert verify(path).problems == []
    again = prune(path, tmp_path / "again", np.inf)  # a removed document keeps no entries; the rest prune to itself
    assert again.size == size and again.counts_of(np.arange(size)).tolist() == reader.store.counts[:size].tolist()


def test_an_interrupted_pruning_goes_on_to_the_same_files(built, tmp_path, monkeypatch):
    whole = prune(built.store.path, tmp_path / "whole", 4.0)
    monkeypatch.setattr(prune_module, "CHUNK_ENTRIES", 8)
    real, calls = prune_module._copy_chunk, []

    def dies(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(prune_module, "_copy_chunk", dies)
    with pytest.raises(KeyboardInterrupt):
        prune(built.store.path, tmp_path / "resumed", 4.0)
    half = Datastore(tmp_path / "resumed")
    assert half.manifest["status"] == "building" and 0 < half.size < whole.size
    monkeypatch.setattr(prune_module, "_copy_chunk", real)
    done = prune(built.store.path, tmp_path / "resumed", 4.0)
    for name in ("keys.f16", "values.i32", "counts.i32"):
        assert (done.path / name).read_bytes() == (whole.path / name).read_bytes()
    assert _entries(done) == _entries(whole) and done.manifest["status"] == "complete"
    with pytest.raises(DatastoreError, match="another datastore"):  # another radius into the same place
        prune(built.store.path, tmp_path / "resumed", 8.0)


def test_a_compressed_store_prunes_into_codes_of_the_same_codec(built, tmp_path):
    from bertknn.ingest.ingester import Writer

    Writer(built.store).convert_keys("SQ8")
    pruned = prune(built.store.path, tmp_path / "pruned", np.inf)
    assert (
        pruned.manifest.key_codec == "SQ8" and (pruned.path / "keys.codes").stat().st_size == pruned.size * pruned.dim
    )
    assert verify(pruned.path).problems == []


def test_a_sharded_store_prunes_shard_by_shard(tmp_path, encoder):
    path = make_sharded(tmp_path / "sharded", encoder, [SMALL_DOCS[:3], SMALL_DOCS[3:]])
    source = ShardedDatastore(path)
    pruned = prune(path, tmp_path / "pruned", np.inf)
    assert isinstance(pruned, ShardedDatastore) and len(pruned.shards) == 2
    assert [s.size for s in pruned.shards] == [
        prune(s.path, tmp_path / f"alone{i}", np.inf).size for i, s in enumerate(source.shards)
    ]
    assert pruned.counts_of(np.arange(pruned.size)).sum() == source.size
    assert ShardedDatastore(tmp_path / "pruned").size == pruned.size  # shards.json counts the pruned shards
    assert BertKNN(encoder, pruned).predict(QUESTION, top_k=3).knn


def test_damage_to_the_counts_is_named_on_opening_and_by_verify(built, tmp_path):
    path = prune(built.store.path, tmp_path / "pruned", np.inf).path
    data = bytearray((path / "counts.i32").read_bytes())
    data[len(data) // 2] ^= 0x40
    (path / "counts.i32").write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match=r"counts\.i32"):
        BertKNN.load(path, str(built.encoder.name))
    assert any("counts.i32" in problem for problem in verify(path).problems)


def test_cli_prune_and_its_refusals(built, tmp_path):
    runner, src = CliRunner(), str(built.store.path)
    done = runner.invoke(app, ["prune", src, str(tmp_path / "pruned"), "--radius", "inf"])
    assert done.exit_code == 0, done.output
    kept = Datastore(tmp_path / "pruned").size
    assert f"{kept:,} entries of {built.store.size:,}" in " ".join(done.output.split())
    refused = runner.invoke(app, ["prune", src, str(tmp_path / "other"), "--radius", "-1"])
    assert refused.exit_code == 2 and not (tmp_path / "other").exists()
    refused = runner.invoke(app, ["prune", src, str(tmp_path / "pruned"), "--radius", "3"])
    assert refused.exit_code == 2 and "another datastore" in refused.output


def test_the_service_answers_from_a_pruned_store_with_the_counts_in_its_evidence(built, tmp_path):
    from fastapi.testclient import TestClient

    from bertknn.serving.service import create_app

    reader = BertKNN(built.encoder, prune(built.store.path, tmp_path / "pruned", np.inf))
    want = reader.predict(QUESTION, top_k=5, evidence=3, link=False)  # TF-IDF's documents: merged contexts among them
    with TestClient(create_app(reader), base_url="http://localhost") as client:
        body = {"text": QUESTION, "top_k": 5, "evidence": 3, "options": {"link": False}}
        response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    shown = [n for ns in response.json()["evidence"].values() for n in ns]
    assert [n["count"] for n in shown] == [n.count for ns in want.evidence.values() for n in ns]
    assert any(n["count"] > 1 for n in shown)


def test_verify_names_a_count_under_one_even_with_its_checksum_recorded_again(built, tmp_path):
    from bertknn.store.verify import record_checksums

    path = prune(built.store.path, tmp_path / "pruned", np.inf).path
    counts = np.fromfile(path / "counts.i32", np.int32)
    counts[3] = 0
    counts.tofile(path / "counts.i32")
    record_checksums(path)  # the checksums agree: only the check of the values themselves can see it
    assert any("counts.i32: entries [3] stand for fewer than one context" in p for p in verify(path).problems)
