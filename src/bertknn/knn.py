"""kNN stage: exact nearest stored contexts of a question's mask state, and their vote (SPEC §3).

The search runs over the contiguous key ranges of the selected documents, straight on the float16 memmap (no index
is built per query): squared Euclidean distances, the k smallest, and p_kNN(w) = sum of exp(-d_i / T) over the
neighbours whose value is w, normalised over the neighbours (computed after subtracting the smallest distance, so it
never underflows).
"""

from __future__ import annotations

import numpy as np
import torch


def candidates(ranges: list[tuple[int, int]]) -> np.ndarray:
    """Entry indices of the given [start, end) ranges, concatenated."""
    if not ranges:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


def nearest(keys: np.ndarray, entries: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The (at most) k entries nearest to `query` by squared L2, nearest first: (entry indices, squared distances)."""
    if not len(entries):
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows = torch.from_numpy(np.asarray(keys[entries])).float().numpy()  # float16 -> 32: torch converts faster
    diff = rows - np.asarray(query, dtype=np.float32)
    dist = np.einsum("ij,ij->i", diff, diff)
    part = np.argpartition(dist, k - 1)[:k] if len(dist) > k else np.arange(len(dist))
    order = part[np.lexsort((entries[part], dist[part]))]
    return entries[order], dist[order]


def neighbour_weights(sq_dist: np.ndarray, temperature: float) -> np.ndarray:
    """exp(-d / T) normalised over the neighbours, computed stably from the smallest distance."""
    w = np.exp(-(np.asarray(sq_dist, np.float64) - np.min(sq_dist)) / temperature)
    return w / w.sum()


def knn_distribution(values: np.ndarray, sq_dist: np.ndarray, temperature: float, vocab_size: int) -> np.ndarray:
    """p_kNN over the vocabulary: each word gets the SUM of its neighbours' normalised weights."""
    return np.bincount(values, weights=neighbour_weights(sq_dist, temperature), minlength=vocab_size)
