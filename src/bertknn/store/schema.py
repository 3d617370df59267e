"""store.sqlite's schema, and the two ways it is opened: a reader's connection is read-only (SQLite `mode=ro`: it
never writes, not even to upgrade an older store's schema, whose missing columns it reads as temporary views give
them), a writer's (`writer.open_datastore_writer`, under the writer lock) creates and upgrades the schema. A writer
killed mid-transaction leaves a hot journal, which only a read-write connection can roll back: a reader that meets one
has SQLite roll it back (`Connection`), restoring the committed state, and reads on."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

SQLITE = "store.sqlite"  # the file of a datastore directory that holds these tables
REMOVED_PREFIX = "\x1f"  # a control character, which document ids may not hold (text.parse_document)
REPLACING_PREFIX = "\x1e"  # the id of a staged document that replaces the live one with its id when published
WORDS = """CREATE TABLE IF NOT EXISTS words (value INTEGER PRIMARY KEY, pieces TEXT NOT NULL UNIQUE, word TEXT NOT NULL)
"""  # made by the first writer that stores a word of several tokens (a read-only format 1 store has none)
NAMES_TABLES = """
CREATE TABLE IF NOT EXISTS names (  -- names.py: a name, the normalised title it names, how (title, alias, part)
    name TEXT NOT NULL, title TEXT NOT NULL, kind INTEGER NOT NULL, PRIMARY KEY (name, title)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS names_title ON names (title);
CREATE TABLE IF NOT EXISTS redirects (  -- a Wikipedia dump's redirect titles and their targets, normalised
    name TEXT NOT NULL, title TEXT NOT NULL, PRIMARY KEY (name, title)) WITHOUT ROWID;
"""
SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    idx INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL, norm_title TEXT NOT NULL,
    start INTEGER, end INTEGER,  -- the entry range [start, end); NULL until the document is embedded
    state TEXT NOT NULL DEFAULT 'live',
    digest TEXT,  -- sha256 of the document's title and passages: an add with other text under the same id is seen
    removed_id TEXT,  -- a removed document's id (its `id` becomes REMOVED_PREFIX + idx, so the id is free)
    date TEXT,  -- the document's own date (ISO 8601, `text.iso_date`), when its corpus gives one
    since TEXT,  -- the newest date registered up to it (its own included): an undated document is as new as that
    aliases TEXT);  -- the other names of its subject (a JSON list), where its corpus gives them
CREATE INDEX IF NOT EXISTS documents_title ON documents (norm_title);
CREATE TABLE IF NOT EXISTS sentences (idx INTEGER PRIMARY KEY, doc INTEGER NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sentences_doc ON sentences (doc);
CREATE TABLE IF NOT EXISTS entries (
    idx INTEGER PRIMARY KEY, sentence INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS parts (  -- the commit point: the live parts of each index, all a reader opens
    kind TEXT NOT NULL, name TEXT NOT NULL, first INTEGER NOT NULL, stop INTEGER NOT NULL, PRIMARY KEY (kind, name));
"""
    + NAMES_TABLES
)
ADDED = (  # columns of `documents` added after the first datastores, with their definitions
    ("state", "TEXT NOT NULL DEFAULT 'live'", "'live'"),
    ("digest", "TEXT", "NULL"),
    ("removed_id", "TEXT", "NULL"),
    ("date", "TEXT", "NULL"),
    ("since", "TEXT", "NULL"),
    ("aliases", "TEXT", "NULL"),
)
STORE_ID, COMMITS = "store_id", "commits"  # meta rows: the datastore's id, and how many commits its writers made
TIMEOUT_S = 30.0  # how long a connection waits for SQLite's own lock (another connection's transaction)
SPILL_BYTES = 1 << 20  # a writer's log past this after a commit is copied into the file then (sealing.spill), so a
# long commit (a build's) needs no more disk for the log than this and its largest transaction
READONLY_ROLLBACK = getattr(sqlite3, "SQLITE_READONLY_ROLLBACK", 776)  # a hot journal met by a read-only connection


