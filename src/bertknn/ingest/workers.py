"""CPU worker processes for the stages that are pure Python (sentence splitting, IR hashing): `ordered_map`.

A build should never leave the model waiting for these stages; bench/README.md has the rates of one process and of
several. The standard library's process pool does the work; what is written here is
only the part it lacks: results in input order with a bounded number of batches in flight, so memory does not grow
with the corpus (`Executor.map` submits the whole input at once).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from itertools import islice
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

PARALLEL_FROM = 5000  # items: below this, starting worker processes costs more than they save
BATCH = 200  # items per task a worker gets
AHEAD = 2  # tasks in flight per worker


def count(workers: int, items: int | None = None) -> int:
    """Worker processes to use: `workers` when > 0; 0 ("auto") means every core for `items` >= PARALLEL_FROM (or
    an unknown number of items), else none (1: work in this process)."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: every core for large corpora), not {workers}")
    if workers:
        return workers
    return (os.cpu_count() or 1) if items is None or items >= PARALLEL_FROM else 1


def _apply(fn: Callable[[T], R], batch: list[T]) -> list[R]:
    return [fn(item) for item in batch]


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int, batch: int = BATCH) -> Iterator[R]:
    """`fn` of each item, in order; with `workers` > 1 in that many processes, `AHEAD` batches per worker in flight.
    `fn` must be a module-level function that touches neither the model nor the datastore's connections.

    Workers are forked where the OS can (as PyTorch's DataLoader does): "spawn" would import the parent's main
    module again in each worker, which for the command line is all of bertknn with PyTorch (seconds per worker)."""
    if workers <= 1:
        yield from map(fn, items)
        return
    it = iter(items)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        flight: deque = deque()
        while chunk := list(islice(it, batch)):
            flight.append(pool.submit(_apply, fn, chunk))
            if len(flight) >= AHEAD * workers:
                yield from flight.popleft().result()
        while flight:
            yield from flight.popleft().result()
