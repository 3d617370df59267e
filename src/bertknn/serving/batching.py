"""`MicroBatcher`: the one worker thread that answers every question of the service, one `predict_batch` call for
the requests that wait together with the same settings (one forward pass instead of one per request). Before each
call it takes in what any process committed to the datastore (`BertKNN.refresh`).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from bertknn.query.pipeline import BertKNN, Query
from bertknn.query.search import ShardUnavailable
from bertknn.query.settings import Settings


@dataclass
class _Job:
    queries: list[Query]
    settings: tuple[int, int, Settings]  # (top_k, evidence, settings): jobs with equal ones share a predict_batch call
    future: Future = field(default_factory=Future)


class MicroBatcher:
    """One worker thread that runs every prediction; jobs waiting together with the same settings share one call.

    The worker takes the oldest job, then everything else waiting (up to `max_batch` jobs, waiting at most
    `window_ms` for more), groups the jobs by settings and calls `predict_batch` once per group. `max_batch=1`
    answers one request at a time. When a merged call fails, its jobs are retried one by one, so a bad request
    fails alone.
    """

    def __init__(self, reader: BertKNN, lock: threading.Lock, max_batch: int = 32, window_ms: float = 0.0) -> None:
        if max_batch < 1 or window_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and window_ms >= 0 (got {max_batch}, {window_ms})")
        self.reader, self.lock, self.max_batch, self.window = reader, lock, max_batch, window_ms / 1000
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.calls = 0  # predict_batch calls made, for /health

    def submit(self, queries: list[Query], top_k: int, evidence: int, settings: Settings) -> Future:
        """Queue questions (`BertKNN.preprocess`); the future's result is their list of `Prediction`s."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bertknn-model", daemon=True)
                self._thread.start()
        job = _Job(queries, (top_k, evidence, settings))
        self.queue.put(job)
        return job.future

    def close(self) -> None:
        """Stop the worker after the jobs already queued."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self.queue.put(None)
            thread.join()

    def _take(self, first: _Job) -> list[_Job]:
        jobs, deadline = [first], time.monotonic() + self.window
        while len(jobs) < self.max_batch:
            try:
                job = (
                    self.queue.get(timeout=max(deadline - time.monotonic(), 0))
                    if self.window
                    else self.queue.get_nowait()
                )
            except queue.Empty:
                break
            if job is None:  # close(): finish this round, then stop
                self.queue.put(None)
                break
            jobs.append(job)
        return [job for job in jobs if job.future.set_running_or_notify_cancel()]  # drop requests given up on

    def _run(self) -> None:
        while (first := self.queue.get()) is not None:
            groups: dict[tuple, list[_Job]] = {}
            for job in self._take(first):
                groups.setdefault(job.settings, []).append(job)
            for group in groups.values():
                self._answer(group)

    def _answer(self, group: list[_Job]) -> None:
        top_k, evidence, settings = group[0].settings
        queries = [q for job in group for q in job.queries]
        try:
            with self.lock:
                self.calls += 1
                self.reader.refresh()
                predictions = self.reader.predict_batch(queries, None, top_k, evidence, settings=settings)
        except Exception as err:
            if len(group) > 1 and not isinstance(err, ShardUnavailable):  # one by one finds the question that failed
                for job in group:
                    self._answer([job])
            else:  # one question, or a shard down that every question of the group waits on
                for job in group:
                    job.future.set_exception(err)
            return
        start = 0
        for job in group:
            job.future.set_result(predictions[start : start + len(job.queries)])
            start += len(job.queries)
