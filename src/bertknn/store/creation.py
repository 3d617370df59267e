"""A new datastore: an empty one with its manifest (`create`), or a copy of another's documents that starts a store of
another model or layer, or a pruned one (`copy_registration`). Each is made whole or not at all."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from bertknn.store import atomic, schema
from bertknn.store import evidence as evidence_table
from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore
from bertknn.store.errors import sqlite_errors
from bertknn.store.identity import new_id, write_identity
from bertknn.store.manifest import DatastoreError
from bertknn.store.records import Part
from bertknn.store.schema import SQLITE, STORE_ID


def create(path: str | Path, manifest: dict) -> Datastore:
    """A new, empty datastore directory with this manifest (`builder.create` makes the manifest from a model).

    A directory that holds only temporary files (`*.tmp`: what a create killed before its manifest was in place
    leaves) counts as empty; anything else is refused.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DatastoreError(f"{path} is a file, not a directory; choose a new or empty directory for the datastore")
    leftovers = list(path.iterdir()) if path.exists() else []
    if any(not p.name.endswith(".tmp") for p in leftovers):
        raise DatastoreError(f"{path} exists and is not a datastore; choose an empty or new directory")
    path.mkdir(parents=True, exist_ok=True)
    atomic.remove_temporary(path)
    manifest = {**manifest, STORE_ID: manifest.get(STORE_ID) or new_id()}
    write_json(path / "manifest.json", manifest)
    with sqlite_errors(str(path / SQLITE), "free space and rerun"), closing(schema.writing(path / SQLITE)) as db, db:
        write_identity(db, manifest)
        schema.write_parts(db, {"tfidf": [], "faiss": []})  # a new store's indexes are listed from the start
    return Datastore(path)


def copy_registration(
    source: str | Path,
    path: str | Path,
    manifest: dict,
    parts: dict[str, list[Part]],
    files: list[str],
    words: bool = False,
) -> Datastore:
    """A new datastore at `path` (with this manifest) holding the documents and sentences of `source`, nothing
    embedded, and the index parts given (`parts`: kind -> list, committed in the copy; `files`: their files and
    folders, copied): registration does not depend on the model, so another model or layer can start from it.
    With `words`, the words of several tokens are kept too (a copy for the same model: `prune`)."""
    source, path = Path(source), Path(path)
    tmp = atomic.new_folder(path)
    try:
        _fill_copy(source, tmp, manifest, parts, files, words)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-made stays (a kill leaves it to the next run)
        raise
    atomic.publish(tmp, path)
    return Datastore(path)


def _fill_copy(
    source: Path, tmp: Path, manifest: dict, parts: dict[str, list[Part]], files: list[str], words: bool
) -> None:
    """`copy_registration`'s contents, written into the temporary folder `tmp`."""
    with (
        Datastore(source) as src,
        sqlite_errors(str(tmp / SQLITE), "free space and rerun"),
        atomic.naming(tmp / SQLITE),
        closing(sqlite3.connect(tmp / SQLITE)) as db,
        db,
    ):
        src.db.backup(db)
        db.execute("UPDATE documents SET start = NULL, end = NULL")
        db.execute("DELETE FROM entries")
        db.execute("DELETE FROM meta")
        db.execute(schema.WORDS)
        if not words:
            db.execute("DELETE FROM words")
        db.execute("DELETE FROM parts")
        db.execute(evidence_table.TABLE)
        db.execute("DELETE FROM evidence")  # the copy's entries bring theirs
        rows = [(kind, p.name, p.first, p.stop) for kind, listed in parts.items() for p in listed]
        db.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", rows)
        db.execute("INSERT INTO meta VALUES ('parts', '1')")
    with (
        sqlite_errors(str(tmp / SQLITE), "free space and rerun"),
        closing(sqlite3.connect(tmp / SQLITE)) as db,
    ):
        db.execute("VACUUM")  # the source's entry rows leave free pages behind: the copy holds only what it keeps
    for name in files:
        atomic.copy(source / name, tmp / name)
    manifest = {**manifest, STORE_ID: new_id()}  # a new datastore: not the source's
    write_json(tmp / "manifest.json", manifest)
    with sqlite_errors(str(tmp / SQLITE), "free space and rerun"), closing(schema.writing(tmp / SQLITE)) as db, db:
        write_identity(db, manifest)
