"""Corpus readers: the text collection a datastore is built from, in one of five forms (SPEC §1).

A JSONL file (text.py), Parquet files in the layout of the Hugging Face dataset wikimedia/wikipedia (columns id,
url, title, text), DrQA's docs.db (SQLite, `documents(id, text)`, the title being the id), a Wikipedia XML dump
(`*-pages-articles*.xml.bz2` or plain .xml) or, in Python, a `datasets.Dataset`. `open_corpus` picks the reader by
the path's suffix (a directory: its Parquet files, refused if it holds another format too) or the object's type.
Every reader makes its Documents with text.parse_document, so each format gets the same checks and messages, naming
the file and the line, row or page.
Memory does not grow with the corpus: Parquet is read in record batches, docs.db through a cursor, the dump as a
stream of pages.
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import importlib
import json
import os
import re
import sqlite3
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from bertknn.store.datastore import file_sha256
from bertknn.store.records import Record
from bertknn.text import CorpusError, Document, normalize_title, parse_document, read_jsonl, split_sentences

if TYPE_CHECKING:
    from datasets import Dataset

FORMATS = (
    "JSONL (.jsonl, .ndjson), Parquet (.parquet, or a directory of them) with columns id, title and text, "
    "DrQA's docs.db (.db, .sqlite: an SQLite table documents(id, text)), a Wikipedia XML dump (.xml, .xml.bz2) "
    "or, in Python, a datasets.Dataset with columns id, title and text"
)
EXTRA = "pip install 'bertknn[wikipedia]'"
BATCH_ROWS = 256  # Parquet rows decoded at a time (a Wikipedia article averages a few kB)
HIDDEN_NAMESPACES = (-2, 6, 14)  # Media, File, Category: links that show no text in an article
HIDDEN_TAGS = frozenset({"ref", "references", "table"})  # footnotes and tables are not running text
PARAGRAPH = re.compile(r"\n\s*\n")


class MissingDependency(CorpusError, ImportError):
    """A reader's optional library is not installed; the message says how to install it."""


def _require(reading: str, *modules: str) -> None:
    """Import a reader's optional libraries, or raise MissingDependency naming the extra that installs them."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingDependency(f"reading {reading} needs the package {module}: {EXTRA}") from None


def _columns(names: list[str], where: str) -> list[str]:
    """The columns a document is read from (id, title, and text or else sentences; date where there is one);
    CorpusError when one is missing."""
    text = "text" if "text" in names or "sentences" not in names else "sentences"
    missing = [c for c in ("id", "title", text) if c not in names]
    if missing:
        raise CorpusError(
            f"{where}: no column {', '.join(missing)} (a corpus table has the columns id, title and text, as the "
            "dataset wikimedia/wikipedia)"
        )
    return ["id", "title", text] + [c for c in ("date", "aliases", "redirects") if c in names]


class Corpus(ABC):
    """A text collection: its documents in a fixed order, a cheap count where the format has one, a fingerprint."""

    format: ClassVar[str]  # the manifest's name for the format
    empty: ClassVar[str] = "the corpus is empty"
    name: str  # the file, directory or dataset that messages name
    skipped: tuple[str, ...] = ()  # what a corpus directory holds besides corpus files (`ParquetCorpus`)

    def located(self) -> Iterator[tuple[str, Document]]:
        """Each document with where it was read (file and line, row or page); CorpusError on a bad one or none."""
        found = False
        for item in self._read():
            found = True
            yield item
        if not found:
            raise CorpusError(f"{self.name}: {self.empty}")

    def __iter__(self) -> Iterator[Document]:
        return (doc for _, doc in self.located())

    @abstractmethod
    def _read(self) -> Iterator[tuple[str, Document]]:
        """The documents with where each was read (`located` adds the check for an empty corpus)."""

    def take_redirects(self) -> list[tuple[str, str]]:
        """The (redirect title, target title) pairs read since the last call (a Wikipedia dump's redirect pages, which
        name their target article: its aliases); none in other formats, whose documents carry their own aliases."""
        return []

    @abstractmethod
    def count(self) -> int | None:
        """The number of documents from the format's metadata, without reading them; None where it has none."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A digest that changes when the documents may have: what a resumed build is checked against."""

    def info(self, documents: int) -> dict:
        """What a datastore's manifest records of this corpus ("corpus"), given its number of documents."""
        return {"path": self.name, "format": self.format, "sha256": self.fingerprint(), "documents": documents}


