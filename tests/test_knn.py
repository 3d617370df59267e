"""kNN stage: exact search against brute force, the per-word sum, numerical stability; interpolation."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn.combine import interpolate, ranked
from bertknn.knn import candidates, knn_distribution, nearest, neighbour_weights


def test_candidates_concatenate_ranges():
    assert candidates([(3, 6), (10, 12)]).tolist() == [3, 4, 5, 10, 11]
    assert candidates([]).tolist() == []


@pytest.mark.parametrize("k", [1, 7, 128, 1000])
def test_nearest_equals_brute_force(k):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(600, 24)).astype(np.float16)
    entries = candidates([(0, 100), (250, 600)])
    query = rng.normal(size=24).astype(np.float32)
    got, dist = nearest(keys, entries, query, k)
    brute = ((keys[entries].astype(np.float64) - query.astype(np.float64)) ** 2).sum(1)
    order = np.argsort(brute, kind="stable")[: min(k, len(entries))]
    assert got.tolist() == entries[order].tolist()
    np.testing.assert_allclose(dist, brute[order], rtol=1e-5)


def test_nearest_of_nothing_is_empty():
    ids, dist = nearest(np.zeros((5, 4), np.float16), np.zeros(0, np.int64), np.zeros(4, np.float32), 3)
    assert len(ids) == 0 and len(dist) == 0


def test_knn_distribution_sums_weights_per_word():
    weights = np.array([0.4, 0.3, 0.2, 0.05, 0.05])
    temperature = 6.0
    dist = -temperature * np.log(weights) + 123.0  # distances whose normalised exp(-d/T) are exactly `weights`
    p = knn_distribution(np.array([5, 7, 5, 5, 9]), dist, temperature, vocab_size=12)
    assert p[5] == pytest.approx(0.65)
    assert p[7] == pytest.approx(0.3)
    assert p[9] == pytest.approx(0.05)
    assert p.sum() == pytest.approx(1.0)
    assert np.count_nonzero(p) == 3


def test_knn_distribution_is_stable_at_large_distances():
    dist = np.array([1e4, 1e4 + 3.0, 2e4, 5e4])
    p = knn_distribution(np.array([1, 2, 3, 1]), dist, 6.0, vocab_size=5)
    assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
    assert p[1] > p[2] > 0 and p[3] == 0.0  # 1e4 away from the nearest: underflows to 0, without NaN
    w = neighbour_weights(dist[:2], 6.0)
    assert w[0] / w[1] == pytest.approx(np.exp(3.0 / 6.0))


def test_interpolation_sums_to_one_and_falls_back_to_bert():
    rng = np.random.default_rng(1)
    p_bert = rng.dirichlet(np.ones(50))
    p_knn = knn_distribution(np.array([3, 3, 8]), np.array([1.0, 2.0, 4.0]), 6.0, 50)
    p = interpolate(p_bert, p_knn, 0.3)
    assert p.sum() == pytest.approx(1.0)
    assert p[3] == pytest.approx(0.3 * p_knn[3] + 0.7 * p_bert[3])
    assert interpolate(p_bert, None, 0.3) is p_bert


def test_ranked_orders_by_probability_and_drops_zeros(tokenizer):
    p = np.zeros(tokenizer.vocab_size)
    ids = tokenizer.convert_tokens_to_ids(["paris", "rome", "berlin"])
    p[ids] = [0.2, 0.5, 0.3]
    assert [(t.token, t.probability) for t in ranked(p, tokenizer, 5)] == [
        ("rome", 0.5),
        ("berlin", 0.3),
        ("paris", 0.2),
    ]
