"""A sharded datastore read as one: the shards of a distributed build (`distributed.py`) behind the `Datastore`
interface the query path uses (storage only: nothing here knows the model).

`shards.json`, written once when the sharded build ends, lists the shards in order with the fields fixed at
creation; it holds no counts. Document and entry indices are global, shard after shard, so a shard's document d is
global document `first_document + d`: the counts and offsets (the manifest's `documents`, `entries`,
`live_documents`, and each shard row's) are taken from the shards' own commit records whenever they are read, so they
cannot drift from them (documents added to the last shard move no other shard's offsets). Reads (keys, values,
document ranges, titles, evidence, hidden documents) go to the shards that hold what is asked, grouped so each shard
is asked once.

`store.Store` (store/protocol.py) is what the query path and the service use of a datastore: both `Datastore` and
`ShardedDatastore` have it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.errors import sqlite_errors, writer_of
from bertknn.store.manifest import Manifest
from bertknn.store.protocol import Shards, Store
from bertknn.store.records import Provenance, newest_first
from bertknn.store.schema import SQLITE

SHARDS_FILE = "shards.json"


def shard_name(i: int) -> str:
    """The name of shard i: its folder under `shards/` and its Serve deployment."""
    return f"shard-{i:05d}"


def is_sharded(path: str | Path) -> bool:
    """True for the directory of a sharded datastore."""
    return (Path(path) / SHARDS_FILE).is_file()


COUNTS = ("documents", "entries", "live_documents")  # taken from the shards, not from shards.json


def read_top(path: Path) -> dict:
    """What shards.json fixes: the shards in order (`{"path": ...}` rows) and the fields fixed at creation (the
    counts a file written before kept them are left out: the shards hold them). DatastoreError when it is damaged."""
    try:
        top = json.loads((path / SHARDS_FILE).read_text(encoding="utf-8"))
        paths = [row["path"] for row in top["shards"]]
        if not paths:
            raise ValueError("it lists no shards")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatastoreError(f"{path / SHARDS_FILE} is damaged ({err}); rerun the sharded build") from None
    return fixed_top(top, paths)


def fixed_top(fields: dict, paths: list[str]) -> dict:
    """The contents of a shards.json: `fields` without counts, and the shards' paths (relative to the directory)."""
    return {
        **{k: v for k, v in fields.items() if k not in (*COUNTS, "shards", "status")},
        "shards": [{"path": p} for p in paths],
    }


def shard_paths(path: str | Path) -> list[Path]:
    """The directories of a sharded datastore's shards, in order, as shards.json lists them (none is opened)."""
    return [Path(path) / row["path"] for row in read_top(Path(path))["shards"]]


def directories(path: str | Path) -> list[Path]:
    """The directories of the one-directory datastores `path` holds: a sharded datastore's shards, else `path`."""
    return shard_paths(path) if is_sharded(path) else [Path(path)]


def require_datastore(path: Path) -> None:
    """DatastoreError unless `path` holds a datastore (shards.json, or one directory's manifest or SQLite file), even
    one too damaged to open."""
    if not is_sharded(path) and not (path / "manifest.json").exists() and not (path / SQLITE).exists():
        raise DatastoreError(f"{path} is not a datastore (no manifest.json); create one with `bertknn build`")


def _renumbering(table: dict[int, int]) -> Callable[[np.ndarray], np.ndarray]:
    """A function mapping a shard's values to the sharded store's: lexicon numbers through `table`, vocabulary ids
    (below every lexicon number) unchanged."""
    if all(a == b for a, b in table.items()):
        return lambda values: values
    local = np.asarray(sorted(table), np.int64)
    mapped = np.asarray([table[v] for v in local.tolist()], np.int32)

    def renumber(values: np.ndarray) -> np.ndarray:
        at = np.clip(np.searchsorted(local, values), 0, len(local) - 1)
        return np.where(local[at] == values, mapped[at], values).astype(values.dtype)

    return renumber


@contextlib.contextmanager
def every(contexts: Iterable[contextlib.AbstractContextManager]) -> Iterator[None]:
    """Each of `contexts` entered in turn (a shard's after the one before it), all left at the end."""
    with contextlib.ExitStack() as held:
        for context in contexts:
            held.enter_context(context)
        yield


