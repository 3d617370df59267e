"""SQLite's errors about a datastore's file as `DatastoreError`s that name it and say what to do (a full disk as
`atomic.DiskFullError`): what the reader, the writer and a new store's creation all turn them into."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from bertknn.store import atomic
from bertknn.store.manifest import DatastoreError


@contextlib.contextmanager
def sqlite_errors(what: str, hint: str) -> Iterator[None]:
    """SQLite's errors about a damaged or foreign file as a DatastoreError naming `what` (integrity errors pass)."""
    try:
        yield
    except sqlite3.IntegrityError:
        raise
    except sqlite3.DatabaseError as err:
        code = getattr(err, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_FULL or "disk is full" in str(err):
            raise atomic.DiskFullError(Path(what)) from None  # SQLite rolled the transaction back: nothing damaged
        if code is not None and code & 0xFF == sqlite3.SQLITE_READONLY:  # the file, not its content
            raise DatastoreError(
                f"{what} cannot be written ({err}): check its permissions and the file system (mounted read-only, "
                "an immutable file); nothing was changed"
            ) from None
        raise DatastoreError(f"{what} is damaged or unreadable ({err}); {hint}") from None
