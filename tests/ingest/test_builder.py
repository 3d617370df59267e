"""Builder stage (src/bertknn/ingest/builder.py): contents against direct computation, resumable builds, packing, key
dtype, the model check and refusals."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from bertknn.ingest import builder
from bertknn.model.encoder import Encoder
from bertknn.store.datastore import Datastore, DatastoreError, read_committed
from bertknn.store.writer import DatastoreWriter
from bertknn.store.writers import open_writer
from bertknn.text import CorpusError, iter_corpus, split_sentences, tokenize_sentences

from ..conftest import SMALL_DOCS, write_corpus
from ..store.test_datastore import _tables, assert_same_store

KEY_ATOL = 5e-3  # keys are stored as float16: ~1e-3 relative error on values of magnitude <= 4


def test_entry_count_equals_eligible_targets(tmp_path, small_corpus, encoder, tokenizer):
    store = builder.build(small_corpus, tmp_path / "s", encoder)
    sentences = [s for d in iter_corpus(small_corpus) for p in d.passages for s in split_sentences(p)]
    expected = sum(len(s.positions) for s in tokenize_sentences(tokenizer, sentences))
    assert store.size == expected > 30
    assert store.n_documents == 5 and store.manifest.complete
    manifest = read_committed(tmp_path / "s")  # the counts are committed to SQLite, over manifest.json's
    assert manifest["entries"] == expected and manifest["dtype"] == "float16" and manifest["layer"] == 3
    assert (tmp_path / "s" / "keys.f16").stat().st_size == expected * 32 * 2


def test_every_key_is_the_layer_state_of_its_masked_sentence(tmp_path, small_corpus, encoder, tokenizer):
    store = builder.build(small_corpus, tmp_path / "s", encoder)
    for entry in range(store.size):
        (ev,) = store.documents.provenance([entry])
        enc = tokenizer(ev.sentence, return_offsets_mapping=True)
        inside = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if ev.span[0] <= a < b <= ev.span[1]]
        pos, pieces = inside[0], [enc["input_ids"][i] for i in inside]
        value = int(store.values[entry])  # the word's own token, or its number in the lexicon
        assert (
            [value] == pieces
            if len(pieces) == 1
            else store.lexicon.words([value])[value][0] == " ".join(map(str, pieces))
        )
        ids = torch.tensor([[*enc["input_ids"][:pos], tokenizer.mask_token_id, *enc["input_ids"][inside[-1] + 1 :]]])
        with torch.no_grad():
            states = encoder.model(input_ids=ids, output_hidden_states=True).hidden_states
        np.testing.assert_allclose(store.keys[entry].astype(np.float32), states[3][0, pos].numpy(), atol=KEY_ATOL)


def test_crash_between_keys_and_commit_resumes_exactly(tmp_path, encoder, monkeypatch):
    corpus = write_corpus(tmp_path / "c.jsonl", SMALL_DOCS * 1 + [dict(d, id=d["id"] + "b") for d in SMALL_DOCS])
    builder.build(corpus, tmp_path / "clean", encoder, chunk_entries=8)
    calls = {"n": 0}
    real = DatastoreWriter._commit_entries

    def crash_on_third(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed after writing keys, before the commit")
        return real(self, *args)

    monkeypatch.setattr(DatastoreWriter, "_commit_entries", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        builder.build(corpus, tmp_path / "resumed", encoder, chunk_entries=8)
    partial = Datastore(tmp_path / "resumed")
    assert not partial.manifest.complete and partial.size > 0
    assert (tmp_path / "resumed" / "keys.f16").stat().st_size > partial.size * 64  # uncommitted bytes are ignored
    monkeypatch.setattr(DatastoreWriter, "_commit_entries", real)
    builder.build(corpus, tmp_path / "resumed", encoder, chunk_entries=8)
    assert_same_store(tmp_path / "clean", tmp_path / "resumed")


BUILD_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
from bertknn.ingest import builder
from bertknn.store import datastore as ds
from bertknn.model.encoder import Encoder
builder.build(sys.argv[1], sys.argv[2], Encoder.load(sys.argv[3]), chunk_entries=8,
         progress=lambda phase, done, n: time.sleep(0.3))
"""


