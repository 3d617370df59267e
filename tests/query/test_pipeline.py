"""BertKNN end to end on the tiny BERT: distributions, evidence, title shortcut, batching, errors."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from bertknn import BertKNN, DatastoreError, QuestionError
from bertknn.index.exact import nearest
from bertknn.ingest import builder
from bertknn.query.combine import calibrate
from bertknn.query.knn import knn_distribution
from bertknn.query.search import in_mentions
from bertknn.query.settings import CONFIDENCE_TEMPERATURE, DEFAULT, LM_FLOOR, PAPER

from ..tolerances import FLOAT16_KEYS_RTOL, FLOAT64_RTOL, assert_ranking_close

RAW = {"confidence_temperature": 1.0, "lm_floor": 0.0}  # the probabilities as combined, not calibrated


def test_prediction_is_the_interpolation_of_its_parts(built):
    ask = {"subject": "Ilsa Varnhold", "top_k": 5, "mixture": "linear", "lam": 0.3}
    p = built.predict("Ilsa Varnhold was born in [MASK] .", **ask, **RAW)
    assert p.documents == ["Ilsa Varnhold"]
    assert p.p.sum() == pytest.approx(1.0) and p.p_knn.sum() == pytest.approx(1.0)
    # the paper's mixture of the very arrays returned: float64 arithmetic on the same inputs (and the LM's float32)
    np.testing.assert_allclose(p.p, 0.3 * p.p_knn + 0.7 * p.p_bert, rtol=1e-6)
    shown = built.predict("Ilsa Varnhold was born in [MASK] .", **ask)  # bertknn's probabilities: calibrated
    # a second call, the same question alone: the same bits on this machine, then float64 arithmetic on them
    np.testing.assert_allclose(shown.p, calibrate(p.p, p.p_bert, CONFIDENCE_TEMPERATURE, LM_FLOOR), rtol=1e-6)
    assert [t.token for t in p.bert_knn] == [t.token for t in sorted(p.bert_knn, key=lambda t: -t.probability)]
    assert p.bert_knn[0].probability == pytest.approx(float(p.p.max()))
    assert len(p.bert) == 5


def test_knn_part_equals_a_brute_force_over_the_titled_document(built):
    store = built.store
    _, states = built.encoder.query(["Ilsa Varnhold was born in [MASK] ."])
    start, end = store.documents.ranges([store.documents.find_titles("ilsa varnhold")[0][0]])[0]
    keys = np.asarray(store.keys[start:end], np.float64)
    dist = ((keys - states[0]) ** 2).sum(1)
    name = in_mentions(
        store.documents.provenance(list(range(start, end))), "ilsa varnhold"
    )  # "Ilsa", "Varnhold": no vote
    assert name.sum() == 2
    values = np.asarray(store.values[start:end])
    expected = knn_distribution(values[~name], dist[~name], 6.0, built.encoder.vocab_size)
    p = built.predict("Ilsa Varnhold was born in [MASK] .", subject="ilsa varnhold", sentence_temperature=0)
    np.testing.assert_allclose(p.p_knn, expected, atol=1e-6)  # k=128 > entries: every other entry votes (keys alone)
    paper = built.predict("Ilsa Varnhold was born in [MASK] .", subject="ilsa varnhold", settings=PAPER)
    every = knn_distribution(values, dist, 6.0, built.encoder.vocab_size)
    np.testing.assert_allclose(paper.p_knn, every, atol=1e-6)  # the paper's: every entry of the document
    ids, _ = nearest(store.keys, np.arange(start, end), states[0], 3)
    assert ids.tolist() == (np.argsort(dist, kind="stable")[:3] + start).tolist()


def test_evidence_points_at_the_voting_words(built):
    p = built.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold", top_k=5, evidence=2)
    assert list(p.evidence) == [t.token for t in p.knn]
    for word, neighbours in p.evidence.items():
        assert 1 <= len(neighbours) <= 2
        assert [n.distance for n in neighbours] == sorted(n.distance for n in neighbours)
        for n in neighbours:
            a, b = n.span
            assert n.sentence[a:b].lower() == word and n.title == "Ilsa Varnhold"
    assert "p_bert" not in p.to_dict() and p.to_dict()["evidence"]


@pytest.mark.parametrize(
    ("subject", "title"), [("  ILSA   varnhold ", "Ilsa Varnhold"), ("CAFÉ ZÜRICH", "Café Zürich")]
)
def test_title_shortcut_is_case_and_unicode_insensitive(built, subject, title):
    assert built.predict("It is in [MASK] .", subject=subject).documents == [title]


def test_without_a_title_match_tfidf_picks_documents(built):
    p = built.predict("Lisbon is a city in [MASK] .", subject="Lisbon cello")
    assert p.documents[0] == "Ilsa Varnhold" and 1 <= len(p.documents) <= 3


def test_no_documents_means_bert_alone(built):
    p = built.predict("The [MASK] of the .")
    assert p.documents == [] and p.knn == [] and p.evidence == {}
    np.testing.assert_array_equal(p.p, p.p_bert)
    assert [t.token for t in p.bert_knn] == [t.token for t in p.bert]


def test_batch_equals_single_predictions(built):
    questions = ["Ilsa Varnhold was born in [MASK] .", "Dante wrote poems in [MASK] .", "The [MASK] of the ."]
    subjects = ["Ilsa Varnhold", None, None]
    batch = built.predict_batch(questions, subjects, top_k=3, batch_size=2)
    for q, s, b in zip(questions, subjects, batch):
        one = built.predict(q, subject=s, top_k=3)  # padded in a batch of two: the model's tolerance
        assert_ranking_close(
            [(t.token, t.probability) for t in one.bert_knn], [(t.token, t.probability) for t in b.bert_knn]
        )
        np.testing.assert_allclose(one.p, b.p, atol=1e-5)


def test_bad_questions_fail_before_any_work(built):
    with pytest.raises(QuestionError, match=r"question 2 .*has 2 \[MASK\]"):
        built.predict_batch(["A [MASK] .", "[MASK] and [MASK] ."])
    with pytest.raises(ValueError, match="2 questions but 1 subjects"):
        built.predict_batch(["A [MASK] .", "B [MASK] ."], ["x"])


def test_hyperparameters_are_checked(built):
    with pytest.raises(ValueError, match=r"k must be a whole number >= 1, .*lam must be a number in \[0, 1\]"):
        BertKNN(built.encoder, built.store, k=0, lam=2.0)
    with pytest.raises(
        ValueError, match=r"temperature must be a number > 0, not nan; lam must be a number in \[0, 1\]"
    ):
        built.predict("Dante was born in [MASK] .", temperature=float("nan"), lam="0.5")
    with pytest.raises(ValueError, match=r"k must be a whole number >= 1, not 2.5"):
        built.predict("Dante was born in [MASK] .", k=2.5)
    with pytest.raises(TypeError, match="unknown hyperparameter"):
        BertKNN(built.encoder, built.store, lambda_=0.5)


def test_load_round_trip_uses_the_datastore_model(built):
    again = BertKNN.load(built.store.path, n_docs=1, k=4, temperature=2.0, lam=0.5, mixture="linear", **RAW)
    assert again.encoder.name == built.encoder.name and again.hparams["k"] == 4
    a = again.predict("Dante was born in [MASK] .", subject="Dante Alighieri")
    assert np.count_nonzero(a.p_knn) <= 4
    np.testing.assert_allclose(a.p, 0.5 * a.p_knn + 0.5 * a.p_bert, rtol=1e-6)  # the arrays returned, mixed
    with pytest.raises(DatastoreError, match="holds layer-3 keys, but the model reads layer 2"):
        BertKNN.load(built.store.path, layer=2)


def test_incomplete_datastore_is_refused(tmp_path, encoder):
    store = builder.create(tmp_path / "s", encoder)
    with pytest.raises(DatastoreError, match="incomplete: rerun `bertknn build`"):
        BertKNN(encoder, store)


def test_lazy_store_embeds_only_what_retrieval_picks(tmp_path, small_corpus, encoder, built):
    lazy = BertKNN.build(small_corpus, tmp_path / "lazy", encoder, lazy=True)
    assert lazy.store.manifest.lazy and lazy.store.size == 0 and lazy.index.n_docs == 5
    p = lazy.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold")
    assert lazy.store.documents.pending() == [1, 2, 3, 4]
    full = built.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold")
    ranked = [[(t.token, t.probability) for t in q.knn] for q in (p, full)]
    assert_ranking_close(*ranked, rtol=FLOAT16_KEYS_RTOL)  # keys batched otherwise, stored as float16
    np.testing.assert_allclose(p.p, full.p, atol=1e-4)
    (start, end), (fstart, fend) = lazy.store.documents.ranges([0])[0], built.store.documents.ranges([0])[0]
    np.testing.assert_allclose(lazy.store.keys[start:end], built.store.keys[fstart:fend], atol=5e-3)
    again = BertKNN.load(tmp_path / "lazy")
    assert again.store.manifest.lazy and again.store.size == end - start  # what was embedded is kept


def test_a_question_to_a_lazy_store_logs_the_progress_of_its_embedding(tmp_path, small_corpus, encoder, caplog):
    lazy = BertKNN.build(small_corpus, tmp_path / "lazy", encoder, lazy=True)
    with caplog.at_level(logging.INFO, logger="bertknn"):
        lazy.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold")
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("bertknn.")]
        assert lines[0] == f"embedding 1 documents of {lazy.store.path} before they are searched"
        assert re.fullmatch(
            rf"embedded 1 of 1 documents, {lazy.store.size} contexts \(\d+ contexts/s in [\d.]+ s\)", lines[1]
        )
        caplog.clear()
        lazy.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold")  # nothing left to embed
        assert not [r for r in caplog.records if r.name.startswith("bertknn.")]


def test_per_call_hyperparameters_apply_to_that_call_only(built):
    q, subject = "Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold"
    # each call asks the same question alone: the LM's bits are the same on this machine, the rest float64 on them
    base = built.predict(q, subject=subject, **RAW)
    lm_only = built.predict(q, subject=subject, lam=0.0, mixture="linear", **RAW)
    np.testing.assert_allclose(lm_only.p, base.p_bert)
    held = base.p_knn > 0  # log-linear at lambda 0: the LM's ranking of the neighbours' words
    lm = base.p_bert.astype(np.float64)  # the LM's bits, renormalised in float64 as the pipeline does
    lm_of_neighbours = np.where(held, lm, 0.0) / lm[held].sum()
    at_zero = built.predict(q, subject=subject, lam=0.0, **RAW).p
    np.testing.assert_allclose(at_zero, lm_of_neighbours, rtol=FLOAT64_RTOL)  # the same bits, then float64
    hot = built.predict(q, subject=subject, temperature=1e6, k=2)
    assert np.count_nonzero(hot.p_knn) <= 2 and hot.p_knn.max() in (pytest.approx(0.5, abs=1e-4), pytest.approx(1.0))
    assert built.hparams == DEFAULT.hparams
    np.testing.assert_allclose(built.predict(q, subject=subject, **RAW).p, base.p)
    with pytest.raises(TypeError, match="unknown hyperparameter"):
        built.predict(q, alpha=1)
    with pytest.raises(ValueError, match="lam must be a number in"):
        built.predict(q, lam=2)
