"""Evidence vectors: a sentence encoder's vectors of each entry's evidence texts (its word, sentence and clause,
the document's names out: `text.evidence_texts`), stored with the entries, so that a question weighed by its
sentences (`query/`, `model/sentences.py`) embeds only its own text, never its neighbours'.

One table of store.sqlite, `evidence`, keyed by the text (64 bits of its BLAKE2b hash): a text shared by several
entries (a sentence by all its words, a word by all its occurrences, a clause by every entry it precedes) is stored
once and counts its entries in `refs`. Rows are written in the transaction that commits their entries
(`DatastoreWriter.append`), so a build or an add killed at any point leaves every committed entry with its vectors
and no others; removing a document releases its entries' references and deletes the rows no entry uses any more.

A vector is stored in 4 bits a value with one float32 scale per vector (its largest magnitude over 7): 196 bytes for
384 dimensions, against 1,536 in float32 (bench/README.md measures what int8 and 4 bits cost the answers). Written by
hand rather than with a FAISS codec (codec.py), because FAISS's scalar quantisers scale per dimension and must be
trained on a sample, where a vector's own scale needs no training: a store's first chunk may be one sentence, and
every shard of a Ray build and every add encode alike.

The manifest's `evidence` names the sentence encoder when every entry has its vectors (a store built with them, or
one made before them once `bertknn sentences` filled them: the meta row `evidence_filled` holds how far that got).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bertknn.text import evidence_texts

if TYPE_CHECKING:
    from bertknn.store.protocol import OneStore

TABLE = "CREATE TABLE IF NOT EXISTS evidence (id INTEGER PRIMARY KEY, vector BLOB NOT NULL, refs INTEGER NOT NULL)"
FIELD = "evidence"  # manifest: the sentence encoder whose vectors every entry's evidence texts have
FILLED = "evidence_filled"  # meta: entries [0, n) whose evidence is stored, while a store made before is filled
VIEWS = 3  # texts per entry: word, sentence, clause (`text.evidence_texts`)


def text_id(text: str) -> int:
    """A text's row id: 64 bits of its BLAKE2b hash, signed as SQLite's integer keys are."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def entry_texts(rows: Iterable[tuple[str, tuple[int, int], str]]) -> list[str]:
    """The evidence texts of entries given as (sentence, target span, title), VIEWS per entry, in order."""
    return [text for sentence, span, title in rows for text in evidence_texts(sentence, span, title)]


LEVELS = 7  # codes -7..7: 4 bits a value, two values a byte


def encode(vectors: np.ndarray) -> list[bytes]:
    """Rows of float vectors (an even width) as blobs: a float32 scale (the row's largest magnitude / LEVELS), then
    4-bit codes, two a byte (the first value in the low half)."""
    vectors = np.asarray(vectors, np.float32)
    if vectors.shape[1] % 2:
        raise ValueError(f"evidence vectors must have an even width, not {vectors.shape[1]}")
    scale = np.abs(vectors).max(axis=1, keepdims=True) / np.float32(LEVELS)
    scale[scale == 0] = 1
    codes = (np.rint(vectors / scale) + LEVELS + 1).astype(np.uint8)  # 1..15
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return [s.tobytes() + c.tobytes() for s, c in zip(scale.astype(np.float32), packed)]


def decode(blob: bytes) -> np.ndarray:
    """A blob of `encode` back to a float32 vector."""
    packed = np.frombuffer(blob, np.uint8, offset=4)
    codes = np.empty(2 * len(packed), np.float32)
    codes[0::2], codes[1::2] = packed & 15, packed >> 4
    return (codes - (LEVELS + 1)) * np.frombuffer(blob, np.float32, count=1)[0]


@dataclass(frozen=True)
class Evidence:
    """A chunk's evidence, to commit with its entries: each entry's text ids ([n, VIEWS] int64, in entry order) and
    the blobs (`encode`) of the ids the store does not hold yet."""

    ids: np.ndarray
    blobs: dict[int, bytes]


