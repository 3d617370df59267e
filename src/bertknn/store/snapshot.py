"""A reader's snapshot: every read of a question from one commit of a datastore.

A reader maps keys and values up to the entry count of the commit it holds (`Datastore.reopen_if_changed` moves it
to the latest), while SQLite, read in autocommit, answers each statement from the latest commit. Inside a snapshot
the reader's connection holds a read transaction (SQLite's shared lock: a writer's commit waits for it, as it waits
for a checksum check), so the rows a question reads come from one commit; a holder that reopens the reader inside
the snapshot (`BertKNN` does, per batch) has the memory maps, the index parts and the documents agree.

Snapshots nest and may be taken by several threads of one process: the first begins the transaction, the last ends
it. A write by the same process (a lazy store embedding on demand, through its writer) pauses it first, since the
writer's commit would wait for it, and the snapshot begins again at the write's end, reopened on what it committed.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator


class Snapshots:
    """The read transaction of a reader's connection, shared by the snapshots open on it."""

    def __init__(self, connection: Callable[[], sqlite3.Connection], reopen: Callable[[], bool]) -> None:
        self._connection, self._reopen = connection, reopen  # the reader's connection; move it to the latest commit
        self._open = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """One more snapshot: the first begins the read transaction."""
        with self._lock:
            self._open += 1
            if self._open == 1:
                self._begin(reopen=False)

    def exit(self) -> None:
        """One snapshot fewer: the last ends the read transaction."""
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._end()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No read transaction meanwhile (a write of this process), then one again, reopened on what it committed."""
        with self._lock:
            if self._open:
                self._end()
        try:
            yield
        finally:
            with self._lock:
                if self._open:
                    self._begin(reopen=True)

    def _begin(self, reopen: bool) -> None:
        db = self._connection()
        if not db.in_transaction:
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM meta").fetchone()  # the shared lock is taken at the first read
        if reopen:
            self._reopen()

    def _end(self) -> None:
        db = self._connection()
        if db.in_transaction:
            db.execute("ROLLBACK")
