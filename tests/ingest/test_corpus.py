"""Corpus readers: the same documents from JSONL, Parquet, DrQA's docs.db and a datasets.Dataset; a Wikipedia XML
dump's articles as plain text; counts, fingerprints, errors naming file and row; a build from Parquet."""

from __future__ import annotations

import bz2
import sqlite3
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset

from bertknn.ingest import builder
from bertknn.ingest.corpus import FORMATS, MissingDependency, open_corpus
from bertknn.query.pipeline import BertKNN
from bertknn.store.datastore import DatastoreError, file_sha256
from bertknn.text import CorpusError, Document

from ..conftest import write_corpus
from ..store.test_datastore import assert_same_store

# DrQA's docs.db has no title column (the title is the id), so the documents' ids are their titles
ROWS = [
    {"id": "Ilsa Varnhold", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Lisbon. She plays the cello."},
    {"id": "Quellbrook", "title": "Quellbrook", "text": "Quellbrook is a town in Norway.\n\nIt lies on a fjord."},
    {"id": "Café Zürich", "title": "Café Zürich", "text": "The café opened in 1911 and serves coffee from Brazil."},
]
DOCUMENTS = [Document(r["id"], r["title"], (r["text"],)) for r in ROWS]


def write_parquet(path, rows):
    """A Parquet file in the column layout of wikimedia/wikipedia: id, url, title, text."""
    url = [f"https://en.wikipedia.org/wiki/{r['title'].replace(' ', '_')}" for r in rows]
    table = pa.table({"id": [r["id"] for r in rows], "url": url} | {c: [r[c] for r in rows] for c in ("title", "text")})
    pq.write_table(table, path)
    return path


def write_docs_db(path, rows):
    """A docs.db as DrQA's retriever/build_db.py makes it."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE documents (id PRIMARY KEY, text);")
        db.executemany("INSERT INTO documents VALUES (?,?)", [(r["id"], r["text"]) for r in rows])
    return path


def page(title, ns, page_id, text, redirect=None):
    """One <page> of a MediaWiki export (schema 0.11) with its only revision."""
    after = f'<redirect title="{redirect}" />' if redirect else ""
    return f"""  <page>
    <title>{title}</title>
    <ns>{ns}</ns>
    <id>{page_id}</id>{after}
    <revision>
      <id>{page_id}01</id>
      <parentid>{page_id}00</parentid>
      <timestamp>2024-05-01T12:00:00Z</timestamp>
      <contributor><username>Editor</username><id>7</id></contributor>
      <comment>tidy</comment>
      <origin>{page_id}01</origin>
      <model>wikitext</model>
      <format>text/x-wiki</format>
      <text bytes="{len(text.encode())}" sha1="0" xml:space="preserve">{text}</text>
      <sha1>0</sha1>
    </revision>
  </page>
"""


ARTICLE = """{{Short description|Cellist}}
{{Infobox person
| name = Ilsa Varnhold
| birth_place = [[Lisbon]]
}}
'''Ilsa Varnhold''' was born in [[Lisbon]].&lt;ref&gt;{{cite web |title=Birth}}&lt;/ref&gt; She plays the \
[[cello|violoncello]] in Vienna.&lt;!-- a comment --&gt;

[[File:Varnhold.jpg|thumb|Varnhold in 2010]]
== Career ==
She joined the [[Vienna Philharmonic]] in 2004 &amp;amp; toured Brazil.

{| class="wikitable"
|-
| 2004 || Vienna
|}

[[Category:Cellists]]
"""
DUMP = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:schemaLocation="http://www.mediawiki.org/xml/export-0.11/'
    ' http://www.mediawiki.org/xml/export-0.11.xsd" version="0.11" xml:lang="en">\n'
    "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <dbname>enwiki</dbname>\n"
    "    <base>https://en.wikipedia.org/wiki/Main_Page</base>\n    <generator>MediaWiki 1.43.0-wmf.3</generator>\n"
    "    <case>first-letter</case>\n    <namespaces>\n"
    '      <namespace key="-2" case="first-letter">Media</namespace>\n'
    '      <namespace key="0" case="first-letter" />\n'
    '      <namespace key="6" case="first-letter">File</namespace>\n'
    '      <namespace key="10" case="first-letter">Template</namespace>\n'
    '      <namespace key="14" case="first-letter">Category</namespace>\n'
    "    </namespaces>\n  </siteinfo>\n"
    + page("Ilsa Varnhold", 0, 12, ARTICLE)
    + page("Varnhold", 0, 13, "#REDIRECT [[Ilsa Varnhold]]", redirect="Ilsa Varnhold")
    + page("Template:Cellist", 10, 14, "A '''cellist''' template.")
    + "</mediawiki>\n"
)
ARTICLE_DOCUMENT = Document(
    "12",
    "Ilsa Varnhold",
    (
        "Ilsa Varnhold was born in Lisbon. She plays the violoncello in Vienna.",
        "She joined the Vienna Philharmonic in 2004 & toured Brazil.",
    ),
    "2024-05-01T12:00:00",  # the revision's timestamp, in UTC
)


@pytest.fixture()
def sources(tmp_path):
    """The same three documents as JSONL, one Parquet file, a directory of two, a docs.db and a Dataset."""
    (tmp_path / "parts").mkdir()
    write_parquet(tmp_path / "parts" / "train-00001-of-00002.parquet", ROWS[2:])
    write_parquet(tmp_path / "parts" / "train-00000-of-00002.parquet", ROWS[:2])  # read in name order
    return {
        "jsonl": write_corpus(tmp_path / "c.jsonl", ROWS),
        "parquet": write_parquet(tmp_path / "c.parquet", ROWS),
        "parquet-dir": tmp_path / "parts",
        "drqa": write_docs_db(tmp_path / "docs.db", ROWS),
        "dataset": Dataset.from_list(ROWS),
    }


@pytest.fixture()
def dumps(tmp_path):
    """The three-page dump, plain and bz2-compressed."""
    plain = tmp_path / "enwiki-20240501-pages-articles.xml"
    plain.write_text(DUMP, encoding="utf-8")
    packed = tmp_path / "enwiki-20240501-pages-articles-multistream.xml.bz2"
    packed.write_bytes(bz2.compress(DUMP.encode()))
    return plain, packed


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "parquet-dir", "drqa", "dataset"])
def test_every_format_gives_the_same_documents(sources, kind):
    corpus = open_corpus(sources[kind])
    assert list(corpus) == DOCUMENTS
    assert corpus.count() == (None if kind == "jsonl" else 3)  # from metadata; JSONL has none


def test_a_dump_gives_its_articles_as_plain_paragraphs(dumps):
    for path in dumps:
        corpus = open_corpus(path)
        assert [(where, doc) for where, doc in corpus.located()] == [(f"{path}: page 12", ARTICLE_DOCUMENT)]
        assert corpus.count() is None  # a dump has no count: build reads it in full
        assert corpus.take_redirects() == [("Varnhold", "Ilsa Varnhold")] and corpus.take_redirects() == []


def test_a_dump_s_redirects_are_aliases_of_their_targets_in_the_built_store(dumps, tmp_path, encoder):
    from bertknn.query.linking import link
    from bertknn.query.pipeline import BertKNN

    knn = BertKNN.build(dumps[1], tmp_path / "s", encoder)
    found = link(knn.store, knn.index, "Varnhold plays the [MASK] .")
    assert (found.subject, found.text, found.by) == ("Ilsa Varnhold", "Varnhold", "alias")  # not its surname: an alias
    assert knn.store.db.execute("SELECT * FROM redirects").fetchall() == [("varnhold", "ilsa varnhold")]


def test_fingerprints_follow_the_bytes(sources, tmp_path):
    parquet, parts, drqa = sources["parquet"], sources["parquet-dir"], sources["drqa"]
    assert open_corpus(parquet).fingerprint() == file_sha256(parquet)
    assert open_corpus(drqa).info(3) == {
        "path": str(drqa.resolve()),
        "format": "drqa",
        "sha256": file_sha256(drqa),
        "documents": 3,
    }
    before = {kind: open_corpus(sources[kind]).fingerprint() for kind in ("parquet", "parquet-dir", "drqa")}
    assert open_corpus(parts).fingerprint() == before["parquet-dir"]  # the same files: the same fingerprint
    write_parquet(parquet, ROWS[:2])
    write_parquet(parts / "train-00001-of-00002.parquet", [{**ROWS[2], "text": "Another text."}])
    write_docs_db(tmp_path / "other.db", ROWS[:1])
    drqa.write_bytes((tmp_path / "other.db").read_bytes())
    after = {kind: open_corpus(sources[kind]).fingerprint() for kind in ("parquet", "parquet-dir", "drqa")}
    assert all(after[kind] != before[kind] for kind in before)
    dataset = sources["dataset"]
    info = open_corpus(dataset).info(3)
    assert info["fingerprint"] == dataset._fingerprint and "sha256" not in info
    assert open_corpus(Dataset.from_list(ROWS[:2])).fingerprint() != dataset._fingerprint


def test_bad_rows_are_named_with_their_file_and_row(tmp_path):
    bad = [*ROWS[:1], {**ROWS[1], "text": "   "}]
    path = write_parquet(tmp_path / "bad.parquet", bad)
    with pytest.raises(CorpusError, match=f"^{path}: row 2: document 'Quellbrook' has no text$"):
        list(open_corpus(path))
    db = write_docs_db(tmp_path / "bad.db", [*ROWS[:1], {"id": "Nothing", "text": None}])
    with pytest.raises(CorpusError, match=rf"^{db}: row 2: 'text' must be a string \(or 'sentences'"):
        list(open_corpus(db))
    dataset = Dataset.from_list([*ROWS[:2], {**ROWS[2], "id": ""}])
    with pytest.raises(CorpusError, match=f"^datasets.Dataset {dataset._fingerprint}: row 3: missing or empty 'id'"):
        list(open_corpus(dataset))
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "untitled.parquet")
    with pytest.raises(CorpusError, match=r"untitled.parquet: no column title \(a corpus table has the columns"):
        open_corpus(tmp_path / "untitled.parquet").count()
    with pytest.raises(CorpusError, match=r"^datasets.Dataset \w+: no column id, title \(a corpus table"):
        open_corpus(Dataset.from_dict({"text": ["x"]}))


def test_files_that_are_not_of_their_format_are_named(tmp_path, dumps):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CorpusError, match=r"junk.parquet: not a readable Parquet file \("):
        list(open_corpus(tmp_path / "junk.parquet"))
    with sqlite3.connect(tmp_path / "other.sqlite") as db:
        db.execute("CREATE TABLE articles (id, text)")
    with pytest.raises(CorpusError, match=r"other.sqlite: not a DrQA docs.db .*no such table: documents"):
        open_corpus(tmp_path / "other.sqlite").count()
    truncated = tmp_path / "truncated.xml.bz2"
    truncated.write_bytes(dumps[1].read_bytes()[:-40])
    with pytest.raises(CorpusError, match=r"truncated.xml.bz2: not a readable MediaWiki XML dump \("):
        list(open_corpus(truncated))
    (tmp_path / "cut.xml").write_text(DUMP[:-100], encoding="utf-8")  # cut inside the last page
    with pytest.raises(CorpusError, match=r"cut.xml: not a readable MediaWiki XML dump after page 14 \("):
        list(open_corpus(tmp_path / "cut.xml"))
    (tmp_path / "feed.xml").write_text("<rss><channel /></rss>", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"feed.xml: not a MediaWiki XML export \(its root is <rss>\)"):
        list(open_corpus(tmp_path / "feed.xml"))
    (tmp_path / "bare.xml").write_text(DUMP.replace(ARTICLE, "{{Wiktionary redirect}}"), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bare.xml: no article with text"):
        list(open_corpus(tmp_path / "bare.xml"))  # a page with no text left is skipped


def test_unknown_formats_and_missing_files_are_refused(tmp_path):
    (tmp_path / "corpus.csv").write_text("id,title,text\n", encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        open_corpus(tmp_path / "corpus.csv")
    assert str(err.value) == f"{tmp_path / 'corpus.csv'}: not a corpus format bertknn reads; supported: {FORMATS}"
    with pytest.raises(CorpusError, match="a corpus of type dict cannot be read; supported: JSONL"):
        open_corpus({"id": "a"})
    with pytest.raises(CorpusError, match=r"missing.parquet: no such corpus file"):
        open_corpus(tmp_path / "missing.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match=r"empty: a directory without .parquet files"):
        open_corpus(tmp_path / "empty")


def test_a_missing_optional_library_names_the_extra(dumps, monkeypatch):
    monkeypatch.setitem(sys.modules, "mwparserfromhell", None)  # an import of it fails
    with pytest.raises(
        MissingDependency, match=r"needs the package mwparserfromhell: pip install 'bertknn\[wikipedia\]'"
    ):
        list(open_corpus(dumps[0]))
    assert issubclass(MissingDependency, ImportError) and issubclass(MissingDependency, CorpusError)


def test_a_build_from_parquet_equals_one_from_jsonl(tmp_path, sources, encoder):
    from_jsonl = BertKNN.build(sources["jsonl"], tmp_path / "from-jsonl", encoder)
    reports = []
    from_parquet = builder.build(sources["parquet-dir"], tmp_path / "p", encoder, progress=lambda *r: reports.append(r))
    assert from_jsonl.store.size > 0 and from_parquet.manifest.complete
    assert_same_store(tmp_path / "from-jsonl", tmp_path / "p")
    assert reports[0] == ("checking", 3, 3) and ("reading", 3, 3) in reports  # the count came from the footers
    corpus = from_parquet.manifest["corpus"]
    assert corpus == {
        "path": str((tmp_path / "parts").resolve()),
        "format": "parquet",
        "sha256": open_corpus(tmp_path / "parts").fingerprint(),
        "documents": 3,
    }
    write_parquet(tmp_path / "parts" / "train-00001-of-00002.parquet", [{**ROWS[2], "text": "Another text."}])
    with pytest.raises(DatastoreError, match="another corpus"):
        builder.build(sources["parquet-dir"], tmp_path / "p", encoder)
    from_dataset = BertKNN.build(sources["dataset"], tmp_path / "from-dataset", encoder)
    assert from_dataset.store.manifest["corpus"]["fingerprint"] == sources["dataset"]._fingerprint
    assert_same_store(tmp_path / "from-jsonl", tmp_path / "from-dataset")


def test_a_build_reports_checking_and_stops_at_a_duplicate_id(tmp_path, encoder):
    path = write_parquet(tmp_path / "dup.parquet", [*ROWS, {**ROWS[0], "text": "Ilsa Varnhold lives in Vienna."}])
    reports = []
    with pytest.raises(CorpusError, match=f"^{path}: row 4: duplicate document id 'Ilsa Varnhold' \\(given first at "):
        builder.build(path, tmp_path / "s", encoder, progress=lambda *r: reports.append(r))
    assert reports[0] == ("checking", 4, 4) and not (tmp_path / "s").exists()  # refused before anything is written


def test_eval_lama_reads_a_parquet_directory_and_reuses_its_registration(sources, encoder, tmp_path, monkeypatch):
    """`lama_reader` (eval lama, tune) takes any format: a second model's datastore of the same Parquet directory
    starts from the first one's registered documents."""
    from bertknn.evaluation.run import lama_reader

    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    first = lama_reader(sources["parquet-dir"], encoder)
    assert first.store.manifest.lazy and first.store.n_documents == len(ROWS)
    copied, copy = [], builder.copy_registration
    monkeypatch.setattr(
        builder, "copy_registration", lambda source, *a, **k: copied.append(source) or copy(source, *a, **k)
    )
    other = encoder.at_layer(2)
    second = lama_reader(sources["parquet-dir"], other)
    assert copied == [first.store.path]  # found through the directory's fingerprint
    assert second.store.path != first.store.path and second.store.manifest.layer == 2
    assert second.store.manifest["corpus"] == first.store.manifest["corpus"]
    assert second.store.documents.sentences(list(range(len(ROWS)))) == first.store.documents.sentences(
        list(range(len(ROWS)))
    )
