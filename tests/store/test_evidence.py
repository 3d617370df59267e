"""Evidence vectors kept with the entries (store/evidence.py): each text once, its references counted exactly as the
entries use it, the vectors the sentence encoder's within int8's rounding, kept by prune and convert-keys, released
by remove, checked by verify; a store made before them answers as before until `bertknn sentences` fills them."""

import logging
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn.ingest import evidence_encoding as build_evidence
from bertknn.ingest.ingester import Writer
from bertknn.ingest.prune import prune
from bertknn.model.sentences import SENTENCE_MODEL, sentence_encoder
from bertknn.query.pipeline import BertKNN
from bertknn.store import evidence
from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.verify import verify
from bertknn.store.writer import DatastoreWriter
from bertknn.store.writers import open_writer
from tests.conftest import write_corpus
from tests.tolerances import MODEL_ATOL

from ..conftest import writable

QUESTIONS = ["Ilsa Varnhold was born in [MASK] .", "Dante was born in [MASK] .", "Quellbrook lies near [MASK] ."]
SUBJECTS = ["Ilsa Varnhold", "Dante Alighieri", "Quellbrook"]


def _live(store: Datastore) -> list[int]:
    hidden = store.documents.hidden()
    entries = np.arange(store.size)
    return entries[~np.isin(store.documents.of(entries), hidden)].tolist()


def _references(store: Datastore) -> Counter:
    """What the table must count: each text id once per live entry that uses it."""
    return Counter(store.evidence.ids(_live(store)).ravel().tolist())


def _rows(store: Datastore) -> Counter:
    return Counter(dict(store.db.execute("SELECT id, refs FROM evidence")))


def _made_before(path) -> None:
    """Make a built store look like one made before evidence vectors: no table, no manifest field."""
    with open_writer(path) as writer, writer.commit():
        with writer.db:
            writer.db.execute("DROP TABLE evidence")
        writer.set_manifest(**{evidence.FIELD: None})
        write_json(path / "manifest.json", writer.store.manifest)  # and the file as a store made before kept it