def test_kill_9_mid_build_then_rerun_equals_uninterrupted_build(tmp_path, tiny_model_dir, encoder):
    docs = [dict(d, id=f"{d['id']}-{i}") for i in range(3) for d in SMALL_DOCS]
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    builder.build(corpus, tmp_path / "clean", encoder, chunk_entries=8)
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(corpus), str(out), str(tiny_model_dir)])
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if Datastore(out).size > 0:
                break
        except (DatastoreError, sqlite3.Error, FileNotFoundError):
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not Datastore(out).manifest.complete
    builder.build(corpus, out, encoder, chunk_entries=8)
    assert_same_store(tmp_path / "clean", out)


def test_malformed_corpus_writes_nothing(tmp_path, encoder):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "Lisbon is big."}\n{"id": "b", "title": \n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: not valid JSON"):
        builder.build(corpus, tmp_path / "out", encoder)
    assert not (tmp_path / "out").exists()
    corpus.write_text("\n\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="the corpus is empty"):
        builder.build(corpus, tmp_path / "out", encoder)
    assert not (tmp_path / "out").exists()


def test_refuses_another_model_or_layer(tmp_path, small_corpus, encoder, tiny_model_dir, tokenizer):
    store = builder.build(small_corpus, tmp_path / "s", encoder)
    other = Encoder(type(encoder.model)(encoder.model.config), tokenizer, "other-random-bert")
    with pytest.raises(DatastoreError, match=r"was built with model .* but the given model 'other-random-bert'"):
        builder.check_encoder(store, other)
    with pytest.raises(DatastoreError, match="holds layer-3 keys, but the model reads layer 2"):
        builder.check_encoder(store, Encoder.load(str(tiny_model_dir), layer=2))
    with pytest.raises(DatastoreError, match="was built with model"):
        builder.build(small_corpus, tmp_path / "s", other)


def test_another_corpus_in_the_same_directory_is_refused(tmp_path, small_corpus, encoder):
    builder.build(small_corpus, tmp_path / "s", encoder)
    other = write_corpus(tmp_path / "other.jsonl", SMALL_DOCS[:2])
    with pytest.raises(DatastoreError, match="another corpus"):
        builder.build(other, tmp_path / "s", encoder)


def test_copied_registration_serves_another_layer(tmp_path, small_corpus, encoder, tiny_model_dir):
    builder.build(small_corpus, tmp_path / "l3", encoder)
    layer2 = Encoder.load(str(tiny_model_dir), layer=2)
    copied = builder.copy_registration(tmp_path / "l3", tmp_path / "l2", layer2)
    assert copied.size == 0 and copied.documents.pending() == [0, 1, 2, 3, 4] and copied.manifest.layer == 2
    assert _tables(tmp_path / "l3")["sentences"] == _tables(tmp_path / "l2")["sentences"]
    builder.build(small_corpus, tmp_path / "fresh2", layer2)
    resumed = builder.build(small_corpus, tmp_path / "l2", layer2)  # registration found complete: only embedding runs
    assert resumed.manifest.complete
    assert_same_store(tmp_path / "fresh2", tmp_path / "l2")


def test_pack_is_recorded_used_and_must_match_on_resume(tmp_path, small_corpus, encoder, tokenizer):
    store = builder.build(small_corpus, tmp_path / "p", encoder, pack=2)
    assert store.manifest.pack == 2 and json.loads((tmp_path / "p" / "manifest.json").read_text())["pack"] == 2
    sentences = [s for d in iter_corpus(small_corpus) for p in d.passages for s in split_sentences(p)]
    expected = encoder.embed(tokenize_sentences(tokenizer, sentences), pack=2)
    np.testing.assert_allclose(store.keys.astype(np.float32), expected, atol=KEY_ATOL)
    with pytest.raises(DatastoreError, match=r"keys computed with pack=2; resume it with the same --pack"):
        builder.build(small_corpus, tmp_path / "p", encoder)


def test_int8_keys_are_recorded_follow_the_store_on_add_and_must_match_on_resume(
    tmp_path, small_corpus, encoder, tokenizer
):
    from bertknn.query.pipeline import BertKNN

    knn = BertKNN.build(small_corpus, tmp_path / "q", encoder, int8_keys=True)
    store = knn.store
    assert store.manifest.int8_keys and json.loads((tmp_path / "q" / "manifest.json").read_text())["int8"] is True
    sentences = [s for d in iter_corpus(small_corpus) for p in d.passages for s in split_sentences(p)]
    flat = tokenize_sentences(tokenizer, sentences)
    int8, exact = encoder.embed(flat, int8_keys=True), encoder.embed(flat)
    np.testing.assert_allclose(store.keys.astype(np.float32), int8, atol=KEY_ATOL)
    cosine = (int8 * exact).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(exact, axis=1)
    assert cosine.min() > 0.95 and not np.allclose(int8, exact, atol=1e-3)  # close to float32, not equal
    size = store.size
    knn.add_documents([{"id": "n1", "title": "Tallinn", "text": "Tallinn is a port city."}])
    added = encoder.embed(tokenize_sentences(tokenizer, ["Tallinn is a port city."]), int8_keys=True)
    np.testing.assert_allclose(store.keys[size:].astype(np.float32), added, atol=KEY_ATOL)  # add follows the store
    with pytest.raises(DatastoreError, match=r"holds int8 keys; resume it with --int8-keys"):
        builder.build(small_corpus, tmp_path / "q", encoder)
    builder.build(small_corpus, tmp_path / "f", encoder)
    with pytest.raises(DatastoreError, match=r"holds float32 keys; resume it without --int8-keys"):
        builder.build(small_corpus, tmp_path / "f", encoder, int8_keys=True)


def test_worker_processes_register_and_index_exactly_as_one_process(tmp_path, encoder, monkeypatch):
    from bertknn.index.retrieval import TfidfIndex
    from bertknn.ingest import workers
    from bertknn.query.pipeline import BertKNN

    docs = [
        {
            "id": f"w{i}",
            "title": f"Town {i}",
            "text": f"Town {i} lies in Norway. It was founded in {1000 + i}. Dr. Lund lived there.",
        }
        for i in range(450)  # three batches of workers.BATCH documents
    ]
    corpus = write_corpus(tmp_path / "towns.jsonl", docs)
    one = BertKNN.build(corpus, tmp_path / "one", encoder, lazy=True, n_workers=1)
    monkeypatch.setattr(builder, "SLOW_SPLITTERS", {"sentencex"})  # its sentences split in the workers too
    two = BertKNN.build(corpus, tmp_path / "two", encoder, lazy=True, n_workers=2)
    for table in ("documents", "sentences"):
        query = f"SELECT * FROM {table} ORDER BY idx"
        assert one.store.db.execute(query).fetchall() == two.store.db.execute(query).fetchall()
    a, b = TfidfIndex.load(one.store), TfidfIndex.load(two.store)
    assert a.n_docs == b.n_docs == 450
    for sa, sb in zip(a.segments, b.segments, strict=True):
        for name in ("hashes", "indptr", "docs", "logtf"):
            np.testing.assert_array_equal(getattr(sa, name), getattr(sb, name))
    assert workers.count(0, 10) == 1 and workers.count(3, 10) == 3
    with pytest.raises(ValueError, match="workers must be >= 0"):
        workers.count(-1)


def test_embedding_with_the_next_chunk_tokenized_ahead_gives_the_same_store(tmp_path, encoder):
    """The GPU's read-ahead (`prefetch`), run on CPU: chunk for chunk the same keys, entries and commits."""
    corpus = write_corpus(tmp_path / "c.jsonl", SMALL_DOCS + [dict(d, id=d["id"] + "b") for d in SMALL_DOCS])
    stores = {}
    for prefetch in (False, True):
        store = builder.build(corpus, tmp_path / f"p{prefetch}", encoder, lazy=True)
        seen = []
        with open_writer(store) as writer:
            added = builder.embed(
                writer.store,
                store.documents.pending(),
                encoder,
                chunk_entries=8,
                progress=seen.append,
                prefetch=prefetch,
            )
        store.reopen_if_changed()
        assert added == store.size > 0 and len(seen) > 2
        stores[prefetch] = seen
    assert stores[False] == stores[True]
    assert_same_store(tmp_path / "pFalse", tmp_path / "pTrue")
