"""Datastore stage: (key, value) pairs with provenance, in one directory (SPEC §1). Storage only: nothing here knows
the model or the tokenizer (builder.py turns a corpus into what is stored here).

Layout of a datastore directory:
- manifest.json: format version, model name and weights hash, layer, dimension, dtype, counts, build status;
- keys.f16: float16 keys, one row of `dim` values per entry, append-only (read through a numpy memmap); or, in a
  store whose keys are compressed (manifest `key_codec`), keys.codes (one code per entry, append-only) and the
  trained codec keys.codec (codec.py), read as keys through the codec;
- values.i32: int32 word ids, one per entry: a word of one token is its vocabulary id; a word of several tokens
  (format 2) a number from the manifest's `words_from` on, which the `words` table of store.sqlite maps to its tokens;
- counts.i32, in a pruned store only (manifest `pruned`, build/prune.py): how many contexts each entry stands for
  (1 unless near-duplicates were merged into it), which the kNN vote weighs it by;
- store.sqlite: documents (each with one contiguous entry range and a state), sentences, each entry's provenance,
  the words of several tokens, the vectors of the entries' evidence texts (evidence.py), and the commit point of the
  indexes: the live parts of each (`parts`), which the indexes (index/) write and readers open, named here only by
  kind, name and range.

Format 1 (older datastores) stored only words of one token: it opens and answers as it did, and documents added to it
keep that rule. It cannot be upgraded in place (its words of several tokens have no keys): build it anew.

A document's state is 'live' (searched), 'adding' (registered by `bertknn add` but not yet searchable: it becomes
live in one transaction once its keys and index entries are all written) or 'removed' (hidden from every path; its
id moves to `removed_id`, so the id is free again).

`append` stores one chunk of documents at a time: keys and values are written and fsynced first, then SQLite
commits the chunk's rows and the new entry count in one transaction. That count is the truth: a reader and a
resumed build ignore any bytes past it, so a build killed at any point resumes to exactly the uninterrupted result.

One process writes at a time (`Datastore.writing`: an flock on write.lock); a writer first re-reads what others
committed and, when it is done, records per-block checksums of every data file (integrity.py). Opening a store
checks its manifest against SQLite, every file's size, and a sample of checksum blocks (damage confined to the
optional FAISS files is set aside in `faiss_damage`, so IR questions still work); `bertknn verify` is verify.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import numpy as np

from bertknn.store import atomic, schema
from bertknn.store import evidence as evidence_table
from bertknn.store.atomic import write_json
from bertknn.store.codec import FLOAT16, Decoded, KeyCodec
from bertknn.store.integrity import ChecksumError, Checksums, Damage, seal
from bertknn.store.lock import LOCK_FILE, LOCK_WAIT, BusyError, acquire_lock
from bertknn.store.manifest import IDENTITY, DatastoreError, read_manifest
from bertknn.store.records import Part, Provenance, Record, newest_first
from bertknn.text import FORMER_SPLITTER

REMOVED_PREFIX = "\x1f"  # a control character, which document ids may not hold (text.parse_document)
REPLACING_PREFIX = "\x1e"  # the id of a staged document that replaces the live one with its id when published
SQL_PARAMS = 900  # SQLite caps the number of parameters of one statement (999 in old builds)
SQLITE = "store.sqlite"
RECHECK_S = 0.2  # pause before damage found on opening is looked at again
SAMPLE_BLOCKS = 16  # checksum blocks checked at random when a store is opened (besides each file's last block)
KEYS, CODES, CODEC = "keys.f16", "keys.codes", "keys.codec"  # float16 keys; or their codes and the codec (codec.py)
VALUES, COUNTS = "values.i32", "counts.i32"  # each entry's word; and, in a pruned store, the contexts it stands for
APPEND_ONLY = (KEYS, CODES, VALUES, COUNTS)  # files that only grow; bytes past the committed entries are not data
NOT_DATA = {"manifest.json", "checksums.json", LOCK_FILE}  # files of a datastore that checksums do not cover


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def sqlite_errors(what: str, hint: str) -> Iterator[None]:
    """SQLite's errors about a damaged or foreign file as a DatastoreError naming `what` (integrity errors pass)."""
    try:
        yield
    except sqlite3.IntegrityError:
        raise
    except sqlite3.DatabaseError as err:
        if getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(err):
            raise atomic.DiskFullError(Path(what)) from None  # SQLite rolled the transaction back: nothing damaged
        raise DatastoreError(f"{what} is damaged or unreadable ({err}); {hint}") from None