def test_four_bits_with_a_scale_per_vector_round_each_value_by_at_most_half_a_step():
    rng = np.random.default_rng(0)
    vectors = np.vstack([rng.standard_normal((20, 384)).astype(np.float32), np.zeros((1, 384), np.float32)])
    vectors[:5] *= 1e-3
    decoded = np.array([evidence.decode(blob) for blob in evidence.encode(vectors)])
    step = np.abs(vectors).max(axis=1, keepdims=True) / evidence.LEVELS
    assert all(len(blob) == 4 + 384 // 2 for blob in evidence.encode(vectors))
    # the largest value comes back but for float32's rounding of max / 7 * 7
    np.testing.assert_allclose(np.abs(decoded).max(axis=1), np.abs(vectors).max(axis=1), rtol=1e-6)
    assert (np.abs(decoded - vectors) <= step / 2 * (1 + 1e-6)).all()  # rint: half a step, float32's rounding aside
    assert not decoded[-1].any()  # a zero vector stays zero
    with pytest.raises(ValueError, match="even width"):
        evidence.encode(np.ones((1, 3)))


def test_a_build_stores_each_evidence_text_once_with_its_entries_counted(tmp_path, small_corpus, encoder):
    store = BertKNN.build(small_corpus, tmp_path / "s", encoder).store
    assert store.evidence.model == SENTENCE_MODEL
    assert _rows(store) == _references(store)
    rows = [(e.sentence, e.span, e.title) for e in store.documents.provenance(list(range(store.size)))]
    texts = sorted(set(evidence.entry_texts(rows)))
    assert len(texts) < 3 * store.size  # sentences and words are shared by entries
    stored = store.evidence.vectors(texts)
    assert sorted(stored) == texts
    fresh = sentence_encoder(encoder.runtime).sentence_vectors(texts)
    step = np.abs(fresh).max(axis=1, keepdims=True) / evidence.LEVELS
    # 4 bits round by half a step; the build embedded these texts in other batches (model noise: MODEL_ATOL)
    assert (np.abs(np.array([stored[t] for t in texts]) - fresh) <= step / 2 + MODEL_ATOL).all()


def test_remove_releases_the_references_and_drops_the_texts_no_entry_uses(built):
    store = built.store
    only_d1 = set(store.evidence.ids(list(range(*store.documents.ranges([0])[0]))).ravel().tolist())
    only_d1 -= set(store.evidence.ids(list(range(store.documents.ranges([0])[0][1], store.size))).ravel().tolist())
    assert only_d1 and only_d1 <= store.evidence.held(only_d1)
    built.remove_documents(["d1"])
    assert _rows(store) == _references(store)
    assert not store.evidence.held(only_d1)


def test_a_remove_looks_only_at_the_rows_it_releases(built):
    """A remove's work is its own entries' (bench/scale.py: it scanned the whole table): a row it does not release is
    left as it is, even one that no entry uses (which verify reports)."""
    with built.writer.commit() as written, written.db:
        written.db.execute("INSERT INTO evidence VALUES (7, x'00', 0)")  # planted: no entry's text
    built.remove_documents(["d1"])
    rows = dict(_rows(built.store))
    assert rows.pop(7) == 0
    assert Counter(rows) == _references(built.store)


def test_an_append_that_lacks_the_evidence_the_store_holds_is_refused(built):
    size = built.store.size
    with built.writer.commit() as store, pytest.raises(DatastoreError, match="lacks them: nothing was stored"):
        store.writer.append([0], [(0, 0, "x")], np.zeros((1, store.dim)), np.zeros(1, np.int32), [np.array([[0, 1]])])
    assert built.store.size == built.writer.store.size == size


def test_prune_and_convert_keys_keep_the_evidence(tmp_path, encoder):
    text = "Ode Lund sang in Vienna. Lund danced in Vienna. Lund lived in Vienna with Ada Quen."
    corpus = write_corpus(tmp_path / "c.jsonl", [{"id": "a", "title": "Ode Lund", "text": text}])
    source = BertKNN.build(corpus, tmp_path / "s", encoder).store
    pruned = prune(source.path, tmp_path / "pruned", radius=1e9)  # a document's entries of one word merge
    assert pruned.size < source.size and pruned.evidence.model == SENTENCE_MODEL
    assert _rows(pruned) == _references(pruned)
    ids = list(_rows(pruned))
    assert pruned.evidence.blobs(ids) == source.evidence.blobs(ids)  # copied, not embedded again
    before = dict(source.db.execute("SELECT id, vector FROM evidence"))
    with Writer(source) as writer:
        writer.convert_keys("SQ8", train_size=source.size)
    assert dict(Datastore(source.path).db.execute("SELECT id, vector FROM evidence")) == before


def test_verify_names_entries_without_their_vectors_and_vectors_of_the_wrong_size(built):
    store = built.store
    assert not verify(store.path).problems
    (first,) = store.evidence.ids([0])[0][:1]
    with built.writer.commit() as written, written.db:
        written.db.execute("DELETE FROM evidence WHERE id = ?", (int(first),))
        written.db.execute("UPDATE evidence SET vector = x'0000' WHERE id = (SELECT max(id) FROM evidence)")
    problems = " ".join(verify(store.path).problems)
    assert "entries checked lack their evidence vectors (the first: entry 0)" in problems
    assert "1 evidence vectors have the wrong size" in problems
    assert "the evidence vectors count" in problems  # the deleted row's references are missing


def test_a_store_made_before_answers_as_before_until_bertknn_sentences_fills_it(
    tmp_path, small_corpus, encoder, caplog, monkeypatch
):
    built = BertKNN.build(small_corpus, tmp_path / "s", encoder)
    weighed = built.predict_batch(QUESTIONS, SUBJECTS, top_k=3, evidence=0)
    plain = built.predict_batch(QUESTIONS, SUBJECTS, top_k=3, evidence=0, sentence_temperature=0)
    built.store.close()
    _made_before(tmp_path / "s")
    with caplog.at_level(logging.WARNING):
        old = writable(encoder, Datastore(tmp_path / "s"))
        answered = old.predict_batch(QUESTIONS, SUBJECTS, top_k=3, evidence=0)
    assert old.store.evidence.model is None and old.settings.sentence_temperature == 0
    assert caplog.text.count("bertknn sentences") == 1  # said once, not silently
    # the same store and inputs, the weights off: bit-identical answers
    assert [p.to_dict(encoder.tokenizer) for p in answered] == [p.to_dict(encoder.tokenizer) for p in plain]
    added = {"id": "d9", "title": "Orla Fenwick", "text": "Orla Fenwick was born in Tallinn in 1950."}
    old.add_documents([added])  # an add to it stores no vectors until it is filled
    assert old.store.evidence.model is None
    monkeypatch.setattr(build_evidence, "FILL_ENTRIES", 7)
    fill, calls = DatastoreWriter.fill_evidence, []

    def killed(self, stop, found):  # a run killed after its first transaction
        if calls:
            raise KeyboardInterrupt
        calls.append(stop)
        fill(self, stop, found)

    monkeypatch.setattr(DatastoreWriter, "fill_evidence", killed)
    with pytest.raises(KeyboardInterrupt), open_writer(old.store) as writer:
        build_evidence.fill(writer.store, encoder.runtime)
    monkeypatch.undo()
    assert old.store.evidence.filled == 7 and old.store.evidence.model is None
    with open_writer(old.store) as writer:
        assert build_evidence.fill(writer.store, encoder.runtime) == old.store.size - 7  # goes on from there
    old.store.reopen_if_changed()
    assert old.store.evidence.model == SENTENCE_MODEL and _rows(old.store) == _references(old.store)
    again = BertKNN(encoder, old.store).predict_batch(QUESTIONS, SUBJECTS, top_k=3, evidence=0)  # opened again
    # the first answers: vectors embedded in other batches than the build's may round to another 4-bit code (model
    # noise), which moves the weights' near-ties further down, not the answer each question's document states
    assert [p.bert_knn[0].token for p in again] == [p.bert_knn[0].token for p in weighed]


def test_bertknn_sentences_fills_a_store_made_before(tmp_path, small_corpus, encoder):
    from typer.testing import CliRunner

    from bertknn.cli import app

    BertKNN.build(small_corpus, tmp_path / "s", encoder).store.close()
    _made_before(tmp_path / "s")
    result = CliRunner().invoke(app, ["sentences", str(tmp_path / "s"), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "evidence vectors stored for" in result.output
    store = Datastore(tmp_path / "s")
    assert store.evidence.model == SENTENCE_MODEL and _rows(store) == _references(store)
    again = CliRunner().invoke(app, ["sentences", str(tmp_path / "s"), "--threads", "1"])
    assert again.exit_code == 0 and "nothing to do" in again.output


def test_a_document_added_to_a_store_with_evidence_brings_its_vectors(tmp_path, encoder):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"id": "a", "title": "Ada Quen", "text": "Quen lived in Vienna."}])
    knn = BertKNN.build(corpus, tmp_path / "s", encoder)
    knn.add_documents([{"id": "b", "title": "Ode Lund", "text": "Lund lived in Vienna and sang in Lyon."}])
    assert _rows(knn.store) == _references(knn.store)
    assert knn.store.evidence.held(knn.store.evidence.ids([knn.store.size - 1]).ravel().tolist())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0)
)
def test_any_finite_vector_comes_back_within_half_a_step(values):
    vector = np.asarray(values, np.float32)
    (blob,) = evidence.encode(vector[None])
    step = np.abs(vector).max() / evidence.LEVELS
    assert np.abs(evidence.decode(blob) - vector).max() <= step / 2 * (1 + 1e-5) + 1e-30


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.integers(0, 80), st.integers(0, 20), st.text(max_size=30))
def test_any_sentence_span_and_title_give_three_texts_and_stable_ids(sentence, start, length, title):
    span = (min(start, len(sentence)), min(start + length, len(sentence)))
    texts = evidence.entry_texts([(sentence, span, title)])
    assert len(texts) == evidence.VIEWS and all(isinstance(t, str) for t in texts)
    assert [evidence.text_id(t) for t in texts] == [
        evidence.text_id(t) for t in evidence.entry_texts([(sentence, span, title)])
    ]


