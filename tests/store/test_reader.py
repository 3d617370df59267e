"""A reader never writes: a datastore opened for reading, and questions asked of it, leave every file as it was (an
older store's too: its schema is not upgraded), through a read-only SQLite connection; a hot journal that a killed
writer left is rolled back by SQLite and the committed state read; a write outside `writing()` is refused."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.store.datastore import Datastore

DATA = Path(__file__).resolve().parents[1] / "data"
KILLED_WRITER = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode = DELETE")  # as a store left by a writer before WAL mode (rollback journal)
db.execute("PRAGMA cache_size = 1")  # dirty pages spill into the file before the commit: the journal is hot
db.execute("BEGIN")
db.execute("UPDATE documents SET title = 'changed'")
db.execute("UPDATE sentences SET text = text || printf('%.2000c', 'x')")
os._exit(9)
"""


def _files(path: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under `path`: (size, modification time, sha256). Not store.sqlite-shm, SQLite's shared memory of a
    store whose writer is open: every reader marks in it which commit it reads (https://www.sqlite.org/walformat.html);
    it holds no data and is gone once the last connection closes."""
    return {
        file.relative_to(path).as_posix(): (file.stat().st_size, file.stat().st_mtime_ns, _sha(file))
        for file in sorted(path.rglob("*"))
        if file.is_file() and not file.name.endswith("-shm")
    }


def _sha(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _ask(knn: BertKNN) -> None:
    """Questions with and without a subject, their evidence and the store's checks: what a reader does."""
    knn.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold")
    knn.predict("Dante was born in [MASK] .")
    assert knn.store.check(sample=None) == []


def test_questions_asked_of_a_store_write_nothing(built, tmp_path):
    path = shutil.copytree(built.store.path, tmp_path / "copy")
    before = _files(path)
    store = Datastore(path)
    _ask(BertKNN(built.encoder, store))
    assert _files(path) == before
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # the connection itself cannot write
        store.db.execute("CREATE TABLE t (x)")
    with pytest.raises(DatastoreError, match=r"is opened for reading and never writes"):
        store.writer.commit_parts(faiss=[])
    assert _files(path) == before


def test_a_store_made_before_is_read_without_upgrading_its_schema(tmp_path, tiny_model_dir):
    """tests/data/format1 lacks columns added since (a document's date): they are read as NULL, the file untouched;
    its first writer upgrades it."""
    path = shutil.copytree(DATA / "format1", tmp_path / "format1")
    before = _files(path)
    knn = BertKNN.load(path, str(tiny_model_dir))
    _ask(knn)
    assert [date for _, date in knn.store.documents.find_titles("dante alighieri")] == [None]  # no date column: NULL
    assert _files(path) == before
    knn.writer.store_writer().close()  # opening the writer upgrades it
    with sqlite3.connect(path / "store.sqlite") as db:
        assert {"date", "since"} <= {row[1] for row in db.execute("PRAGMA table_info(documents)")}


def test_a_hot_journal_left_by_a_killed_writer_is_rolled_back_and_the_committed_state_read(built, tmp_path):
    path = shutil.copytree(built.store.path, tmp_path / "copy")
    with Datastore(path) as store:
        titles = store.documents.titles(list(range(store.n_documents)))
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path / "store.sqlite")], check=False)
    assert (path / "store.sqlite-journal").is_file()  # the writer died mid-transaction
    with Datastore(path) as store:  # its checksums hold too: the rollback restored the committed pages
        assert store.documents.titles(list(range(store.n_documents))) == titles
    assert not (path / "store.sqlite-journal").exists() or (path / "store.sqlite-journal").stat().st_size == 0


def test_a_bertknn_opened_read_only_never_writes_and_says_how_to_write(tmp_path, small_corpus, encoder, tiny_model_dir):
    """`BertKNN.load(..., read_only=True)` supplies no writer side: a lazy store's questions that retrieve documents
    not embedded yet, adds and removes are refused with what to do, every file as it was; `load` embeds them."""
    path = tmp_path / "lazy"
    BertKNN.build(small_corpus, path, encoder, lazy=True).store.close()
    before = _files(path)
    reader = BertKNN.load(path, str(tiny_model_dir), read_only=True)
    assert reader.writer is None and reader.store.documents.pending([0]) == [0]
    refused = [
        (lambda: reader.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold"), "embedding the doc"),
        (lambda: reader.add_documents([{"id": "n", "title": "N", "text": "N was born in Riga."}]), "adding documents"),
        (lambda: reader.remove_documents(["d1"]), "removing documents"),
    ]
    for call, what in refused:
        with pytest.raises(DatastoreError, match=rf"{what}.* this BertKNN only reads it: open it with `BertKNN.load"):
            call()
    assert _files(path) == before
    writer = BertKNN.load(path, str(tiny_model_dir))
    assert writer.predict("Ilsa Varnhold was born in [MASK] .", subject="Ilsa Varnhold").knn
    assert writer.store.documents.pending([0]) == []  # Ilsa's document (d1) was embedded on demand
