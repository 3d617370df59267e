"""store.sqlite's checksums follow its commits through SQLite's write-ahead log (store/wal.py): a commit hashes again
only the blocks holding the pages it wrote, and what a kill, a failed seal or another process's reader leaves
unhashed is hashed by the next seal, with `verify` comparing SQLite's blocks only where its record is whole again."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys

import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.ingest.ingester import Writer
from bertknn.store import integrity, wal
from bertknn.store import verify as checks
from bertknn.store.datastore import Datastore
from bertknn.store.writer import open_datastore_writer

from ..conftest import SMALL_DOCS, write_corpus

PAGE = 4096  # SQLite's default page size; the tests check SQLite one page per block, so a commit touches few
FRESH = [
    {"id": f"n{i}", "title": f"Zorblat Quenmire {i}", "text": f"Zorblat Quenmire {i} was born in Tallinn."}
    for i in range(3)
]
SEALED_NOTE = "committed to after its checksums were recorded"
KILLED_AFTER_COMMIT = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")  # as bertknn's writer (the store at rest is in rollback mode)
db.execute("PRAGMA wal_autocheckpoint = 0")  # the commit stays in the log
db.execute("INSERT INTO meta VALUES ('note', 'committed')")
os._exit(9)  # killed after the commit, before its seal
"""


MANY = [  # enough documents for store.sqlite's tables to span many pages
    {"id": f"m{i}", "title": f"Person {i}", "text": f"Person {i} was born in Oslo. Person {i} plays the cello."}
    for i in range(400)
]


@pytest.fixture()
def store(tmp_path, encoder, monkeypatch):
    monkeypatch.setattr(integrity, "PAGED_BLOCK", PAGE)
    knn = BertKNN.build(write_corpus(tmp_path / "a.jsonl", SMALL_DOCS + MANY), tmp_path / "a", encoder)
    knn.close()
    return tmp_path / "a"


def _whole(path) -> list[str]:
    """The brute-force reference: a digest of every block of store.sqlite as it is now."""
    data = (path / "store.sqlite").read_bytes()
    return [hashlib.blake2b(data[i : i + PAGE], digest_size=16).hexdigest() for i in range(0, len(data), PAGE)]


def _recorded(path) -> list[str]:
    return integrity.Checksums(path).files["store.sqlite"]["blocks"]


def _sqlite_hashed(monkeypatch) -> list[int]:
    """The blocks of store.sqlite hashed to be recorded from now on (not those a check compares)."""
    real, hashed = integrity._hash_blocks, []

    def counting(file, length, blocks, size=None):
        blocks = list(blocks)
        if file.name == "store.sqlite":
            hashed.extend(blocks)
        return real(file, length, blocks, size)

    monkeypatch.setattr(integrity, "_hash_blocks", counting)
    return hashed


def test_a_commit_hashes_again_only_the_blocks_holding_the_pages_it_wrote(store, encoder, monkeypatch):
    assert _recorded(store) == _whole(store)
    hashed, logged, real = _sqlite_hashed(monkeypatch), [], wal.checkpoint

    def checkpoint(db, wait_ms):  # the pages in the log when the seal copies them
        logged.append(wal.pages(store / "store.sqlite"))
        return real(db, wait_ms)

    monkeypatch.setattr(wal, "checkpoint", checkpoint)
    before = len(_whole(store))
    with Writer(Datastore(store), encoder) as writer:
        writer.add_documents(FRESH[:1])
    assert _recorded(store) == _whole(store)  # equal to hashing the whole file
    (pages, page_size), count = logged[0], len(_whole(store))
    assert page_size == PAGE and len(logged) == 1
    assert set(hashed) == {p - 1 for p in pages} | set(range(before - 1, count))  # its pages, and the file's growth
    assert len(set(hashed)) < count / 2, (len(set(hashed)), count)
    report = checks.verify(store)
    assert report.problems == [] and not any(SEALED_NOTE in n for n in report.notes), report
    assert wal.signature(store / "store.sqlite") == ""  # the seal emptied the log


def test_a_writer_killed_after_its_commit_leaves_the_log_to_the_next_seal(store, encoder):
    subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT, str(store / "store.sqlite")], check=False)
    assert wal.pages(store / "store.sqlite")[0]  # the commit is in the log, not in the file
    with Datastore(store) as reader:  # opens sound, and reads the commit
        assert reader.read_meta("note") == "committed"
    report = checks.verify(store)
    assert report.problems == [] and any(SEALED_NOTE in n for n in report.notes), report
    with Writer(Datastore(store), encoder) as writer:  # the next command's seal hashes the killed one's pages too
        writer.add_documents(FRESH[:1])
    assert _recorded(store) == _whole(store)
    report = checks.verify(store)
    assert report.problems == [] and not any(SEALED_NOTE in n for n in report.notes), report


