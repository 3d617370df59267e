"""The datastore's promises: nothing bricks it, reruns finish the job, one writer at a time, damage is found."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn import BertKNN, DatastoreError
from bertknn.cli import app
from bertknn.ingest import builder
from bertknn.query.settings import PAPER
from bertknn.store import verify as checks
from bertknn.store.datastore import Datastore, read_committed
from bertknn.store.writer import DatastoreWriter
from bertknn.store.writers import open_writer
from tests.conftest import held_elsewhere, index_keys

from ..conftest import writable, write_corpus

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
QUESTION, SUBJECT = "Zorblat Quenmire was born in [MASK] .", "Zorblat Quenmire"
STOPWORDS_ONLY = {"id": "it-1", "title": "It", "text": "It is what it is."}


def _top(knn: BertKNN, retrieval: str = "ir") -> str:
    # the keys alone (no sentence weights): over the whole datastore (faiss) the sentences "X was born in Tallinn"
    # and "Y was born in Lisbon" read alike with the names out, and the tiny model's keys are what tell them apart
    return knn.predict(QUESTION, subject=SUBJECT, top_k=1, retrieval=retrieval, sentence_temperature=0).knn[0].token


def test_a_document_without_targets_does_not_brick_the_store(built):
    # the paper's vote: the retrieval-aware one moves with the IDF that any added document changes
    built.settings = PAPER
    reference = built.predict("Dante was born in [MASK] .", top_k=3)
    assert built.add_documents([STOPWORDS_ONLY]) == 0
    for knn in (built, BertKNN.load(built.store.path, str(built.encoder.name), settings=PAPER)):
        assert knn.predict("Dante was born in [MASK] .", top_k=3).bert_knn == reference.bert_knn
        assert knn.predict("It is [MASK] .", top_k=3).bert  # a question whose IR query is all stopwords
    built.remove_document("it-1")
    assert built.predict("Dante was born in [MASK] .", top_k=3).bert_knn == reference.bert_knn


def test_a_corpus_of_stopwords_builds_and_answers(tmp_path, encoder):
    corpus = write_corpus(tmp_path / "c.jsonl", [STOPWORDS_ONLY, {"id": "it-2", "title": "Was", "text": "Was it?"}])
    knn = BertKNN.build(corpus, tmp_path / "s", encoder)
    assert knn.store.size == 0 and knn.store.manifest.complete
    prediction = knn.predict("It is [MASK] .", top_k=3)
    assert prediction.knn == [] and len(prediction.bert) == 3


def test_an_id_that_looks_like_a_removed_one_does_not_block_removal(built):
    built.add_documents([{**FRESH, "id": "d1#removed-0"}])
    built.remove_document("d1")
    built.remove_document("d1#removed-0")
    assert built.store.documents.states(["d1", "d1#removed-0"]) == {}
    built.add_documents([{**FRESH, "id": "d1"}])  # both ids are free again
    assert _top(built) == "tallinn"


def test_removing_several_ids_is_all_or_nothing_and_a_rerun_finishes(built):
    with pytest.raises(DatastoreError, match=r"no document with id 'nope'.*nothing was removed"):
        built.remove_documents(["d1", "nope"])
    assert built.store.documents.states(["d1"]) == {"d1": "live"}
    assert built.remove_documents(["d1", "d2"]) == (["d1", "d2"], [])
    assert built.remove_documents(["d1", "d2"]) == ([], ["d1", "d2"])  # the same command again: nothing left to do
    assert built.store.documents.count_live() == 3


def test_a_killed_add_rerun_with_corrected_text_keeps_the_new_text(built, monkeypatch):
    wrong = {**FRESH, "text": "Zorblat Quenmire was born in Oslo. He sells boats."}
    with monkeypatch.context() as patch:
        patch.setattr(DatastoreWriter, "publish", lambda self, **parts: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            built.add_documents([wrong])
    rerun = BertKNN.load(built.store.path, str(built.encoder.name))
    rerun.add_documents([FRESH], skip_existing=True)
    assert _top(rerun) == "tallinn"
    evidence = rerun.predict(QUESTION, subject=SUBJECT, top_k=1).evidence["tallinn"]
    assert all("Oslo" not in n.sentence for n in evidence)
    manifest = read_committed(built.store.path)  # manifest.json with the fields committed since over it
    assert manifest["embedded"] == manifest["documents"] == rerun.store.n_documents
    assert manifest["entries"] == rerun.store.size


def test_adding_other_text_under_a_live_id_is_refused(built):
    built.add_documents([FRESH])
    assert built.add_documents([FRESH], skip_existing=True) == 0  # the same document again: nothing to do
    with pytest.raises(DatastoreError, match=r"\['n1'\] are in .* with other text; remove them first"):
        built.add_documents([{**FRESH, "text": "Zorblat Quenmire was born in Oslo."}], skip_existing=True)


def test_a_build_killed_before_its_first_manifest_resumes(tmp_path, small_corpus, encoder):
    out = tmp_path / "s"
    out.mkdir()
    (out / "manifest.tmp").write_text('{"format": "bertk')  # what a kill during the first manifest write leaves
    store = builder.build(small_corpus, out, encoder)
    assert store.manifest.complete and store.n_documents == 5


def test_a_build_that_registered_nothing_accepts_a_corrected_corpus(tmp_path, small_corpus, encoder):
    builder.create(tmp_path / "s", encoder, {"path": "bad.jsonl", "sha256": "0" * 64, "documents": 5})
    assert builder.build(small_corpus, tmp_path / "s", encoder).manifest.complete


def test_build_into_a_file_is_refused(tmp_path, small_corpus, encoder):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(DatastoreError, match="is a file, not a directory"):
        builder.build(small_corpus, target, encoder)


def test_one_writer_at_a_time(built, tmp_path):
    path = built.store.path
    busy = pytest.raises(DatastoreError, match=r"being written by pid \d+.*one writer at a time")
    with held_elsewhere(path), busy:  # another process's writer
        open_writer(path)
    with open_writer(path) as writer:  # free again once the other writer is done
        writer.remove(["d1"])
    more = write_corpus(tmp_path / "more.jsonl", [FRESH])
    add = ["add", str(path), str(more), "--backend", "torch", "--threads", "1"]
    with held_elsewhere(path):
        result = CliRunner().invoke(app, [*add, "--wait", "0.2"])
    assert result.exit_code == 2 and "one writer at a time" in result.output.replace("\n", " ")
    assert "waiting up to 0.2 s for pid" in result.output
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with held_elsewhere(path):
            holding.set()
            release.wait(60)

    writer = threading.Thread(target=hold)
    writer.start()
    assert holding.wait(60)
    threading.Timer(0.5, release.set).start()
    result = CliRunner().invoke(app, add)  # waits (up to 60 s by default) for the other writer to finish
    writer.join(60)
    assert result.exit_code == 0 and "added 1 documents" in result.output, result.output


def test_a_reader_takes_in_another_process_commits(built, tmp_path):
    writer = BertKNN.load(built.store.path, str(built.encoder.name))
    index_keys(writer.store, "Flat")
    writer.add_documents([FRESH])
    assert built.refresh() and built.faiss is not None
    assert _top(built) == "tallinn" and _top(built, "faiss") == "tallinn"
    built.add_documents([{"id": "n2", "title": "Ruxana Pell", "text": "Ruxana Pell was born in Riga."}])  # no clash
    writer.remove_documents(["n1"])
    built.refresh()
    assert "Zorblat Quenmire" not in built.predict(QUESTION, subject=SUBJECT).documents
    assert not built.refresh()  # nothing new


def _damage(path, offset: int, data: bytes) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)


@pytest.fixture()
def indexed(built):
    index_keys(built.store, "Flat")
    built.add_documents([FRESH])
    return built.store.path


@pytest.mark.parametrize(
    ("name", "how", "message"),
    [
        ("keys.f16", "flip", "keys.f16 block 0 .*checksum mismatch"),
        ("values.i32", "value", "values.i32 block 0 .*checksum mismatch"),
        ("store.sqlite", "zero-page", "store.sqlite"),
        ("store.sqlite", "zero-last-page", "store.sqlite"),
        ("store.sqlite", "truncate", "store.sqlite"),
        ("tfidf_logtf.npy", "flip", "tfidf_logtf.npy"),
        ("keys.f16", "truncate", "keys.f16"),
        ("manifest.json", "layer", "says layer = 2 but store.sqlite records 3"),
        ("manifest.json", "no-dim", "field 'dim' is missing"),
        ("manifest.json", "garbage", "manifest.json is damaged"),
        ("checksums.json", "garbage", "checksums.json is damaged"),
        ("checksums.json", "delete", "checksums.json: missing, though the datastore had checksums"),
        ("store.sqlite", "delete", "store.sqlite is missing or empty"),
        ("store.sqlite", "append", r"store.sqlite: [\d,]+ bytes, [\d,]+ recorded"),
        ("tfidf_docs.npy", "append", r"tfidf_docs.npy: [\d,]+ bytes, [\d,]+ recorded"),
    ],
)
def test_damage_is_found_when_the_store_is_opened_and_by_verify(indexed, tmp_path, name, how, message):
    store = shutil.copytree(indexed, tmp_path / "copy")
    file = store / name
    size = file.stat().st_size
    if how == "flip":
        _damage(file, size // 2, bytes([file.read_bytes()[size // 2] ^ 0x10]))
    elif how == "value":
        _damage(file, 8, np.int32(2000).tobytes())  # another word, inside the vocabulary
    elif how == "zero-page":
        _damage(file, 4096, bytes(4096))
    elif how == "zero-last-page":
        _damage(file, size - 4096, bytes(4096))
    elif how == "truncate":
        file.write_bytes(file.read_bytes()[: size // 2])
    elif how == "garbage":
        file.write_text("{not json")
    elif how == "delete":
        file.unlink()
    elif how == "append":
        with file.open("ab") as handle:
            handle.write(b"junk")
    else:
        manifest = json.loads(file.read_text())
        if how == "layer":
            manifest["layer"] = 2
        else:
            del manifest["dim"]
        file.write_text(json.dumps(manifest))
    with pytest.raises(DatastoreError, match=message):
        BertKNN.load(store).predict(QUESTION, subject=SUBJECT)
    result = CliRunner().invoke(app, ["verify", str(store)])
    assert result.exit_code == 1 and name in result.output.replace("\n", "")
    result = CliRunner().invoke(app, ["ask", str(store), QUESTION, "--backend", "torch", "--threads", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output and "error:" in result.output


def test_damaged_faiss_leaves_ir_questions_working(indexed, built):
    reference = _top(built)
    faiss_file = indexed / "faiss.index"
    faiss_file.write_bytes(faiss_file.read_bytes()[:100])
    knn = BertKNN.load(indexed, str(built.encoder.name))
    assert _top(knn) == reference
    with pytest.raises(DatastoreError, match=r"faiss.index is damaged.*`bertknn repair .*` rebuilds the FAISS index"):
        _top(knn, "faiss")
    faiss_file.unlink()
    with pytest.raises(DatastoreError, match=r"faiss.index is missing"):
        _top(BertKNN.load(indexed, str(built.encoder.name)), "faiss")


def test_verify_reports_the_damaged_block_and_passes_a_sound_store(built, tmp_path, monkeypatch):
    monkeypatch.setattr("bertknn.store.integrity.BLOCK", 256)  # many blocks in a small store
    path = tmp_path / "s"
    shutil.copytree(built.store.path, path)
    checks.record_checksums(path)
    found = checks.verify(path)
    assert found.problems == [] and found.blocks > 10
    _damage(path / "keys.f16", 3 * 256 + 4, bytes([(path / "keys.f16").read_bytes()[3 * 256 + 4] ^ 1]))
    found = checks.verify(path)
    assert found.problems == ["keys.f16 block 3 (bytes 768-1,023): checksum mismatch"]
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 1 and "keys.f16 block 3" in result.output


def test_non_finite_keys_and_foreign_values_never_reach_an_answer(built, tmp_path):
    path = shutil.copytree(built.store.path, tmp_path / "s")
    [(docs, _)] = Datastore(path).documents.find_titles("dante alighieri")
    start, _ = Datastore(path).documents.ranges([docs])[0]
    _damage(path / "keys.f16", start * 2 * 32, np.float16(np.nan).tobytes())
    checks.record_checksums(path)  # damage the checksums cannot see: it happened before they were recorded
    with pytest.raises(DatastoreError, match=rf"entries \[{start}\] hold a non-finite key"):
        BertKNN.load(path).predict("Dante was born in [MASK] .", subject="Dante Alighieri")
    assert any("non-finite" in p for p in checks.verify(path).problems)


def test_an_interrupted_writer_is_not_taken_for_damage(built, monkeypatch):
    index_keys(built.store, "Flat")
    with monkeypatch.context() as patch:
        patch.setattr(DatastoreWriter, "publish", lambda self, **parts: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            built.add_documents([FRESH])
    found = checks.verify(built.store.path)
    assert found.problems == [] and any("interrupted" in note for note in found.notes)
    rerun = BertKNN.load(built.store.path, str(built.encoder.name))
    rerun.add_documents([FRESH], skip_existing=True)
    assert checks.verify(built.store.path).notes == [] and _top(rerun, "faiss") == "tallinn"


def test_a_writer_never_records_damage_as_sound(built, tmp_path):
    path = shutil.copytree(built.store.path, tmp_path / "s")
    segment = path / "tfidf_logtf.npy"
    _damage(segment, segment.stat().st_size - 4, b"\x00\x00\x80\x7f")  # after the open check, before a writer
    with open_writer(path) as writer:
        writer.remove(["d5"])
    assert any("tfidf_logtf.npy block 0" in p for p in checks.verify(path).problems)  # still reported
    keys = path / "keys.f16"
    _damage(keys, 6, bytes([keys.read_bytes()[6] ^ 4]))  # inside the last, partly filled block
    writer = writable(built.encoder, Datastore(path, check=False))
    with pytest.raises(DatastoreError, match=r"keys.f16 block 0 .*checksum mismatch"):
        writer.add_documents([FRESH])
    assert writer.store.documents.states(["n1"]) == {}  # refused before anything was written


def test_a_rebuilt_faiss_index_is_taken_in_after_damage(indexed, built):
    faiss_file = indexed / "faiss.index"
    faiss_file.write_bytes(faiss_file.read_bytes()[:100])
    knn = BertKNN.load(indexed, str(built.encoder.name))
    with pytest.raises(DatastoreError, match=r"faiss\.index is damaged"):
        _top(knn, "faiss")
    faiss_file.unlink()
    (indexed / "faiss.json").unlink()
    index_keys(Datastore(indexed, check=False), "Flat")  # as `bertknn index` in another process
    assert knn.refresh() and _top(knn, "faiss") == "tallinn"
