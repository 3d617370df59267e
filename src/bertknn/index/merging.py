"""The log merge policy shared by the parts of the IR index and of the FAISS index (as Lucene's LogMergePolicy).

Both indexes grow by parts written once (a segment of added documents, a chunk of added keys) and merge adjacent
runs of parts of one size into one, so a query reads few parts and an add never rewrites the whole index.
"""

from __future__ import annotations

import math

FACTOR = 10  # parts of one level merged into one


def merge_plan(sizes: list[int], factor: int = FACTOR) -> tuple[int, int] | None:
    """The first run of `factor` adjacent parts of one level (level: floor(log_factor(size))), as (start, stop)
    positions, or None. Merging such runs until none is left keeps fewer than `factor` parts per level, so a query
    reads O(factor x log(N)) parts, and each item is rewritten O(log(N)) times."""
    levels = [int(math.log(max(size, 1), factor) + 1e-9) for size in sizes]
    run = 1
    for i in range(1, len(levels) + 1):
        run = run + 1 if i < len(levels) and levels[i] == levels[i - 1] else 1
        if run == factor:
            return i - factor + 1, i + 1
    return None
