"""What a write says when the file system stops it: a store.sqlite that cannot be written is named as such (not as
damage that `verify` would then not find), and a write committed before its checksums could be recorded says that
it was committed, and what records them."""

from __future__ import annotations

import sqlite3

import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.ingest.ingester import Writer
from bertknn.store import integrity, schema
from bertknn.store import verify as checks
from bertknn.store.datastore import Datastore

from ..conftest import SMALL_DOCS, write_corpus

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}


@pytest.fixture()
def store(tmp_path, encoder):
    return BertKNN.build(write_corpus(tmp_path / "a.jsonl", SMALL_DOCS), tmp_path / "a", encoder).store.path


def test_a_store_sqlite_that_cannot_be_written_is_named_so_and_nothing_changes(store, encoder, monkeypatch):
    # as SQLite reports an immutable file or a read-only mount (root writes a file whatever its mode bits say, so the
    # writer's connection is opened read-only instead)
    def read_only(file):
        return sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True, factory=schema.Writing)

    monkeypatch.setattr(schema, "writing", read_only)
    before = (store / "store.sqlite").read_bytes()
    with pytest.raises(DatastoreError) as refused:
        Writer(Datastore(store), encoder).add_documents([FRESH])
    message = str(refused.value)
    assert "store.sqlite cannot be written" in message and "permissions" in message, message
    assert "damaged" not in message and "verify" not in message, message
    assert (store / "store.sqlite").read_bytes() == before
    assert checks.verify(store).problems == []


def test_a_write_whose_checksums_cannot_be_recorded_says_it_was_committed(store, encoder, monkeypatch):
    real = integrity.write_json

    def refused(path, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", f"{path}.tmp")

    monkeypatch.setattr(integrity, "write_json", refused)
    with pytest.raises(DatastoreError, match="was committed, but its checksums could not be recorded") as caught:
        Writer(Datastore(store), encoder).add_documents([FRESH])
    assert "Operation not permitted" in str(caught.value) and "verify --record" in str(caught.value)
    monkeypatch.setattr(integrity, "write_json", real)
    with Datastore(store) as reopened:  # committed: the document is there, and the store opens sound
        assert reopened.documents.states(["n1"]) == {"n1": "live"}
    Writer(Datastore(store), encoder).remove_documents(["d5"])  # the next write records the checksums
    assert checks.verify(store).problems == []