class _FileCorpus(Corpus):
    """A corpus kept in one file (or a directory): messages name the path as given, the manifest in full."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise CorpusError(f"{path}: no such corpus file")
        self.path, self.name = path, str(path)

    def fingerprint(self) -> str:
        """sha256 of the file's bytes."""
        return file_sha256(self.path)

    def info(self, documents: int) -> dict:
        return {**super().info(documents), "path": str(self.path.resolve())}


class JsonlCorpus(_FileCorpus):
    """JSON Lines, one {id, title, text | sentences} document per line (text.read_jsonl)."""

    format = "jsonl"

    def _read(self) -> Iterator[tuple[str, Document]]:
        return read_jsonl(self.path)

    def count(self) -> None:
        """JSON Lines have no count but their lines."""
        return None


class ParquetCorpus(_FileCorpus):
    """A Parquet file, or a directory of them read in name order, with columns id, title and text (or sentences):
    the layout of the Hugging Face dataset wikimedia/wikipedia. Read in record batches.

    A directory that also holds files of another corpus format is refused, naming them: reading only its Parquet
    files would drop their documents without a word. Entries of no corpus format (a README, notes, the _SUCCESS or
    .crc files that downloads and Spark leave beside the data, subdirectories) hold no documents to lose, so they are
    skipped, not refused, and named in `skipped` for the caller to report.
    """

    format = "parquet"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        if not path.is_dir():
            self.files = [path]
            return
        found: dict[str, list[Path]] = {}
        skipped = []
        for entry in sorted(path.iterdir()):
            reader = _reader(entry) if entry.is_file() else None
            if reader is None:
                skipped.append(entry.name + ("/" if entry.is_dir() else ""))
            else:
                found.setdefault(reader.format, []).append(entry)
        if len(found) > 1:
            listed = "; ".join(f"{kind}: {', '.join(f.name for f in files)}" for kind, files in found.items())
            raise CorpusError(
                f"{path} holds corpus files of several formats ({listed}): a directory is read as Parquet files "
                "only; move the others out (a JSONL, docs.db or XML dump corpus is given as its file)"
            )
        self.files, self.skipped = found.get(self.format, []), tuple(skipped)
        if not self.files:
            raise CorpusError(f"{path}: a directory without .parquet files")

    @contextlib.contextmanager
    def _open(self, file: Path) -> Iterator[tuple[Any, list[str]]]:
        """An open Parquet file and the columns a document is read from; Arrow's errors as CorpusError."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            with pq.ParquetFile(file) as handle:
                yield handle, _columns(handle.schema_arrow.names, str(file))
        except (pa.ArrowException, OSError) as err:
            raise CorpusError(f"{file}: not a readable Parquet file ({err})") from None

    def _read(self) -> Iterator[tuple[str, Document]]:
        for file in self.files:
            row = 0
            with self._open(file) as (handle, columns):
                for batch in handle.iter_batches(BATCH_ROWS, columns=columns):
                    for obj in batch.to_pylist():
                        row += 1
                        where = f"{file}: row {row}"
                        yield where, parse_document(obj, where)

    def count(self) -> int:
        """The rows the files' footers record."""
        total = 0
        for file in self.files:
            with self._open(file) as (handle, _):
                total += handle.metadata.num_rows
        return total

    def fingerprint(self) -> str:
        """sha256 of the file; for a directory, sha256 over its Parquet files' names and sha256s in name order."""
        if not self.path.is_dir():
            return file_sha256(self.path)
        digest = hashlib.sha256()
        for file in self.files:
            digest.update(f"{file.name}\0{file_sha256(file)}\n".encode())
        return digest.hexdigest()


