"""The commit point of a datastore's indexes, as Lucene's segments_N: readers open exactly the parts that SQLite
lists (`Datastore.parts`); a writer writes each part whole under a name no list holds, commits a new list
(`DatastoreWriter.commit_parts`, or `publish` with the documents the parts index), and only then deletes the files that
no list names (`retire`). A reader that finds a listed file gone reads the list again: a merge committed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.records import Part

T = TypeVar("T")
RETRIES = 10  # times a reader takes a newer list when a merge retired what it was opening


def open_listed(store: Datastore, kind: str, open_parts: Callable[[list[Part]], T], legacy: Callable[[], T]) -> T:
    """`open_parts` of the committed list of `kind`; `legacy()` for a datastore made before lists were committed.

    A part missing or not as listed while the list has changed since is a merge committed by the writer meanwhile:
    the new list is opened. While the list stays the same, it is damage, and the error is raised.
    """
    listed = store.parts(kind)
    if listed is None:
        return legacy()
    for _ in range(RETRIES - 1):
        try:
            return open_parts(listed)
        except (FileNotFoundError, DatastoreError):
            now = store.parts(kind)
            if now == listed:
                raise
            listed = now
    return open_parts(listed)


def retire(store: Datastore, kind: str, on_disk: Iterable[str], delete: Callable[[str], None]) -> list[str]:
    """Delete the parts of `kind` found on disk that the committed list does not name (replaced by a merge, or
    written by a writer that was interrupted before its commit); return their names. For the writer, after a
    commit: a reader still opening a retired part finds the new list."""
    committed = store.parts(kind)
    if committed is None:  # nothing is listed yet (a datastore made before lists): every part may be live
        return []
    gone = sorted(set(on_disk) - {part.name for part in committed})
    for name in gone:
        delete(name)
    return gone
