"""A commit's seal: the checksums of what a writer wrote, recorded when its commit ends (`DatastoreWriter.commit`).

Keys and values are extended by their new tails (`Checksums.extend`); store.sqlite by the blocks holding the pages
its write-ahead log holds (wal.py: saved as pending first, copied into the file, hashed again); new files are recorded
whole. store.sqlite is in WAL mode once a writer commits (`to_wal`) and back in rollback mode at rest where the
writer's close finds no other connection (`from_wal`). A change made outside the log since the last seal (a commit
whose pages another program's connection copied into the file when it closed, after a writer was killed; a journal
mode switched by a writer killed before it listed page 1) cannot be told apart by its pages: the writer that meets it
lists every block of store.sqlite as pending when it opens (`opened`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bertknn.store import schema, wal
from bertknn.store.identity import held, new_id
from bertknn.store.integrity import ChecksumError, Checksums, block_size, data_files, seal
from bertknn.store.manifest import DatastoreError
from bertknn.store.schema import COMMITS, SQLITE, STORE_ID

if TYPE_CHECKING:
    from bertknn.store.datastore import Datastore


def record(store: Datastore, began: int) -> None:
    """Record a commit's checksums (`integrity.seal`): the new tail of keys and values, store.sqlite's changed
    blocks, and the data files not recorded yet (new, or announced by `rewriting`). A recorded file is never
    re-recorded whole here, so damage stays visible. `store`: the writer's view; `began`: store.sqlite's commits when
    the writer opened."""
    with _unspilled(store.db):
        try:
            sums = Checksums(store.path)
            for name, width in store.entry_files():
                sums.extend(name, store.size * width)
        except ChecksumError as err:
            raise DatastoreError(f"{err}: damaged before this write; its checksums are kept") from None
        if store.read_meta("checksummed") != "1":  # from now on a missing checksums.json is damage: it exists first
            sums.save()
            with store.sqlite_errors(), store.db:
                store.db.execute("INSERT OR REPLACE INTO meta VALUES ('checksummed', '1')")
        store_id, commits = _identified(store, began)
        own = {STORE_ID: store_id, COMMITS: commits} if store_id else {}
        log = _sqlite(store, sums)
        meta = {wal.CHANGES: wal.change_counter(store.path / SQLITE), wal.LOG: log}
        seal(sums, data_files(store.path), **meta, **own)
    store.version = store.data_version()


def spill(store: Datastore) -> None:
    """Inside a long commit (a build's), after a transaction that left the log past `schema.SPILL_BYTES`: its pages'
    blocks listed as pending, then copied into the file, so the log needs no more disk than a rollback journal would;
    the seal hashes them. Best effort: where it cannot, the log grows and the seal does it."""
    try:
        logged = _logged_blocks(store.path / SQLITE)
        if logged and not store.db.in_transaction:
            _list(store, logged)
            wal.checkpoint(store.db, int(schema.TIMEOUT_S * 1000))
    except (OSError, sqlite3.Error):
        pass


def _logged_blocks(file: Path) -> set[int]:
    """The checksum blocks of store.sqlite that hold the pages its log names."""
    written, page_size = wal.pages(file)
    return {(page - 1) * page_size // block_size(SQLITE) for page in written if page}


@contextlib.contextmanager
def _unspilled(db: sqlite3.Connection) -> Iterator[None]:
    """No spill meanwhile: the seal holds checksums.json's pending blocks in memory."""
    spilling, db.spill = getattr(db, "spill", None), None
    try:
        yield
    finally:
        db.spill = spilling


def _sqlite(store: Datastore, sums: Checksums) -> str:
    """Record store.sqlite anew: the pages its log holds copied into it and the blocks holding them hashed again, or
    the whole file where it is not in WAL mode. The blocks a checkpoint is about to change are saved in checksums.json
    first (`wal.PENDING`), so a failure or a kill after it leaves them to the next seal; another process's reader
    that holds frames back leaves them there too. Returns the log's signature."""
    file = store.path / SQLITE
    if not getattr(store.db, "wal", False):
        sums.record(SQLITE)
        return wal.signature(file)
    pending = set(sums.meta.get(wal.PENDING, [])) | _logged_blocks(file)
    if not pending:
        return wal.signature(file)
    sums.meta[wal.PENDING] = sorted(pending)
    sums.save()
    if wal.checkpoint(store.db, int(schema.TIMEOUT_S * 1000)):
        sums.update(SQLITE, pending)
        del sums.meta[wal.PENDING]
    return wal.signature(file)


def _identified(store: Datastore, began: int) -> tuple[str | None, int]:
    """store.sqlite's id and commits (`identity.held`); a store made before ids is given one by its first writer
    that commits (none is written when this write committed nothing: a sound store's repair writes nothing)."""
    with store.sqlite_errors():
        store_id, commits = held(store.db)
        if store_id is None and commits > began:
            with store.db:
                store.db.execute("INSERT INTO meta VALUES (?, ?)", (STORE_ID, new_id()))
            store_id, commits = held(store.db)
    return store_id, commits


def opened(store: Datastore, commits: int) -> None:
    """At a writer's opening (`commits`: store.sqlite's): where store.sqlite changed after the last seal outside the
    log (commits whose pages the log no longer holds, or a change counter advanced: a journal mode switched, a
    rollback-mode commit), list every block of store.sqlite as pending, so the next seal hashes it whole."""
    file = store.path / SQLITE
    try:
        sums = Checksums(store.path)
    except ChecksumError:
        return  # damage that the writer's checks report
    sealed = sums.meta.get(COMMITS)  # fewer commits than sealed: an older copy, which identity.py refuses
    unlogged = isinstance(sealed, int) and commits > sealed and not wal.pages(file)[0]
    if SQLITE in sums.files and (unlogged or sums.meta.get(wal.CHANGES) != wal.change_counter(file)):
        _list(store, set(range(-(-file.stat().st_size // block_size(SQLITE)))))


def to_wal(store: Datastore) -> None:
    """At a writer's first commit: store.sqlite in WAL mode (automatic checkpoints are off: `schema.writing`), so
    that each seal finds the pages its commits wrote. The switch rewrites page 1 in place, so block 0 is listed as
    pending (a kill before that: the change counter, which the switch advanced, tells the next writer's `opened`)."""
    db = store.db
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        if db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            return  # a file system without shared memory: each seal hashes the whole file
        _list(store, {0})
    db.wal = True


def from_wal(store: Datastore) -> None:
    """At a writer's close, when its connection is store.sqlite's only one and the log holds nothing unsealed:
    store.sqlite back in rollback mode, its log and shared memory gone, so that the store at rest is read and
    written by a bertknn made before WAL mode as before (that one would record the log's files as data). Page 1 is
    rewritten in place and hashed again (a kill before: `opened`, as for `to_wal`). Otherwise it stays in WAL mode."""
    file, db = store.path / SQLITE, store.db
    if not getattr(db, "wal", False) or wal.pages(file)[0] or db.in_transaction:
        return
    try:
        db.execute("PRAGMA busy_timeout = 0")  # another connection (a reader's) is open: stay in WAL mode at once
        if db.execute("PRAGMA journal_mode = DELETE").fetchone()[0] != "delete":
            return
        db.wal = False
        sums = Checksums(store.path)
        sums.update(SQLITE, set(sums.meta.pop(wal.PENDING, [])) | {0})
        sums.meta.update({wal.CHANGES: wal.change_counter(file), wal.LOG: wal.signature(file)})
        sums.save()
    except (ChecksumError, OSError, sqlite3.Error):
        return


def _list(store: Datastore, blocks: set[int]) -> None:
    """Save `blocks` of store.sqlite as pending in checksums.json (where it records store.sqlite)."""
    try:
        sums = Checksums(store.path)
    except ChecksumError:
        return  # damage that the writer's checks report
    if SQLITE in sums.files:
        sums.meta[wal.PENDING] = sorted(set(sums.meta.get(wal.PENDING, [])) | blocks)
        sums.save()


def settle(store: Datastore, began: int) -> None:
    """At a writer's close: seal what store.sqlite's log holds that no seal recorded (a schema upgraded when opened)
    and the blocks still pending (`to_wal`'s), since closing the connection copies the log into the file. Where it
    cannot (a damaged store refused), the log is left as it is, and the next writer lists the whole file
    (`opened`)."""
    try:
        meta = Checksums(store.path).meta
        if meta.get(wal.PENDING) or wal.signature(store.path / SQLITE) not in ("", meta.get(wal.LOG)):
            record(store, began)
    except (DatastoreError, ChecksumError, OSError, sqlite3.Error):
        pass
