"""The exact search: the nearest stored contexts of a question's mask state among given entries (SPEC §3).

It runs over the contiguous key ranges of the selected documents, straight on the float16 memmap (no index is built
per query), or on the codes of compressed keys (`codec.Decoded.distances`): squared Euclidean distances and the k
smallest.
"""

from __future__ import annotations

import numpy as np
import torch

from bertknn.store.codec import Decoded, KeyCodec


def candidates(ranges: list[tuple[int, int]]) -> np.ndarray:
    """Entry indices of the given [start, end) ranges, concatenated."""
    if not ranges:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def nearest(
    keys: np.ndarray | Decoded, entries: np.ndarray, query: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The (at most) k entries nearest to `query` by squared L2, nearest first: (entry indices, squared distances)."""
    if not len(entries):
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    if isinstance(keys, Decoded):  # compressed keys: distances on the codes
        dist = keys.distances(entries, query)
    else:
        rows = torch.from_numpy(np.asarray(keys[entries])).float().numpy()  # float16 -> 32: torch converts faster
        diff = rows - np.asarray(query, dtype=np.float32)
        dist = np.einsum("ij,ij->i", diff, diff)
    part = np.argpartition(dist, k - 1)[:k] if len(dist) > k else np.arange(len(dist))
    order = part[np.lexsort((entries[part], dist[part]))]
    return entries[order], dist[order]


def nearest_codes(
    codec: KeyCodec, codes: np.ndarray, entries: np.ndarray, query: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """`exact.nearest` over compressed keys: the (at most) k nearest to `query` by squared L2 to the decoded
    keys (`Decoded.distances`), nearest first (ties by entry)."""
    return nearest(Decoded(codec, codes), entries, query, k)
