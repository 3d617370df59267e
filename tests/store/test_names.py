"""The names index (`store.names`): the names of each document written with it, the same rows as a rebuild from the
documents makes, and `verify` and `repair` knowing it."""

import sqlite3

import pytest

from bertknn.ingest.repair import repair
from bertknn.query.linking import link
from bertknn.store import names
from bertknn.store.names import ALIAS, MORE, PART, TITLE, names_of, rebuild
from bertknn.store.verify import verify
from bertknn.text import CorpusError, parse_document
from tests.conftest import writable


def _rows(path) -> list[tuple]:
    with sqlite3.connect(path / "store.sqlite") as db:
        return db.execute("SELECT * FROM names ORDER BY name, title").fetchall()


def test_a_title_s_names_are_itself_its_aliases_and_its_parts():
    assert names_of("Mercury (planet)") == [("mercury (planet)", TITLE), ("mercury", PART)]
    assert names_of("Anna  Maria Berg", ["A. M. Berg", "anna maria berg"]) == [
        ("anna maria berg", TITLE),
        ("a. m. berg", ALIAS),
        ("berg", PART),
        ("anna", PART),
    ]
    assert names_of("The Who") == [("the who", TITLE)]  # "the" and "who" are stopwords: no part names it
    assert names_of("Born in 68") == [("born in 68", TITLE), ("born", PART)]  # "68": a number; linking's rules judge
    doc = parse_document({"id": "a", "title": "A", "text": "x", "aliases": ["B", " "], "redirects": ["C", "B"]}, "h")
    assert doc.aliases == ("B", "C")
    with pytest.raises(CorpusError, match="here: 'aliases' must be a list of strings"):
        parse_document({"id": "a", "title": "A", "text": "x", "aliases": "B"}, "here")


def test_writers_keep_the_rows_a_rebuild_from_the_documents_makes_and_those_a_held_commit_reads(
    tmp_path, encoder, built
):
    knn = writable(encoder, built.store)
    knn.add_documents([{"id": "b1", "title": "Anna Berg", "text": "Anna Berg sang.", "aliases": ["Annie"]}])
    knn.add_documents([{"id": "b2", "title": "Tomas Berg", "text": "Tomas Berg sang."}])
    knn.add_documents([{"id": "b3", "title": "Lena Berg", "text": "Lena Berg sang."}])  # a third title
    knn.remove_documents(["b2"])  # its rows stay, read by no lookup: a reader holding an earlier commit reads them
    knn.add_documents([{"id": "b1", "title": "Anna Berg", "text": "Anna Berg sang twice."}], replace=True)
    written = _rows(built.store.path)
    assert ("annie", "anna berg", ALIAS) in written and ("tomas berg", "tomas berg", TITLE) in written
    assert [r for r in written if r[0] in ("berg", "tomas")] == [
        ("berg", "anna berg", PART),
        ("berg", "lena berg", PART),
        ("berg", "tomas berg", PART),
        ("tomas", "tomas berg", PART),
    ]
    spans = ["berg", "tomas", "tomas berg", "annie", "lena"]
    found = names.lookup(knn.store.db, spans)
    with sqlite3.connect(built.store.path / "store.sqlite") as db:
        rebuild(db)  # the parts of a title whose documents are all removed are left out
    assert _rows(built.store.path) == [
        r for r in written if r not in (("berg", "tomas berg", PART), ("tomas", "tomas berg", PART))
    ]
    assert names.lookup(knn.store.db, spans) == found  # the same links


def test_a_part_that_added_documents_shared_names_its_title_again_once_they_are_removed(encoder, built):
    """Removing what was added gives every link back: "Varnhold" names Ilsa Varnhold alone, then with two more
    titles added none (three titles share it: more than a lookup reads), then, those removed, Ilsa Varnhold again."""
    knn = writable(encoder, built.store)
    asked = "Varnhold was born in [MASK] ."

    def linked() -> str | None:
        found = link(knn.store, knn.index, asked)
        return found and found.subject

    assert linked() == "Ilsa Varnhold"
    knn.add_documents([{"id": f"v{i}", "title": f"{name} Varnhold", "text": f"{name} Varnhold sang."} for i, name
                       in enumerate(["Oskar", "Petra"])])  # fmt: skip
    assert linked() is None and names.lookup(knn.store.db, ["varnhold"]) == [("varnhold", MORE, PART, "")]
    knn.remove_documents(["v0", "v1"])
    assert linked() == "Ilsa Varnhold"
    assert names.lookup(knn.store.db, ["varnhold"]) == [("varnhold", "ilsa varnhold", PART, "Ilsa Varnhold")]


def test_verify_names_a_names_index_that_lacks_a_title_and_repair_makes_it_again(built):
    path = built.store.path
    built.store.close()
    assert verify(path).problems == []
    with sqlite3.connect(path / "store.sqlite") as db:
        db.execute("DELETE FROM names WHERE title = 'paris'")
    problems = verify(path).problems
    assert problems == [
        "store.sqlite: the names index lacks the titles of 1 live document(s); `bertknn repair` rebuilds it"
    ]
    done = repair(path)
    assert any("the names index (in store.sqlite): made again" in line for line in done.rebuilt)
    assert verify(path).problems == [] and ("paris", "paris", TITLE) in _rows(path)
