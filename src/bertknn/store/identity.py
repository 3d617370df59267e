"""Which store.sqlite is a datastore's own, and whether it is its latest: a store.sqlite copied in from another
datastore, or an older copy of the store's own put back, holds other documents than the keys, indexes and checksums
beside it, and would answer from a wrong state while every block of it is sound.

A datastore has an id (`STORE_ID`, random), written in manifest.json when it is created and kept in store.sqlite's
`meta`; store.sqlite counts its commits (`COMMITS`: every transaction of a writer's connection adds one,
`schema.Writing`); each writer's seal records both in checksums.json (integrity.py). A store.sqlite whose id is not
the manifest's (or the checksums') is another store's; one that counts fewer commits than the checksums were
sealed at is an older copy. More commits than sealed is a writer interrupted before its seal, which is sound.
A store made before ids has none in its manifest: its first writer that commits gives store.sqlite one, and the
checksums record it from then on.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Mapping

from bertknn.store.integrity import Damage
from bertknn.store.manifest import IDENTITY
from bertknn.store.schema import COMMITS, SQLITE, STORE_ID

PUT_BACK = "put back this datastore's latest store.sqlite, or rebuild the datastore"
RECORD = "restore this datastore's own, or `bertknn verify --record` records the files as they are"


def new_id() -> str:
    """A new datastore's id."""
    return uuid.uuid4().hex


def held(db: sqlite3.Connection) -> tuple[str | None, int]:
    """(id, commits) as store.sqlite holds them (None and 0 where a store made before them has none)."""
    rows = dict(db.execute("SELECT key, value FROM meta WHERE key IN (?, ?)", (STORE_ID, COMMITS)).fetchall())
    return rows.get(STORE_ID), int(rows.get(COMMITS, 0))


def sealed(meta: Mapping[str, object]) -> tuple[str | None, int | None]:
    """(id, commits) as the last seal recorded them in checksums.json's meta (None where it recorded none)."""
    store_id, commits = meta.get(STORE_ID), meta.get(COMMITS)
    return (store_id if isinstance(store_id, str) else None), (commits if isinstance(commits, int) else None)


def damage(
    manifest_id: str | None, db: sqlite3.Connection, meta: Mapping[str, object], older: bool = True
) -> list[Damage]:
    """What is wrong with store.sqlite's provenance: another store's (its id is not manifest.json's or the
    checksums'), or, with `older`, an older copy of this store's own (fewer commits than checksums.json was sealed
    at). checksums.json of another store (its id is neither manifest.json's nor store.sqlite's) is named instead."""
    own, commits = held(db)
    seal_id, seal_commits = sealed(meta)
    made = db.execute("SELECT 1 FROM meta WHERE key = 'identity'").fetchone()  # none: its create was interrupted
    if manifest_id is not None and own != manifest_id and made:
        said = f"is another datastore's (its id {own or 'none'}, manifest.json's {manifest_id}); {PUT_BACK}"
        return [Damage(SQLITE, None, said)]
    if seal_id is not None and own is not None and seal_id != own:
        return [
            Damage("checksums.json", None, f"is another datastore's (its id {seal_id}, {SQLITE}'s {own}); {RECORD}")
        ]
    if older and seal_id == own and seal_commits is not None and commits < seal_commits:
        return [
            Damage(
                SQLITE,
                None,
                f"is an older copy: it holds commit {commits:,}, this datastore's checksums were sealed at commit "
                f"{seal_commits:,}, so what was committed since (documents added or removed) is missing from it; "
                f"{PUT_BACK}, or, if it was restored on purpose, `bertknn verify --record` accepts it",
            )
        ]
    return []


def identity(manifest: dict) -> str:
    """The copy of a manifest's model and key settings that SQLite keeps, which opening the store compares."""
    return json.dumps({field: manifest.get(field) for field in IDENTITY})


def write_identity(db: sqlite3.Connection, manifest: dict) -> None:
    """`identity` and the store's id (where its manifest has one) kept in SQLite, inside the caller's transaction."""
    db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity(manifest),))
    if manifest.get(STORE_ID):
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (STORE_ID, manifest[STORE_ID]))