def copy_top(store: Store, out: Path) -> None:
    """The file that makes `out` a datastore laid out as `store` is, its shards in the same places under it: a
    sharded store's shards.json (written once they are there), nothing for a one-directory store."""
    if isinstance(store, ShardedDatastore):
        write_json(out / SHARDS_FILE, fixed_top(store.manifest, [row["path"] for row in store.manifest["shards"]]))


def open_store(path: str | Path, check: bool = True) -> Store:
    """The datastore at `path`, sharded or not (`check` as `Datastore` takes it, for each shard)."""
    return ShardedDatastore(path, check=check) if is_sharded(path) else Datastore(path, check)


class _Rows:
    """Rows of one array kept in several shards (keys or values), indexed by global entry numbers; `renumber`
    (values only) maps each shard's lexicon numbers to the sharded store's."""

    def __init__(
        self,
        parts: list[np.ndarray],
        starts: np.ndarray,
        renumber: list[Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> None:
        self.parts, self.starts, self.renumber = parts, starts, renumber
        self.shape = (int(starts[-1]), *parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: np.ndarray | slice) -> np.ndarray:
        rows = np.arange(*rows.indices(len(self))) if isinstance(rows, slice) else np.asarray(rows, np.int64)
        out = np.empty((len(rows), *self.shape[1:]), self.dtype)
        shard = np.searchsorted(self.starts, rows, side="right") - 1
        for s in np.unique(shard):
            mine = shard == s
            part = self.parts[s][rows[mine] - self.starts[s]]
            out[mine] = self.renumber[s](part) if self.renumber else part
        return out


class ShardedDatastore(Shards):
    """The shards of `path/shards.json` read as one datastore (global document and entry numbers): a reader, or
    with `writer` a `writers.ShardedWriter`'s own view, over its shards' writers' views (`shards`)."""

    def __init__(
        self, path: str | Path, shards: list[Datastore] | None = None, writer: Any = None, check: bool = True
    ) -> None:
        self.path = Path(path)
        self._top = read_top(self.path)
        self._shards = shards or [Datastore(self.path / row["path"], check) for row in self._top["shards"]]
        self.documents = ShardedDocuments(self)  # the documents' reads, by global numbers
        self.evidence = ShardedEvidence(self)  # the evidence vectors' reads
        self.lexicon = ShardedLexicon(self)  # the shards' words of several tokens as one lexicon
        self._writer = writer and weakref.ref(writer)  # not kept alive by its view: its locks go with it
        self.recount()

    def recount(self) -> None:
        """The global numbers and the manifest's counts, from the shards as last (re)read."""
        doc_starts, entry_starts = self.doc_starts, self.entry_starts
        self.keys = _Rows([s.keys for s in self.shards], entry_starts)
        self.values = _Rows([s.values for s in self.shards], entry_starts, self.lexicon.renumbering())
        rows = [
            {**row, "first_document": int(doc), "first_entry": int(at), "documents": s.n_documents, "entries": s.size}
            for row, s, doc, at in zip(self._top["shards"], self.shards, doc_starts, entry_starts)
        ]
        live = self.documents.count_live()
        counts = {"documents": self.n_documents, "entries": self.size, "live_documents": live}
        self.manifest = Manifest({**self._top, **counts, "shards": rows, "status": "complete"})

    @property
    def shards(self) -> list[Datastore]:
        """The shards, in order (`protocol.Shards`)."""
        return self._shards

    @property
    def dim(self) -> int:
        return self.shards[0].dim

    @property
    def size(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def n_documents(self) -> int:
        return sum(s.n_documents for s in self.shards)

    @property
    def version(self) -> tuple:
        return tuple(s.version for s in self.shards)

    def check_model(self, name: str, weights_hash: str, dim: int, layer: int) -> None:
        self.shards[0].check_model(name, weights_hash, dim, layer)

    def close(self) -> None:
        """Close every shard's SQLite connection."""
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> ShardedDatastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reopen_if_changed(self) -> bool:
        """Move every shard to its latest commit (`Datastore.reopen_if_changed`); False when none had changed."""
        changed = [shard.reopen_if_changed() for shard in self.shards]
        if any(changed):
            self.recount()
        return any(changed)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Every shard's read transaction paused meanwhile (`Datastore.paused`), the counts re-read after."""
        with every(shard.paused() for shard in self.shards):
            yield
        self.recount()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every shard read from one commit meanwhile (`Datastore.snapshot`), its counts and offsets re-read."""
        with every(shard.snapshot() for shard in self.shards):
            self.recount()
            yield

    @property
    def faiss_damage(self) -> list:
        """Damage confined to the shards' FAISS files (IR questions still work)."""
        return [damage for shard in self.shards for damage in shard.faiss_damage]

    @property
    def writer(self) -> Any:
        """The `writers.ShardedWriter` whose own view this is; a reader never writes (DatastoreError)."""
        return writer_of(self.path, self._writer)

    def sqlite_errors(self) -> contextlib.AbstractContextManager[None]:
        """SQLite's errors about a damaged shard as a DatastoreError naming the shards' directory."""
        return sqlite_errors(
            f"the SQLite file of a shard under {self.path}", f"`bertknn verify {self.path}` locates it"
        )

    def counts_of(self, entries: np.ndarray) -> np.ndarray | None:
        """The contexts each entry stands for (`Datastore.counts_of`), None when no shard is pruned."""
        if not any(shard.manifest.pruned for shard in self.shards):
            return None

        def read(shard: Datastore, local: list[int], s: int) -> list:
            counts = shard.counts_of(np.asarray(local, np.int64))
            return [1] * len(local) if counts is None else counts.tolist()

        return np.asarray(self.documents.gather(list(entries), self.entry_starts, read), np.int64)


class ShardedLexicon:
    """The shards' lexicons read as one (`lexicon.Lexicon` of one store), by the sharded store's numbers."""

    def __init__(self, store: ShardedDatastore) -> None:
        self.store = store
        self._words: dict[int, tuple[str, str]] = {}  # filled by `renumbering`, when the shards are (re)read

    def renumbering(self) -> list[Callable[[np.ndarray], np.ndarray]]:
        """The shards' lexicons as one (a word held by several shards is one word: it keeps the number of the first
        shard that holds it, and the words new in a later shard are numbered on), and for each shard the map of its
        numbers to these."""
        self._words: dict[int, tuple[str, str]] = {}
        number: dict[str, int] = {}
        maps = []
        for shard in self.store.shards:
            rows = shard.lexicon.words(None)
            table = {}
            for value, (pieces, word) in sorted(rows.items()):
                if pieces not in number:  # numbered on in the order the shard numbered them, as one store would
                    number[pieces] = max(self._words) + 1 if self._words else value
                    self._words[number[pieces]] = (pieces, word)
                table[value] = number[pieces]
            maps.append(_renumbering(table))
        return maps

    @property
    def whole_words(self) -> bool:
        return self.store.shards[0].lexicon.whole_words

    @property
    def names(self) -> bool:
        return self.store.shards[0].lexicon.names

    def words(self, values: Iterable[int] | None) -> dict[int, tuple[str, str]]:
        """(tokens' ids as text, word) of the given lexicon numbers (None: all), across shards."""
        if values is None:
            return dict(self._words)
        wanted = {int(v) for v in values}
        missing = sorted(wanted - set(self._words))
        if missing:
            raise DatastoreError(
                f"{self.store.path} holds no word for values {missing[:5]}: it is damaged; `bertknn verify`"
            )
        return {v: self._words[v] for v in wanted}


class ShardedDocuments:
    """The documents of a sharded datastore read by global numbers (`documents.Documents` of one store): each shard
    is asked once for what it holds."""

    def __init__(self, store: ShardedDatastore) -> None:
        self.store = store

    def count_live(self) -> int:
        """How many documents searches can return, over all shards."""
        return sum(shard.documents.count_live() for shard in self.store.shards)

    def live_end(self) -> int:
        """One past the last live document over all shards (0 when none is): what an IR index must cover."""
        ends = [int(a) + s.documents.live_end() for s, a in zip(self.store.shards, self.store.doc_starts)]
        return max((end for end, s in zip(ends, self.store.shards) if s.documents.count_live()), default=0)

    def pending(self, docs: list[int] | None = None) -> list[int]:
        """No document is pending: the shards of a sharded build are complete."""
        return []

    def _by_shard(self, items: list[int], starts: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(shard, positions in `items`, local numbers) for each shard holding some of `items`."""
        items = np.asarray(items, np.int64)
        shard = np.searchsorted(starts, items, side="right") - 1
        if len(items) and (items.min() < 0 or items.max() >= starts[-1]):
            raise DatastoreError(f"{self.store.path} has no item {int(items.max())} (it holds {int(starts[-1])})")
        for s in np.unique(shard):
            where = np.flatnonzero(shard == s)
            yield int(s), where, items[where] - starts[s]

    def gather(self, items: list[int], starts: np.ndarray, read: Callable[[Datastore, list[int], int], list]) -> list:
        out: list = [None] * len(items)
        for s, where, local in self._by_shard(items, starts):
            for i, value in zip(where, read(self.store.shards[s], local.tolist(), s)):
                out[i] = value
        return out

    def ranges(self, docs: list[int]) -> list[tuple[int, int]]:
        def read(shard: Datastore, local: list[int], s: int) -> list:
            base = int(self.store.entry_starts[s])
            return [(a + base, b + base) for a, b in shard.documents.ranges(local)]

        return self.gather(docs, self.store.doc_starts, read)

    def titles(self, docs: list[int]) -> list[str]:
        return self.gather(docs, self.store.doc_starts, lambda shard, local, s: shard.documents.titles(local))

    def dated_titles(self, docs: list[int]) -> list[tuple[str, str | None]]:
        return self.gather(docs, self.store.doc_starts, lambda shard, local, s: shard.documents.dated_titles(local))

    def provenance(self, entries: list[int]) -> list[Provenance]:
        def read(shard: Datastore, local: list[int], s: int) -> list:
            base = int(self.store.entry_starts[s])
            return [dataclasses.replace(e, entry=e.entry + base) for e in shard.documents.provenance(local)]

        return self.gather(entries, self.store.entry_starts, read)

    def of(self, entries: np.ndarray) -> np.ndarray:
        def read(shard: Datastore, local: list[int], s: int) -> list:
            return (shard.documents.of(np.asarray(local, np.int64)) + self.store.doc_starts[s]).tolist()

        return np.asarray(self.gather(list(entries), self.store.entry_starts, read), np.int64)

    def find_titles(self, norm_title: str) -> list[tuple[int, str | None]]:
        found = [
            (d + int(start), date)
            for shard, start in zip(self.store.shards, self.store.doc_starts)
            for d, date in shard.documents.find_titles(norm_title)
        ]
        return newest_first(found)

    def named(self, spans: list[str]) -> list[tuple[str, str, int, str]] | None:
        found = [shard.documents.named(spans) for shard in self.store.shards]
        return None if any(f is None for f in found) else sorted({row for rows in found for row in rows})

    def aliases(self, norm_title: str) -> list[str]:
        return list(dict.fromkeys(a for shard in self.store.shards for a in shard.documents.aliases(norm_title)))

    def dated(self) -> np.ndarray:
        starts = self.store.doc_starts
        return np.concatenate([s.documents.dated() + starts[i] for i, s in enumerate(self.store.shards)])

    def hidden(self) -> np.ndarray:
        starts = self.store.doc_starts
        return np.concatenate([s.documents.hidden() + starts[i] for i, s in enumerate(self.store.shards)])

    def states(self, ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for shard in self.store.shards:
            found |= shard.documents.states(ids)
        return found

    def live_digests(self, ids: list[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for shard in self.store.shards:
            found |= shard.documents.live_digests(ids)
        return found


class ShardedEvidence:
    """The evidence vectors of a sharded datastore read (`evidence.EvidenceReads` of one store)."""

    def __init__(self, store: ShardedDatastore) -> None:
        self.store = store

    @property
    def model(self) -> str | None:
        """The sentence encoder of the evidence vectors (`EvidenceReads.model`) when every shard has them."""
        models = {shard.evidence.model for shard in self.store.shards}
        return models.pop() if len(models) == 1 else None

    def vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of the evidence `texts` any shard holds (`EvidenceReads.vectors`)."""
        found: dict[str, np.ndarray] = {}
        for shard in self.store.shards:
            rest = [t for t in texts if t not in found]
            if rest:
                found.update(shard.evidence.vectors(rest))
        return found
