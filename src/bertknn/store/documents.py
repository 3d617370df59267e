"""The documents of a datastore read: their entry ranges, titles, dates and states, their sentences and the
provenance of their entries (the `documents`, `sentences` and `entries` tables of store.sqlite, schema.py).
`Datastore.documents` is one; `ShardedDocuments` (shards.py) reads a sharded store's by global numbers alike.

A reader's documents are those of the commit it holds (`hold`, at each reopen): the documents it counts, and which
of them were hidden then, so a document another process adds, replaces or removes after changes none of its answers
until it is reopened. The writer's own view reads every commit as it makes it (`hold` never called)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from bertknn.store import names
from bertknn.store.manifest import DatastoreError
from bertknn.store.records import Provenance, newest_first
from bertknn.store.schema import SQLITE

if TYPE_CHECKING:
    from bertknn.store.protocol import OneStore

SQL_PARAMS = 900  # SQLite caps the number of parameters of one statement (999 in old builds)


class Documents:
    """The reads of one datastore's documents, through its connection of the moment (the writer's while it writes,
    so a writer reads its own commits)."""

    def __init__(self, store: OneStore) -> None:
        self.store = store
        self._owners: tuple | None = None  # (entry count, range starts, documents) cached by `of`
        self._dated: tuple | None = None  # (store version, documents) cached by `dated`
        self._held: tuple[int, np.ndarray, frozenset] | None = None  # a reader's commit (`hold`)

    def hold(self) -> None:
        """Read from now on the documents of the commit the store holds now (a reader's reopen): its count, and the
        documents hidden then (being added, or removed)."""
        self._held = None
        hidden = self.hidden()
        self._held = (self.store.n_documents, hidden, frozenset(hidden.tolist()))

    @property
    def db(self) -> sqlite3.Connection:
        """The store's connection of the moment."""
        return self.store.db

    def ranges(self, docs: list[int]) -> list[tuple[int, int]]:
        """The contiguous entry range [start, end) of each document index."""
        if not docs:
            return []
        rows = dict(
            (r[0], (r[1], r[2]))
            for r in self.db.execute(
                f"SELECT idx, start, end FROM documents WHERE idx IN ({','.join('?' * len(docs))})", docs
            )
        )
        if len(rows) < len(set(docs)):
            missing = sorted(set(docs) - set(rows))[:5]
            raise DatastoreError(f"{self.store.path / SQLITE} lacks documents {missing}: damaged")
        return [rows[d] for d in docs]

    def find_titles(self, norm_title: str) -> list[tuple[int, str | None]]:
        """The live documents whose normalised title (`text.normalize_title`) is `norm_title`, newest first
        (`newest_first`), each with its date (its own, else the newest registered before it)."""
        # `+state`: the title's index finds the few rows; the state's would scan every live document
        query = "SELECT idx, coalesce(date, since), state FROM documents WHERE norm_title = ?"
        return newest_first(self._live(self.db.execute(query, (norm_title,)).fetchall()))

    def _live(self, rows: list[tuple]) -> list[tuple]:
        """Those of (idx, ..., state) rows that are live documents of the commit read (`hold`), without the state."""
        if self._held is None:
            return [row[:-1] for row in rows if row[-1] == "live"]
        count, _, hidden = self._held
        return [row[:-1] for row in rows if row[0] < count and row[0] not in hidden]

    def named(self, spans: list[str]) -> list[tuple[str, str, int, str]] | None:
        """(name, normalised title, kind, title) of the names index's rows for those of `spans` that name a title with
        a live document (`names.lookup`); None for a store made before the index (it links no subject until its next
        writer gives it one)."""
        held = None if self._held is None else (self._held[0], self._held[1].tolist())
        return names.lookup(self.db, spans, held)

    def aliases(self, norm_title: str) -> list[str]:
        """A normalised title's names: itself and its documents' aliases (normalised)."""
        return names.aliases_of(self.db, norm_title)

    def dated(self) -> np.ndarray:
        """The live documents added after the build (past the documents of the corpus the manifest records) that
        carry a date of their own, in index order (cached until the store changes): the updates and news items that
        take part in the conflicts of the subjects they name (`retrieval.naming`). The build's own articles do not,
        though a dump dates each one: another article that names a subject is no version of its article."""
        if self._dated is None or self._dated[0] != self.store.version:
            corpus = self.store.manifest.get("corpus") or {}
            built = corpus.get("documents") if isinstance(corpus, dict) else None
            query = "SELECT idx, state FROM documents WHERE idx >= ? AND date IS NOT NULL"
            rows = self._live(self.db.execute(query, (built,)).fetchall()) if isinstance(built, int) else []
            self._dated = (self.store.version, np.asarray([r[0] for r in rows], np.int64))
        return self._dated[1]

    def dated_titles(self, docs: list[int]) -> list[tuple[str, str | None]]:
        """(normalised title, date: its own, else the newest registered before it) of documents, by index: what
        orders versions of one article (`versions`)."""
        return [tuple(row) for row in self._by_index("norm_title, coalesce(date, since)", docs)]

    def titles(self, docs: list[int]) -> list[str]:
        """The titles of documents, by index."""
        return [row[0] for row in self._by_index("title", docs)]

    def _by_index(self, columns: str, docs: list[int]) -> list[tuple]:
        """`columns` of documents in the order of `docs` (one query, as `provenance`); a missing one is damage."""
        sql = f"SELECT idx, {columns} FROM documents WHERE idx IN (SELECT value FROM json_each(?))"
        found = {row[0]: row[1:] for row in self.db.execute(sql, (json.dumps([int(d) for d in docs]),))}
        if len(found) < len(set(map(int, docs))):
            raise DatastoreError(f"{self.store.path / SQLITE} lacks documents the IR index returns: damaged")
        return [found[int(d)] for d in docs]

    def provenance(self, entries: list[int]) -> list[Provenance]:
        """Provenance of stored entries (one query for all): document, sentence, the target's span and, in a pruned
        store, how many contexts the entry stands for."""
        counts = self.store.counts_of(np.asarray(entries, np.int64))
        count = dict(zip(map(int, entries), counts.tolist())) if counts is not None else {}
        found = {
            idx: Provenance(idx, doc_id, title, sentence, (start, end), count.get(idx, 1), date)
            for idx, doc_id, title, sentence, start, end, date in self.db.execute(
                "SELECT e.idx, coalesce(d.removed_id, d.id), d.title, s.text, e.start, e.end, d.date FROM entries e "
                "JOIN sentences s ON s.idx = "
                "e.sentence JOIN documents d ON d.idx = s.doc WHERE e.idx IN (SELECT value FROM json_each(?))",
                (json.dumps([int(e) for e in entries]),),
            )
        }
        missing = [int(e) for e in entries if int(e) not in found]
        if missing:
            raise DatastoreError(
                f"{self.store.path / SQLITE} has no provenance for entries {missing[:5]}: it is damaged; "
                "`bertknn verify`"
            )
        return [found[int(e)] for e in entries]

    def entry_rows(self, entries: np.ndarray) -> list[tuple[int, int, int]]:
        """(sentence, start, end) of each of `entries`, in their order: what `append` stored for them."""
        with self.store.sqlite_errors():
            found = {
                idx: (sentence, start, end)
                for idx, sentence, start, end in self.db.execute(
                    "SELECT idx, sentence, start, end FROM entries WHERE idx IN (SELECT value FROM json_each(?))",
                    (json.dumps([int(e) for e in entries]),),
                )
            }
        return [found[int(e)] for e in entries]

    def texts(self, first: int = 0, stop: int | None = None) -> Iterator[str]:
        """Each document's sentences joined, for documents first..stop-1 in order (what the IR index is built from)."""
        query = (
            "SELECT group_concat(text, ' ') FROM (SELECT doc, text FROM sentences WHERE doc >= ? AND doc < ? "
            "ORDER BY idx) GROUP BY doc ORDER BY doc"
        )
        for (text,) in self.db.execute(query, (first, self.store.n_documents if stop is None else stop)):
            yield text

    def rows(self, column: str, values: list) -> list[tuple]:
        """(value, idx, state, digest) of the documents whose `column` is one of `values`."""
        found = []
        for i in range(0, len(values), SQL_PARAMS):
            part = values[i : i + SQL_PARAMS]
            marks = ",".join("?" * len(part))
            query = f"SELECT {column}, idx, state, digest FROM documents WHERE {column} IN ({marks})"
            found += self.db.execute(query, part).fetchall()
        return found

    def live_digests(self, ids: list[str]) -> dict[str, str | None]:
        """The text digest (`corpus.digest`) of each of the given ids that is live; None for a document stored
        before digests were kept."""
        with self.store.sqlite_errors():
            return {doc_id: digest for doc_id, _, state, digest in self.rows("id", ids) if state == "live"}

    def states(self, ids: list[str]) -> dict[str, str]:
        """The state of each of the given document ids that the datastore holds (removed ones are not held)."""
        with self.store.sqlite_errors():
            return {doc_id: state for doc_id, _, state, _ in self.rows("id", ids)}

    def adding(self) -> list[int]:
        """Documents registered by an add that has not been published yet."""
        return [r[0] for r in self.db.execute("SELECT idx FROM documents WHERE state = 'adding' ORDER BY idx")]

    def removed_ids(self, ids: list[str]) -> set[str]:
        """Those of the given ids whose documents were removed (and not added again since)."""
        with self.store.sqlite_errors():
            return {doc_id for doc_id, *_ in self.rows("removed_id", ids)}

    def live_end(self) -> int:
        """One past the last live document (0 when none is): what an IR index must cover."""
        query = "SELECT coalesce(max(idx) + 1, 0) FROM documents WHERE state = 'live' AND idx < ?"
        return self.db.execute(query, (self.store.n_documents,)).fetchone()[0]

    def count_live(self) -> int:
        """How many documents searches can return."""
        if self._held is not None:
            return self._held[0] - len(self._held[1])
        return self.db.execute("SELECT count(*) FROM documents WHERE state = 'live'").fetchone()[0]

    def hidden(self) -> np.ndarray:
        """Indices of the documents no search may return (being added, or removed)."""
        if self._held is not None:
            return self._held[1]
        rows = self.db.execute("SELECT idx FROM documents WHERE state IN ('adding', 'removed')").fetchall()  # indexed
        return np.asarray([r[0] for r in rows], dtype=np.int64)

    def of(self, entries: np.ndarray) -> np.ndarray:
        """The document index of each entry (entries must be committed)."""
        if self._owners is None or self._owners[0] != self.store.size:  # ranges only change when entries are committed
            rows = self.db.execute("SELECT start, idx FROM documents WHERE end > start ORDER BY start").fetchall()
            self._owners = (self.store.size, *np.asarray(rows, dtype=np.int64).reshape(-1, 2).T)
        _, starts, docs = self._owners
        return docs[np.searchsorted(starts, np.asarray(entries, np.int64), side="right") - 1]

    def pending(self, docs: list[int] | None = None) -> list[int]:
        """The documents (of `docs`, or all) whose entries are not embedded yet, in index order. A removed document is
        never pending: it is searched by nobody (a staged text an add rerun with other text superseded, say), so it
        neither waits to be embedded nor makes a store lazy (`builder.finish`)."""
        query = "SELECT idx FROM documents WHERE start IS NULL AND state != 'removed'"
        if docs is None:
            return [r[0] for r in self.db.execute(f"{query} ORDER BY idx")]
        docs = sorted(set(docs))
        found: set[int] = set()
        for i in range(0, len(docs), SQL_PARAMS):
            part = docs[i : i + SQL_PARAMS]
            found |= {r[0] for r in self.db.execute(f"{query} AND idx IN ({','.join('?' * len(part))})", part)}
        return [d for d in docs if d in found]

    def sentences(self, docs: list[int]) -> list[tuple[int, int, str]]:
        """(sentence index, document, text) of the sentences of the given documents, in document and text order."""
        with self.store.sqlite_errors():
            return self.db.execute(
                f"SELECT idx, doc, text FROM sentences WHERE doc IN ({','.join('?' * len(docs))}) ORDER BY doc, idx",
                docs,
            ).fetchall()

    def text_length(self, doc: int) -> int:
        """Characters of a document's sentences (what a build sizes its chunks by)."""
        with self.store.sqlite_errors():
            return self.db.execute("SELECT sum(length(text)) FROM sentences WHERE doc = ?", (doc,)).fetchone()[0] or 0
