"""A refused corpus leaves --out as it was: a duplicate id in any format (found by the build's first read, before
anything is written, also across the files a distributed build gives to different shards), a directory of several
formats; files of no corpus format in a directory are named, not read."""

from __future__ import annotations

import re
import sqlite3

import pytest
from datasets import Dataset
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.cli import main as cli
from bertknn.ingest import builder
from bertknn.ingest.corpus import open_corpus
from bertknn.store.datastore import Datastore
from bertknn.text import CorpusError

from ..conftest import write_corpus
from .test_corpus import DUMP, ROWS, page, write_parquet

runner = CliRunner()
AGAIN = {**ROWS[0], "text": "Ilsa Varnhold lives in Vienna."}  # a second document with the first one's id


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Render on a console wide enough that no line checked is wrapped."""
    monkeypatch.setattr(cli.console, "width", 1000)


def write_loose_docs_db(path, rows):
    """A docs.db whose id column is not a key, so it can hold an id twice (DrQA's own has a PRIMARY KEY)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE documents (id, text);")
        db.executemany("INSERT INTO documents VALUES (?,?)", [(r["id"], r["text"]) for r in rows])
    return path


def write_dump(path, pages):
    """A Wikipedia XML dump of articles given as (title, page id, wikitext)."""
    site = DUMP[: DUMP.index("  <page>")]
    body = "".join(page(title, 0, page_id, text) for title, page_id, text in pages)
    path.write_text(site + body + "</mediawiki>\n", encoding="utf-8")
    return path


def duplicated(tmp_path, kind):
    """A corpus of `kind` whose last document has the id of its first."""
    rows = [*ROWS, AGAIN]
    if kind == "jsonl":
        return write_corpus(tmp_path / "dup.jsonl", rows)
    if kind == "parquet":
        return write_parquet(tmp_path / "dup.parquet", rows)
    if kind == "parquet-dir":  # the two documents in different files
        (tmp_path / "parts").mkdir()
        write_parquet(tmp_path / "parts" / "0.parquet", rows[:2])
        write_parquet(tmp_path / "parts" / "1.parquet", rows[2:])
        return tmp_path / "parts"
    if kind == "drqa":
        return write_loose_docs_db(tmp_path / "docs.db", rows)
    pages = [(ROWS[0]["title"], 12, ROWS[0]["text"]), ("Quellbrook", 13, ROWS[1]["text"]), (AGAIN["title"], 12, "x")]
    return write_dump(tmp_path / "enwiki-pages-articles.xml", pages)


def run_build(corpus, out, model):
    return runner.invoke(app, ["build", str(corpus), "--out", str(out), "--model", str(model), "--threads", "1"])


@pytest.mark.parametrize("before", ["absent", "empty", "absent, as its parent"])
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "parquet-dir", "drqa", "xml-dump"])
def test_a_duplicate_id_in_any_format_leaves_out_as_it_was(tmp_path, tiny_model_dir, kind, before):
    corpus = duplicated(tmp_path, kind)
    out = tmp_path / "new" / "store" if before == "absent, as its parent" else tmp_path / "store"
    if before == "empty":
        out.mkdir()
    result = run_build(corpus, out, tiny_model_dir)
    doc_id = "12" if kind == "xml-dump" else "Ilsa Varnhold"  # a dump's ids are its page ids
    assert result.exit_code == 2 and f"duplicate document id '{doc_id}'" in result.output, result.output
    if before == "empty":
        assert list(out.iterdir()) == []
    else:
        assert not out.exists() and not (tmp_path / "new").exists()


def test_a_duplicate_id_in_a_dataset_leaves_out_as_it_was(tmp_path, encoder):
    dataset = Dataset.from_list([*ROWS, AGAIN])
    with pytest.raises(CorpusError, match=r"row 4: duplicate document id 'Ilsa Varnhold' \(given first at .*row 1\)$"):
        builder.build(dataset, tmp_path / "store", encoder)
    assert not (tmp_path / "store").exists()


def test_the_first_read_names_both_places_of_an_id_given_twice(tmp_path):
    corpus = open_corpus(duplicated(tmp_path, "parquet-dir"))
    with pytest.raises(
        CorpusError,
        match=r"1\.parquet: row 2: duplicate document id 'Ilsa Varnhold' \(given first at "
        r".*0\.parquet: row 1\)$",
    ):
        builder.check_corpus(corpus, lambda phase, done, total: None)


def test_ids_that_only_share_a_hash_are_not_duplicates(tmp_path, monkeypatch):
    """Ids are kept as 8-byte hashes: distinct ids with one hash are compared whole and pass."""
    monkeypatch.setattr(builder, "_id_hash", lambda doc_id: 7)
    corpus = open_corpus(write_parquet(tmp_path / "c.parquet", ROWS))
    assert builder.check_corpus(corpus, lambda phase, done, total: None) == len(ROWS)
    with pytest.raises(CorpusError, match=r"row 4: duplicate document id 'Ilsa Varnhold'"):
        builder.check_corpus(open_corpus(write_parquet(tmp_path / "d.parquet", [*ROWS, AGAIN])), print)


def test_a_directory_of_several_formats_is_refused_naming_them(tmp_path, tiny_model_dir):
    (tmp_path / "mixed").mkdir()
    write_parquet(tmp_path / "mixed" / "0.parquet", ROWS[:2])
    write_corpus(tmp_path / "mixed" / "1.jsonl", ROWS[2:])
    (tmp_path / "mixed" / "notes.txt").write_text("where the files came from", encoding="utf-8")
    message = f"{tmp_path / 'mixed'} holds corpus files of several formats (parquet: 0.parquet; jsonl: 1.jsonl)"
    with pytest.raises(CorpusError, match=f"^{re.escape(message)}: "):
        open_corpus(tmp_path / "mixed")
    result = run_build(tmp_path / "mixed", tmp_path / "store", tiny_model_dir)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "store").exists()


def test_files_of_no_corpus_format_in_a_directory_are_named_and_skipped(tmp_path, tiny_model_dir):
    (tmp_path / "parts").mkdir()
    write_parquet(tmp_path / "parts" / "0.parquet", ROWS)
    (tmp_path / "parts" / "notes.txt").write_text("where the files came from", encoding="utf-8")
    (tmp_path / "parts" / "old").mkdir()
    assert open_corpus(tmp_path / "parts").skipped == ("notes.txt", "old/")
    result = run_build(tmp_path / "parts", tmp_path / "store", tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert f"note: {tmp_path / 'parts'}: skipped 2 entries of no corpus format: notes.txt, old/" in result.output
    assert Datastore(tmp_path / "store").n_documents == len(ROWS)


def test_a_distributed_build_refuses_an_id_its_shards_would_each_hold_once(tmp_path, tiny_model_dir):
    """Shards of two documents each: the id given twice lands in two shards, whose own checks could not see it."""
    from bertknn.ingest import distributed

    with pytest.raises(CorpusError, match=r"duplicate document id 'Ilsa Varnhold' \(given first at "):
        distributed.build(duplicated(tmp_path, "parquet-dir"), tmp_path / "sharded", str(tiny_model_dir), shard_docs=2)
    assert not (tmp_path / "sharded").exists()
