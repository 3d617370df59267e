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


class Store(Protocol):
    """What the query path (search, pipeline, FAISS) and the service use of a datastore: `Datastore` and
    `ShardedDatastore` both have it, with the same parameter names (tests/test_store_protocol.py holds them to it)."""

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


class OneStore(Store, Protocol):
    """What the reads by concept of one directory's datastore (`documents.Documents`, `lexicon.Lexicon`,
    `evidence.EvidenceReads`) use of it (`Datastore`): besides `Store`, its SQLite connection of the moment and the
    values its writers keep there. Typed here so that those modules need not import datastore.py, which makes them."""

    @property
    def db(self) -> sqlite3.Connection: ...

    def read_meta(self, key: str) -> str | None: ...
