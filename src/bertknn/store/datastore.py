"""Datastore stage: (key, value) pairs with provenance, in one directory (SPEC §1). Storage only: nothing here knows
the model or the tokenizer (builder.py turns a corpus into what is stored here).

Layout of a datastore directory:
- manifest.json: format version, model name and weights hash, layer, dimension, dtype, written once at creation;
  what changes after (build status, counts, key codec, evidence model, tuned settings) is committed to store.sqlite
  (manifest.py: the commit record);
- keys.f16: float16 keys, one row of `dim` values per entry, append-only (read through a numpy memmap); or, in a
  store whose keys are compressed (manifest `key_codec`), keys.codes (one code per entry, append-only) and the
  trained codec keys.codec (codec.py), read as keys through the codec;
- values.i32: int32 word ids, one per entry: a word of one token is its vocabulary id; a word of several tokens
  (format 2) a number from the manifest's `words_from` on, which the `words` table of store.sqlite maps to its tokens;
- counts.i32, in a pruned store only (manifest `pruned`, ingest/prune.py): how many contexts each entry stands for
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

`Datastore` is the reader: its SQLite connection is read-only (schema.py), and it never writes. Its reads go by
concept: `manifest` (manifest.py: what the manifest says), `documents` (documents.py: documents, sentences,
provenance), `lexicon` (lexicon.py: words of several tokens), `evidence` (evidence.py: evidence vectors); it keeps
the memory maps, the commit point of the indexes (`parts`) and the integrity checks. A reader holds one commit
until it is reopened (`reopen_if_changed`). One process writes at a time, through the `DatastoreWriter`
(writer.py), opened once, which holds the writer lock (lock.py) and its own connection, appends, publishes and
commits, and records the per-block checksums of every data file at each commit's end (integrity.py). The
committed entry count is the truth: a reader and a resumed build ignore any bytes past it. Opening a store checks
its manifest against SQLite, every file's size, and a sample of checksum blocks (damage confined to the
optional FAISS files is set aside in `faiss_damage`, so IR questions still work); `bertknn verify` is verify.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bertknn.store import atomic, identity, schema, wal
from bertknn.store import evidence as evidence_table
from bertknn.store.codec import Decoded, KeyCodec
from bertknn.store.documents import Documents
from bertknn.store.errors import sqlite_errors, writer_of
from bertknn.store.integrity import ChecksumError, Checksums, Damage, damage_message
from bertknn.store.lexicon import Lexicon
from bertknn.store.manifest import FLOAT16, RECORD, DatastoreError, Manifest, read_manifest, with_record
from bertknn.store.protocol import Shards
from bertknn.store.records import Part
from bertknn.store.schema import SQLITE, STORE_ID
from bertknn.store.snapshot import Snapshots

RECHECK_S = 0.2  # pause before damage found on opening is looked at again
SAMPLE_BLOCKS = 16  # checksum blocks checked at random when a store is opened (besides each file's last block)
KEYS, CODES, CODEC = "keys.f16", "keys.codes", "keys.codec"  # float16 keys; or their codes and the codec (codec.py)
VALUES, COUNTS = "values.i32", "counts.i32"  # each entry's word; and, in a pruned store, the contexts it stands for
APPEND_ONLY = (KEYS, CODES, VALUES, COUNTS)  # files that only grow; bytes past the committed entries are not data


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_stat(path: Path) -> list[int] | None:
    """(size, modification time in ns) of a file, None when it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        info = path.stat()
        return [info.st_size, info.st_mtime_ns]
    return None


def read_committed(path: Path) -> Manifest:
    """The manifest of the datastore at `path` as committed (what `Datastore.manifest` holds), read without opening
    the store: none of its checks (a distributed build asks its shards how far they got)."""
    manifest, file = read_manifest(path), path / SQLITE
    if not file.is_file() or file.stat().st_size == 0:
        return manifest
    with (
        sqlite_errors(str(file), f"`bertknn verify {path}` locates the damage"),
        contextlib.closing(schema.reading(file)) as db,
    ):
        return committed(path, manifest, db)


