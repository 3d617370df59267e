"""Adding or removing documents in place (atomic, resumable): `BertKNN.add_documents`/`remove_documents`, which
delegate to `bertknn.ingest.ingester.Writer`."""

from __future__ import annotations

import shutil
import sqlite3

import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn import BertKNN, DatastoreError
from bertknn.cli import app
from bertknn.cli import main as cli
from bertknn.index.faiss_index import FaissIndex
from bertknn.index.retrieval import TfidfIndex
from bertknn.ingest import builder
from bertknn.ingest import ingester as writer_module
from bertknn.ingest.ingester import Writer
from bertknn.store import atomic
from bertknn.store.datastore import Datastore
from bertknn.store.shards import ShardedDatastore
from bertknn.store.verify import verify
from bertknn.store.writer import DatastoreWriter
from bertknn.text import CorpusError
from tests.conftest import index_keys

from ..conftest import SMALL_DOCS, writable, write_corpus
from ..sharded_store import make_sharded

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
QUESTION, SUBJECT = "Zorblat Quenmire was born in [MASK] .", "Zorblat Quenmire"


def _answers(knn: BertKNN, retrieval: str) -> tuple[str, list[str]]:
    # the keys alone (no sentence weights): over the whole datastore (faiss) the sentences "X was born in Tallinn"
    # and "Y was born in Lisbon" read alike with the names out, and the tiny model's keys are what tell them apart
    p = knn.predict(QUESTION, subject=SUBJECT, retrieval=retrieval, top_k=3, sentence_temperature=0)
    return p.knn[0].token if p.knn else "", p.documents


@pytest.mark.parametrize("retrieval", ["ir", "faiss"])
def test_fresh_fact_answerable_after_add_and_gone_after_remove(built, retrieval):
    index_keys(built.store, "Flat")
    knn = writable(built.encoder, built.store)
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


