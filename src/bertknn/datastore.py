"""Datastore stage: (key, value) pairs with provenance, in one directory (SPEC §1).

Layout of a datastore directory:
- manifest.json: format version, model name and weights hash, layer, dimension, dtype, counts, build status;
- keys.f16: float16 keys, one row of `dim` values per entry, append-only (read through a numpy memmap);
- values.i32: int32 token ids, one per entry;
- store.sqlite: documents (each with one contiguous entry range and a state), sentences and each entry's provenance.

A document's state is 'live' (searched), 'adding' (registered by `bertknn add` but not yet searchable: it becomes
live in one transaction once its keys and index entries are all written) or 'removed' (hidden from every path).

The build appends one chunk of documents at a time: keys and values are written and fsynced first, then SQLite
commits the chunk's rows and the new entry count in one transaction. That count is the truth: a reader and a
resumed build ignore any bytes past it, so a build killed at any point resumes to exactly the uninterrupted result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
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
    start INTEGER, end INTEGER,  -- the entry range [start, end); NULL until the document is embedded
    state TEXT NOT NULL DEFAULT 'live');
CREATE INDEX IF NOT EXISTS documents_title ON documents (norm_title);
CREATE TABLE IF NOT EXISTS sentences (idx INTEGER PRIMARY KEY, doc INTEGER NOT NULL, text TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sentences_doc ON sentences (doc);
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


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks."""
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
        if "state" not in {row[1] for row in self.db.execute("PRAGMA table_info(documents)")}:  # before add/remove
            with self.db:
                self.db.execute("ALTER TABLE documents ADD COLUMN state TEXT NOT NULL DEFAULT 'live'")
        self.db.execute("CREATE INDEX IF NOT EXISTS documents_state ON documents (state)")
        self._owners: tuple | None = None  # (entry count, range starts, documents) cached by `documents_of`
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
        """True once every document of the corpus is embedded."""
        return self.manifest.get("status") == "complete"

    @property
    def lazy(self) -> bool:
        """True for a datastore whose documents are embedded on demand (`bertknn build --lazy`)."""
        return self.manifest.get("status") == "lazy"

    @property
    def pack(self) -> int:
        """How many non-adjacent targets of a sentence were masked per pass when its keys were computed (1 = exact)."""
        return int(self.manifest.get("pack", 1))

    @property
    def int8(self) -> bool:
        """True when keys were computed by the encoder quantised to int8 (`--int8-keys`), not in float32."""
        return bool(self.manifest.get("int8", False))

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
            "SELECT idx FROM documents WHERE norm_title = ? AND state = 'live' ORDER BY idx LIMIT 1",
            (normalize_title(subject),),
        ).fetchone()
        return row[0] if row else None

    def titles(self, docs: list[int]) -> list[str]:
        """The titles of documents, by index."""
        return [self.db.execute("SELECT title FROM documents WHERE idx = ?", (d,)).fetchone()[0] for d in docs]

    def evidence(self, entries: list[int]) -> list[Evidence]:
        """Provenance of stored entries (one query for all): document, sentence and the target's span."""
        found = {
            idx: Evidence(idx, doc_id, title, sentence, (start, end))
            for idx, doc_id, title, sentence, start, end in self.db.execute(
                "SELECT e.idx, d.id, d.title, s.text, e.start, e.end FROM entries e JOIN sentences s ON s.idx = "
                "e.sentence JOIN documents d ON d.idx = s.doc WHERE e.idx IN (SELECT value FROM json_each(?))",
                (json.dumps([int(e) for e in entries]),),
            )
        }
        return [found[int(e)] for e in entries]

    def iter_document_texts(self, first: int = 0, stop: int | None = None) -> Iterator[str]:
        """Each document's sentences joined, for documents first..stop-1 in order (what the IR index is built from)."""
        query = (
            "SELECT group_concat(text, ' ') FROM (SELECT doc, text FROM sentences WHERE doc >= ? AND doc < ? "
            "ORDER BY idx) GROUP BY doc ORDER BY doc"
        )
        for (text,) in self.db.execute(query, (first, self.n_documents if stop is None else stop)):
            yield text

    def register(self, docs: list[Document], state: str = "live") -> None:
        """Add documents and their sentences (text only, not yet embedded) in one transaction."""
        sent_idx = self.db.execute("SELECT count(*) FROM sentences").fetchone()[0]
        with self.db:
            for doc_idx, doc in enumerate(docs, self.n_documents):
                self.db.execute(
                    "INSERT INTO documents VALUES (?, ?, ?, ?, NULL, NULL, ?)",
                    (doc_idx, doc.id, doc.title, normalize_title(doc.title), state),
                )
                sentences = [s for p in doc.passages for s in split_sentences(p)]
                self.db.executemany(
                    "INSERT INTO sentences VALUES (?, ?, ?)",
                    [(sent_idx + i, doc_idx, t) for i, t in enumerate(sentences)],
                )
                sent_idx += len(sentences)
        self.n_documents += len(docs)

    def states(self, ids: list[str]) -> dict[str, str]:
        """The state of each of the given document ids that the datastore holds."""
        found = {}
        for i in range(0, len(ids), 900):  # SQLite caps the number of parameters of one statement
            part = ids[i : i + 900]
            query = f"SELECT id, state FROM documents WHERE id IN ({','.join('?' * len(part))})"
            found.update(dict(self.db.execute(query, part).fetchall()))
        return found

    def adding(self) -> list[int]:
        """Documents registered by an add that has not been published yet."""
        return [r[0] for r in self.db.execute("SELECT idx FROM documents WHERE state = 'adding' ORDER BY idx")]

    def publish(self) -> None:
        """Make every 'adding' document live, in one transaction."""
        with self.db:
            self.db.execute("UPDATE documents SET state = 'live' WHERE state = 'adding'")

    def remove(self, doc_id: str) -> None:
        """Hide a live document from every search path, in one transaction; its id becomes free for a new one."""
        with self.db:
            changed = self.db.execute(
                "UPDATE documents SET state = 'removed', id = id || '#removed-' || idx WHERE id = ? AND state = 'live'",
                (doc_id,),
            ).rowcount
        if not changed:
            raise DatastoreError(f"no document with id {doc_id!r} in {self.path}")

    def live_documents(self) -> int:
        """How many documents searches can return."""
        return self.db.execute("SELECT count(*) FROM documents WHERE state = 'live'").fetchone()[0]

    def hidden_documents(self) -> np.ndarray:
        """Indices of the documents no search may return (being added, or removed)."""
        rows = self.db.execute("SELECT idx FROM documents WHERE state != 'live'").fetchall()
        return np.asarray([r[0] for r in rows], dtype=np.int64)

    def documents_of(self, entries: np.ndarray) -> np.ndarray:
        """The document index of each entry (entries must be committed)."""
        if self._owners is None or self._owners[0] != self.size:  # ranges only change when entries are committed
            rows = self.db.execute("SELECT start, idx FROM documents WHERE end > start ORDER BY start").fetchall()
            self._owners = (self.size, *np.asarray(rows, dtype=np.int64).reshape(-1, 2).T)
        _, starts, docs = self._owners
        return docs[np.searchsorted(starts, np.asarray(entries, np.int64), side="right") - 1]

    def pending(self, docs: list[int] | None = None) -> list[int]:
        """The documents (of `docs`, or all) whose entries are not embedded yet, in index order."""
        query = "SELECT idx FROM documents WHERE start IS NULL"
        if docs is None:
            return [r[0] for r in self.db.execute(f"{query} ORDER BY idx")]
        docs = sorted(set(docs))
        found: set[int] = set()
        for i in range(0, len(docs), 900):  # SQLite caps the number of parameters of one statement
            part = docs[i : i + 900]
            found |= {r[0] for r in self.db.execute(f"{query} AND idx IN ({','.join('?' * len(part))})", part)}
        return [d for d in docs if d in found]

    def embed(
        self,
        docs: list[int],
        encoder: Encoder,
        chunk_entries: int = 4096,
        token_budget: int = 1024,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Embed the given documents that are not embedded yet; return how many entries were added.

        Documents are taken in index order and committed in chunks of whole documents that end once they hold about
        `chunk_entries` sentences' worth of words; `progress(documents_done)` is called after each chunk.
        """
        added, chunk, words, done = 0, [], 0, 0
        todo = self.pending(docs)
        for i, doc in enumerate(todo):
            chunk.append(doc)
            words += self.db.execute("SELECT sum(length(text)) FROM sentences WHERE doc = ?", (doc,)).fetchone()[0] // 6
            if words >= chunk_entries or i == len(todo) - 1:
                added += self._embed_chunk(chunk, encoder, token_budget)
                done += len(chunk)
                chunk, words = [], 0
                if progress:
                    progress(done)
        if added and self.manifest.get("status") != "building":
            embedded = self.n_documents - len(self.pending())
            status = "complete" if embedded == self.n_documents else "lazy"
            self.set_manifest(status=status, embedded=embedded, entries=self.size)
        return added

    def _embed_chunk(self, docs: list[int], encoder: Encoder, token_budget: int) -> int:
        """Embed whole documents: append keys and values (fsynced), then commit their rows and the new count."""
        rows = self.db.execute(
            f"SELECT idx, doc, text FROM sentences WHERE doc IN ({','.join('?' * len(docs))}) ORDER BY doc, idx", docs
        ).fetchall()
        flat = tokenize_sentences(encoder.tokenizer, [r[2] for r in rows])
        keys = encoder.embed(flat, token_budget, self.pack, self.int8).astype(np.float16)
        values = np.concatenate([s.target_ids for s in flat]) if flat else np.zeros(0, np.int32)
        start = self.size
        for name, array, width in (("keys.f16", keys, 2 * self.dim), ("values.i32", values, 4)):
            with (self.path / name).open("r+b" if (self.path / name).exists() else "wb") as handle:
                handle.truncate(start * width)  # drop bytes of a chunk that was never committed
                handle.seek(0, os.SEEK_END)
                handle.write(np.ascontiguousarray(array).tobytes())
                handle.flush()
                os.fsync(handle.fileno())
        entry, first = start, {}
        entry_rows = []
        for (sent_idx, doc, _), sent in zip(rows, flat):
            first.setdefault(doc, entry)
            entry_rows += [(entry + j, sent_idx, int(a), int(b)) for j, (a, b) in enumerate(sent.spans)]
            entry += len(sent.spans)
        self._commit_entries(docs, first, entry_rows, start, entry)
        self._map()
        return entry - start

    def _commit_entries(self, docs: list[int], first: dict[int, int], rows: list, start: int, end: int) -> None:
        """One transaction: the chunk's entry rows, each document's [start, end) range and the new entry count."""
        with self.db:
            self.db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", rows)
            bounds = [first.get(d, start) for d in docs]  # every document of a chunk has >= 1 sentence
            ends = [*bounds[1:], end]
            self.db.executemany(
                "UPDATE documents SET start = ?, end = ? WHERE idx = ?",
                [(a, b, d) for d, a, b in zip(docs, bounds, ends)],
            )
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('entries', ?)", (str(end),))

    def set_manifest(self, **changes: object) -> None:
        """Update the manifest atomically."""
        self.manifest.update(changes)
        _write_json(self.path / "manifest.json", self.manifest)


def create(
    path: str | Path, encoder: Encoder, corpus: dict | None = None, pack: int = 1, int8: bool = False
) -> Datastore:
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
        if store.pack != pack:
            raise DatastoreError(
                f"{path} holds keys computed with pack={store.pack}; resume it with the same --pack, or choose "
                "another --out directory"
            )
        if store.int8 != int8:
            have, flag = ("int8", "with --int8-keys") if store.int8 else ("float32", "without --int8-keys")
            raise DatastoreError(f"{path} holds {have} keys; resume it {flag}, or choose another --out directory")
        return store
    if path.exists() and any(path.iterdir()):
        raise DatastoreError(f"{path} exists and is not a datastore; choose an empty or new directory")
    path.mkdir(parents=True, exist_ok=True)
    _write_json(path / "manifest.json", _new_manifest(encoder, corpus, pack, int8))
    return Datastore(path)


def _new_manifest(encoder: Encoder, corpus: dict | None, pack: int, int8: bool) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": encoder.name,
        "model_hash": encoder.weights_hash,
        "layer": encoder.layer,
        "dim": encoder.dim,
        "pack": pack,
        "int8": int8,
        "dtype": "float16",
        "value_dtype": "int32",
        "status": "building",
        "corpus": corpus,
    }


def copy_registration(
    source: str | Path, path: str | Path, encoder: Encoder, pack: int = 1, int8: bool = False
) -> Datastore:
    """A new, empty datastore for `encoder` at `path` with the documents, sentences and IR index of `source`.

    Registration (sentence splitting and indexing) does not depend on the model, so a datastore of another model or
    layer over the same corpus can start from it; nothing is embedded.
    """
    source, path = Path(source), Path(path)
    src = Datastore(source)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with sqlite3.connect(tmp / "store.sqlite") as db:
        src.db.backup(db)
        db.execute("UPDATE documents SET start = NULL, end = NULL")
        db.execute("DELETE FROM entries")
        db.execute("DELETE FROM meta")
    for name in source.glob("tfidf_*"):
        (shutil.copytree if name.is_dir() else shutil.copyfile)(name, tmp / name.name)
    manifest = _new_manifest(encoder, src.manifest.get("corpus"), pack, int8)
    _write_json(tmp / "manifest.json", manifest)
    tmp.replace(path)
    return Datastore(path)


def build(
    corpus: str | Path,
    out: str | Path,
    encoder: Encoder,
    lazy: bool = False,
    pack: int = 1,
    int8: bool = False,
    chunk_entries: int = 4096,
    token_budget: int = 1024,
    progress: Callable[[str, int, int], None] | None = None,
) -> Datastore:
    """Build (or resume building) the datastore of a JSONL corpus.

    Documents are first registered (text and sentences, in chunks of 500 documents), then embedded in chunks
    (`Datastore.embed`); with `lazy`, embedding is left for later and done per document on demand.
    `pack` > 1 masks that many targets per pass and `int8` runs the encoder quantised (`Encoder.embed`); the manifest
    records both: a resume with others is refused, and later embedding (lazy, `add`) follows them.
    `progress(phase, done, total)` reports both phases. The corpus is validated in full first, so a malformed line
    fails before anything is written; a resumed build gives exactly the entries of an uninterrupted one.
    """
    corpus = Path(corpus)
    n_docs = validate_corpus(corpus)
    corpus_info = {"path": str(corpus.resolve()), "sha256": file_sha256(corpus), "documents": n_docs}
    store = create(out, encoder, corpus_info, pack, int8)
    report = progress or (lambda phase, done, total: None)
    chunk: list[Document] = []
    report("reading", store.n_documents, n_docs)
    for i, doc in enumerate(iter_corpus(corpus)):
        if i < store.n_documents:
            continue
        chunk.append(doc)
        if len(chunk) == 500 or i == n_docs - 1:
            store.register(chunk)
            chunk = []
            report("reading", store.n_documents, n_docs)
    if not lazy:
        todo = store.pending()
        done = n_docs - len(todo)
        report("embedding", done, n_docs)
        store.embed(todo, encoder, chunk_entries, token_budget, lambda d: report("embedding", done + d, n_docs))
    embedded = n_docs - len(store.pending())
    store.set_manifest(
        status="complete" if embedded == n_docs else "lazy", documents=n_docs, embedded=embedded, entries=store.size
    )
    return store
