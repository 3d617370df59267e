"""A reader's snapshot: every read of a question from one commit of a datastore.

A reader maps keys and values up to the entry count it last read, while SQLite, read in autocommit, answers each
statement from the latest commit: a writer committing between the two (a document added or replaced) would hand a
question entry ranges past the mapped keys. Inside a snapshot the reader's connection holds a read transaction
(SQLite's shared lock: a writer's commit waits for it, as it waits for a checksum check) and the store re-reads what
was committed when it began (`Datastore.reload`), so the memory maps, the index parts and the documents agree.

Snapshots nest and may be taken by several threads of one process: the first begins the transaction, the last ends
it. A write by the same store object (a lazy store embedding on demand) ends it first, since its own commit would
wait for it, and the snapshot begins again at the write's end, on what the write committed.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator


class Snapshots:
    """The read transaction of a reader's connection, shared by the snapshots open on it."""

    def __init__(self, connection: Callable[[], sqlite3.Connection], reload: Callable[[], None]) -> None:
        self._connection, self._reload = connection, reload  # the reader's connection now; re-read the store
        self._open = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """One more snapshot: the first begins the read transaction and re-reads the store."""
        with self._lock:
            self._open += 1
            if self._open == 1:
                self._begin()

    def exit(self) -> None:
        """One snapshot fewer: the last ends the read transaction."""
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._end()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No read transaction meanwhile (a write of this store object), then one again on what the write committed."""
        with self._lock:
            if self._open:
                self._end()
        try:
            yield
        finally:
            with self._lock:
                if self._open:
                    self._begin()

    def _begin(self) -> None:
        db = self._connection()
        if not db.in_transaction:
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM meta").fetchone()  # the shared lock is taken at the first read
        self._reload()

    def _end(self) -> None:
        db = self._connection()
        if db.in_transaction:
            db.execute("ROLLBACK")
