"""Compressed keys (`index.codec`): each form's round trip within its encoder's error, checked against the encoder's
own arithmetic done here, and the exact search over codes equal to a brute force over the decoded keys."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from bertknn.index.exact import nearest_codes
from bertknn.store.codec import Decoded, KeyCodec

from ..tolerances import DISTANCE_ATOL, DISTANCE_RTOL, assert_neighbours_close


@pytest.fixture(scope="module")
def keys() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((3000, 32)) * rng.uniform(0.5, 3, 32)).astype(np.float32)


def test_sq8_decodes_each_value_within_half_a_step_of_its_dimension(keys):
    codec = KeyCodec.train("SQ8", keys)
    assert codec.code_size == 32 and codec.encode(keys).dtype == np.uint8
    step = (keys.max(axis=0) - keys.min(axis=0)) / 255  # SQ8: 256 levels over each dimension's trained range
    error = np.abs(codec.decode(codec.encode(keys)) - keys)
    assert (error <= step / 2 + 1e-5).all()
    assert error.max() > step.min() / 8  # lossy: not an identity


def test_pq_decodes_each_sub_vector_to_its_nearest_centroid(keys):
    codec = KeyCodec.train("PQ8", keys)
    assert codec.code_size == 8
    centroids = faiss.vector_to_array(codec.index.pq.centroids).reshape(8, 256, 4)  # 8 sub-vectors of 4 dims
    subs = keys[:200].reshape(200, 8, 1, 4)
    nearest = ((subs - centroids[None]) ** 2).sum(-1).argmin(-1)  # (200, 8) centroid per sub-vector
    expected = centroids[np.arange(8), nearest].reshape(200, 32)
    np.testing.assert_allclose(codec.decode(codec.encode(keys[:200])), expected, atol=1e-5)


def test_pca_then_sq8_keeps_keys_of_that_rank_up_to_the_sq8_step():
    rng = np.random.default_rng(1)
    low = (rng.standard_normal((2000, 6)) @ rng.standard_normal((6, 32))).astype(np.float32)  # rank 6
    codec = KeyCodec.train("PCA6,SQ8", low)
    assert codec.code_size == 6
    error = np.linalg.norm(codec.decode(codec.encode(low)) - low, axis=1)
    assert np.median(error) < 0.02 * np.median(np.linalg.norm(low, axis=1))


@pytest.mark.parametrize("name", ["SQ4", "SQ8", "PQ8", "PCA16,SQ8"])  # on the codes (SQ, PQ); decoded (PCA)
def test_the_exact_search_on_codes_equals_a_brute_force_over_the_decoded_keys(keys, name):
    codec = KeyCodec.train(name, keys)
    codes = codec.encode(keys)
    decoded = codec.decode(codes)
    rng = np.random.default_rng(2)
    entries = np.sort(rng.choice(len(keys), 700, replace=False))
    for query in keys[rng.choice(len(keys), 5)] + 0.1:
        found, dist = nearest_codes(codec, codes, entries, query, 64)
        d = ((decoded[entries] - query) ** 2).sum(axis=1)
        order = np.lexsort((entries, d))[:64]
        assert_neighbours_close(found, dist, entries[order], d[order])  # float32 sums in another order
        distances = Decoded(codec, codes).distances(entries, query)
        np.testing.assert_allclose(distances, d, rtol=DISTANCE_RTOL, atol=DISTANCE_ATOL)
    assert Decoded(codec, codes).shape == keys.shape
    assert nearest_codes(codec, codes, np.zeros(0, np.int64), keys[0], 8)[0].tolist() == []


def test_a_saved_codec_encodes_as_the_one_trained(keys, tmp_path):
    codec = KeyCodec.train("PCA16,SQ8", keys)
    codec.save(tmp_path / "keys.codec")
    again = KeyCodec.load(tmp_path / "keys.codec", "PCA16,SQ8")
    np.testing.assert_array_equal(again.encode(keys[:50]), codec.encode(keys[:50]))
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("name", "n", "message"),
    [
        ("SQ9", 300, "bad key codec 'SQ9'"),
        ("PQ7", 300, "bad key codec 'PQ7'.*multiple of the number of subquantizers"),
        ("PQ8", 100, "cannot train key codec 'PQ8' on 100 keys"),
    ],
)
def test_a_codec_faiss_cannot_make_is_refused_by_name(keys, name, n, message):
    with pytest.raises(ValueError, match=message):
        KeyCodec.train(name, keys[:n])
