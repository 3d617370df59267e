"""The pages a commit wrote to store.sqlite, read from SQLite's write-ahead log, so that a commit's seal hashes again
only the blocks that hold them instead of the whole file (which grows with the store).

A writer's connection turns store.sqlite's WAL mode on at its first commit (`sealing.to_wal`), automatic
checkpoints off (`schema.writing`): a commit appends its pages to store.sqlite-wal as frames and leaves the database
file as it was. The seal reads which pages
the log holds (`pages`), saves the blocks holding them in checksums.json (`PENDING`), copies the pages into the
database file (`checkpoint`), hashes those blocks again (`integrity.Checksums.update`) and saves the record without
them. While a writer holds the store nothing else copies frames (readers are read-only), so the database file's
recorded blocks stay true between seals. A kill between a commit and its seal leaves the frames in the log, a kill
after the blocks were saved leaves them listed: the next seal hashes them either way, and until then `verify`
compares the database file's blocks only where none are listed and the log is as the last seal left it
(`signature`).

The log's format (https://www.sqlite.org/fileformat2.html#the_write_ahead_log): a 32-byte header (page size at bytes
8-11, the salts at 16-23), then frames of a 24-byte header (page number at 0-3, the salts again at 8-15) and one page.
Frames whose salts are not the header's are left over from before the log was last restarted.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bertknn.store import descriptors
from bertknn.store.identity import held
from bertknn.store.schema import COMMITS

HEADER, FRAME_HEADER = 32, 24
CHECKPOINT_WAIT_MS = 200  # how long a seal waits for another process's reader of an older commit before leaving
# the rest of the log to the next seal (a `verify` in progress holds one for minutes)
PENDING = "sqlite_pending"  # checksums.json's meta: store.sqlite's blocks a checkpoint changes, not yet hashed
CHANGES, LOG = "sqlite_changes", "sqlite_wal"  # and its change counter and log (`signature`) at the last seal


def log_of(database: Path) -> Path:
    """The write-ahead log beside a database file."""
    return database.with_name(database.name + "-wal")


def pages(database: Path) -> tuple[set[int], int]:
    """The page numbers (from 1) the log's frames hold, and the page size; nothing where there is no log. A frame
    torn by a kill may name any page: the caller keeps those inside the file."""
    try:
        handle = log_of(database).open("rb")
    except FileNotFoundError:
        return set(), 0
    with handle:
        header = handle.read(HEADER)
        if len(header) < HEADER:
            return set(), 0
        page_size = int.from_bytes(header[8:12], "big")
        page_size = 65536 if page_size == 1 else page_size  # the format writes 65536 as 1
        found: set[int] = set()
        while len(frame := handle.read(FRAME_HEADER)) == FRAME_HEADER and frame[8:16] == header[16:24]:
            found.add(int.from_bytes(frame[:4], "big"))
            handle.seek(page_size, 1)
        return found, page_size


def checkpoint(db: sqlite3.Connection, wait_ms: int) -> bool:
    """Copy the log's frames into the database file and empty the log; True when every frame was copied. A reader of
    an older commit in another process holds the frames after it back (waited for `CHECKPOINT_WAIT_MS`): they stay in
    the log for the next seal. `wait_ms`: the connection's busy timeout, restored after."""
    if db.in_transaction:
        return False
    db.execute(f"PRAGMA busy_timeout = {CHECKPOINT_WAIT_MS}")
    try:
        _, log, copied = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.execute(f"PRAGMA busy_timeout = {wait_ms}")
    return log == copied


def signature(database: Path) -> str:
    """What the log is now ("" when it is empty or absent): its salts and length. `verify` compares the database
    file's blocks only when this is what the last seal recorded."""
    try:
        with log_of(database).open("rb") as handle:
            header = handle.read(HEADER)
            length = handle.seek(0, 2)
    except FileNotFoundError:
        return ""
    return "" if length == 0 else f"{header[16:24].hex()}:{length}"


def change_counter(database: Path) -> int | None:
    """The database file's change counter (header bytes 24-27), which a commit in rollback mode, and a checkpoint that
    copies page 1, advance; None before the first writer made the file (a create killed before it)."""
    try:
        return int.from_bytes(descriptors.read(database, 24, 4), "big")
    except FileNotFoundError:
        return None


def as_sealed(database: Path, db: sqlite3.Connection, meta: dict) -> bool:
    """Whether the database file is as the last seal recorded it (`meta`, checksums.json's): no blocks pending, its
    commits (`identity.held`, read through `db`), change counter and log as the seal left them. `verify` and a
    reader's check compare its blocks only then."""
    commits = held(db)[1]
    return (
        not meta.get(PENDING)
        and meta.get(COMMITS, commits) == commits
        and meta.get(CHANGES) == change_counter(database)
        and meta.get(LOG, "") == signature(database)
    )