def file_stat(path: Path) -> list[int] | None:
    """(size, modification time in ns) of a file, None when it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        info = path.stat()
        return [info.st_size, info.st_mtime_ns]
    return None


def data_files(path: Path) -> list[str]:
    """The files of a datastore directory that checksums cover (relative names), temporary files excluded."""
    return sorted(
        str(file.relative_to(path))
        for file in [*path.iterdir(), *path.glob("tfidf_add_*/*")]
        if file.is_file()
        and file.name not in NOT_DATA
        and not file.name.endswith(".tmp")
        and not file.parent.name.endswith(".tmp")
    )


INDEX_PREFIXES = ("faiss", "tfidf")  # the indexes' files (index/): made from the documents and keys kept here


def is_index_file(name: str) -> bool:
    """Whether a file of a datastore (its name relative to the datastore) belongs to an index: the TF-IDF segments
    and the FAISS files, which `bertknn repair` rebuilds from what the store keeps."""
    return name.startswith(INDEX_PREFIXES)


def _damage_message(path: Path, damage: list) -> str:
    shown = "; ".join(str(d) for d in damage[:5]) + (f"; and {len(damage) - 5} more" if len(damage) > 5 else "")
    if all(is_index_file(d.file) for d in damage):
        return f"{path} is damaged: {shown}. These are index files: `bertknn repair {path}` rebuilds them"
    return (
        f"{path} is damaged: {shown}. `bertknn verify {path}` checks every block; restore the damaged files from a "
        f"copy, or rebuild the datastore (`bertknn repair {path}` rebuilds damaged index files and says what else a "
        "rebuild needs)"
    )


class Datastore:
    """A datastore directory opened for reading (and, under `writing()`, for appending).

    `check` verifies the manifest against SQLite, the sizes of all checksummed files and `SAMPLE_BLOCKS` random
    checksum blocks (all of them in a small store): damage found raises DatastoreError naming file and block.
    """

    def __init__(self, path: str | Path, check: bool = True) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.dim = int(self.manifest["dim"])
        self._lock = None  # the open, flocked write.lock while this object holds the writer lock
        self._threads = threading.RLock()  # one writing thread per object; the flock is taken once per object
        db_file = self.path / SQLITE
        if (not db_file.is_file() or db_file.stat().st_size == 0) and self.manifest["status"] != "building":
            raise DatastoreError(
                f"{db_file} is missing or empty but the manifest says the datastore is {self.manifest['status']}: "
                "restore it from a copy, or rebuild the datastore"
            )
        self._writer_db: sqlite3.Connection | None = None  # made by the first `writing`, used only under the lock
        with self.sqlite_errors():
            self.db = self._reader = self._read_only()  # the connection in use: the writer's while writing
            self._check_identity()
        self._owners: tuple | None = None  # (entry count, range starts, documents) cached by `documents_of`
        self._codec: KeyCodec | None = None  # loaded by `codec` for compressed keys
        self._map()
        self.version = self._data_version()
        self.faiss_damage: list[Damage] = []  # damage confined to the FAISS files: IR questions still work
        if check:
            damage = self.check(sample=SAMPLE_BLOCKS)
            if damage:  # another process's writer may have been between two steps: look again at what was found
                time.sleep(RECHECK_S)
                damage = self.check(only=damage)
            self.faiss_damage = [d for d in damage if d.file.startswith("faiss")]
            if len(damage) > len(self.faiss_damage):
                raise DatastoreError(_damage_message(self.path, damage))

    def close(self) -> None:
        """Close the SQLite connections (the memory maps close with the object); `with Datastore(path) as store:`
        closes them on leaving."""
        self._reader.close()
        if self._writer_db is not None:
            self._writer_db.close()

    def _read_only(self) -> sqlite3.Connection:
        """A read-only connection to store.sqlite (`schema.reading`): a reader never writes; an empty schema where the
        first writer has not made the file yet (a build interrupted before)."""
        file = self.path / SQLITE
        if not file.is_file() or file.stat().st_size == 0:
            return schema.empty()
        return schema.reading(file)

    def _writes(self) -> None:
        """Refuse a write outside `writing()`: only the holder of the writer lock writes."""
        if self._lock is None:
            raise DatastoreError(f"{self.path}: a write outside `Datastore.writing()`, which holds the writer lock")

    def __enter__(self) -> Datastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def sqlite_errors(self) -> Iterator[None]:
        """Turn SQLite's errors about a damaged or foreign file into a DatastoreError that names the file, and a full
        disk into a DiskFullError (any transaction left open is rolled back: a service's writer goes on)."""
        try:
            with sqlite_errors(str(self.path / SQLITE), f"`bertknn verify {self.path}` locates the damage"):
                yield
        except atomic.DiskFullError:
            if self.db.in_transaction:
                self.db.rollback()
            raise

    def _check_identity(self) -> None:
        """Refuse a manifest whose model, layer or key settings disagree with the copy kept in SQLite."""
        try:
            known = dict(json.loads(self._meta("identity", "{}")))
        except (ValueError, TypeError):
            raise DatastoreError(f"{self.path / SQLITE} is damaged (its copy of the manifest is unreadable)") from None
        for field, value in known.items():
            if self.manifest.get(field) != value:
                raise DatastoreError(
                    f"{self.path / 'manifest.json'} says {field} = {self.manifest.get(field)!r} but {SQLITE} records "
                    f"{value!r}: the manifest was edited or damaged; restore {field} = {value!r}"
                )

    def _map(self) -> None:
        """Memory-map the committed entries; anything past the committed count is ignored."""
        with self.sqlite_errors():
            self.size = int(self._meta("entries", "0"))
            self.n_documents = self.db.execute("SELECT coalesce(max(idx) + 1, 0) FROM documents").fetchone()[0]
        for name, width in self.entry_files():
            have = (self.path / name).stat().st_size if (self.path / name).exists() else 0
            if have < self.size * width:
                raise DatastoreError(
                    f"{self.path / name} is truncated ({have:,} bytes for {self.size:,} entries): the datastore is "
                    "damaged; restore it from a copy or rebuild it"
                )
        self.counts = None
        if self.size:
            self.keys = self._map_keys()
            self.values = np.memmap(self.path / VALUES, np.int32, "r", shape=(self.size,))
            if self.pruned:
                self.counts = np.memmap(self.path / COUNTS, np.int32, "r", shape=(self.size,))
        else:
            self.keys = np.zeros((0, self.dim), np.float16)
            self.values = np.zeros(0, np.int32)

    @property
    def key_codec(self) -> str:
        """How keys are stored: "float16", or the FAISS factory string of their codec (`bertknn convert-keys`)."""
        return str(self.manifest.get("key_codec", FLOAT16))

    @property
    def codec(self) -> KeyCodec | None:
        """The trained codec of compressed keys (keys.codec), None for float16 keys."""
        if self.key_codec == FLOAT16:
            return None
        if self._codec is None or self._codec.name != self.key_codec:
            try:
                self._codec = KeyCodec.load(self.path / CODEC, self.key_codec)
            except RuntimeError as err:
                raise DatastoreError(
                    f"{self.path / CODEC} is damaged or missing ({str(err).splitlines()[-1]})"
                ) from None
        return self._codec

    def keys_file(self) -> tuple[str, int]:
        """The file of the keys and its bytes per entry."""
        codec = self.codec
        return (KEYS, 2 * self.dim) if codec is None else (CODES, codec.code_size)

    @property
    def pruned(self) -> dict | None:
        """How the store was pruned (`build/prune.py`: radius, contexts before), None for an unpruned one."""
        return self.manifest.get("pruned")

    def entry_files(self) -> list[tuple[str, int]]:
        """The files that hold one row per entry (keys, values; counts in a pruned store) and their bytes per entry."""
        return [self.keys_file(), (VALUES, 4), *([(COUNTS, 4)] if self.pruned else [])]

    def counts_of(self, entries: np.ndarray) -> np.ndarray | None:
        """How many contexts each of `entries` stands for (`Provenance.count`), None in an unpruned store (all 1)."""
        return None if self.counts is None else np.asarray(self.counts[entries])

    def _map_keys(self) -> np.ndarray | Decoded:
        """The committed keys: the float16 memmap, or the codes memmap read through the codec."""
        codec = self.codec
        if codec is None:
            return np.memmap(self.path / KEYS, np.float16, "r", shape=(self.size, self.dim))
        return Decoded(codec, np.memmap(self.path / CODES, np.uint8, "r", shape=(self.size, codec.code_size)))

    def _meta(self, key: str, default: str) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def read_meta(self, key: str) -> str | None:
        """A value a writer keeps in SQLite (`write_meta`: a copy of the FAISS index's settings, say), None if none."""
        with self.sqlite_errors():
            return self._meta(key, None)

    def write_meta(self, key: str, value: str) -> None:
        """Keep a value in SQLite, in its own transaction (for the writer)."""
        self._writes()
        with self.sqlite_errors(), self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _data_version(self) -> tuple:
        """Changes whenever another connection commits to SQLite or a checksummed file is rewritten."""
        with self.sqlite_errors():
            version = self.db.execute("PRAGMA data_version").fetchone()[0]
        return version, file_stat(self.path / "checksums.json")

    def reload(self) -> None:
        """Re-read what other processes committed (entries, documents, manifest, FAISS damage mended meanwhile)."""
        version = self._data_version()
        if version == self.version:
            return
        self.version = version
        self.manifest = read_manifest(self.path)
        self._map()
        if self.faiss_damage:  # a rebuilt index is no longer damaged
            self.faiss_damage = self.check(only=self.faiss_damage)

    @contextlib.contextmanager
    def writing(self, wait: float | None = None, check_tails: bool = True) -> Iterator[Datastore]:
        """Hold the datastore's writer lock (waiting up to `wait` seconds for another writer; None: as `lock_wait`
        says), re-read the committed state, and on success record the checksums of what was written. Re-entrant
        within a thread; other threads of this process wait like other processes. `check_tails`: refuse first when
        the last block of keys or values is damaged (`bertknn repair` checks every block itself, under the lock)."""
        wait = LOCK_WAIT.get() if wait is None else wait
        began = time.monotonic()
        got = self._threads.acquire(timeout=wait) if wait > 0 else self._threads.acquire(blocking=False)
        if not got:
            raise BusyError(f"{self.path} is being written by another thread of this process; rerun when it is done")
        try:
            if self._lock is not None:  # this thread holds it already
                yield self
                return
            self._lock = acquire_lock(self.path, max(0.0, wait - (time.monotonic() - began)))
            try:
                atomic.remove_temporary(self.path)  # what an interrupted writer left half-written
                with self.sqlite_errors():
                    if self._writer_db is None:  # kept open after: a reader thread may hold it as `db` a while
                        self._writer_db = schema.writing(self.path / SQLITE)
                    self.db = self._writer_db
                self.reload()
                if self._meta("identity", "") == "":  # a create killed between its manifest and this record
                    self.record_identity()
                if check_tails:
                    self._check_tails()
                yield self
                self.seal()
            finally:
                self._read_again()
                handle, self._lock = self._lock, None
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
        finally:
            self._threads.release()

    def _read_again(self) -> None:
        """Back to reading when a write ends: through a new read-only connection where the schema may have changed
        under the old one (its temporary views, or the empty schema of a store not yet made); the old one is left
        open for a thread that still reads through it."""
        if not isinstance(self._reader, schema.Connection) or self._reader.views:
            self._reader = self._read_only()
        self.db = self._reader
        self.version = self._data_version()

    def _check_tails(self) -> None:
        """Refuse to append to keys or values whose last, partly filled block was damaged: the seal would have to
        hash that block again, and would take the damage for data."""
        try:
            damage = Checksums(self.path).verify(APPEND_ONLY, sample=0, growing=APPEND_ONLY)
        except ChecksumError as err:
            damage = [Damage("checksums.json", None, str(err))]
        if damage:
            raise DatastoreError(_damage_message(self.path, damage))

    def seal(self) -> None:
        """Record checksums (`integrity.seal`): the new tail of keys and values, SQLite whole, and the data files not
        recorded yet (new, or announced by `rewriting`). A recorded file is never re-recorded here, so damage stays
        visible."""
        try:
            sums = Checksums(self.path)
            for name, width in self.entry_files():
                sums.extend(name, self.size * width)
        except ChecksumError as err:
            raise DatastoreError(f"{err}: damaged before this write; its checksums are kept") from None
        if self._meta("checksummed", "0") != "1":  # from now on a missing checksums.json is damage: so it exists first
            sums.save()
            with self.sqlite_errors(), self.db:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('checksummed', '1')")
        seal(sums, data_files(self.path), changed=[SQLITE], sqlite_changes=self._changes())
        self.version = self._data_version()

    def rewriting(self, *names: str) -> None:
        """Drop the checksums of files about to be replaced, so an interrupted rewrite is not taken for damage (the
        writer's seal records them again)."""
        sums = Checksums(self.path)
        if set(names) & set(sums.files):
            sums.forget(names)
            sums.save()

    def _changes(self) -> int:
        """SQLite's file change counter (header bytes 24-27): it grows with every committed transaction."""
        with (self.path / SQLITE).open("rb") as handle:
            handle.seek(24)
            return int.from_bytes(handle.read(4), "big")

    def check(
        self,
        sample: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        only: list[Damage] | None = None,
    ) -> list[Damage]:
        """Damage found in the checksummed files: sizes always, then `sample` random blocks (None: every block).

        SQLite is only compared when it has not been committed to since its checksums were recorded (a writer that
        was interrupted seals it on its next run).
        """
        try:
            sums = Checksums(self.path)
        except ChecksumError as err:
            return [Damage("checksums.json", None, str(err))]
        if not sums.files and self._meta("checksummed", "0") == "1":
            return [Damage("checksums.json", None, "missing, though the datastore had checksums recorded")]
        with self._read_transaction():  # no writer may commit to SQLite while its blocks are compared
            names = set(sums.files)
            if sums.meta.get("sqlite_changes") != self._changes():
                names.discard(SQLITE)
            return sums.verify(names, sample, progress, growing=APPEND_ONLY, only=only)

    @contextlib.contextmanager
    def _read_transaction(self) -> Iterator[None]:
        """Hold SQLite's shared lock (a read transaction): other connections cannot commit meanwhile."""
        with self.sqlite_errors():
            if self.db.in_transaction:
                yield
                return
            self.db.execute("BEGIN")
            try:
                self.db.execute("SELECT count(*) FROM meta").fetchone()
                yield
            finally:
                self.db.execute("ROLLBACK")

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
    def splitter(self) -> str:
        """The sentence splitter its documents were split with (`text.FORMER_SPLITTER` for stores that do not say)."""
        return str(self.manifest.get("splitter", FORMER_SPLITTER))

    @property
    def key_dtype(self) -> str:
        """The precision the model ran in when the keys were computed ("float32" for stores that do not say)."""
        return str(self.manifest.get("key_dtype", "float32"))

    @property
    def int8_keys(self) -> bool:
        """True when keys were computed by the encoder quantised to int8 (`--int8-keys`), not in float32."""
        return bool(self.manifest.get("int8", False))

    @property
    def layer(self) -> int:
        """The block whose states are the keys."""
        return int(self.manifest["layer"])

    def check_model(self, name: str, weights_hash: str, dim: int, layer: int) -> None:
        """Refuse to query or extend with a model or layer other than the one the keys were made with."""
        want = self.manifest
        if weights_hash != want["model_hash"] or dim != self.dim:
            raise DatastoreError(
                f"the datastore at {self.path} was built with model {want['model']!r} (weights sha256 "
                f"{want['model_hash'][:12]}), but the given model {name!r} has weights "
                f"{weights_hash[:12]}; use the same model or build a new datastore"
            )
        if layer != self.layer:
            raise DatastoreError(
                f"the datastore at {self.path} holds layer-{self.layer} keys, but the model reads layer "
                f"{layer}; use layer={self.layer} or build a datastore for layer {layer}"
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
        if len(rows) < len(set(docs)):
            raise DatastoreError(f"{self.path / SQLITE} lacks documents {sorted(set(docs) - set(rows))[:5]}: damaged")
        return [rows[d] for d in docs]

    def find_titles(self, norm_title: str) -> list[tuple[int, str | None]]:
        """The live documents whose normalised title (`text.normalize_title`) is `norm_title`, newest first
        (`newest_first`), each with its date (its own, else the newest registered before it)."""
        query = "SELECT idx, coalesce(date, since) FROM documents WHERE norm_title = ? AND state = 'live'"
        return newest_first(self.db.execute(query, (norm_title,)).fetchall())

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
            raise DatastoreError(f"{self.path / SQLITE} lacks documents the IR index returns: damaged")
        return [found[int(d)] for d in docs]

    def provenance(self, entries: list[int]) -> list[Provenance]:
        """Provenance of stored entries (one query for all): document, sentence, the target's span and, in a pruned
        store, how many contexts the entry stands for."""
        counts = self.counts_of(np.asarray(entries, np.int64))
        count = dict(zip(map(int, entries), counts.tolist())) if counts is not None else {}
        found = {
            idx: Provenance(idx, doc_id, title, sentence, (start, end), count.get(idx, 1), date)
            for idx, doc_id, title, sentence, start, end, date in self.db.execute(
                "SELECT e.idx, d.id, d.title, s.text, e.start, e.end, d.date FROM entries e "
                "JOIN sentences s ON s.idx = "
                "e.sentence JOIN documents d ON d.idx = s.doc WHERE e.idx IN (SELECT value FROM json_each(?))",
                (json.dumps([int(e) for e in entries]),),
            )
        }
        missing = [int(e) for e in entries if int(e) not in found]
        if missing:
            raise DatastoreError(
                f"{self.path / SQLITE} has no provenance for entries {missing[:5]}: it is damaged; `bertknn verify`"
            )
        return [found[int(e)] for e in entries]

    def entry_rows(self, entries: np.ndarray) -> list[tuple[int, int, int]]:
        """(sentence, start, end) of each of `entries`, in their order: what `append` stored for them."""
        with self.sqlite_errors():
            found = {
                idx: (sentence, start, end)
                for idx, sentence, start, end in self.db.execute(
                    "SELECT idx, sentence, start, end FROM entries WHERE idx IN (SELECT value FROM json_each(?))",
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

    def register(self, docs: list[Record], state: str = "live") -> None:
        """Add documents and their sentences (text only, not yet embedded) in one transaction."""
        self._writes()
        with self.sqlite_errors(), self.db:
            self._insert(docs, state)
        self.n_documents += len(docs)

    def _insert(self, docs: list[Record], state: str) -> None:
        first, sent_idx = self.db.execute(
            "SELECT (SELECT coalesce(max(idx) + 1, 0) FROM documents), "
            "(SELECT coalesce(max(idx) + 1, 0) FROM sentences)"
        ).fetchone()
        row = self.db.execute("SELECT since FROM documents ORDER BY idx DESC LIMIT 1").fetchone()
        since = row[0] if row else None  # never decreasing with idx: the last document's is the newest so far
        for doc_idx, doc in enumerate(docs, first):
            since = max(since, doc.date) if since and doc.date else since or doc.date
            self.db.execute(
                "INSERT INTO documents (idx, id, title, norm_title, state, digest, date, since) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (doc_idx, doc.id, doc.title, doc.norm_title, state, doc.digest, doc.date, since),
            )
            rows = [(sent_idx + i, doc_idx, t) for i, t in enumerate(doc.sentences)]
            self.db.executemany("INSERT INTO sentences VALUES (?, ?, ?)", rows)
            sent_idx += len(doc.sentences)

    def _rows(self, column: str, values: list) -> list[tuple]:
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
        with self.sqlite_errors():
            return {doc_id: digest for doc_id, _, state, digest in self._rows("id", ids) if state == "live"}

    def states(self, ids: list[str]) -> dict[str, str]:
        """The state of each of the given document ids that the datastore holds (removed ones are not held)."""
        with self.sqlite_errors():
            return {doc_id: state for doc_id, _, state, _ in self._rows("id", ids)}

    def stage(self, docs: list[Record], replace: bool = False) -> list[str]:
        """Register the given documents as 'adding' (hidden) unless the same document is there; return the ids
        skipped because a live document has the same id and text. In one transaction.

        A live document with the same id but other text is refused (remove it first), or with `replace` staged to
        take its place when published (`publish`: Lucene's updateDocument); an 'adding' one left by an interrupted
        add with other text is replaced, so a rerun with corrected text never keeps the old one.
        """
        self._writes()
        ids = [d.id for d in docs]
        with self.sqlite_errors():
            rows = self._rows("id", ids + [REPLACING_PREFIX + i for i in ids])
        held = {doc_id: (idx, state, digest) for doc_id, idx, state, digest in rows if doc_id[:1] != REPLACING_PREFIX}
        staged = {
            doc_id[1:]: (idx, state, digest) for doc_id, idx, state, digest in rows if doc_id[:1] == REPLACING_PREFIX
        }
        changed = [d for d in docs if d.id in held and held[d.id][2] not in (None, d.digest)]
        conflicts = [d.id for d in changed if held[d.id][1] == "live"]
        if conflicts and not replace:
            raise DatastoreError(
                f"document id(s) {conflicts[:5]} are in {self.path} with other text; remove them first "
                "(`bertknn remove --doc ID`), or add with --replace"
            )
        skipped = [d.id for d in docs if d.id in held and held[d.id][1] == "live" and d.id not in conflicts]
        redone = [d for d in docs if d.id in staged and staged[d.id][2] == d.digest]  # an interrupted replace's
        stale = [staged[i][0] for i in staged if i not in {d.id for d in redone}]
        new = [d for d in docs if (d.id not in held or d in changed) and d not in redone]
        rename = {d.id for d in new if d.id in conflicts}
        new = [dataclasses.replace(d, id=REPLACING_PREFIX + d.id) if d.id in rename else d for d in new]
        with self.sqlite_errors(), self.db:
            self._hide([held[d.id][0] for d in changed if d.id not in conflicts] + stale)
            self._insert(new, "adding")
        self.n_documents = self.db.execute("SELECT coalesce(max(idx) + 1, 0) FROM documents").fetchone()[0]
        return skipped

    def _hide(self, docs: list[int]) -> None:
        """Mark documents removed, free their ids and release their entries' evidence (inside the caller's
        transaction)."""
        filled = self.evidence_filled
        ranges = self.db.execute(
            "SELECT start, end FROM documents WHERE start IS NOT NULL AND idx IN (SELECT value FROM json_each(?))",
            (json.dumps([int(d) for d in docs]),),
        )
        entries = [e for a, b in ranges for e in range(a, min(b, filled))]
        if entries:
            evidence_table.release(self.db, self.evidence_ids(entries))
        self.db.executemany(
            "UPDATE documents SET state = 'removed', removed_id = id, id = ? || idx WHERE idx = ?",
            [(REMOVED_PREFIX, d) for d in docs],
        )

    def adding(self) -> list[int]:
        """Documents registered by an add that has not been published yet."""
        return [r[0] for r in self.db.execute("SELECT idx FROM documents WHERE state = 'adding' ORDER BY idx")]

    def publish(self, **parts: list[Part]) -> None:
        """Make every 'adding' document live and commit the index parts given (kind=list, as `commit_parts`), in one
        transaction: a reader sees the documents and the parts that index them together, or neither."""
        self._writes()
        with self.sqlite_errors(), self.db:
            replacing = self.db.execute(
                "SELECT idx, substr(id, 2) FROM documents WHERE state = 'adding' AND substr(id, 1, 1) = ?",
                (REPLACING_PREFIX,),
            ).fetchall()
            if replacing:  # the documents they replace are hidden, their ids taken over, in this one transaction
                old = self._rows("id", [doc_id for _, doc_id in replacing])
                self._hide([idx for _, idx, state, _ in old if state == "live"])
                self.db.executemany("UPDATE documents SET id = ? WHERE idx = ?", [(i, x) for x, i in replacing])
            self.db.execute("UPDATE documents SET state = 'live' WHERE state = 'adding'")
            _write_parts(self.db, parts)

    def parts(self, kind: str) -> list[Part] | None:
        """The committed live parts of an index (`kind`: "tfidf", "faiss"), in order; None for a datastore made
        before parts were committed (its readers list the directory, until a writer commits the list)."""
        with self.sqlite_errors():
            if self._meta("parts", "0") != "1":
                return None
            rows = self.db.execute("SELECT name, first, stop FROM parts WHERE kind = ? ORDER BY first", (kind,))
            return [Part(*row) for row in rows]

    def commit_parts(self, **parts: list[Part]) -> None:
        """Replace the committed list of each index kind given (kind=list of its live parts), in one transaction.
        For the writer: files that no list names are deleted after, never before."""
        self._writes()
        with self.sqlite_errors(), self.db:
            _write_parts(self.db, parts)

    def remove(self, ids: list[str]) -> tuple[list[str], list[str]]:
        """Hide documents from every search path, all in one transaction; return (removed now, removed before).

        An id the datastore never held raises DatastoreError and nothing changes, so a rerun of the same removal
        finishes it: ids removed by the first run are reported as removed before.
        """
        self._writes()
        ids = list(dict.fromkeys(str(i) for i in ids))
        with self.sqlite_errors():
            held = {doc_id: idx for doc_id, idx, state, _ in self._rows("id", ids) if state in ("live", "adding")}
        before = self.removed_ids([i for i in ids if i not in held])
        unknown = [i for i in ids if i not in held and i not in before]
        if unknown:
            raise DatastoreError(
                f"no document with id {', '.join(map(repr, unknown[:5]))} in {self.path}; nothing was removed"
            )
        with self.sqlite_errors(), self.db:
            self._hide(list(held.values()))
        return list(held), [i for i in ids if i in before]

    def removed_ids(self, ids: list[str]) -> set[str]:
        """Those of the given ids whose documents were removed (and not added again since)."""
        with self.sqlite_errors():
            return {doc_id for doc_id, *_ in self._rows("removed_id", ids)}

    def live_end(self) -> int:
        """One past the last live document (0 when none is): what an IR index must cover."""
        return self.db.execute("SELECT coalesce(max(idx) + 1, 0) FROM documents WHERE state = 'live'").fetchone()[0]

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
        for i in range(0, len(docs), SQL_PARAMS):
            part = docs[i : i + SQL_PARAMS]
            found |= {r[0] for r in self.db.execute(f"{query} AND idx IN ({','.join('?' * len(part))})", part)}
        return [d for d in docs if d in found]

    def sentences(self, docs: list[int]) -> list[tuple[int, int, str]]:
        """(sentence index, document, text) of the sentences of the given documents, in document and text order."""
        with self.sqlite_errors():
            return self.db.execute(
                f"SELECT idx, doc, text FROM sentences WHERE doc IN ({','.join('?' * len(docs))}) ORDER BY doc, idx",
                docs,
            ).fetchall()

    def text_length(self, doc: int) -> int:
        """Characters of a document's sentences (what a build sizes its chunks by)."""
        with self.sqlite_errors():
            return self.db.execute("SELECT sum(length(text)) FROM sentences WHERE doc = ?", (doc,)).fetchone()[0] or 0

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
        self._writes()
        keys = np.asarray(keys, np.float16)
        if not np.isfinite(keys).all():  # float16 overflows past 65,504: such keys would poison every distance
            raise DatastoreError(
                f"the model gave non-finite keys (NaN, or beyond float16's range) for documents {docs[:5]}; nothing "
                "of them was stored. Check the model, or choose another --layer"
            )
        start, codec = self.size, self.codec
        if (evidence is None) == bool(self.evidence_model):
            raise DatastoreError(
                f"{self.path} {'holds' if self.evidence_model else 'lacks'} evidence vectors, and this append "
                f"{'lacks' if evidence is None else 'holds'} them: nothing was stored"
            )
        if evidence is not None and len(evidence.ids) != len(values):
            raise DatastoreError(f"{len(evidence.ids)} entries' evidence for {len(values)} entries: nothing stored")
        if codec is not None:
            keys = codec.encode(keys)
        if counts is None:
            counts = np.ones(len(values), np.int32)
        arrays = (keys, np.asarray(values, np.int32), np.asarray(counts, np.int32))
        for (name, width), array in zip(self.entry_files(), arrays):  # counts only where the store is pruned
            atomic.append(self.path / name, start * width, np.ascontiguousarray(array).data)  # past the committed
        entry, first = start, {}
        entry_rows = []
        for (sent_idx, doc, _), sentence_spans in zip(rows, spans):
            first.setdefault(doc, entry)
            entry_rows += [(entry + j, sent_idx, int(a), int(b)) for j, (a, b) in enumerate(sentence_spans)]
            entry += len(sentence_spans)
        self._commit_entries(docs, first, entry_rows, start, entry, words, evidence)
        self._map()
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
        with self.sqlite_errors(), self.db:
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

    @property
    def evidence_model(self) -> str | None:
        """The sentence encoder whose vectors every entry's evidence texts have (evidence.py); None in a store made
        before them until `bertknn sentences` fills them."""
        return self.manifest.get(evidence_table.FIELD)

    @property
    def evidence_filled(self) -> int:
        """Entries [0, n) whose evidence is stored: all of a store with evidence; of one being filled, how far."""
        return self.size if self.evidence_model else int(self._meta(evidence_table.FILLED, "0"))

    def evidence_ids(self, entries: list[int]) -> np.ndarray:
        """The text ids ([n, evidence.VIEWS]) of entries' evidence texts (`text.evidence_texts`)."""
        rows = ((e.sentence, e.span, e.title) for e in self.provenance(entries))
        ids = [evidence_table.text_id(t) for t in evidence_table.entry_texts(rows)]
        return np.asarray(ids, np.int64).reshape(-1, evidence_table.VIEWS)

    def evidence_held(self, ids: Iterable[int]) -> set[int]:
        """Those of the text ids whose vectors the store holds."""
        with self.sqlite_errors():
            return evidence_table.held(self.db, ids)

    def evidence_blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """The stored vectors (encoded) of those of the text ids the store holds: what a copy of entries carries."""
        with self.sqlite_errors():
            return evidence_table.blobs(self.db, ids)

    def evidence_vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of the evidence `texts` the store holds (what the sentence weights read)."""
        with self.sqlite_errors():
            return evidence_table.read(self.db, texts)

    def fill_evidence(self, stop: int, evidence: evidence_table.Evidence) -> None:
        """A store made before evidence vectors: store those of entries [`evidence_filled`, stop) in one
        transaction and record how far that got (`bertknn sentences`, build/evidence.py)."""
        self._writes()
        with self.sqlite_errors(), self.db:
            evidence_table.commit(self.db, evidence)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (evidence_table.FILLED, str(stop)))

    @property
    def whole_words(self) -> bool:
        """Whether this store's targets are whole words (format 2) rather than words of one token (format 1)."""
        return self.manifest["version"] >= 2

    @property
    def names(self) -> bool:
        """Whether multi-word names are targets too (besides their words)."""
        return bool(self.manifest.get("names"))

    def word_values(self, words: list[tuple[str, str]]) -> tuple[list[int], list[tuple[int, str, str]]]:
        """The values of words of several tokens, each given as (its tokens' ids as text, the word): those the store
        holds, and new ones numbered on from the manifest's `words_from`, returned also as rows for `append` to
        commit with the entries that use them. Only a writer asks (numbers are given out under the writer lock)."""
        held = self._word_rows("pieces", sorted({pieces for pieces, _ in words}))  # these words only, not the lexicon
        known = {pieces: value for value, (pieces, _) in held.items()}
        new: list[tuple[int, str, str]] = []
        last = self._select_words("SELECT max(value) FROM words")
        after = self.manifest["words_from"] - 1 if not last or last[0][0] is None else last[0][0]
        values = []
        for pieces, word in words:
            if pieces not in known:
                after += 1
                known[pieces] = after
                new.append((after, pieces, word))
            values.append(known[pieces])
        return values, new

    def words(self, values: Iterable[int] | None) -> dict[int, tuple[str, str]]:
        """(tokens' ids as text, word) of the given lexicon numbers (values of words of several tokens; None: all)."""
        if values is None:
            return self._word_rows()
        wanted = sorted({int(v) for v in values})
        if not wanted:
            return {}
        rows = self._word_rows("value", wanted)
        missing = [v for v in wanted if v not in rows]
        if missing:
            raise DatastoreError(
                f"{self.path / SQLITE} holds no word for values {missing[:5]}: it is damaged; `bertknn verify`"
            )
        return rows

    def _word_rows(self, column: str | None = None, keys: list | None = None) -> dict[int, tuple[str, str]]:
        """value -> (pieces, word) of the `words` table: the rows whose `column` ("value" or "pieces") is one of
        `keys`, or all."""
        query, args = "SELECT value, pieces, word FROM words", ()
        if column is not None:
            query, args = f"{query} WHERE {column} IN (SELECT value FROM json_each(?))", (json.dumps(keys),)
        return {value: (pieces, word) for value, pieces, word in self._select_words(query, args)}

    def _select_words(self, query: str, args: tuple = ()) -> list[tuple]:
        """The rows of a query of the `words` table; none in a store without it (format 1, or no long word yet)."""
        with self.sqlite_errors():
            try:
                return self.db.execute(query, args).fetchall()
            except sqlite3.OperationalError as err:
                if "no such table" in str(err):
                    return []
                raise

    def record_identity(self) -> None:
        """Keep a copy of the manifest's model and key settings in SQLite, which opening the store compares."""
        self._writes()
        with self.sqlite_errors(), self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity(self.manifest),))

    def set_manifest(self, **changes: object) -> None:
        """Update the manifest atomically (a change of `key_codec` re-maps the keys)."""
        self._writes()
        self.manifest.update(changes)
        write_json(self.path / "manifest.json", self.manifest)
        if "key_codec" in changes:
            self._map()


def create(path: str | Path, manifest: dict) -> Datastore:
    """A new, empty datastore directory with this manifest (`builder.create` makes the manifest from a model).

    A directory that holds only temporary files (`*.tmp`: what a create killed before its manifest was in place
    leaves) counts as empty; anything else is refused.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DatastoreError(f"{path} is a file, not a directory; choose a new or empty directory for the datastore")
    leftovers = list(path.iterdir()) if path.exists() else []
    if any(not p.name.endswith(".tmp") for p in leftovers):
        raise DatastoreError(f"{path} exists and is not a datastore; choose an empty or new directory")
    path.mkdir(parents=True, exist_ok=True)
    atomic.remove_temporary(path)
    write_json(path / "manifest.json", manifest)
    with sqlite_errors(str(path / SQLITE), "free space and rerun"), closing(schema.writing(path / SQLITE)) as db, db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity(manifest),))
        _write_parts(db, {"tfidf": [], "faiss": []})  # a new store's indexes are listed from the start
    return Datastore(path)


def identity(manifest: dict) -> str:
    """The copy of a manifest's model and key settings that SQLite keeps, which opening the store compares."""
    return json.dumps({field: manifest.get(field) for field in IDENTITY})


def _write_parts(db: sqlite3.Connection, parts: dict[str, list[Part]]) -> None:
    """Replace the committed list of each index kind given, inside the caller's transaction."""
    for kind, listed in parts.items():
        db.execute("DELETE FROM parts WHERE kind = ?", (kind,))
        db.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", [(kind, p.name, p.first, p.stop) for p in listed])
    if parts:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('parts', '1')")


def copy_registration(
    source: str | Path,
    path: str | Path,
    manifest: dict,
    parts: dict[str, list[Part]],
    files: list[str],
    words: bool = False,
) -> Datastore:
    """A new datastore at `path` (with this manifest) holding the documents and sentences of `source`, nothing
    embedded, and the index parts given (`parts`: kind -> list, committed in the copy; `files`: their files and
    folders, copied): registration does not depend on the model, so another model or layer can start from it.
    With `words`, the words of several tokens are kept too (a copy for the same model: `prune`)."""
    source, path = Path(source), Path(path)
    tmp = atomic.new_folder(path)
    try:
        _fill_copy(source, tmp, manifest, parts, files, words)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-made stays (a kill leaves it to the next run)
        raise
    atomic.publish(tmp, path)
    return Datastore(path)


def _fill_copy(
    source: Path, tmp: Path, manifest: dict, parts: dict[str, list[Part]], files: list[str], words: bool
) -> None:
    """`copy_registration`'s contents, written into the temporary folder `tmp`."""
    with (
        Datastore(source) as src,
        sqlite_errors(str(tmp / SQLITE), "free space and rerun"),
        atomic.naming(tmp / SQLITE),
        closing(sqlite3.connect(tmp / SQLITE)) as db,
        db,
    ):
        src.db.backup(db)
        db.execute("UPDATE documents SET start = NULL, end = NULL")
        db.execute("DELETE FROM entries")
        db.execute("DELETE FROM meta")
        db.execute(schema.WORDS)
        if not words:
            db.execute("DELETE FROM words")
        db.execute("DELETE FROM parts")
        db.execute(evidence_table.TABLE)
        db.execute("DELETE FROM evidence")  # the copy's entries bring theirs
        rows = [(kind, p.name, p.first, p.stop) for kind, listed in parts.items() for p in listed]
        db.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", rows)
        db.execute("INSERT INTO meta VALUES ('parts', '1')")
    with (
        sqlite_errors(str(tmp / SQLITE), "free space and rerun"),
        closing(sqlite3.connect(tmp / SQLITE)) as db,
    ):
        db.execute("VACUUM")  # the source's entry rows leave free pages behind: the copy holds only what it keeps
    for name in files:
        atomic.copy(source / name, tmp / name)
    write_json(tmp / "manifest.json", manifest)
    with sqlite_errors(str(tmp / SQLITE), "free space and rerun"), closing(schema.writing(tmp / SQLITE)) as db, db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('identity', ?)", (identity(manifest),))