@pytest.mark.parametrize("crash_at", ["embed", "ir_segment", "faiss", "publish"])
def test_a_crash_mid_add_leaves_the_old_state_and_a_rerun_completes(built, monkeypatch, crash_at):
    index_keys(built.store, "Flat")
    knn = writable(built.encoder, built.store)
    reference = knn.predict(QUESTION, subject=SUBJECT, top_k=3)
    targets = {
        "embed": (builder, "embed"),
        "ir_segment": (TfidfIndex, "save"),
        "faiss": (FaissIndex, "update"),
        "publish": (DatastoreWriter, "publish"),
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
    assert built.store.documents.states(["d1"]) == {"d1": "live"}


def test_a_store_made_before_the_commit_point_answers_unchanged_and_its_first_writer_commits_the_listing(built):
    """A datastore whose index parts were never committed (made before SQLite listed them) is read by its listing;
    the first write commits that listing, and what no list names is deleted only then."""
    index_keys(built.store, "Flat")
    built.add_documents([FRESH])  # a TF-IDF segment and a FAISS part beside the base ones
    reference = {r: built.predict(QUESTION, subject=SUBJECT, retrieval=r, top_k=3) for r in ("ir", "faiss")}
    path = built.store.path
    with sqlite3.connect(path / "store.sqlite") as db:  # as a datastore made before the commit point
        db.execute("DELETE FROM parts")
        db.execute("DELETE FROM meta WHERE key = 'parts'")
    (path / "tfidf_add_000000003").mkdir()  # a stray folder a merge would have replaced: not on the listing
    old = BertKNN.load(path, str(built.encoder.name))
    assert old.store.parts("tfidf") is None and old.store.parts("faiss") is None
    for retrieval, expected in reference.items():
        p = old.predict(QUESTION, subject=SUBJECT, retrieval=retrieval, top_k=3)
        assert [t.token for t in p.bert_knn] == [t.token for t in expected.bert_knn]
        assert p.documents == expected.documents
    old.add_documents([{"id": "n2", "title": "Quilla Varn", "text": "Quilla Varn was born in Oslo."}])
    assert [p.name for p in old.store.parts("tfidf")] == [".", "tfidf_add_000000005", "tfidf_add_000000006"]
    assert old.store.parts("faiss")[0].name == "faiss.index"
    assert not (path / "tfidf_add_000000003").exists()  # retired once the listing was committed
    assert _answers(old, "ir")[0] == _answers(old, "faiss")[0] == "tallinn"
    assert verify(path).problems == []


def test_keys_converted_to_a_codec_are_read_from_the_codes_and_take_adds_removes_and_faiss(built):
    path, size, dim = built.store.path, built.store.size, built.store.dim
    before = np.asarray(built.store.keys[:], np.float32)
    assert Writer(built.store).convert_keys("SQ8") == size
    reader = BertKNN.load(path, str(built.encoder.name))
    assert reader.store.manifest.key_codec == "SQ8" and reader.store.keys_file() == ("keys.codes", dim)
    assert not (path / "keys.f16").exists() and (path / "keys.codes").stat().st_size == size * dim
    step = (before.max(axis=0) - before.min(axis=0)) / 255  # SQ8, trained on every key of this small store
    assert (np.abs(reader.store.keys[np.arange(size)] - before) <= step / 2 + 1e-3).all()
    index_keys(reader.store, "Flat")  # FAISS reads the keys through the codec
    reader = BertKNN.load(path, str(built.encoder.name))
    added = reader.add_documents([FRESH])  # new keys encoded with the stored codec
    assert (path / "keys.codes").stat().st_size == (size + added) * dim
    assert _answers(reader, "ir")[0] == _answers(reader, "faiss")[0] == "tallinn"
    reader.remove_document("n1")
    assert _answers(reader, "ir")[0] != "tallinn"
    assert verify(path).problems == []
    assert Writer(reader.store).convert_keys("SQ8") == 0  # done already: nothing to do


def test_an_interrupted_conversion_leaves_float16_keys_and_a_rerun_gives_the_same_codes(built, tmp_path, monkeypatch):
    whole = shutil.copytree(built.store.path, tmp_path / "whole")
    with Datastore(whole) as store:
        Writer(store).convert_keys("SQ8")
    monkeypatch.setattr(writer_module, "CONVERT_CHUNK", 8)
    real, calls = atomic.append, []

    def dies(*args):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(*args)

    with monkeypatch.context() as patch:
        patch.setattr(atomic, "append", dies)
        with pytest.raises(KeyboardInterrupt):
            Writer(built.store).convert_keys("SQ8")
    reopened = BertKNN.load(built.store.path, str(built.encoder.name))
    assert reopened.store.manifest.key_codec == "float16" and _answers(reopened, "ir")[0] != "tallinn"
    assert Writer(reopened.store).convert_keys("SQ8") == reopened.store.size - 8  # goes on after the first chunk
    assert (built.store.path / "keys.codes").read_bytes() == (whole / "keys.codes").read_bytes()
    assert verify(built.store.path).problems == []


@pytest.mark.parametrize("name", ["keys.codes", "keys.codec"])
def test_damage_to_compressed_keys_is_named_on_opening_and_by_verify(built, name):
    Writer(built.store).convert_keys("SQ8")
    path = built.store.path / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(DatastoreError, match=name):
        BertKNN.load(built.store.path, str(built.encoder.name))
    assert any(name in problem for problem in verify(built.store.path).problems)


def test_a_sharded_store_converts_shard_by_shard_and_reads_the_codes_as_one(tmp_path, encoder):
    path = make_sharded(tmp_path / "sharded", encoder, [SMALL_DOCS[:3], SMALL_DOCS[3:]])
    store = ShardedDatastore(path)
    before = np.asarray(store.keys[np.arange(store.size)], np.float32)
    assert Writer(store).convert_keys("SQ8") == store.size
    assert [s.manifest.key_codec for s in store.shards] == ["SQ8", "SQ8"] and all(s.codec for s in store.shards)
    after = ShardedDatastore(path).keys[np.arange(store.size)]
    for shard, first in zip(store.shards, store.entry_starts[:-1]):  # each shard's codec, trained on its own keys
        mine = before[first : first + shard.size]
        step = (mine.max(axis=0) - mine.min(axis=0)) / 255
        assert (np.abs(after[first : first + shard.size] - mine) <= step / 2 + 1e-3).all()
    reader = BertKNN(encoder, ShardedDatastore(path))
    assert reader.predict("Quellbrook is a town in [MASK] .", top_k=3).knn
    assert all(verify(shard.path).problems == [] for shard in store.shards)
