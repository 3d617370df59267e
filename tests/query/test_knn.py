"""kNN stage: exact search against brute force, the per-word sum, numerical stability, the retrieval-aware vote
(interpolation and ranking: test_combine.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn.index.exact import candidates, nearest
from bertknn.query.knn import document_prior, document_vote, knn_distribution, neighbour_weights

from ..tolerances import assert_neighbours_close


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
    assert_neighbours_close(got, dist, entries[order], brute[order])  # float32 sums against float64 ones


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


def test_document_prior_is_a_softmax_of_scores_relative_to_the_best():
    e = np.exp(-1.0)
    np.testing.assert_allclose(document_prior([4.0, 2.0], 0.5), [1 / (1 + e), e / (1 + e)])
    np.testing.assert_allclose(document_prior([40.0, 20.0], 0.5), document_prior([4.0, 2.0], 0.5))  # scale-free
    np.testing.assert_allclose(document_prior([1.0], 0.1), [1.0])


def test_document_vote_marginalises_over_documents():
    # document 0 (p(d|q) 0.8): words 5 and 6 at distances 0 and 6; document 1 (0.2): word 7, the nearest key of all
    values, dist, groups = np.array([7, 5, 6]), np.array([0.0, 3.0, 9.0]), np.array([1, 0, 0])
    p = document_vote(values, dist, groups, np.array([0.8, 0.2]), 6.0, 10)
    e = np.exp(-1.0)
    expected = np.zeros(10)
    expected[[5, 6, 7]] = [0.8 / (1 + e), 0.8 * e / (1 + e), 0.2]
    np.testing.assert_allclose(p, expected)
    paper = knn_distribution(values, dist, 6.0, 10)
    assert paper.argmax() == 7 and p.argmax() == 5  # the near key of the weakly retrieved document no longer wins
    # a document without neighbours drops out: the prior is renormalised over the others
    np.testing.assert_allclose(
        document_vote(values[1:], dist[1:], groups[1:], np.array([0.5, 0.5]), 6.0, 10)[[5, 6]],
        [1 / (1 + e), e / (1 + e)],
    )
    # one document: the paper's vote exactly; far distances do not underflow
    np.testing.assert_allclose(
        document_vote(values, dist + 1e4, np.zeros(3, int), np.ones(1), 6.0, 10),
        knn_distribution(values, dist + 1e4, 6.0, 10),
    )
