"""Sentence vectors stored ahead: the file's round trip, damage read as missing, another encoder's file refused, and
`bertknn sentences` storing every entry's texts so that a question embeds only its own, with the same answers."""

import logging
import sqlite3

import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.model.default_model import SENTENCE_MODEL
from bertknn.model.sentence_vectors import StoredVectors, default_path
from bertknn.model.sentences import SentenceMatch, evidence_texts
from bertknn.query.pipeline import BertKNN
from bertknn.store.datastore import Datastore
from tests.conftest import CountingSentences, write_corpus
from tests.tolerances import assert_ranking_close

TEXTS = ["was born in Bergen.", "died in Oslo.", "Bergen", "studied in something"]


def test_stored_vectors_come_back_exactly_and_a_rerun_embeds_nothing(tmp_path, encoder):
    stored = StoredVectors(tmp_path / "v.sqlite", "enc")
    counting = CountingSentences(encoder)
    assert stored.get(TEXTS) == {}  # no file yet
    assert stored.add(TEXTS[:2] + TEXTS[:1], counting.sentence_vectors) == 2
    assert stored.add(TEXTS, counting.sentence_vectors) == 2  # the two not stored yet
    assert counting.calls == [TEXTS[:2], TEXTS[2:]]
    got = StoredVectors(tmp_path / "v.sqlite", "enc").get([*TEXTS, "never stored"])
    assert sorted(got) == sorted(TEXTS)
    # the same two calls again, on the same machine: the same bits, which the file must keep
    again = np.concatenate([encoder.sentence_vectors(TEXTS[:2]), encoder.sentence_vectors(TEXTS[2:])])
    for text, vector in zip(TEXTS, again):
        np.testing.assert_array_equal(got[text], vector.astype(np.float32))


def test_a_damaged_vector_is_read_as_missing_and_embedded_again(tmp_path, encoder, caplog):
    path = tmp_path / "v.sqlite"
    StoredVectors(path, "enc").add(TEXTS, encoder.sentence_vectors)
    with sqlite3.connect(path) as db:  # one bit of one vector flipped, its CRC as it was
        (vector,) = db.execute("SELECT vector FROM vectors WHERE text = ?", (TEXTS[1],)).fetchone()
        flipped = bytearray(vector)
        flipped[100] ^= 0x10
        db.execute("UPDATE vectors SET vector = ? WHERE text = ?", (bytes(flipped), TEXTS[1]))
    counting = CountingSentences(encoder)
    match = SentenceMatch(encoder=counting, stored=StoredVectors(path, "enc"))
    with caplog.at_level(logging.WARNING):
        got = match.vectors(TEXTS)
    assert counting.calls == [[TEXTS[1]]] and match.stored.damaged == 1
    assert f"the vector of {TEXTS[1]!r} is damaged; embedded again" in caplog.text
    np.testing.assert_allclose(got[TEXTS[1]], encoder.sentence_vectors(TEXTS[1:2])[0], atol=1e-6)
    assert StoredVectors(path, "enc").add(TEXTS, counting.sentence_vectors) == 1  # a rerun stores it again
    assert counting.calls[-1] == [TEXTS[1]] and sorted(StoredVectors(path, "enc").get(TEXTS)) == sorted(TEXTS)


def test_another_encoders_or_an_unreadable_file_is_not_read(tmp_path, encoder, caplog):
    path = tmp_path / "v.sqlite"
    StoredVectors(path, "enc").add(TEXTS, encoder.sentence_vectors)
    with caplog.at_level(logging.WARNING):
        assert StoredVectors(path, "other").get(TEXTS) == {}
    assert "holds the vectors of another sentence encoder, 'enc'" in caplog.text
    with pytest.raises(ValueError, match="another sentence encoder, 'enc'"):
        StoredVectors(path, "other").add(["new text"], encoder.sentence_vectors)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    assert StoredVectors(garbage, "enc").get(TEXTS) == {}
    with pytest.raises(OSError, match=r"garbage\.sqlite cannot be read .*delete it and rerun `bertknn sentences`"):
        StoredVectors(garbage, "enc").add(TEXTS, encoder.sentence_vectors)


DOCS = [
    {"id": "a", "title": "Maren Holtby", "text": "Holtby was born in Bergen. Holtby died in Oslo. She sang songs."},
    {"id": "b", "title": "Ada Quen", "text": "Quen lived in Vienna. Quen wrote books about Lyon."},
]


