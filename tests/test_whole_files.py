"""A datastore's files written whole: what a writer killed or stopped by a full disk used to leave (an empty
faiss.json or tfidf_ndocs.txt, a 0-byte faiss.index) is named by `verify`, repaired by a rerun, and no longer made."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import faiss
import pytest
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.console import console
from bertknn.index.faiss_files import save
from bertknn.index.faiss_index import FaissIndex
from bertknn.store import atomic
from bertknn.store.datastore import Datastore
from bertknn.store.integrity import Checksums

from .conftest import full_after

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Lines as wide as any temporary path: a message is never wrapped inside a file name."""
    monkeypatch.setattr(console, "width", 1000)


def _cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _left_by_an_interrupted_writer(store: Path, name: str) -> None:
    """What writing `name` in place did when killed or out of space: its checksums dropped first, then emptied."""
    sums = Checksums(store)
    sums.forget([name])
    sums.save()
    (store / name).write_bytes(b"")


@pytest.fixture()
def indexed(built) -> Path:
    store = built.store.path
    assert _cli("index", store, "--factory", "Flat", "--threads", "1").exit_code == 0
    return store


@pytest.mark.parametrize("name", ["faiss.json", "tfidf_ndocs.txt", "faiss.index"])
def test_verify_names_an_empty_file_that_a_reader_needs(indexed, name):
    _left_by_an_interrupted_writer(indexed, name)
    result = _cli("verify", indexed)
    assert result.exit_code == 1, result.output
    assert f"damaged:{indexed / name}" in "".join(result.output.split())


def test_verify_names_a_faiss_index_that_faiss_cannot_read(indexed):
    data = (indexed / "faiss.index").read_bytes()
    (indexed / "faiss.index").write_bytes(data[: len(data) // 2])
    _cli("verify", indexed, "--record")  # recorded as it is: only FAISS itself can tell it is cut short
    result = _cli("verify", indexed)
    assert result.exit_code == 1 and "faiss.indexisdamaged" in "".join(result.output.split()), result.output


def test_a_rerun_of_index_repairs_the_settings_an_interrupted_writer_left(indexed):
    vectors = faiss.read_index(str(indexed / "faiss.index")).ntotal
    _left_by_an_interrupted_writer(indexed, "faiss.json")
    result = _cli("index", indexed, "--factory", "Flat", "--threads", "1")
    assert result.exit_code == 0, result.output
    store = Datastore(indexed)
    assert FaissIndex.load(store).ntotal == vectors == store.size
    assert _cli("verify", indexed).exit_code == 0


def test_checksummed_settings_that_are_damaged_stay_an_error(indexed):
    (indexed / "faiss.json").write_bytes(b"{")  # damage after the writer recorded it: not an interrupted write
    result = _cli("index", indexed, "--factory", "Flat", "--threads", "1")
    assert result.exit_code != 0


def _full_after(monkeypatch, suffix: str, room: int) -> None:
    """Writes to temporary files ending in `suffix` fail with ENOSPC once `room` bytes are written."""
    full_after(monkeypatch, room, lambda path: path.name.endswith(suffix + atomic.TMP))


def test_a_full_disk_while_writing_a_faiss_file_keeps_the_good_index_and_says_so(indexed, monkeypatch):
    store = Datastore(indexed)
    good = (indexed / "faiss.index").read_bytes()
    index = FaissIndex.load(store).index
    _full_after(monkeypatch, ".index", 100)
    with pytest.raises(atomic.DiskFullError) as caught:
        save(index, store)  # FAISS's own writer returned here, and renamed an empty file over the good one
    assert f"no space left for {indexed / 'faiss.index'}: the write needs {len(good):,} bytes" in str(caught.value)
    monkeypatch.undo()
    assert (indexed / "faiss.index").read_bytes() == good and not list(indexed.glob("*.tmp"))
    assert _cli("verify", indexed).exit_code == 0


def test_a_full_disk_while_adding_names_the_file_and_a_rerun_counts_what_it_stored(indexed, monkeypatch):
    doc = '{"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}'
    corpus = indexed.parent / "more.jsonl"
    corpus.write_text(doc + "\n", encoding="utf-8")
    _full_after(monkeypatch, ".index", 100)  # keys, values and the IR segment fit; the FAISS part does not
    result = _cli("add", indexed, corpus, "--backend", "torch", "--threads", "1")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "no space left for" in text and "faiss_add_" in text, result.output
    assert not list(indexed.glob("*.tmp"))
    monkeypatch.undo()
    rerun = _cli("add", indexed, corpus, "--backend", "torch", "--threads", "1")
    assert rerun.exit_code == 0, rerun.output
    store = Datastore(indexed)
    ((start, end),) = store.documents.ranges([store.n_documents - 1])
    assert end - start > 0 and f"added 1 documents ({end - start:,} contexts)" in " ".join(rerun.output.split())
    assert _cli("verify", indexed).exit_code == 0


def test_a_full_disk_in_sqlite_is_named_as_such_not_as_damage_and_rolled_back(built):
    store = built.store
    before = store.documents.count_live()
    full = pytest.raises(atomic.DiskFullError, match=r"^no space left for .*store\.sqlite: the write does not fit")
    with full, built.writer.commit() as written, written.sqlite_errors(), written.db:
        written.db.execute("UPDATE documents SET state = 'removed'")
        raise sqlite3.OperationalError("database or disk is full")  # what SQLite raises on a full disk
    assert not written.db.in_transaction and written.documents.count_live() == before
    assert store.documents.count_live() == before
