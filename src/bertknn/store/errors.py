"""SQLite's errors about a datastore's file as `DatastoreError`s that name it and say what to do (a full disk as
`atomic.DiskFullError`): what the reader, the writer and a new store's creation all turn them into; and the error of
a write asked of a reader (`writer_of`)."""

from __future__ import annotations

import contextlib
import sqlite3
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def writer_of(path: Path, own: weakref.ref | None) -> Any:
    """The writer a store object is the own view of (`own`, a weak reference to it); a reader (None) never writes:
    DatastoreError, which says what writes."""
    writer = own and own()
    if writer is None:
        raise DatastoreError(
            f"{path} is opened for reading and never writes: writes go through its writer "
            "(`bertknn.store.writers.open_writer`)"
        )
    return writer
