"""How a test compares floats that went through BLAS, ONNX Runtime or a model (the rule of tests/README.md).

Such floats depend on the order in which sums are accumulated, and that order changes with batching, padding, the
thread count and the CPU's kernels (PyTorch's AVX2 or AVX-512 code, MKL's, OpenBLAS's and FAISS's per-CPU paths).
So they are compared with one of the tolerances below, each with its reason, and a ranking of them is compared with
`assert_ranking_close` or `assert_neighbours_close`, which accept a swap of two entries only where their values are
within that tolerance of each other (a near-tie that float noise may order either way). Exact comparisons stay where
the code promises bit-identity: a rerun on the same machine with the same inputs, copies of stored bytes, integer
arithmetic, and float64 arithmetic done by numpy in one fixed order on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# float32 through a model (hidden states, LM probabilities, sentence vectors): every state is a chain of float32 dot
# products (32 to 768 terms, rounding ~ sqrt(n) * 2**-24 each), layer norms and softmaxes over a few blocks; another
# batching, padding or kernel moves values by 1e-7 to 1e-6 relative (2.1e-8 was seen on LM probabilities between
# batch shapes, 2.4e-5 on a squared distance near 0). 1e-4 is well above that and far below any difference a test
# means to catch (a wrong token, mask or layer changes values by 1e-2 or more).
MODEL_RTOL = 1e-4
# elements near 0 of such states and vectors (layer-normed states and unit sentence vectors are O(1); their noise
# is ~1e-6 absolute)
MODEL_ATOL = 1e-5
# answers from float16 keys that builds batched otherwise (a sharded build against a single one): where batching
# noise crosses a float16 rounding boundary a key element moves by one float16 step (2**-11 relative, 2e-3 absolute
# at the tiny models' scale), which moves distances and the vote's probabilities by up to ~1e-4 relative; 1e-3
FLOAT16_KEYS_RTOL = 1e-3
# float64 arithmetic by numpy on the same inputs, by another formula (the code's logs and exps against the test's
# powers): a few roundings of 2**-53 times the logs' size, ~1e-14
FLOAT64_RTOL = 1e-9
# squared L2 distances from float32 keys (FAISS, the datastore's search): d = |q|^2 - 2 q.k + |k|^2 loses relative
# accuracy as d nears 0 (8.965191e-07 against 8.965382e-07 was seen for one near-identical key), so an absolute
# term scaled to the keys' squared norms (a few tens for the tiny test models) backs the relative one
DISTANCE_RTOL, DISTANCE_ATOL = 1e-4, 1e-4


def assert_ranking_close(
    got: Sequence[tuple[object, float]], expected: Sequence[tuple[object, float]], rtol: float = MODEL_RTOL, atol=0.0
) -> None:
    """Two rankings of (item, value), best first: the same length, the values rank by rank within the tolerance, and
    an item differs from the expected one at a rank only where the two are a near-tie (the expected value of the item
    found there, or the value at the ranking's end when it fell out, within the tolerance of the expected value)."""
    assert len(got) == len(expected), (got, expected)
    values, wanted = np.array([v for _, v in got], float), np.array([v for _, v in expected], float)
    np.testing.assert_allclose(values, wanted, rtol=rtol, atol=atol)
    slack = 2 * (atol + rtol * np.abs(wanted))  # both sides may be off by the tolerance
    where = {item: v for item, v in expected}
    for rank, ((item, _), (want, value)) in enumerate(zip(got, expected)):
        if item != want:
            other = where.get(item, wanted[-1])  # an item ranked past the end was at most the last value
            assert abs(other - value) <= slack[rank], f"rank {rank}: {item!r} in place of {want!r}, no near-tie"


def assert_neighbours_close(
    ids: np.ndarray,
    distances: np.ndarray,
    want_ids: np.ndarray,
    want_distances: np.ndarray,
    rtol: float = DISTANCE_RTOL,
    atol: float = DISTANCE_ATOL,
) -> None:
    """Nearest neighbours (ids, squared distances, nearest first) against a float64 brute force: the distances
    within the tolerance, the ids equal except where near-tied distances may swap them."""
    assert_ranking_close(
        list(zip(np.asarray(ids).tolist(), np.asarray(distances, float))),
        list(zip(np.asarray(want_ids).tolist(), np.asarray(want_distances, float))),
        rtol,
        atol,
    )
