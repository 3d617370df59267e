"""Combine stage (src/bertknn/query/combine.py): the linear and log-linear mixtures, the adaptive lambda,
calibration, the ranking of answers and the words they are ranked over, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn.query.combine import calibrate, confident_lam, interpolate, log_linear_scores
from bertknn.query.knn import knn_distribution
from bertknn.query.prediction import TokenScore, ranked
from bertknn.query.words import Words

from ..tolerances import FLOAT64_RTOL


def test_interpolation_sums_to_one_and_falls_back_to_bert():
    rng = np.random.default_rng(1)
    p_bert = rng.dirichlet(np.ones(50))
    p_knn = knn_distribution(np.array([3, 3, 8]), np.array([1.0, 2.0, 4.0]), 6.0, 50)
    p = interpolate(p_bert, p_knn, 0.3)
    assert p.sum() == pytest.approx(1.0)
    assert p[3] == pytest.approx(0.3 * p_knn[3] + 0.7 * p_bert[3])
    assert interpolate(p_bert, None, 0.3) is p_bert


def test_the_log_linear_mixture_is_the_normalised_weighted_geometric_mean():
    p_bert = np.array([0.5, 0.3, 0.15, 0.05])
    p_knn = np.array([0.0, 0.2, 0.0, 0.8])
    p = interpolate(p_bert, p_knn, 0.5, "log-linear")
    a, b = np.sqrt(0.2 * 0.3), np.sqrt(0.8 * 0.05)  # 0.2449..., 0.2
    np.testing.assert_allclose(p, [0.0, a / (a + b), 0.0, b / (a + b)], rtol=FLOAT64_RTOL)
    assert p[1] > p[3]  # the LM's 0.3 against 0.05 outweighs the kNN's 0.2 against 0.8; linear: the other way
    linear = interpolate(p_bert, p_knn, 0.5)
    assert linear[3] > linear[1] and np.allclose(linear, 0.5 * p_knn + 0.5 * p_bert)
    np.testing.assert_allclose(interpolate(p_bert, p_knn, 1.0, "log-linear"), p_knn)
    np.testing.assert_allclose(interpolate(p_bert, p_knn, 0.0, "log-linear"), [0.0, 6 / 7, 0.0, 1 / 7])
    underflow = interpolate(np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.5, 0.5]), 0.5, "log-linear")
    np.testing.assert_allclose(underflow, [0.0, 0.5, 0.5])  # an LM probability of 0 does not make NaNs
    assert interpolate(p_bert, None, 0.5, "log-linear") is p_bert


def test_ranked_orders_by_probability_and_drops_zeros(tokenizer):
    p = np.zeros(tokenizer.vocab_size)
    ids = tokenizer.convert_tokens_to_ids(["paris", "rome", "berlin"])
    p[ids] = [0.2, 0.5, 0.3]
    assert [(t.token, t.probability) for t in ranked(p, tokenizer, 5)] == [
        ("rome", 0.5),
        ("berlin", 0.3),
        ("paris", 0.2),
    ]


def test_confident_lambda_scales_with_the_knn_s_entropy():
    assert confident_lam(np.array([0.0, 1.0]), 0.6, 128) == 0.6  # all neighbours agree: lam
    assert confident_lam(np.full(4, 0.25), 0.6, 4) == pytest.approx(0.0)  # 4 neighbours on 4 words: no weight
    assert confident_lam(np.array([0.5, 0.5, 0.0]), 0.6, 4) == pytest.approx(0.6 * (1 - np.log(2) / np.log(4)))
    assert confident_lam(np.array([1.0]), 0.6, 1) == 0.6


def test_calibrate_scales_by_the_temperature_and_mixes_in_the_lm():
    p = np.array([0.6, 0.3, 0.1, 0.0])
    p_lm = np.array([0.1, 0.2, 0.3, 0.4])
    root = np.sqrt(p[:3]) / np.sqrt(p[:3]).sum()
    expected = 0.9 * np.append(root, 0.0) + 0.1 * p_lm
    np.testing.assert_allclose(calibrate(p, p_lm, 2.0, 0.1), expected, rtol=FLOAT64_RTOL)
    assert calibrate(p, p_lm, 2.0, 0.1).sum() == pytest.approx(1.0)
    assert calibrate(p, p_lm) is p  # 1 and 0: nothing to do
    sharper = calibrate(p, p_lm, 0.5)
    np.testing.assert_allclose(sharper, np.append(p[:3] ** 2 / (p[:3] ** 2).sum(), 0.0), rtol=FLOAT64_RTOL)


# --- new tests: each function of combine.py against values computed here ---


@pytest.mark.parametrize("lam", [0.0, 0.25, 0.5, 1.0])
def test_the_linear_mixture_of_random_distributions_by_hand(lam):
    rng = np.random.default_rng(7)
    p_bert, p_knn = rng.dirichlet(np.ones(40)), rng.dirichlet(np.ones(40))
    p_knn[rng.choice(40, 30, replace=False)] = 0.0  # neighbours hold a few words only
    p_knn /= p_knn.sum()
    p = interpolate(p_bert, p_knn, lam, "linear")
    for i in range(40):
        assert p[i] == pytest.approx(lam * p_knn[i] + (1 - lam) * p_bert[i], rel=FLOAT64_RTOL, abs=1e-15)
    assert p.sum() == pytest.approx(1.0)


def test_the_log_linear_mixture_of_random_distributions_by_hand():
    rng = np.random.default_rng(11)
    p_bert = rng.dirichlet(np.ones(30))
    p_knn = np.zeros(30)
    held = np.array([2, 9, 17, 23])
    p_knn[held] = [0.1, 0.4, 0.3, 0.2]
    lam = 0.7
    p = interpolate(p_bert, p_knn, lam, "log-linear")
    product = np.array([p_knn[i] ** lam * p_bert[i] ** (1 - lam) for i in held])
    expected = np.zeros(30)
    expected[held] = product / product.sum()
    np.testing.assert_allclose(p, expected, rtol=FLOAT64_RTOL, atol=0)
    assert np.flatnonzero(p).tolist() == held.tolist()  # words no neighbour holds get 0


def test_the_log_linear_mixture_multiplies_each_word_by_its_prior():
    p_bert = np.array([0.4, 0.3, 0.2, 0.1])
    p_knn = np.array([0.0, 0.5, 0.25, 0.25])
    prior = np.array([1.0, 1.0, 3.0, 1.0])
    p = interpolate(p_bert, p_knn, 0.5, "log-linear", prior)
    b, c, d = np.sqrt(0.5 * 0.3), 3 * np.sqrt(0.25 * 0.2), np.sqrt(0.25 * 0.1)
    np.testing.assert_allclose(p, [0.0, b / (b + c + d), c / (b + c + d), d / (b + c + d)], rtol=FLOAT64_RTOL)
    assert p.argmax() == 2  # the bonus lifts word 2 above word 1, which wins without it
    assert interpolate(p_bert, p_knn, 0.5, "log-linear").argmax() == 1
    np.testing.assert_array_equal(interpolate(p_bert, p_knn, 0.5, "linear", prior), 0.5 * p_knn + 0.5 * p_bert)


def test_log_linear_scores_for_one_lambda_and_for_many():
    p_knn, p_bert = np.array([0.5, 0.25]), np.array([0.1, 0.0])
    tiny = np.finfo(np.float64).tiny  # an LM probability of 0 is floored to the smallest positive float
    one = log_linear_scores(p_knn, p_bert, 0.3)
    np.testing.assert_allclose(one, [0.3 * np.log(0.5) + 0.7 * np.log(0.1), 0.3 * np.log(0.25) + 0.7 * np.log(tiny)])
    many = log_linear_scores(p_knn, p_bert, np.array([0.0, 0.3, 1.0]))
    assert many.shape == (3, 2)
    np.testing.assert_allclose(many[0], [np.log(0.1), np.log(tiny)])
    np.testing.assert_allclose(many[1], one)
    np.testing.assert_allclose(many[2], np.log(p_knn))


def test_the_adaptive_lambda_of_an_uneven_vote_by_hand():
    p_knn = np.array([0.0, 0.7, 0.2, 0.0, 0.1])
    entropy = -(0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1))
    assert confident_lam(p_knn, 0.5, 10) == pytest.approx(0.5 * (1 - entropy / np.log(10)), rel=FLOAT64_RTOL)
    # more spread than `neighbours` could make (4 words, 3 neighbours): the confidence stops at 0
    assert 1 - np.log(4) / np.log(3) < 0 and confident_lam(np.full(4, 0.25), 0.5, 3) == 0.0
    assert confident_lam(np.full(4, 0.25), 0.5, 1) == 0.5  # one neighbour: lam


def test_calibrate_with_only_a_floor_or_only_a_temperature():
    p = np.array([0.5, 0.0, 0.3, 0.2])
    p_lm = np.array([0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(calibrate(p, p_lm, 1.0, 0.2), 0.8 * p + 0.2 * p_lm, rtol=FLOAT64_RTOL)
    cooled = calibrate(p, p_lm, 3.0)
    cube = np.array([0.5, 0.0, 0.3, 0.2]) ** (1 / 3)
    np.testing.assert_allclose(cooled, cube / cube.sum(), rtol=FLOAT64_RTOL)
    assert cooled[1] == 0.0 and np.argsort(-cooled, kind="stable").tolist() == [0, 2, 3, 1]  # the order kept


def test_ranked_keeps_the_k_best_with_ties_ordered_by_index(tokenizer):
    p = np.zeros(tokenizer.vocab_size)
    paris, rome, berlin = tokenizer.convert_tokens_to_ids(["paris", "rome", "berlin"])  # 3000, 4199, 4068
    p[[paris, rome, berlin]] = [0.25, 0.5, 0.25]
    top = ranked(p, tokenizer, 3)
    assert top == [  # paris before berlin: the same probability, the lower id
        TokenScore("rome", 0.5, rome),
        TokenScore("paris", 0.25, paris),
        TokenScore("berlin", 0.25, berlin),
    ]
    assert top[0].pieces == (rome,)  # a word of one token: its own id
    assert [t.token for t in ranked(p, tokenizer, 1)] == ["rome"]
    assert [t.token for t in ranked(p, tokenizer, 2)] == ["rome", "paris"]  # a tie at the cut: the lower id
    assert ranked(p, tokenizer, 0) == []
    assert ranked(None, tokenizer, 3) == []
    assert ranked(np.zeros(tokenizer.vocab_size), tokenizer, 3) == []


def test_ranked_names_words_of_several_tokens_by_their_text_and_lexicon_number(tokenizer):
    vocab = tokenizer.vocab_size
    tall, inn = tokenizer.convert_tokens_to_ids(["tall", "##inn"])
    words = Words(vocab, np.array([vocab + 3]), ((tall, inn),), ("tallinn",), np.array([0.01]))
    p = np.zeros(words.size)
    paris = tokenizer.convert_tokens_to_ids("paris")
    p[[paris, vocab]] = [0.4, 0.6]
    top = ranked(p, tokenizer, 5, words)
    assert top == [TokenScore("tallinn", 0.6, vocab + 3, (tall, inn)), TokenScore("paris", 0.4, paris)]


def test_words_over_the_vocabulary_and_the_neighbours_words_of_several_tokens():
    words = Words(5, np.array([7, 9, 12]), ((1, 2), (2, 3), (3, 4)), ("ab", "bc", "cd"))
    assert words.size == 8
    np.testing.assert_array_equal(words.index(np.array([0, 4, 9, 7, 12, 3])), [0, 4, 6, 5, 7, 3])
    scored = words.scored([0, 2], np.array([0.2, 0.05]))
    np.testing.assert_array_equal(scored.scores, [0.2, 0.0, 0.05])
    assert words.scores.size == 0  # scored returns a copy
    p_vocab = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    lm = scored.lm(p_vocab)
    np.testing.assert_allclose(lm, np.array([0.1, 0.2, 0.3, 0.25, 0.15, 0.2, 0.0, 0.05]) / 1.25, rtol=FLOAT64_RTOL)
    assert Words(5).lm(p_vocab) is p_vocab
    p = np.array([0.0, 0.3, 0.0, 0.0, 0.1, 0.2, 0.25, 0.15])
    np.testing.assert_array_equal(scored.unscored_dropped(p), [0.0, 0.3, 0.0, 0.0, 0.1, 0.2, 0.0, 0.15])
    assert words.scored([0, 1, 2], np.ones(3)).unscored_dropped(p) is p  # every word scored: nothing dropped


def test_words_best_and_candidates_rank_by_knn_probability_then_index():
    p_knn = np.array([0.0, 0.3, 0.0, 0.0, 0.1, 0.2, 0.1, 0.3])
    assert Words.best(p_knn, 3).tolist() == [1, 7, 5]
    assert Words.best(p_knn, 0).tolist() == [1, 4, 5, 6, 7]  # every word held, in index order
    assert Words.best(None, 3).tolist() == []
    words = Words(5, np.array([7, 9, 12]), ((1, 2), (2, 3), (3, 4)), ("ab", "bc", "cd"))
    assert words.candidates(p_knn, 3) == [0, 2]  # indices 7 and 5 of the 3 best are words 2 and 0 of several tokens
    assert words.candidates(p_knn, 0) == [0, 1, 2]
    assert words.candidates(p_knn, 1) == []
    assert Words(5).candidates(p_knn, 3) == []


def test_words_describe_tokens_and_words_of_several_tokens(tokenizer):
    vocab = tokenizer.vocab_size
    tall, inn = tokenizer.convert_tokens_to_ids(["tall", "##inn"])
    words = Words(vocab, np.array([vocab + 4]), ((tall, inn),), ("tallinn",))
    assert words.describe([3000, vocab, 0], tokenizer) == [
        ("paris", 3000, (3000,)),
        ("tallinn", vocab + 4, (tall, inn)),
        ("[PAD]", 0, (0,)),
    ]


def test_a_token_score_of_one_token_holds_its_id_as_its_pieces():
    assert TokenScore("x", 0.5, 12).pieces == (12,)
    assert TokenScore("xy", 0.5, 40000, [np.int64(3), np.int64(4)]).pieces == (3, 4)
    assert all(type(p) is int for p in TokenScore("xy", 0.5, 40000, [np.int64(3)]).pieces)