def exists(db: sqlite3.Connection) -> bool:
    """Whether the store has the table (a store made before it has none until it is written)."""
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'evidence'").fetchone() is not None


def _select(db: sqlite3.Connection, columns: str, ids: Sequence[int]) -> list[tuple]:
    query = f"SELECT {columns} FROM evidence WHERE id IN (SELECT value FROM json_each(?))"
    return db.execute(query, (json.dumps([int(i) for i in ids]),)).fetchall() if ids and exists(db) else []


def held(db: sqlite3.Connection, ids: Iterable[int]) -> set[int]:
    """Those of `ids` the store holds."""
    return {row[0] for row in _select(db, "id", list(set(ids)))}


def blobs(db: sqlite3.Connection, ids: Iterable[int]) -> dict[int, bytes]:
    """The stored blobs of those of `ids` the store holds."""
    return dict(_select(db, "id, vector", list(set(ids))))


def read(db: sqlite3.Connection, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """The stored vectors of those of `texts` the store holds."""
    ids = {text_id(t): t for t in texts}
    return {ids[i]: decode(blob) for i, blob in _select(db, "id, vector", list(ids))}


def commit(db: sqlite3.Connection, evidence: Evidence) -> None:
    """Store `evidence` (inside the caller's transaction): new rows with their blobs, and each id's references
    counted. A ValueError names an id that has neither a row nor a blob (nothing is written)."""
    counts = Counter(evidence.ids.ravel().tolist())
    unknown = set(counts) - set(evidence.blobs)  # ids the chunk brings no blob for: the store must hold them
    lacking = unknown - held(db, unknown)
    if lacking:
        raise ValueError(f"no evidence vector for {len(lacking)} text ids, e.g. {sorted(lacking)[:3]}")
    db.execute(TABLE)
    db.executemany(
        "INSERT INTO evidence VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET refs = refs + excluded.refs",
        [(i, evidence.blobs.get(i, b""), n) for i, n in counts.items()],
    )


def release(db: sqlite3.Connection, ids: np.ndarray) -> None:
    """Drop the references of entries' text ids (inside the caller's transaction) and those of their rows no entry
    uses any more: only the rows released are looked at (by their keys), so a remove's work is its own entries',
    however large the table."""
    counts = Counter(np.asarray(ids).ravel().tolist())
    if counts and exists(db):
        db.executemany("UPDATE evidence SET refs = refs - ? WHERE id = ?", [(n, i) for i, n in counts.items()])
        db.executemany("DELETE FROM evidence WHERE id = ? AND refs <= 0", [(i,) for i in counts])


class EvidenceReads:
    """The evidence vectors of one datastore read (`Datastore.evidence`), through its connection of the moment."""

    def __init__(self, store: OneStore) -> None:
        self.store = store

    @property
    def model(self) -> str | None:
        """The sentence encoder whose vectors every entry's evidence texts have; None in a store made before them
        until `bertknn sentences` fills them."""
        return self.store.manifest.get(FIELD)

    @property
    def filled(self) -> int:
        """Entries [0, n) whose evidence is stored: all of a store with evidence; of one being filled, how far."""
        return self.store.size if self.model else int(self.store.read_meta(FILLED) or "0")

    def ids(self, entries: list[int]) -> np.ndarray:
        """The text ids ([n, VIEWS]) of entries' evidence texts (`text.evidence_texts`)."""
        rows = ((e.sentence, e.span, e.title) for e in self.store.documents.provenance(entries))
        return np.asarray([text_id(t) for t in entry_texts(rows)], np.int64).reshape(-1, VIEWS)

    def held(self, ids: Iterable[int]) -> set[int]:
        """Those of the text ids whose vectors the store holds."""
        with self.store.sqlite_errors():
            return held(self.store.db, ids)

    def blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """The stored vectors (encoded) of those of the text ids the store holds: what a copy of entries carries."""
        with self.store.sqlite_errors():
            return blobs(self.store.db, ids)

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of the evidence `texts` the store holds (what the sentence weights read)."""
        with self.store.sqlite_errors():
            return read(self.store.db, texts)
