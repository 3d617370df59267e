"""The manifest's commit record: manifest.json is written once, at creation; what changes after (status, counts,
codec, evidence model, tuned settings) is committed to store.sqlite in one transaction, and a reader's manifest is
the file's fields with the record's over them. A store made before the record reads its latest values from the file
until its first writer commits a change."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.store.datastore import Datastore, read_committed
from bertknn.store.manifest import COMMITTED, RECORD
from bertknn.store.writers import open_writer

DATA = Path(__file__).resolve().parents[1] / "data"


def _record(path: Path) -> dict | None:
    with sqlite3.connect(path / "store.sqlite") as db:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (RECORD,)).fetchone()
    return None if row is None else json.loads(row[0])


def test_a_build_commits_its_status_and_counts_and_leaves_manifest_json_as_created(built):
    path = built.store.path
    written = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    assert written["status"] == "building" and "entries" not in written  # as `create` wrote it
    with Datastore(path) as store:
        assert store.manifest.complete and store.manifest["entries"] == store.size > 0
        assert store.manifest["documents"] == store.manifest["embedded"] == store.n_documents
        assert read_committed(path) == store.manifest
    assert set(_record(path)) == set(COMMITTED)


def test_a_change_is_one_sqlite_commit_that_other_readers_take_in(built):
    path = built.store.path
    file = (path / "manifest.json").read_bytes()
    reader = Datastore(path)
    tuned = {"hparams": {"k": 64}, "dev": "a test", "P@1": 50.0}
    with built.writer.commit() as store:
        store.writer.set_manifest(tuned=tuned)
        with pytest.raises(ValueError, match=r"manifest fields \['layer'\] are fixed when a datastore is created"):
            store.writer.set_manifest(layer=2, tuned={})
        assert store.manifest["tuned"] == tuned
    assert (path / "manifest.json").read_bytes() == file
    assert "tuned" not in reader.manifest  # a reader holds its commit until reopened
    assert reader.reopen_if_changed() and not reader.reopen_if_changed()
    assert reader.manifest["tuned"] == tuned and reader.manifest.layer == built.store.manifest.layer
    assert _record(path)["tuned"] == tuned
    reader.close()


def test_a_field_set_to_none_is_removed(built):
    with built.writer.commit() as store:
        store.writer.set_manifest(key_codec_pending="SQ8")
        store.writer.set_manifest(key_codec_pending=None)
    assert "key_codec_pending" not in Datastore(built.store.path).manifest
    assert _record(built.store.path)["key_codec_pending"] is None


def test_a_store_made_before_the_record_reads_its_file_and_its_first_change_commits_every_field(tmp_path):
    path = shutil.copytree(DATA / "format1", tmp_path / "format1")
    written = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    assert _record(path) is None and written["status"] == "complete"
    with Datastore(path) as store:
        assert dict(store.manifest) == written
        with open_writer(path) as writer:
            writer.set_manifest(tuned={"hparams": {"k": 32}})
    again = read_committed(path)
    assert again == {**written, "tuned": {"hparams": {"k": 32}}}
    assert _record(path) == {field: again.get(field) for field in COMMITTED}


def test_a_damaged_record_is_refused_naming_it(built):
    path = built.store.path
    with sqlite3.connect(path / "store.sqlite") as db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps({"layer": 2}), RECORD))
    with pytest.raises(DatastoreError, match=r"store\.sqlite \(its manifest record\) is damaged"):
        Datastore(path, check=False)
    with pytest.raises(DatastoreError, match=r"store\.sqlite \(its manifest record\) is damaged"):
        BertKNN.load(path, str(built.encoder.name))