class DrqaCorpus(_FileCorpus):
    """DrQA's docs.db: an SQLite table documents(id, text) whose id is the article's title. Read through a cursor
    in rowid order (the order DrQA wrote it)."""

    format = "drqa"

    @contextlib.contextmanager
    def _query(self, sql: str) -> Iterator[sqlite3.Cursor]:
        """The rows of `sql` over the file, opened read-only; SQLite's errors as CorpusError."""
        try:
            with contextlib.closing(sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)) as db:
                yield db.execute(sql)
        except sqlite3.DatabaseError as err:
            raise CorpusError(
                f"{self.path}: not a DrQA docs.db (an SQLite file with a table documents(id, text)): {err}"
            ) from None

    def _read(self) -> Iterator[tuple[str, Document]]:
        with self._query("SELECT name FROM pragma_table_info('documents')") as rows:
            date = "date" if ("date",) in rows.fetchall() else "NULL"  # a docs.db with a date column: documents dated
        with self._query(f"SELECT id, text, {date} FROM documents ORDER BY rowid") as rows:
            for row, (doc_id, text, when) in enumerate(rows, 1):
                where = f"{self.path}: row {row}"
                yield where, parse_document({"id": doc_id, "title": str(doc_id), "text": text, "date": when}, where)

    def count(self) -> int:
        """SELECT count(*) of the documents table."""
        with self._query("SELECT count(*) FROM documents") as rows:
            return rows.fetchone()[0]


class WikipediaDump(_FileCorpus):
    """A MediaWiki XML export (`*-pages-articles*.xml.bz2` or .xml), streamed page by page with mwxml.

    Articles only: pages of namespace 0 that are not redirects (the redirects' titles are kept as aliases of their
    targets: `take_redirects`). id = page id, title = page title, passages = the
    paragraphs of the last revision's text made plain with mwparserfromhell: templates, footnotes, tables, headings
    and file and category links dropped, links shown as their text. A page with no text left is skipped.
    """

    format = "mediawiki-xml"
    empty = "no article with text (pages of namespace 0 that are not redirects)"

    def _stream(self) -> IO[bytes]:
        return bz2.open(self.path) if self.path.suffix.lower() == ".bz2" else self.path.open("rb")

    def _read(self) -> Iterator[tuple[str, Document]]:
        _require("a Wikipedia XML dump", "mwxml", "mwparserfromhell")
        import mwparserfromhell
        from mwxml import Dump
        from mwxml.element_iterator import ElementIterator
        from mwxml.errors import MalformedXML

        page = None
        try:
            with self._stream() as stream:
                root = ElementIterator.from_file(stream)
                if root.tag != "mediawiki":
                    raise CorpusError(f"{self.path}: not a MediaWiki XML export (its root is <{root.tag}>)")
                dump = Dump.from_element(root)
                namespaces = dump.site_info.namespaces or []
                hidden = {"media", "file", "image", "category"}
                hidden |= {ns.name.casefold() for ns in namespaces if ns.id in HIDDEN_NAMESPACES}
                self._redirects: list[tuple[str, str]] = []
                for page in dump:
                    root.element.clear()  # what iterparse keeps of the pages read so far
                    if page.namespace == 0 and page.redirect:
                        self._redirects.append((page.title, page.redirect))
                    if page.namespace != 0 or page.redirect:
                        continue
                    text, date = "", None
                    for revision in page:  # a pages-articles dump has one revision per page: the last is kept
                        text, date = revision.text or "", revision.timestamp
                    passages = plain_paragraphs(mwparserfromhell.parse(text), hidden)
                    if passages:
                        where = f"{self.path}: page {page.id}"
                        obj = {"id": page.id, "title": page.title, "sentences": passages}
                        if date is not None:  # the revision's time: a later dump's article is newer
                            obj["date"] = date.long_format()
                        yield where, parse_document(obj, where)
        except (MalformedXML, SyntaxError, OSError, EOFError) as err:  # ParseError is a SyntaxError
            after = f" after page {page.id}" if page is not None else ""
            raise CorpusError(f"{self.path}: not a readable MediaWiki XML dump{after} ({err})") from None

    def count(self) -> None:
        """A dump records no count of its articles."""
        return None

    def take_redirects(self) -> list[tuple[str, str]]:
        """The redirects read since the last call (a reader's pass collects them as it goes)."""
        taken, self._redirects = getattr(self, "_redirects", []), []
        return taken