def test_blocks_a_failed_seal_changed_are_listed_and_hashed_by_the_next(store, encoder, monkeypatch):
    real = integrity.Checksums.update

    def failing(self, name, blocks):  # the file system refuses just after the checkpoint changed the file
        raise PermissionError(1, "Operation not permitted", name)

    monkeypatch.setattr(integrity.Checksums, "update", failing)
    with (
        pytest.raises(DatastoreError, match="was committed, but its checksums could not be recorded"),
        Writer(Datastore(store), encoder) as writer,
    ):
        writer.add_documents(FRESH[:1])
    listed = integrity.Checksums(store).meta[wal.PENDING]
    assert listed and _recorded(store) != _whole(store)  # the file changed: its blocks wait, listed
    report = checks.verify(store)
    assert report.problems == [] and any(SEALED_NOTE in n for n in report.notes), report
    monkeypatch.setattr(integrity.Checksums, "update", real)
    with Writer(Datastore(store), encoder) as writer:
        writer.add_documents(FRESH[1:2])
    assert _recorded(store) == _whole(store) and wal.PENDING not in integrity.Checksums(store).meta
    assert checks.verify(store).problems == []


def test_a_reader_of_an_older_commit_holds_frames_back_until_a_later_seal(store, encoder):
    with Writer(Datastore(store), encoder) as writer:
        other = sqlite3.connect(f"{(store / 'store.sqlite').as_uri()}?mode=ro", uri=True)  # another process's reader
        other.execute("BEGIN")
        other.execute("SELECT count(*) FROM documents").fetchone()  # it reads the commit before the add
        writer.add_documents(FRESH[:1])  # the seal cannot copy the add's pages past the reader's commit
        assert integrity.Checksums(store).meta[wal.PENDING]
        report = checks.verify(store)
        assert report.problems == [] and any(SEALED_NOTE in n for n in report.notes), report
        other.execute("ROLLBACK")
        writer.add_documents(FRESH[1:2])
        assert wal.PENDING not in integrity.Checksums(store).meta
        other.close()
    assert _recorded(store) == _whole(store)
    report = checks.verify(store)
    assert report.problems == [] and not any(SEALED_NOTE in n for n in report.notes), report


LATER_WRITE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("INSERT INTO meta VALUES ('note', 'later')")
db.close()  # were it the last connection, SQLite would copy the log into the file and delete it
"""


def test_a_checksum_check_keeps_the_readers_lock_so_another_process_does_not_delete_the_log_under_them(store, encoder):
    """A reader in WAL mode checks every checksum block (this process reads store.sqlite), then another process
    writes and closes: the reader's shared lock tells that process it is not the last, so the log and its shared
    memory stay and the reader reads the write. A descriptor of store.sqlite closed by the check would have dropped
    the lock (descriptors.py): the other process would have deleted them, and the reader read its old commit."""
    with Writer(Datastore(store), encoder) as writer:
        writer.add_documents(FRESH[:1])
        reader = Datastore(store)  # opened while the log exists: it reads in WAL mode
    with reader:
        assert wal.log_of(store / "store.sqlite").exists()
        assert reader.check(sample=None) == []
        subprocess.run([sys.executable, "-c", LATER_WRITE, str(store / "store.sqlite")], check=True)
        assert (store / "store.sqlite-shm").exists() and reader.read_meta("note") == "later"


def test_a_writer_alone_at_its_close_leaves_the_store_in_rollback_mode_with_its_record_whole(store):
    """A writer whose connection is the only one puts store.sqlite back in rollback mode when it closes (an older
    bertknn, which knows no log, reads and writes it as before), page 1's change recorded; the next writer turns
    WAL mode on again and its seal records what it wrote."""
    for round_ in range(2):
        writer = open_datastore_writer(store)
        writer.write_meta("round", str(round_))  # a commit of its own, sealed
        assert writer.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # turned on by its first commit
        writer.close()
        assert (store / "store.sqlite").read_bytes()[18:20] == b"\x01\x01"  # rollback mode (WAL: 2, 2)
        assert not wal.log_of(store / "store.sqlite").exists() and not (store / "store.sqlite-shm").exists()
        assert _recorded(store) == _whole(store) and wal.PENDING not in integrity.Checksums(store).meta
        report = checks.verify(store)
        assert report.problems == [] and not any(SEALED_NOTE in n for n in report.notes), report