def test_bertknn_sentences_stores_every_entrys_texts_and_answers_stay_the_same(tmp_path, monkeypatch, encoder):
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "store"
    BertKNN.build(write_corpus(tmp_path / "c.jsonl", DOCS), out, encoder).store.close()
    result = CliRunner().invoke(app, ["sentences", str(out), "--backend", "torch", "--threads", "1"])
    assert result.exit_code == 0, result.output
    store = Datastore(out)
    rows = store.provenance(list(range(store.size)))
    expected = {text for r in rows for text in evidence_texts(r.sentence, r.span, r.title)}
    path = default_path(SENTENCE_MODEL)
    with sqlite3.connect(path) as db:
        assert {t for (t,) in db.execute("SELECT text FROM vectors")} == expected
    assert f"{len(expected):,} texts of {store.size:,} entries embedded into" in " ".join(result.output.split())
    again = CliRunner().invoke(app, ["sentences", str(out), "--backend", "torch", "--threads", "1"])
    assert "0 texts of" in again.output

    question = ("Maren Holtby was born in [MASK] .", "Maren Holtby")
    plain = BertKNN(encoder, Datastore(out))
    plain.sentence_match.stored = None
    with_file = BertKNN(encoder, Datastore(out))
    assert with_file.sentence_match.stored.path == path
    with_file.sentence_match.background()  # embedded once, whatever is stored
    counting = CountingSentences(with_file.sentence_match.encoder)
    with_file.sentence_match._encoder = counting
    a, b = (k.predict(*question, sentence_temperature=0.05) for k in (plain, with_file))
    # vectors read from the file against vectors embedded now, in other batches: the model's tolerance
    assert_ranking_close(*[[(w.token, w.probability) for w in p.bert_knn] for p in (a, b)])
    assert counting.calls == [["was born in something ."]]  # only the question's own text, beside the LM's pass


def test_bertknn_sentences_on_a_directory_that_is_no_datastore_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["sentences", str(tmp_path / "empty"), "--backend", "torch", "--threads", "1"])
    assert result.exit_code == 2
    assert "error: " in result.output and "is not a datastore" in " ".join(result.output.split())
    assert not default_path(SENTENCE_MODEL).exists()


def test_store_sentences_in_python_commits_in_chunks_and_reports_progress(tmp_path, monkeypatch, encoder):
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("bertknn.model.sentences.STORE_CHUNK", 4)
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", DOCS), tmp_path / "store", encoder)
    knn.sentence_match._encoder = CountingSentences(encoder)  # the tiny model stands in for the sentence encoder
    seen = []
    rows = knn.store.provenance(list(range(knn.store.size)))
    made = knn.store_sentences(lambda done, total: seen.append((done, total)))
    assert made == len({text for r in rows for text in evidence_texts(r.sentence, r.span, r.title)})
    size = knn.store.size
    assert seen == [(0, size), *((min(n, size), size) for n in range(4, size + 4, 4))]
    known, calls = set(), []
    for first in range(0, size, 4):  # one encoder call per chunk of 4 entries holding texts not stored before it
        texts = [t for r in rows[first : first + 4] for t in evidence_texts(r.sentence, r.span, r.title)]
        new = list(dict.fromkeys(t for t in texts if t not in known))
        known.update(new)
        calls += [new] if new else []
    assert knn.sentence_match._encoder.calls == calls
    assert knn.store_sentences() == 0


def test_a_run_stopped_midway_keeps_its_committed_chunks_and_a_rerun_finishes(tmp_path, monkeypatch, encoder):
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("bertknn.model.sentences.STORE_CHUNK", 4)
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", DOCS), tmp_path / "store", encoder)
    counting = CountingSentences(encoder)

    def embed_then_stop(texts):
        if counting.calls:  # the second chunk: interrupted while embedding (Ctrl+C, a kill)
            raise KeyboardInterrupt
        return counting.sentence_vectors(texts)

    knn.sentence_match._encoder = type("Stopping", (), {"sentence_vectors": staticmethod(embed_then_stop)})()
    with pytest.raises(KeyboardInterrupt):
        knn.store_sentences()
    first = set(counting.calls[0])
    assert set(StoredVectors(default_path(SENTENCE_MODEL), SENTENCE_MODEL).get(sorted(first))) == first
    knn.sentence_match._encoder = CountingSentences(encoder)
    rows = knn.store.provenance(list(range(knn.store.size)))
    everything = {text for r in rows for text in evidence_texts(r.sentence, r.span, r.title)}
    assert knn.store_sentences() == len(everything - first)  # the rerun embeds only what was not committed
    assert not first & {t for call in knn.sentence_match._encoder.calls for t in call}


def test_bertknn_sentences_reads_every_shard_of_a_sharded_datastore(tmp_path, monkeypatch, encoder):
    from bertknn.store.shards import ShardedDatastore
    from tests.sharded_store import make_sharded

    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    out = make_sharded(tmp_path / "sharded", encoder, [DOCS[:1], DOCS[1:]])
    result = CliRunner().invoke(app, ["sentences", str(out), "--backend", "torch", "--threads", "1"])
    assert result.exit_code == 0, result.output
    store = ShardedDatastore(out)
    rows = store.provenance(list(range(store.size)))
    assert {r.doc_id for r in rows} == {"a", "b"}
    expected = {text for r in rows for text in evidence_texts(r.sentence, r.span, r.title)}
    with sqlite3.connect(default_path(SENTENCE_MODEL)) as db:
        assert {t for (t,) in db.execute("SELECT text FROM vectors")} == expected


def test_questions_read_the_committed_vectors_while_a_writer_holds_the_file(tmp_path, encoder):
    path = tmp_path / "v.sqlite"
    StoredVectors(path, "enc").add(TEXTS[:2], encoder.sentence_vectors)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # `bertknn sentences` committing a chunk
    writer.execute("DELETE FROM vectors")
    try:
        assert sorted(StoredVectors(path, "enc").get(TEXTS)) == sorted(TEXTS[:2])  # the last commit, not waiting
    finally:
        writer.execute("ROLLBACK")
        writer.close()