def plain_paragraphs(code: Any, hidden_namespaces: set[str]) -> list[str]:
    """The paragraphs of parsed wikitext (mwparserfromhell) as plain text, what is not running text dropped:
    templates and comments (strip_code), and at any depth footnotes, tables, headings and links into
    `hidden_namespaces` (casefolded names such as "file" and "category")."""
    from mwparserfromhell.nodes import Heading, Tag, Wikilink
    from mwparserfromhell.wikicode import Wikicode

    def hidden(node: Any) -> bool:
        if isinstance(node, Wikilink):
            prefix, colon, _ = str(node.title).partition(":")
            return bool(colon) and prefix.strip().casefold() in hidden_namespaces
        return isinstance(node, Heading) or (isinstance(node, Tag) and str(node.tag).strip().lower() in HIDDEN_TAGS)

    def prune(part: Wikicode) -> None:
        part.nodes = [node for node in part.nodes if not hidden(node)]
        for node in part.nodes:  # what strip_code shows of a node: a tag's contents, a link's text or title
            for inner in (getattr(node, name, None) for name in ("contents", "text", "title")):
                if isinstance(inner, Wikicode):
                    prune(inner)

    prune(code)
    return [p.strip() for p in PARAGRAPH.split(code.strip_code()) if p.strip()]


class DatasetCorpus(Corpus):
    """A Hugging Face `datasets.Dataset` with columns id, title and text (or sentences), identified by its
    fingerprint."""

    format = "datasets"

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.name = f"datasets.Dataset {dataset._fingerprint}"
        self.columns = _columns(dataset.column_names, self.name)

    def _read(self) -> Iterator[tuple[str, Document]]:
        for row, obj in enumerate(self.dataset.select_columns(self.columns).with_format(None), 1):
            where = f"{self.name}: row {row}"
            yield where, parse_document(obj, where)

    def count(self) -> int:
        """The dataset's number of rows."""
        return self.dataset.num_rows

    def fingerprint(self) -> str:
        """The dataset's own fingerprint (datasets computes it from its data and the transforms that made it)."""
        return self.dataset._fingerprint

    def info(self, documents: int) -> dict:
        return {"path": self.name, "format": self.format, "fingerprint": self.fingerprint(), "documents": documents}


def open_corpus(source: str | os.PathLike[str] | Corpus | Dataset) -> Corpus:
    """The reader for a corpus: a path (chosen by its suffix; a directory is read as Parquet files), a
    `datasets.Dataset`, or a Corpus (returned as it is). CorpusError naming the supported formats otherwise."""
    if isinstance(source, Corpus):
        return source
    datasets = sys.modules.get("datasets")  # a Dataset can only have been made with datasets imported
    if datasets is not None and isinstance(source, datasets.Dataset):
        return DatasetCorpus(source)
    if not isinstance(source, str | os.PathLike):
        raise CorpusError(f"a corpus of type {type(source).__name__} cannot be read; supported: {FORMATS}")
    path = Path(source)
    reader = ParquetCorpus if path.is_dir() else _reader(path)
    if reader is None:
        raise CorpusError(f"{path}: not a corpus format bertknn reads; supported: {FORMATS}")
    return reader(path)


def _reader(path: Path) -> type[_FileCorpus] | None:
    """The reader of a corpus file chosen by its name's suffix, or None for a name of no corpus format."""
    suffix, name = path.suffix.lower(), path.name.lower()
    if suffix == ".parquet":
        return ParquetCorpus
    if suffix in (".jsonl", ".ndjson"):
        return JsonlCorpus
    if suffix in (".db", ".sqlite", ".sqlite3"):
        return DrqaCorpus
    if suffix == ".xml" or name.endswith(".xml.bz2"):
        return WikipediaDump
    return None


def digest(doc: Document) -> str:
    """sha256 of a document's title and text (and aliases, where it has any): what tells a second add of the same
    document from other text."""
    named = [doc.title, list(doc.passages)] + ([list(doc.aliases)] if doc.aliases else [])
    return hashlib.sha256(json.dumps(named).encode()).hexdigest()


def record(doc: Document, splitter: str) -> Record:
    """A document as the store keeps it: its sentences (split by `splitter`), normalised title and `digest`."""
    sentences = tuple(s for p in doc.passages for s in split_sentences(p, splitter))
    return Record(doc.id, doc.title, normalize_title(doc.title), sentences, digest(doc), doc.date, doc.aliases)


def record_located(located: tuple[str, Document], splitter: str) -> tuple[str, Record]:
    """`record` of a (where, document) pair, keeping where: what worker processes are given (`workers`)."""
    where, doc = located
    return where, record(doc, splitter)
