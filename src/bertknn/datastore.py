"""Datastore stage: (key, value) pairs with provenance, in one directory (SPEC §1).

Layout of a datastore directory:
- manifest.json: format version, model name and weights hash, layer, dimension, dtype, counts, build status;
- keys.f16: float16 keys, one row of `dim` values per entry, append-only (read through a numpy memmap);
- values.i32: int32 token ids, one per entry;
- store.sqlite: documents (each with one contiguous entry range), sentences and each entry's provenance.

The build appends one chunk of documents at a time: keys and values are written and fsynced first, then SQLite
commits the chunk's rows and the new entry count in one transaction. That count is the truth: a reader and a
resumed build ignore any bytes past it, so a build killed at any point resumes to exactly the uninterrupted result.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertknn.encoder import Encoder
from bertknn.text import Document, iter_corpus, normalize_title, split_sentences, tokenize_sentences, validate_corpus

FORMAT = "bertknn-datastore"
VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    idx INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL, norm_title TEXT NOT NULL,
    start INTEGER NOT NULL, end INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS documents_title ON documents (norm_title);
CREATE TABLE IF NOT EXISTS sentences (idx INTEGER PRIMARY KEY, doc INTEGER NOT NULL, text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    idx INTEGER PRIMARY KEY, sentence INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL);
"""


class DatastoreError(ValueError):
    """A datastore that is missing, corrupt, incomplete, or made with another model or layer."""