def test_verify_reads_entries_a_chunk_at_a_time_and_counts_live_ones_from_the_documents(built, tmp_path):
    """`verify` holds nothing of the store's size (bench/scale.py): its chunked reads find what a whole read finds,
    a damaged key in the last chunk included, and its live entries are those a brute-force scan keeps."""
    import shutil

    from bertknn.store import verify as checks

    path = shutil.copytree(built.store.path, tmp_path / "copy")
    with Writer(Datastore(path)) as writer:
        writer.remove_documents(["d1"])
    store = Datastore(path, check=False)
    live = _live(store)
    assert checks._live_sample(store, store.documents.hidden().tolist(), 10**6, rows=7).tolist() == live
    drawn = checks._live_sample(store, store.documents.hidden().tolist(), len(live) // 4)
    assert len(set(drawn.tolist())) == len(drawn) >= 1 and set(drawn.tolist()) <= set(live)  # a sample of the live
    assert checks._entry_problems(store, rows=7) == checks._entry_problems(store, rows=store.size) == []
    keys = np.memmap(path / "keys.f16", np.float16, "r+", shape=(store.size, store.dim))
    keys[store.size - 1, 3] = np.nan  # the last entry: in the last chunk of 7
    keys.flush()
    del keys
    found = checks._entry_problems(store, rows=7)
    assert len(found) == 1 and f"entries [{store.size - 1}] hold non-finite values" in found[0]
    store.close()
