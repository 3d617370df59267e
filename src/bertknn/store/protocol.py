"""`Store`: what the query path (search, pipeline, FAISS) and the service use of a datastore, one directory's
(`Datastore`) or a sharded one's (`ShardedDatastore`) alike."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bertknn.store.manifest import Manifest
from bertknn.store.records import Provenance


class Rows(Protocol):
    """Rows of an array read by number (keys or values): a memory map, or `_Rows` over shards."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, rows: Any) -> Any: ...


class DocumentReads(Protocol):
    """What the query path and the service read of a datastore's documents (`documents.Documents` of one store,
    `shards.ShardedDocuments` of a sharded one), by document and entry number."""

    def pending(self, docs: list[int] | None = None) -> list[int]: ...

    def ranges(self, docs: list[int]) -> list[tuple[int, int]]: ...

    def of(self, entries: np.ndarray) -> np.ndarray: ...

    def titles(self, docs: list[int]) -> list[str]: ...

    def dated_titles(self, docs: list[int]) -> list[tuple[str, str | None]]: ...

    def find_titles(self, norm_title: str) -> list[tuple[int, str | None]]: ...

    def named(self, spans: list[str]) -> list[tuple[str, str, int, str]] | None: ...

    def aliases(self, norm_title: str) -> list[str]: ...

    def dated(self) -> np.ndarray: ...

    def provenance(self, entries: list[int]) -> list[Provenance]: ...

    def hidden(self) -> np.ndarray: ...

    def count_live(self) -> int: ...

    def live_end(self) -> int: ...

    def states(self, ids: list[str]) -> dict[str, str]: ...

    def live_digests(self, ids: list[str]) -> dict[str, str | None]: ...


class EvidenceVectors(Protocol):
    """What the query path reads of a datastore's evidence vectors (`evidence.EvidenceReads` of one store,
    `shards.ShardedEvidence` of a sharded one)."""

    @property
    def model(self) -> str | None: ...

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]: ...


class WordReads(Protocol):
    """What the query path reads of a datastore's words of several tokens (`lexicon.Lexicon` of one store,
    `shards.ShardedLexicon` of a sharded one)."""

    @property
    def whole_words(self) -> bool: ...

    def words(self, values: Iterable[int] | None) -> dict[int, tuple[str, str]]: ...


class Shards:
    """A datastore as the one-directory datastores it is made of, in order (Lucene's leaves): a `Datastore` is its
    own one shard, a `ShardedDatastore` has several. Document and entry numbers run on from shard to shard
    (`doc_starts`, `entry_starts`: where each shard's begin, and the total last), so index/, ingest/ and serving/ are
    written over `shards` and never ask whether a store is sharded."""

    @property
    def shards(self) -> list:
        """The one-directory datastores, in order."""
        raise NotImplementedError

    @property
    def doc_starts(self) -> np.ndarray:
        """Where each shard's documents begin in the store's numbers, and their total last."""
        return np.cumsum([0, *(shard.n_documents for shard in self.shards)], dtype=np.int64)

    @property
    def entry_starts(self) -> np.ndarray:
        """Where each shard's entries begin in the store's numbers, and their total last."""
        return np.cumsum([0, *(shard.size for shard in self.shards)], dtype=np.int64)

    def split_documents(self, docs: np.ndarray | None) -> list[np.ndarray]:
        """Document numbers as each shard's own numbers, shard by shard."""
        docs = np.zeros(0, np.int64) if docs is None else np.asarray(docs, np.int64)
        return [docs[(docs >= a) & (docs < b)] - a for a, b in zip(self.doc_starts[:-1], self.doc_starts[1:])]

    def merge_nearest(self, found: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each shard's nearest (its own entry numbers, squared distances), shard by shard, merged into the k
        nearest by the store's entry numbers, nearest first (ties: the lower entry)."""
        entries = np.concatenate([np.asarray(e, np.int64) + a for (e, _), a in zip(found, self.entry_starts)])
        dist = np.concatenate([np.asarray(d, np.float32) for _, d in found])
        order = np.lexsort((entries, dist))[:k]
        return entries[order], dist[order]


class Store(Protocol):
    """What the query path (search, pipeline, FAISS) and the service use of a datastore: `Datastore` and
    `ShardedDatastore` both have it, with the same parameter names (tests/test_store_protocol.py holds them to it)."""

    @property
    def shards(self) -> list: ...

    @property
    def doc_starts(self) -> np.ndarray: ...

    @property
    def entry_starts(self) -> np.ndarray: ...

    @property
    def path(self) -> Path: ...

    @property
    def manifest(self) -> Manifest: ...

    @property
    def dim(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def n_documents(self) -> int: ...

    @property
    def keys(self) -> Rows: ...

    @property
    def values(self) -> Rows: ...

    @property
    def version(self) -> tuple: ...

    @property
    def faiss_damage(self) -> list: ...

    def check_model(self, name: str, weights_hash: str, dim: int, layer: int) -> None: ...

    def reopen_if_changed(self) -> bool: ...

    def paused(self) -> contextlib.AbstractContextManager[None]: ...

    def snapshot(self) -> contextlib.AbstractContextManager[None]: ...

    def close(self) -> None: ...

    def sqlite_errors(self) -> contextlib.AbstractContextManager[None]: ...

    @property
    def documents(self) -> DocumentReads: ...

    def counts_of(self, entries: np.ndarray) -> np.ndarray | None: ...

    @property
    def evidence(self) -> EvidenceVectors: ...

    @property
    def lexicon(self) -> WordReads: ...

    @property
    def writer(self) -> Any: ...

    def split_documents(self, docs: np.ndarray | None) -> list[np.ndarray]: ...

    def merge_nearest(self, found: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]: ...


class OneStore(Store, Protocol):
    """What the reads by concept of one directory's datastore (`documents.Documents`, `lexicon.Lexicon`,
    `evidence.EvidenceReads`) use of it (`Datastore`): besides `Store`, its SQLite connection of the moment and the
    values its writers keep there. Typed here so that those modules need not import datastore.py, which makes them."""

    @property
    def db(self) -> sqlite3.Connection: ...

    def read_meta(self, key: str) -> str | None: ...