class Connection(sqlite3.Connection):
    """A read-only connection that has SQLite roll back a hot journal (a writer killed mid-transaction) when it meets
    one, then reads on: the rollback restores the committed state, which a writer would restore the same way."""

    def execute(self, *args: object) -> sqlite3.Cursor:
        try:
            return super().execute(*args)
        except sqlite3.OperationalError as err:
            if getattr(err, "sqlite_errorcode", None) != READONLY_ROLLBACK:
                raise
            _roll_back(self.file)
            return super().execute(*args)

    file: Path  # the database file, for the rollback
    views: bool  # whether temporary views give columns the file lacks (an older schema)


class Writing(sqlite3.Connection):
    """A writer's connection: every transaction it commits (`with db:`) adds one to the `COMMITS` row, in that
    transaction, so an older copy of store.sqlite is told from the latest (identity.py)."""

    wal: bool  # whether the file is in WAL mode (`sealing.to_wal`)
    file: Path
    spill: Callable[[], None] | None = None  # called after a commit that left the log past SPILL_BYTES (the writer's)

    def __exit__(self, kind: object, value: object, trace: object) -> bool | None:
        if kind is None and self.in_transaction:
            self.execute(
                "INSERT INTO meta VALUES (?, '1') ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
                (COMMITS,),
            )
        done = super().__exit__(kind, value, trace)
        if kind is None and self.spill is not None and _log_bytes(self.file) > SPILL_BYTES:
            self.spill()
        return done


def _log_bytes(file: Path) -> int:
    try:
        return file.with_name(file.name + "-wal").stat().st_size
    except FileNotFoundError:
        return 0


def _roll_back(file: Path) -> None:
    """SQLite's recovery of a hot journal: a read-write connection's first read rolls it back."""
    db = sqlite3.connect(file, timeout=TIMEOUT_S)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    finally:
        db.close()


def reading(file: Path) -> sqlite3.Connection:
    """A read-only connection to store.sqlite, an older schema's missing columns given by temporary views (which live
    in the connection's own temporary database, not in the file)."""
    db = sqlite3.connect(
        f"{file.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=TIMEOUT_S, factory=Connection
    )
    db.file, db.views = file, False
    columns = {row[1] for row in db.execute("PRAGMA table_info(documents)")}
    missing = [(name, default) for name, _, default in ADDED if name not in columns]
    if columns and missing:
        given = ", ".join(f"{default} AS {name}" for name, default in missing)
        db.execute(f"CREATE TEMP VIEW documents AS SELECT *, {given} FROM main.documents")
        db.views = True
    return db


def empty() -> sqlite3.Connection:
    """What a reader reads of a datastore whose store.sqlite its first writer has not made yet: an empty schema."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript(SCHEMA)
    return db


def writing(file: Path) -> sqlite3.Connection:
    """A writer's connection to store.sqlite: the schema made, or an older one upgraded (columns added)."""
    db = sqlite3.connect(file, check_same_thread=False, timeout=TIMEOUT_S, factory=Writing)
    db.file = file
    db.wal = db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # else its first commit turns it on (sealing)
    db.execute("PRAGMA wal_autocheckpoint = 0")  # the log is copied into the file by the seal alone
    db.execute("PRAGMA synchronous = FULL")  # a commit is on disk when it returns (its journal or log fsynced)
    db.executescript(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(documents)")}
    for name, kind, _ in ADDED:
        if name not in columns:  # a datastore made before the column existed
            with db:
                db.execute(f"ALTER TABLE documents ADD COLUMN {name} {kind}")
    db.execute("CREATE INDEX IF NOT EXISTS documents_state ON documents (state)")
    return db


def write_parts(db: sqlite3.Connection, parts: dict[str, list]) -> None:
    """Replace the committed list of each index kind given, inside the caller's transaction."""
    for kind, listed in parts.items():
        db.execute("DELETE FROM parts WHERE kind = ?", (kind,))
        db.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", [(kind, p.name, p.first, p.stop) for p in listed])
    if parts:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('parts', '1')")