def committed(path: Path, manifest: Manifest, db: sqlite3.Connection) -> Manifest:
    """manifest.json's fields with those committed since over them, as `db` holds them (`manifest.with_record`)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (RECORD,)).fetchone()
    return with_record(manifest, row[0] if row else None, f"{path / SQLITE} (its manifest record)")


class Datastore(Shards):
    """A datastore directory opened for reading: a reader, or the writer's own view (`written_by`).

    `check` verifies the manifest against SQLite, the sizes of all checksummed files and `SAMPLE_BLOCKS` random
    checksum blocks (all of them in a small store): damage found raises DatastoreError naming file and block.
    """

    def __init__(self, path: str | Path, check: bool = True) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.dim = int(self.manifest["dim"])
        self._writer: Any = None  # a weak reference to the writer whose own view this is; None for a reader
        db_file = self.path / SQLITE
        written = self.manifest["status"] != "building" or (self.path / "checksums.json").is_file()
        if (not db_file.is_file() or db_file.stat().st_size == 0) and written:  # a writer had sealed it
            raise DatastoreError(
                f"{db_file} is missing or empty but the datastore was written to: restore it from a copy, or rebuild "
                "the datastore"
            )
        with self.sqlite_errors():
            self.db = self._read_only()  # a reader's, for good; the writer's in the writer's own view
            self.manifest = self._committed(self.manifest)
            self._check_identity()
        self.documents = Documents(self)  # the documents' reads (documents.py)
        self.evidence = evidence_table.EvidenceReads(self)  # the evidence vectors' reads (evidence.py)
        self.lexicon = Lexicon(self)  # the words of several tokens (lexicon.py)
        self._codec: KeyCodec | None = None  # loaded by `codec` for compressed keys
        self._snapshots = Snapshots(lambda: self.db, self.reopen_if_changed)  # the read transaction of `snapshot`
        self._hold()
        self.version = self.data_version()
        self.faiss_damage: list[Damage] = []  # damage confined to the FAISS files: IR questions still work
        if check:
            damage = self.check(sample=SAMPLE_BLOCKS)
            if damage:  # another process's writer may have been between two steps: look again at what was found
                time.sleep(RECHECK_S)
                damage = self.check(only=damage)
            self.faiss_damage = [d for d in damage if d.file.startswith("faiss")]
            if len(damage) > len(self.faiss_damage):
                raise DatastoreError(damage_message(self.path, damage))

    def close(self) -> None:
        """Close the SQLite connection (the memory maps close with the object); `with Datastore(path) as store:`
        closes it on leaving."""
        self.db.close()

    def _read_only(self) -> sqlite3.Connection:
        """A read-only connection to store.sqlite (`schema.reading`): a reader never writes; an empty schema where the
        first writer has not made the file yet (a build interrupted before)."""
        file = self.path / SQLITE
        if not file.is_file() or file.stat().st_size == 0:
            return schema.empty()
        return schema.reading(file)

    @property
    def shards(self) -> list[Datastore]:
        """The one-directory datastores this one is made of (`protocol.Shards`): itself."""
        return [self]

    @property
    def writer(self) -> Any:
        """The writer whose own view of the store this is (`writer.DatastoreWriter`); a reader never writes, so
        asking a reader raises DatastoreError."""
        return writer_of(self.path, self._writer)

    def written_by(self, writer: Any, connection: sqlite3.Connection) -> None:
        """Make this object the writer's own view of the store, for good: read through the writer's connection
        (its own commits seen at once) and answer `writer`. Only `writer.open_writer` calls it, on an object it
        made under the lock; a reader never becomes a writer."""
        self.db.close()
        self.db, self._writer = connection, weakref.ref(writer)  # not kept alive by its view: its lock goes with it
        self.documents = Documents(self)  # every commit as it is made: no commit held
        self.manifest = self._committed(read_manifest(self.path))
        self.remap()
        self.version = self.data_version()

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

    def _committed(self, manifest: Manifest) -> Manifest:
        """manifest.json's fields with those committed since over them (`manifest.with_record`)."""
        with self.sqlite_errors():
            return committed(self.path, manifest, self.db)

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

    def remap(self) -> None:
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
            if self.manifest.pruned:
                self.counts = np.memmap(self.path / COUNTS, np.int32, "r", shape=(self.size,))
        else:
            self.keys = np.zeros((0, self.dim), np.float16)
            self.values = np.zeros(0, np.int32)

    @property
    def codec(self) -> KeyCodec | None:
        """The trained codec of compressed keys (keys.codec), None for float16 keys."""
        if self.manifest.key_codec == FLOAT16:
            return None
        if self._codec is None or self._codec.name != self.manifest.key_codec:
            try:
                self._codec = KeyCodec.load(self.path / CODEC, self.manifest.key_codec)
            except RuntimeError as err:
                raise DatastoreError(
                    f"{self.path / CODEC} is damaged or missing ({str(err).splitlines()[-1]})"
                ) from None
        return self._codec

    def keys_file(self) -> tuple[str, int]:
        """The file of the keys and its bytes per entry."""
        codec = self.codec
        return (KEYS, 2 * self.dim) if codec is None else (CODES, codec.code_size)

    def entry_files(self) -> list[tuple[str, int]]:
        """The files that hold one row per entry (keys, values; counts in a pruned store) and their bytes per entry."""
        return [self.keys_file(), (VALUES, 4), *([(COUNTS, 4)] if self.manifest.pruned else [])]

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

    def data_version(self) -> tuple:
        """Changes whenever another connection commits to SQLite or a checksummed file is rewritten."""
        with self.sqlite_errors():
            version = self.db.execute("PRAGMA data_version").fetchone()[0]
        return version, file_stat(self.path / "checksums.json")

    def _hold(self) -> None:
        """Read the latest commit, in one read transaction: its manifest record, entries (mapped) and documents."""
        with self._read_transaction():
            self.manifest = self._committed(read_manifest(self.path))
            self.remap()
            self.documents.hold()

    def reopen_if_changed(self) -> bool:
        """Move this reader to the latest commit (entries, documents, manifest, FAISS damage mended meanwhile);
        False, and nothing re-read, when nothing was committed since it last looked (Lucene's `openIfChanged`).
        Until then it answers from the commit it holds: its entry count, maps and manifest do not move."""
        version = self.data_version()
        if version == self.version:
            return False
        if not self.db.in_transaction and (not isinstance(self.db, schema.Connection) or self.db.views):
            self.db.close()  # an empty schema (the file not made yet) or an older one's views: read the file anew
            self.db = self._read_only()
            version = self.data_version()
        self.version = version
        self._hold()
        if self.faiss_damage:  # a rebuilt index is no longer damaged
            self.faiss_damage = self.check(only=self.faiss_damage)
        return True

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Read from one commit meanwhile (snapshot.py): what was committed when it began, re-read; writers' commits
        wait for its end."""
        with self.sqlite_errors():
            self._snapshots.enter()
        try:
            yield
        finally:
            self._snapshots.exit()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No read transaction meanwhile (this process's writer commits, which would wait for it), then one again,
        reopened on what was committed (`snapshot.Snapshots.paused`)."""
        with self._snapshots.paused():
            yield

    def check_provenance(self, older: bool) -> None:
        """Refuse, before writing anything, to write to a store.sqlite that is another store's or (with `older`) an
        older copy of this one's (`identity.damage`): its seal would record the wrong state as sound."""
        try:
            meta = Checksums(self.path).meta
        except ChecksumError:
            meta = {}  # a damaged checksums.json is the tails' check's to name
        with self.sqlite_errors():
            wrong = identity.damage(self.manifest.get(STORE_ID), self.db, meta, older)
        if wrong:
            raise DatastoreError(damage_message(self.path, wrong))

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
            foreign = identity.damage(self.manifest.get(STORE_ID), self.db, sums.meta)
            if any(d.file == "checksums.json" for d in foreign):  # its records are of another store's files
                return foreign
            names = set(sums.files) - {d.file for d in foreign}
            if not wal.as_sealed(self.path / SQLITE, self.db, sums.meta):
                names.discard(SQLITE)
            return foreign + sums.verify(names, sample, progress, growing=APPEND_ONLY, only=only)

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

    def check_model(self, name: str, weights_hash: str, dim: int, layer: int) -> None:
        """Refuse to query or extend with a model or layer other than the one the keys were made with."""
        want = self.manifest
        if weights_hash != want["model_hash"] or dim != self.dim:
            raise DatastoreError(
                f"the datastore at {self.path} was built with model {want['model']!r} (weights sha256 "
                f"{want['model_hash'][:12]}), but the given model {name!r} has weights "
                f"{weights_hash[:12]}; use the same model or build a new datastore"
            )
        if layer != self.manifest.layer:
            raise DatastoreError(
                f"the datastore at {self.path} holds layer-{self.manifest.layer} keys, but the model reads layer "
                f"{layer}; use layer={self.manifest.layer} or build a datastore for layer {layer}"
            )

    def parts(self, kind: str) -> list[Part] | None:
        """The committed live parts of an index (`kind`: "tfidf", "faiss"), in order; None for a datastore made
        before parts were committed (its readers list the directory, until a writer commits the list)."""
        with self.sqlite_errors():
            if self._meta("parts", "0") != "1":
                return None
            rows = self.db.execute("SELECT name, first, stop FROM parts WHERE kind = ? ORDER BY first", (kind,))
            return [Part(*row) for row in rows]
