"""The datastore's writer: one object per writing process, opened once (`open_datastore_writer`; for any store,
`writers.open_writer`), as Lucene's IndexWriter: the only holder of the writer lock and of the writer's connection
(made or upgraded here) until it is closed. It reads through a view of its own (a `Datastore` on its connection, so it
sees its commits at once); readers (datastore.py) are other objects, never written through, that move to its commits
when reopened (`Datastore.reopen_if_changed`). Its writes are committed by SQLite transactions (the commit point) and
its files' checksums recorded when a commit ends (`commit`; sealing.py); a write called outside `commit` is a commit
of its own.

`append` stores one chunk of documents at a time: keys and values are written and fsynced first, then SQLite commits
the chunk's rows and the new entry count in one transaction. That count is the truth: a reader and a resumed build
ignore any bytes past it, so a build killed at any point resumes to exactly the uninterrupted result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TypeVar

import numpy as np

from bertknn.store import atomic, names, schema, sealing
from bertknn.store import evidence as evidence_table
from bertknn.store.datastore import APPEND_ONLY, Datastore
from bertknn.store.identity import held, write_identity
from bertknn.store.integrity import ChecksumError, Checksums, Damage, damage_message
from bertknn.store.lock import LOCK_WAIT, acquire_lock
from bertknn.store.manifest import COMMITTED, RECORD, DatastoreError, Manifest
from bertknn.store.records import Part, Record, Staged
from bertknn.store.schema import REMOVED_PREFIX, REPLACING_PREFIX, SQLITE

Method = TypeVar("Method", bound=Callable)
_OPEN: weakref.WeakValueDictionary[Path, DatastoreWriter] = weakref.WeakValueDictionary()  # this process's writers
_OPENING = threading.Lock()


def open_datastore_writer(path: str | Path, wait: float | None = None, check_tails: bool = True) -> DatastoreWriter:
    """The writer of the one-directory datastore at `path`, one per process: the one this process holds open
    already (one more holder), else opened: its lock taken (waiting up to `wait` seconds for another process's
    writer; None: as `lock.lock_wait` says), refused before anything is written where store.sqlite is another
    store's or an older copy (`identity.damage`), what an interrupted writer left half-written removed, its
    connection opened (the schema made or upgraded) and the committed state read. `check_tails`: refuse where the
    last block of keys or values is damaged (`bertknn repair` checks every block itself). Each holder closes it
    (`with open_datastore_writer(p) as w:`); the last one's close lets another process's writer in."""
    key = Path(path).resolve()
    with _OPENING:
        writer = _OPEN.get(key)
        if writer is not None and writer.hold():
            return writer
        writer = _OPEN[key] = _opened(Path(path), wait, check_tails)
        return writer


def _opened(path: Path, wait: float | None, check_tails: bool) -> DatastoreWriter:
    """A new writer of the store at `path` (`open_datastore_writer`)."""
    lock = acquire_lock(path, LOCK_WAIT.get() if wait is None else wait)
    try:
        view = Datastore(path, check=False)
    except BaseException:
        _unlock(lock)
        raise
    try:
        view.check_provenance(older=check_tails)
        atomic.remove_temporary(path)  # what an interrupted writer left half-written
        with view.sqlite_errors():
            writer = DatastoreWriter(view, lock, schema.writing(path / SQLITE))
    except BaseException:
        view.close()
        _unlock(lock)
        raise
    if check_tails:
        writer.check_tails()
    return writer


def _unlock(lock: IO[str]) -> None:
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def committing(method: Method) -> Method:
    """A write called outside `commit` is one commit of its own (sealed at its end); inside, part of that one."""

    @functools.wraps(method)
    def within(self: DatastoreWriter, *args: object, **kwargs: object) -> object:
        with self.commit():
            return method(self, *args, **kwargs)

    return within  # type: ignore[return-value]


class DatastoreWriter:
    """The writes of one datastore, from `open_datastore_writer` to `close`: documents registered, staged, published and
    removed, entries appended with their words and evidence vectors, index parts committed, the manifest changed,
    checksums recorded. Reads go through `store`, its own view, which sees its commits at once. One per process and
    store, shared by its holders; one thread writes at a time (`commit` holds it); readers are objects of their
    own."""

    def __init__(self, store: Datastore, lock: IO[str], connection: sqlite3.Connection) -> None:
        self.store, self._lock = store, lock
        self._threads = threading.RLock()  # the thread inside `commit`
        self._depth = 0  # `commit`s open, nested
        self._holders = 1  # those that opened it and have not closed it
        store.written_by(self, connection)
        self._began = held(store.db)[1]  # store.sqlite's commits when the writer was opened
        sealing.opened(store, self._began)
        connection.spill = functools.partial(sealing.spill, store)
        with store.sqlite_errors():
            names.ensure(store.db)  # a store made before the names index gets it whole
            if store.read_meta("identity") in (None, ""):  # a create killed between its manifest and this record
                with self.db:
                    write_identity(self.db, store.manifest)

    @property
    def db(self) -> sqlite3.Connection:
        """The writer's SQLite connection."""
        return self.store.db

    @property
    def closed(self) -> bool:
        """Whether `close` let the lock go: nothing is written through it after."""
        return self._lock is None

    @property
    def shards(self) -> list[DatastoreWriter]:
        """The writers of the one-directory datastores the store is made of (`protocol.Shards`): itself."""
        return [self]

    def place(self, digests: dict[str, str], skip_existing: bool, replace: bool) -> tuple[DatastoreWriter, list[str]]:
        """Where documents being added go (`digests`: their ids and text digests): this store, which decides on each
        itself (`stage`); no id is left to another shard."""
        return self, []

    def __enter__(self) -> DatastoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hold(self) -> bool:
        """One more holder (`open_datastore_writer`); False when it is closed already."""
        with self._threads:
            self._holders += self._lock is not None
            return self._lock is not None

    def close(self) -> None:
        """One holder fewer; the last one's close lets the writer lock go and closes the connection (a closed writer:
        nothing)."""
        with self._threads:
            self._holders -= 1
            if self._lock is None or self._holders > 0:
                return
            try:
                sealing.settle(self.store, self._began)
                sealing.from_wal(self.store)
            finally:
                lock, self._lock = self._lock, None
                self.store.close()
                _unlock(lock)

    @contextlib.contextmanager
    def commit(self) -> Iterator[DatastoreWriter]:
        """Writes grouped into one commit: the checksums of what they wrote recorded once they have all succeeded
        (`seal`; a failure leaves the committed state as it was, and the next commit seals what it holds). Nested,
        the outermost seals; other threads wait for its end."""
        with self._threads:
            if self._lock is None:
                raise DatastoreError(f"the writer of {self.store.path} is closed: open another (`writers.open_writer`)")
            self._depth += 1
            try:
                if self._depth == 1 and not getattr(self.db, "wal", False):  # nothing is written before a commit
                    with self.store.sqlite_errors():
                        sealing.to_wal(self.store)
                yield self
            finally:
                self._depth -= 1
            if self._depth == 0:
                self._seal()

    def check_tails(self) -> None:
        """Refuse to append to keys or values whose last, partly filled block was damaged: the seal would have to
        hash that block again, and would take the damage for data."""
        try:
            damage = Checksums(self.store.path).verify(APPEND_ONLY, sample=0, growing=APPEND_ONLY)
        except ChecksumError as err:
            damage = [Damage("checksums.json", None, str(err))]
        if damage:
            self.close()  # nothing may be written past it: the lock goes with the error
            raise DatastoreError(damage_message(self.store.path, damage))

    def _seal(self) -> None:
        """The commit's checksums recorded; a failure to record them (a permission, say) says that the writes
        themselves were committed, and what records them."""
        try:
            sealing.record(self.store, self._began)
        except OSError as err:
            if isinstance(err, atomic.DiskFullError):
                raise
            raise DatastoreError(
                f"the change to {self.store.path} was committed, but its checksums could not be recorded ({err}); "
                f"the next write records them, or `bertknn verify --record {self.store.path}` once that is mended"
            ) from None

    @committing
    def write_meta(self, key: str, value: str) -> None:
        """Keep a value in SQLite, in its own transaction (for the writer)."""
        with self.store.sqlite_errors(), self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def rewriting(self, *names: str) -> None:
        """Drop the checksums of files about to be replaced, so an interrupted rewrite is not taken for damage (the
        writer's seal records them again)."""
        sums = Checksums(self.store.path)
        if set(names) & set(sums.files):
            sums.forget(names)
            sums.save()

    @committing
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

    @committing
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
        """Mark documents removed, free their ids and release their entries' evidence, inside the caller's
        transaction (their names stay: a reader holding an earlier commit reads them; `names.lookup`)."""
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

    @committing
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
            schema.write_parts(self.db, parts)
        return published

    @committing
    def commit_parts(self, **parts: list[Part]) -> None:
        """Replace the committed list of each index kind given (kind=list of its live parts), in one transaction.
        For the writer: files that no list names are deleted after, never before."""
        with self.store.sqlite_errors(), self.db:
            schema.write_parts(self.db, parts)

    @committing
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

    @committing
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

    @committing
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

    @committing
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