@dataclass(frozen=True)
class Evidence:
    """Where a stored entry comes from: its document, its sentence and the target's character span there."""

    entry: int
    doc_id: str
    title: str
    sentence: str
    span: tuple[int, int]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json(path: Path, obj: dict) -> None:
    """Write JSON atomically (temporary file, fsync, rename) so a reader never sees half a manifest."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(obj, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


class Datastore:
    """A datastore directory opened for reading (and, during a build, appending)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = self.path / "manifest.json"
        if not manifest.is_file():
            raise DatastoreError(f"{self.path} is not a datastore (no manifest.json); create one with `bertknn build`")
        try:
            self.manifest = json.loads(manifest.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DatastoreError(f"{manifest} is corrupt ({err.msg}); rebuild the datastore") from None
        if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
            raise DatastoreError(f"{manifest} is not a {FORMAT} version {VERSION} manifest")
        self.dim = int(self.manifest["dim"])
        self.db = sqlite3.connect(self.path / "store.sqlite", check_same_thread=False)
        self.db.executescript(SCHEMA)
        self._map()

    def _map(self) -> None:
        """Memory-map the committed entries; anything past the committed count is ignored."""
        self.size = int(self._meta("entries", "0"))
        self.n_documents = self.db.execute("SELECT count(*) FROM documents").fetchone()[0]
        for name, width in (("keys.f16", 2 * self.dim), ("values.i32", 4)):
            have = (self.path / name).stat().st_size if (self.path / name).exists() else 0
            if have < self.size * width:
                raise DatastoreError(
                    f"{self.path / name} is truncated ({have:,} bytes for {self.size:,} entries): the datastore is "
                    "corrupt; rebuild it"
                )
        if self.size:
            self.keys = np.memmap(self.path / "keys.f16", np.float16, "r", shape=(self.size, self.dim))
            self.values = np.memmap(self.path / "values.i32", np.int32, "r", shape=(self.size,))
        else:
            self.keys = np.zeros((0, self.dim), np.float16)
            self.values = np.zeros(0, np.int32)

    def _meta(self, key: str, default: str) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    @property
    def complete(self) -> bool:
        """True once every document of the build's corpus is in."""
        return self.manifest.get("status") == "complete"

    @property
    def layer(self) -> int:
        """The block whose states are the keys."""
        return int(self.manifest["layer"])

    def check_encoder(self, encoder: Encoder) -> None:
        """Refuse to query with a model or layer other than the one the keys were made with."""
        want = self.manifest
        if encoder.weights_hash != want["model_hash"] or encoder.dim != self.dim:
            raise DatastoreError(
                f"the datastore at {self.path} was built with model {want['model']!r} (weights sha256 "
                f"{want['model_hash'][:12]}), but the given model {encoder.name!r} has weights "
                f"{encoder.weights_hash[:12]}; use the same model or build a new datastore"
            )
        if encoder.layer != self.layer:
            raise DatastoreError(
                f"the datastore at {self.path} holds layer-{self.layer} keys, but the model reads layer "
                f"{encoder.layer}; use layer={self.layer} or build a datastore for layer {encoder.layer}"
            )

    def document_ranges(self, docs: list[int]) -> list[tuple[int, int]]:
        """The contiguous entry range [start, end) of each document index."""
        if not docs:
            return []
        rows = dict(
            (r[0], (r[1], r[2]))
            for r in self.db.execute(
                f"SELECT idx, start, end FROM documents WHERE idx IN ({','.join('?' * len(docs))})", docs
            )
        )
        return [rows[d] for d in docs]

    def find_title(self, subject: str) -> int | None:
        """Index of the first document whose title equals `subject` (case- and Unicode-insensitive), else None."""
        row = self.db.execute(
            "SELECT idx FROM documents WHERE norm_title = ? ORDER BY idx LIMIT 1", (normalize_title(subject),)
        ).fetchone()
        return row[0] if row else None

    def titles(self, docs: list[int]) -> list[str]:
        """The titles of documents, by index."""
        return [self.db.execute("SELECT title FROM documents WHERE idx = ?", (d,)).fetchone()[0] for d in docs]

    def evidence(self, entries: list[int]) -> list[Evidence]:
        """Provenance of stored entries: document, sentence and the target's span."""
        out = []
        for entry in entries:
            row = self.db.execute(
                "SELECT d.id, d.title, s.text, e.start, e.end FROM entries e JOIN sentences s ON s.idx = e.sentence "
                "JOIN documents d ON d.idx = s.doc WHERE e.idx = ?",
                (int(entry),),
            ).fetchone()
            out.append(Evidence(int(entry), row[0], row[1], row[2], (row[3], row[4])))
        return out

    def iter_document_texts(self) -> Iterator[str]:
        """Each document's sentences joined, in document order (what the IR index is built from)."""
        query = (
            "SELECT group_concat(text, ' ') FROM (SELECT doc, text FROM sentences ORDER BY idx) "
            "GROUP BY doc ORDER BY doc"
        )
        for (text,) in self.db.execute(query):
            yield text

    def append(self, docs: list[Document], encoder: Encoder, token_budget: int = 8192) -> int:
        """Embed and append whole documents as one committed chunk; return the number of new entries."""
        sentence_texts = [[s for p in doc.passages for s in split_sentences(p)] for doc in docs]
        flat = tokenize_sentences(encoder.tokenizer, [s for group in sentence_texts for s in group])
        keys = encoder.embed(flat, token_budget).astype(np.float16)
        values = np.concatenate([s.target_ids for s in flat]) if flat else np.zeros(0, np.int32)
        start = self.size
        for name, array in (("keys.f16", keys), ("values.i32", values)):
            with (self.path / name).open("r+b" if (self.path / name).exists() else "wb") as handle:
                handle.truncate(start * array.itemsize * (self.dim if array.ndim == 2 else 1))
                handle.seek(0, os.SEEK_END)
                handle.write(np.ascontiguousarray(array).tobytes())
                handle.flush()
                os.fsync(handle.fileno())
        self._commit_rows(docs, sentence_texts, flat, start)
        self._map()
        return len(values)

    def _commit_rows(self, docs: list[Document], sentence_texts: list[list[str]], flat: list, start: int) -> None:
        sent_idx = self.db.execute("SELECT count(*) FROM sentences").fetchone()[0]
        doc_idx, entry, k = self.n_documents, start, 0
        with self.db:  # one transaction: all rows of the chunk and the new entry count, or none
            for doc, texts in zip(docs, sentence_texts):
                first = entry
                for _ in texts:
                    sent = flat[k]
                    self.db.execute("INSERT INTO sentences VALUES (?, ?, ?)", (sent_idx, doc_idx, sent.text))
                    self.db.executemany(
                        "INSERT INTO entries VALUES (?, ?, ?, ?)",
                        [(entry + j, sent_idx, int(a), int(b)) for j, (a, b) in enumerate(sent.spans)],
                    )
                    entry += len(sent.spans)
                    sent_idx, k = sent_idx + 1, k + 1
                self.db.execute(
                    "INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?)",
                    (doc_idx, doc.id, doc.title, normalize_title(doc.title), first, entry),
                )
                doc_idx += 1
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('entries', ?)", (str(entry),))

    def has_document(self, doc_id: str) -> bool:
        """True when a document with this id is already stored."""
        return self.db.execute("SELECT 1 FROM documents WHERE id = ?", (doc_id,)).fetchone() is not None

    def set_manifest(self, **changes: object) -> None:
        """Update the manifest atomically."""
        self.manifest.update(changes)
        _write_json(self.path / "manifest.json", self.manifest)


def create(path: str | Path, encoder: Encoder, corpus: dict | None = None) -> Datastore:
    """Create an empty datastore directory for `encoder` (or reopen it when it was made for the same model)."""
    path = Path(path)
    if (path / "manifest.json").exists():
        store = Datastore(path)
        store.check_encoder(encoder)
        known = store.manifest.get("corpus") or {}
        if corpus and known and known.get("sha256") != corpus["sha256"]:
            raise DatastoreError(
                f"{path} holds a datastore of another corpus ({known.get('path')}); "
                "choose another --out directory or delete this one"
            )
        return store
    if path.exists() and any(path.iterdir()):
        raise DatastoreError(f"{path} exists and is not a datastore; choose an empty or new directory")
    path.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model": encoder.name,
        "model_hash": encoder.weights_hash,
        "layer": encoder.layer,
        "dim": encoder.dim,
        "dtype": "float16",
        "value_dtype": "int32",
        "status": "building",
        "corpus": corpus,
    }
    _write_json(path / "manifest.json", manifest)
    return Datastore(path)


def build(
    corpus: str | Path,
    out: str | Path,
    encoder: Encoder,
    chunk_entries: int = 4096,
    token_budget: int = 8192,
    progress: Callable[[int, int], None] | None = None,
) -> Datastore:
    """Build (or resume building) the datastore of a JSONL corpus; `progress(done_docs, entries)` after each chunk.

    The corpus is validated in full first, so a malformed line fails before anything is written. Chunks hold whole
    documents and end at fixed points, so a resumed build gives exactly the entries of an uninterrupted one.
    """
    corpus = Path(corpus)
    n_docs = validate_corpus(corpus)
    store = create(out, encoder, {"path": str(corpus.resolve()), "sha256": _file_sha256(corpus), "documents": n_docs})
    if not store.complete:
        done = store.n_documents
        if progress:
            progress(done, store.size)
        chunk: list[Document] = []
        pending = 0
        for i, doc in enumerate(iter_corpus(corpus)):
            if i < done:
                continue
            chunk.append(doc)
            pending += sum(len(p) for p in doc.passages) // 6  # rough word count: the chunk's end point
            if pending >= chunk_entries or i == n_docs - 1:
                store.append(chunk, encoder, token_budget)
                chunk, pending = [], 0
                if progress:
                    progress(i + 1, store.size)
        store.set_manifest(status="complete", documents=store.n_documents, entries=store.size)
    return store
