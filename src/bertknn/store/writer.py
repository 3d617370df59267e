"""The datastore's writer: what only the holder of its writer lock does. `Datastore.writing()` takes the lock, opens
the writer's connection (creating or upgrading the schema) and gives the `DatastoreWriter`; its writes are committed
by SQLite transactions (the commit point) and its files' checksums recorded when the write ends (`seal`). Readers
(datastore.py) never write.

`append` stores one chunk of documents at a time: keys and values are written and fsynced first, then SQLite commits
the chunk's rows and the new entry count in one transaction. That count is the truth: a reader and a resumed build
ignore any bytes past it, so a build killed at any point resumes to exactly the uninterrupted result.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bertknn.store import atomic, names, schema
from bertknn.store import evidence as evidence_table
from bertknn.store.identity import held, new_id
from bertknn.store.integrity import ChecksumError, Checksums, data_files, seal
from bertknn.store.manifest import COMMITTED, IDENTITY, RECORD, DatastoreError, Manifest
from bertknn.store.records import Part, Record, Staged
from bertknn.store.schema import COMMITS, REMOVED_PREFIX, REPLACING_PREFIX, SQLITE, STORE_ID

if TYPE_CHECKING:
    from bertknn.store.protocol import Written


class DatastoreWriter:
    """The writes of one datastore, while its writer lock is held (`Datastore.writing()`): documents registered,
    staged, published and removed, entries appended with their words and evidence vectors, index parts committed, the
    manifest changed, checksums recorded. Reads go through `store`, which reads the writer's own commits meanwhile."""

    def __init__(self, store: Written) -> None:
        self.store = store
        self._began = held(store.db)[1]  # store.sqlite's commits when the write began
        with store.sqlite_errors():
            names.ensure(store.db)  # a store made before the names index gets it whole

    @property
    def db(self) -> sqlite3.Connection:
        """The writer's SQLite connection (the store's while it is writing)."""
        return self.store.db

    def write_meta(self, key: str, value: str) -> None:
        """Keep a value in SQLite, in its own transaction (for the writer)."""
        with self.store.sqlite_errors(), self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def seal(self) -> None:
        """Record checksums (`integrity.seal`): the new tail of keys and values, SQLite whole, and the data files not
        recorded yet (new, or announced by `rewriting`). A recorded file is never re-recorded here, so damage stays
        visible."""
        try:
            sums = Checksums(self.store.path)
            for name, width in self.store.entry_files():
                sums.extend(name, self.store.size * width)
        except ChecksumError as err:
            raise DatastoreError(f"{err}: damaged before this write; its checksums are kept") from None
        if (
            self.store.read_meta("checksummed") != "1"
        ):  # from now on a missing checksums.json is damage: so it exists first
            sums.save()
            with self.store.sqlite_errors(), self.db:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('checksummed', '1')")
        store_id, commits = self._identified()
        own = {STORE_ID: store_id, COMMITS: commits} if store_id else {}
        seal(sums, data_files(self.store.path), changed=[SQLITE], sqlite_changes=self.store.sqlite_changes(), **own)
        self.store.version = self.store.data_version()

    def _identified(self) -> tuple[str | None, int]:
        """store.sqlite's id and commits (`identity.held`); a store made before ids is given one by its first
        writer that commits (none is written when this write committed nothing: a sound store's repair writes
        nothing)."""
        with self.store.sqlite_errors():
            store_id, commits = held(self.db)
            if store_id is None and commits > self._began:
                with self.db:
                    self.db.execute("INSERT INTO meta VALUES (?, ?)", (STORE_ID, new_id()))
                store_id, commits = held(self.db)
        return store_id, commits

    def rewriting(self, *names: str) -> None:
        """Drop the checksums of files about to be replaced, so an interrupted rewrite is not taken for damage (the
        writer's seal records them again)."""
        sums = Checksums(self.store.path)
        if set(names) & set(sums.files):
            sums.forget(names)
            sums.save()

    def register(self, docs: list[Record], state: str = "live", redirects: Sequence[tuple[str, str]] = ()) -> None:
        """Add documents and their sentences (text only, not yet embedded), and `redirects` ((alias, title) pairs: a
        Wikipedia dump's), in one transaction."""
        with self.store.sqlite_errors(), self.db:
            self._insert(docs, state)
            names.add_redirects(self.db, redirects)
        self.store.n_documents += len(docs)

    def _insert(self, docs: list[Record], state: str) -> None:
        first, sent_idx = self.db.execute(
            "SELECT (SELECT coalesce(max(idx) + 1, 0) FROM documents), "
            "(SELECT coalesce(max(idx) + 1, 0) FROM sentences)"
        ).fetchone()
        row = self.db.execute("SELECT since FROM documents ORDER BY idx DESC LIMIT 1").fetchone()
        since = row[0] if row else None  # never decreasing with idx: the last document's is the newest so far
        for doc_idx, doc in enumerate(docs, first):
            since = max(since, doc.date) if since and doc.date else since or doc.date
            aliases = json.dumps(list(doc.aliases)) if doc.aliases else None
            self.db.execute(
                "INSERT INTO documents (idx, id, title, norm_title, state, digest, date, since, aliases) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (doc_idx, doc.id, doc.title, doc.norm_title, state, doc.digest, doc.date, since, aliases),
            )
            names.add(self.db, doc.title, doc.aliases)  # in the transaction that registers it
            rows = [(sent_idx + i, doc_idx, t) for i, t in enumerate(doc.sentences)]
            self.db.executemany("INSERT INTO sentences VALUES (?, ?, ?)", rows)
            sent_idx += len(doc.sentences)

    def stage(self, docs: list[Record], replace: bool = False) -> Staged:
        """Register the given documents as 'adding' (hidden) unless the same document is there, in one transaction;
        return what became of each id (`Staged`: added, replacing a live document, or skipped as unchanged).

        A live document with the same id but other text is refused (remove it first), or with `replace` staged to
        take its place when published (`publish`: Lucene's updateDocument); an 'adding' one left by an interrupted
        add with other text is replaced, so a rerun with corrected text never keeps the old one.
        """
        ids = [d.id for d in docs]
        with self.store.sqlite_errors():
            rows = self.store.documents.rows("id", ids + [REPLACING_PREFIX + i for i in ids])
        held = {doc_id: (idx, state, digest) for doc_id, idx, state, digest in rows if doc_id[:1] != REPLACING_PREFIX}
        staged = {
            doc_id[1:]: (idx, state, digest) for doc_id, idx, state, digest in rows if doc_id[:1] == REPLACING_PREFIX
        }
        changed = [d for d in docs if d.id in held and held[d.id][2] not in (None, d.digest)]
        conflicts = [d.id for d in changed if held[d.id][1] == "live"]
        if conflicts and not replace:
            raise DatastoreError(
                f"document id(s) {conflicts[:5]} are in {self.store.path} with other text; remove them first "
                "(`bertknn remove --doc ID`), or add with --replace"
            )
        skipped = [d.id for d in docs if d.id in held and held[d.id][1] == "live" and d.id not in conflicts]
        redone = [d for d in docs if d.id in staged and staged[d.id][2] == d.digest]  # an interrupted replace's
        stale = [staged[i][0] for i in staged if i not in {d.id for d in redone}]
        new = [d for d in docs if (d.id not in held or d in changed) and d not in redone]
        rename = {d.id for d in new if d.id in conflicts}
        new = [dataclasses.replace(d, id=REPLACING_PREFIX + d.id) if d.id in rename else d for d in new]
        with self.store.sqlite_errors(), self.db:
            self._hide([held[d.id][0] for d in changed if d.id not in conflicts] + stale)
            self._insert(new, "adding")
        self.store.n_documents = self.db.execute("SELECT coalesce(max(idx) + 1, 0) FROM documents").fetchone()[0]
        replaced = rename | {d.id for d in redone}
        added = [d.id for d in docs if d.id not in replaced and d.id not in skipped]
        return Staged(tuple(added), tuple(d.id for d in docs if d.id in replaced), tuple(skipped))

    def _hide(self, docs: list[int]) -> None:
        """Mark documents removed, free their ids, release their entries' evidence and drop the parts of their titles
        from the names index where no other document holds them (`names.forget`), inside the caller's transaction."""
        filled = self.store.evidence.filled
        ranges = self.db.execute(
            "SELECT start, end FROM documents WHERE start IS NOT NULL AND idx IN (SELECT value FROM json_each(?))",
            (json.dumps([int(d) for d in docs]),),
        )
        entries = [e for a, b in ranges for e in range(a, min(b, filled))]
        if entries:
            evidence_table.release(self.db, self.store.evidence.ids(entries))
        self.db.executemany(
            "UPDATE documents SET state = 'removed', removed_id = id, id = ? || idx WHERE idx = ?",
            [(REMOVED_PREFIX, d) for d in docs],
        )
        titles = self.db.execute(
            "SELECT norm_title FROM documents WHERE idx IN (SELECT value FROM json_each(?))",
            (json.dumps([int(d) for d in docs]),),
        )
        names.forget(self.db, [t for (t,) in titles])

    def publish(self, **parts: list[Part]) -> list[str]:
        """Make every 'adding' document live and commit the index parts given (kind=list, as `commit_parts`), in one
        transaction: a reader sees the documents and the parts that index them together, or neither. Returns the ids
        published (those an interrupted add staged among them)."""
        with self.store.sqlite_errors(), self.db:
            published = [
                doc_id.removeprefix(REPLACING_PREFIX)
                for (doc_id,) in self.db.execute("SELECT id FROM documents WHERE state = 'adding' ORDER BY idx")
            ]
            replacing = self.db.execute(
                "SELECT idx, substr(id, 2) FROM documents WHERE state = 'adding' AND substr(id, 1, 1) = ?",
                (REPLACING_PREFIX,),
            ).fetchall()
            if replacing:  # the documents they replace are hidden, their ids taken over, in this one transaction
                old = self.store.documents.rows("id", [doc_id for _, doc_id in replacing])
                self._hide([idx for _, idx, state, _ in old if state == "live"])
                self.db.executemany("UPDATE documents SET id = ? WHERE idx = ?", [(i, x) for x, i in replacing])
            self.db.execute("UPDATE documents SET state = 'live' WHERE state = 'adding'")
            write_parts(self.db, parts)
        return published

    def commit_parts(self, **parts: list[Part]) -> None:
        """Replace the committed list of each index kind given (kind=list of its live parts), in one transaction.
        For the writer: files that no list names are deleted after, never before."""
        with self.store.sqlite_errors(), self.db:
            write_parts(self.db, parts)

    def remove(self, ids: list[str]) -> tuple[list[str], list[str]]:
        """Hide documents from every search path, all in one transaction; return (removed now, removed before).

        An id the datastore never held raises DatastoreError and nothing changes, so a rerun of the same removal
        finishes it: ids removed by the first run are reported as removed before. A replacement of a removed id that
        an interrupted `add --replace` staged is dropped with it: no later publish brings the id back.
        """
        ids = list(dict.fromkeys(str(i) for i in ids))
        with self.store.sqlite_errors():
            rows = self.store.documents.rows("id", ids + [REPLACING_PREFIX + i for i in ids])
        held = {doc_id: idx for doc_id, idx, state, _ in rows if state in ("live", "adding") and doc_id in ids}
        staged = [idx for doc_id, idx, state, _ in rows if state == "adding" and doc_id[:1] == REPLACING_PREFIX]
        before = self.store.documents.removed_ids([i for i in ids if i not in held])
        unknown = [i for i in ids if i not in held and i not in before]
        if unknown:
            raise DatastoreError(
                f"no document with id {', '.join(map(repr, unknown[:5]))} in {self.store.path}; nothing was removed"
            )
        with self.store.sqlite_errors(), self.db:  # a replacement an interrupted add staged goes with its document
            self._hide([*held.values(), *staged])
        return list(held), [i for i in ids if i in before]

    def append(
        self,
        docs: list[int],
        rows: list[tuple[int, int, str]],
        keys: np.ndarray,
        values: np.ndarray,
        spans: list[np.ndarray],
        words: Sequence[tuple[int, str, str]] = (),
        counts: np.ndarray | None = None,
        evidence: evidence_table.Evidence | None = None,
    ) -> int:
        """Store the entries of whole documents: keys (float16), values (and in a pruned store `counts`, 1 each when
        not given) appended and fsynced, then in one transaction each sentence's entry rows (`spans[i]`: the character
        spans of `rows[i]`'s targets), the new `words` their values use (`word_values`), their `evidence` vectors
        (a store with evidence must be given them), each document's [start, end) range and the new entry count.
        Returns the entries added."""
        keys = np.asarray(keys, np.float16)
        if not np.isfinite(keys).all():  # float16 overflows past 65,504: such keys would poison every distance
            raise DatastoreError(
                f"the model gave non-finite keys (NaN, or beyond float16's range) for documents {docs[:5]}; nothing "
                "of them was stored. Check the model, or choose another --layer"
            )
        start, codec = self.store.size, self.store.codec
        if (evidence is None) == bool(self.store.evidence.model):
            raise DatastoreError(
                f"{self.store.path} {'holds' if self.store.evidence.model else 'lacks'} evidence vectors, and this "
                "append "
                f"{'lacks' if evidence is None else 'holds'} them: nothing was stored"
            )
        if evidence is not None and len(evidence.ids) != len(values):
            raise DatastoreError(f"{len(evidence.ids)} entries' evidence for {len(values)} entries: nothing stored")
        if codec is not None:
            keys = codec.encode(keys)
        if counts is None:
            counts = np.ones(len(values), np.int32)
        arrays = (keys, np.asarray(values, np.int32), np.asarray(counts, np.int32))
        for (name, width), array in zip(self.store.entry_files(), arrays):  # counts only where the store is pruned
            atomic.append(self.store.path / name, start * width, np.ascontiguousarray(array).data)  # past the committed
        entry, first = start, {}
        entry_rows = []
        for (sent_idx, doc, _), sentence_spans in zip(rows, spans):
            first.setdefault(doc, entry)
            entry_rows += [(entry + j, sent_idx, int(a), int(b)) for j, (a, b) in enumerate(sentence_spans)]
            entry += len(sentence_spans)
        self._commit_entries(docs, first, entry_rows, start, entry, words, evidence)
        self.store.remap()
        return entry - start

    def _commit_entries(
        self,
        docs: list[int],
        first: dict[int, int],
        rows: list,
        start: int,
        end: int,
        words: Sequence,
        evidence: evidence_table.Evidence | None,
    ) -> None:
        """One transaction: the chunk's entry rows, its new words, its evidence vectors, each document's [start, end)
        range and the new entry count."""
        with self.store.sqlite_errors(), self.db:
            if words:
                self.db.execute(schema.WORDS)
                self.db.executemany("INSERT INTO words VALUES (?, ?, ?)", words)
            if evidence is not None:
                evidence_table.commit(self.db, evidence)
            self.db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?)", rows)
            bounds = [first.get(d, start) for d in docs]  # every document of a chunk has >= 1 sentence
            ends = [*bounds[1:], end]
            self.db.executemany(
                "UPDATE documents SET start = ?, end = ? WHERE idx = ?",
                [(a, b, d) for d, a, b in zip(docs, bounds, ends)],
            )
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('entries', ?)", (str(end),))

    def fill_evidence(self, stop: int, evidence: evidence_table.Evidence) -> None:
        """A store made before evidence vectors: store those of entries [`evidence.filled`, stop) in one
        transaction and record how far that got (`bertknn sentences`, ingest/evidence_encoding.py)."""
        with self.store.sqlite_errors(), self.db:
            evidence_table.commit(self.db, evidence)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (evidence_table.FILLED, str(stop)))

    def word_values(self, words: list[tuple[str, str]]) -> tuple[list[int], list[tuple[int, str, str]]]:
        """The values of words of several tokens, each given as (its tokens' ids as text, the word): those the store
        holds, and new ones numbered on from the manifest's `words_from`, returned also as rows for `append` to
        commit with the entries that use them. Only a writer asks (numbers are given out under the writer lock)."""
        held = self.store.lexicon.rows("pieces", sorted({pieces for pieces, _ in words}))  # these words only
        known = {pieces: value for value, (pieces, _) in held.items()}
        new: list[tuple[int, str, str]] = []
        last = self.store.lexicon.last()
        after = self.store.manifest["words_from"] - 1 if last is None else last
        values = []
        for pieces, word in words:
            if pieces not in known:
                after += 1
                known[pieces] = after
                new.append((after, pieces, word))
            values.append(known[pieces])
        return values, new

    def record_identity(self) -> None:
        """Keep a copy of the manifest's model and key settings in SQLite, which opening the store compares, and the
        store's id (`identity.py`)."""
        with self.store.sqlite_errors(), self.db:
            write_identity(self.db, self.store.manifest)

    def set_manifest(self, **changes: object) -> None:
        """Commit changes of the fields that change after creation (`manifest.COMMITTED`; None removes one) in one
        transaction: the commit record then holds every such field (a change of `key_codec` re-maps the keys)."""
        fixed = sorted(set(changes) - set(COMMITTED))
        if fixed:
            raise ValueError(f"manifest fields {fixed} are fixed when a datastore is created")
        record = {field: self.store.manifest.get(field) for field in COMMITTED} | changes
        with self.store.sqlite_errors(), self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (RECORD, json.dumps(record)))
        self.store.manifest = Manifest({k: v for k, v in {**self.store.manifest, **changes}.items() if v is not None})
        if "key_codec" in changes:
            self.store.remap()


def identity(manifest: dict) -> str:
    """The copy of a manifest's model and key settings that SQLite keeps, which opening the store compares."""
    return json.dumps({field: manifest.get(field) for field in IDENTITY})


def write_identity(db: sqlite3.Connection, manifest: dict) -> None:
    """`identity` and the store's id (where its manifest has one) kept in SQLite, inside the caller's transaction."""
    db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity(manifest),))
    if manifest.get(STORE_ID):
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (STORE_ID, manifest[STORE_ID]))


def write_parts(db: sqlite3.Connection, parts: dict[str, list[Part]]) -> None:
    """Replace the committed list of each index kind given, inside the caller's transaction."""
    for kind, listed in parts.items():
        db.execute("DELETE FROM parts WHERE kind = ?", (kind,))
        db.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", [(kind, p.name, p.first, p.stop) for p in listed])
    if parts:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('parts', '1')")
