"""Which store.sqlite is a datastore's own, and whether it is its latest (store/identity.py): a store.sqlite of
another datastore, or an older copy of its own put back, is refused by opening, `verify`, `repair` and every writer,
naming store.sqlite, with nothing changed."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3

import pytest
from typer.testing import CliRunner

from bertknn import BertKNN
from bertknn.cli import app
from bertknn.ingest.ingester import Writer
from bertknn.ingest.repair import repair
from bertknn.store import verify as checks
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.writers import open_writer

from ..conftest import SMALL_DOCS, write_corpus

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}


def _files(path):
    """Every file of a datastore directory and its sha256 (the writer lock aside, and SQLite's shared memory, in
    which every reader marks the commit it reads: it holds no data)."""
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != "write.lock" and not f.name.endswith("-shm")
    }


def _meta(path, key):
    with sqlite3.connect(path / "store.sqlite") as db:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row and row[0]


@pytest.fixture()
def two(tmp_path, encoder):
    """Two datastores built from corpora of the same model: `a` of the small corpus, `b` of one other document."""
    a = BertKNN.build(write_corpus(tmp_path / "a.jsonl", SMALL_DOCS), tmp_path / "a", encoder).store.path
    b = BertKNN.build(write_corpus(tmp_path / "b.jsonl", [FRESH]), tmp_path / "b", encoder).store.path
    return a, b, encoder


def _refused_everywhere(path, encoder, says: str) -> None:
    """Opening, verify, repair and an add refuse the store naming store.sqlite and `says`; no file changes."""
    before = _files(path)
    with pytest.raises(DatastoreError, match=f"store.sqlite.*{says}"):
        Datastore(path)
    report = checks.verify(path)
    assert any("store.sqlite" in p and says in p for p in report.problems), report.problems
    with pytest.raises(DatastoreError, match=r"store\.sqlite") as refused:
        repair(path)
    assert says in str(getattr(refused.value, "problems", refused.value))  # the refusal's findings say why
    with pytest.raises(DatastoreError, match=f"store.sqlite.*{says}"):
        Writer(Datastore(path, check=False), encoder).add_documents([{**FRESH, "id": "n2"}])
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code != 0 and "store.sqlite" in result.output, result.output
    assert _files(path) == before


def test_a_store_sqlite_of_another_datastore_is_refused_naming_it(two):
    a, b, encoder = two
    assert _meta(a, "store_id") == json.loads((a / "manifest.json").read_text())["store_id"]
    assert _meta(a, "store_id") != _meta(b, "store_id")
    shutil.copyfile(b / "store.sqlite", a / "store.sqlite")
    _refused_everywhere(a, encoder, "another datastore")


def test_an_older_copy_of_its_own_store_sqlite_is_refused_naming_it(two, tmp_path):
    a, _, encoder = two
    older = tmp_path / "older.sqlite"
    shutil.copyfile(a / "store.sqlite", older)
    Writer(Datastore(a), encoder).add_documents([FRESH])
    assert int(_meta(a, "commits")) > 0
    shutil.copyfile(older, a / "store.sqlite")  # the add's documents are not in it; its keys are past its count
    _refused_everywhere(a, encoder, "older copy")
    assert "verify --record" in str(checks.verify(a).problems)  # restored on purpose: what accepts it


def test_an_older_store_sqlite_restored_on_purpose_is_accepted_by_verify_record(two, tmp_path):
    a, _, encoder = two
    older = tmp_path / "older.sqlite"
    shutil.copyfile(a / "store.sqlite", older)
    Writer(Datastore(a), encoder).add_documents([FRESH])
    shutil.copyfile(older, a / "store.sqlite")
    checks.record_checksums(a)
    assert checks.verify(a).problems == []
    with Datastore(a) as store:
        assert store.documents.states(["n1", "d1"]) == {"d1": "live"}


def test_a_checksums_json_of_another_datastore_is_named(two):
    a, b, _ = two
    shutil.copyfile(b / "checksums.json", a / "checksums.json")
    problems = checks.verify(a).problems
    assert any(p.startswith("checksums.json") and "another datastore" in p for p in problems), problems
    assert not any("values.i32" in p for p in problems), problems  # not blamed on a sound file


def test_an_interrupted_writer_s_commits_past_the_seal_are_sound(two):
    """store.sqlite that counts more commits than the checksums were sealed at: a writer killed after committing,
    before its seal (tests/reliability/test_kill.py kills at every step); sound, and the next writer seals it."""
    a, _, _ = two
    with open_writer(a) as writer, writer.commit():
        writer.write_meta("probe", "1")
        commits = int(_meta(a, "commits"))
        sealed = json.loads((a / "checksums.json").read_text())["meta"]["commits"]
        assert commits > sealed
        assert Datastore(a, check=True) and checks.verify(a).problems == []
    assert json.loads((a / "checksums.json").read_text())["meta"]["commits"] == int(_meta(a, "commits"))


def test_every_write_transaction_counts_one_commit(two):
    a, _, _ = two
    with open_writer(a) as writer, writer.commit():
        before = int(_meta(a, "commits"))
        writer.write_meta("x", "1")
        writer.write_meta("x", "2")
        assert int(_meta(a, "commits")) == before + 2


def test_a_store_made_before_ids_gets_one_from_its_first_writer_that_commits(two):
    a, b, encoder = two
    manifest = json.loads((a / "manifest.json").read_text())
    del manifest["store_id"]  # as a store made before ids: none in the manifest, none in store.sqlite
    (a / "manifest.json").write_text(json.dumps(manifest))
    with sqlite3.connect(a / "store.sqlite") as db:
        db.execute("DELETE FROM meta WHERE key IN ('store_id', 'commits')")
    checks.record_checksums(a)  # nothing committed: no id yet
    assert _meta(a, "store_id") is None
    Writer(Datastore(a), encoder).add_documents([FRESH])
    own = _meta(a, "store_id")
    assert own and json.loads((a / "checksums.json").read_text())["meta"]["store_id"] == own
    shutil.copyfile(b / "store.sqlite", a / "store.sqlite")  # from then on another store's is told apart
    assert any("another datastore" in p for p in checks.verify(a).problems)
