"""The options beyond the paper through BertKNN: the retrieval-aware vote, the log-linear mixture and the adaptive
lambda, against the knn and combine functions computed by hand from the same neighbours."""

from __future__ import annotations

import numpy as np

from bertknn.query.combine import confident_lam
from bertknn.query.knn import document_prior, document_vote, knn_distribution
from bertknn.query.settings import DOC_TEMPERATURE, LAM, PAPER

from ..tolerances import FLOAT64_RTOL

QUESTION = "Ilsa Varnhold was born in [MASK] ."
# the probabilities as combined (calibration: test_calibration), the keys' vote alone (sentence weights: test_sentences)
RAW = {"confidence_temperature": 1.0, "lm_floor": 0.0, "sentence_temperature": 0.0}


def test_the_retrieval_aware_vote_weighs_each_document_by_its_retrieval_score(built):
    # no subject and no name: TF-IDF's top documents, with their scores (a name would keep only those naming it)
    # lm_words=0: the LM scores every word of several wordpieces, so both mixtures' LM parts are the same
    nameless = "someone was born in [MASK] ."
    paper = built.predict(nameless, **RAW, doc_temperature=0, mixture="linear", lm_words=0)
    found = paper.neighbours
    assert len(found.documents) > 1 and found.scores == sorted(found.scores, reverse=True) and found.scores[0] > 0
    aware = built.predict(nameless, **RAW, doc_temperature=0.1, mixture="linear", lm_words=0)
    docs = built.store.documents.of(found.entries)
    groups = np.array([found.documents.index(int(d)) for d in docs])
    prior = document_prior(np.append(found.scores, 0.0), 0.1)
    values = built.words(found).index(found.values)  # words of several wordpieces follow the vocabulary
    expected = document_vote(values, found.distances, groups, prior, PAPER.temperature, len(paper.p_bert))
    np.testing.assert_allclose(aware.p_knn, expected)
    np.testing.assert_allclose(aware.p, LAM * expected + (1 - LAM) * paper.p_bert)  # bertknn's lambda
    np.testing.assert_array_equal(paper.p_knn, knn_distribution(values, found.distances, 6.0, len(paper.p_bert)))
    assert not np.allclose(aware.p_knn, paper.p_knn)
    default = built.predict(nameless, **RAW)  # bertknn's default vote is the retrieval-aware one
    assert built.settings.doc_temperature == DOC_TEMPERATURE > 0 and not np.allclose(default.p_knn, paper.p_knn)
    with_subject = built.predict(QUESTION, **RAW, subject="Ilsa Varnhold")  # one document: the paper's vote exactly
    np.testing.assert_allclose(
        with_subject.p_knn, built.predict(QUESTION, **RAW, subject="Ilsa Varnhold", doc_temperature=0).p_knn
    )


def test_the_adaptive_lambda_scales_lambda_by_the_knn_s_confidence(built):
    paper = built.predict(QUESTION, **RAW, lam=0.8, doc_temperature=0, mixture="linear")
    adaptive = built.predict(QUESTION, **RAW, lam=0.8, lam_by="entropy", doc_temperature=0, mixture="linear")
    lam = confident_lam(paper.p_knn, 0.8, len(paper.neighbours.entries))
    assert 0 < lam < 0.8
    np.testing.assert_allclose(adaptive.p, lam * paper.p_knn + (1 - lam) * paper.p_bert)
    assert PAPER.replace(lam_by="entropy", doc_temperature=0.1).file_tag() == "n3-k128-T6.0-l0.3-dt0.1-entropy"
    assert PAPER.file_tag() == "n3-k128-T6.0-l0.3"


def test_the_log_linear_mixture_multiplies_the_two_distributions(built):
    linear = built.predict(QUESTION, **RAW, subject="Ilsa Varnhold", mixture="linear")
    mixed = built.predict(QUESTION, **RAW, subject="Ilsa Varnhold", word_bonus=1)  # bertknn's default mixture, no bonus
    assert built.settings.mixture == "log-linear" and built.settings.lam == LAM
    np.testing.assert_array_equal(mixed.p_knn, linear.p_knn)  # the same neighbours and vote: the same bits here
    held = mixed.p_knn > 0
    expected = np.zeros_like(mixed.p)
    expected[held] = mixed.p_knn[held] ** LAM * mixed.p_bert[held].astype(np.float64) ** (1 - LAM)
    np.testing.assert_allclose(mixed.p, expected / expected.sum(), rtol=FLOAT64_RTOL, atol=0)
    assert not mixed.p[~held].any() and mixed.bert_knn[0].token in {t.token for t in mixed.knn}
    assert PAPER.replace(mixture="log-linear").file_tag() == "n3-k128-T6.0-l0.3-loglin"
