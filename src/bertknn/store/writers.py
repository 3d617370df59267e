"""The writer of any datastore, sharded or not: `open_writer` gives a one-directory store's `DatastoreWriter`
(writer.py) or a sharded store's `ShardedWriter`, which holds every shard's writer (their locks taken in shard
order, so two writers cannot hold one each) behind the same interface: `store` (its own view), `commit`, `remove`,
`close`. A caller never asks which it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bertknn.store.manifest import DatastoreError
from bertknn.store.protocol import Store
from bertknn.store.shards import ShardedDatastore, every, is_sharded, shard_paths
from bertknn.store.writer import DatastoreWriter, open_datastore_writer


def open_writer(store: Store | str | Path, wait: float | None = None, check_tails: bool = True) -> StoreWriter:
    """The writer of the datastore at `store` (a path, or an open store's), opened once: see `open_datastore_writer`
    for `wait` and `check_tails`. Close it to let another writer in."""
    path = Path(store if isinstance(store, (str, Path)) else store.path)
    if not is_sharded(path):
        return open_datastore_writer(path, wait, check_tails)
    held: list[DatastoreWriter] = []
    try:
        for shard in shard_paths(path):
            held.append(open_datastore_writer(shard, wait, check_tails))
    except BaseException:
        for writer in held:
            writer.close()
        raise
    return ShardedWriter(path, held)


class ShardedWriter:
    """The writes of a sharded datastore: each shard's own writer (`shards`), and `store`, the shards' views read as
    one. Each shard commits and seals its own writes."""

    def __init__(self, path: Path, shards: list[DatastoreWriter]) -> None:
        self.shards = shards
        self.store = ShardedDatastore(path, [writer.store for writer in shards], writer=self)

    @property
    def closed(self) -> bool:
        """Whether `close` let the locks go."""
        return self.shards[0].closed

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let every shard's lock go (again: nothing)."""
        for writer in self.shards:
            writer.close()

    @contextlib.contextmanager
    def commit(self) -> Iterator[ShardedWriter]:
        """One commit on every shard (`DatastoreWriter.commit`); the global counts re-read at its end."""
        with every(writer.commit() for writer in self.shards):
            yield self
        self.store.recount()

    def place(self, digests: dict[str, str], skip_existing: bool, replace: bool) -> tuple[DatastoreWriter, list[str]]:
        """Where documents being added go (`digests`: their ids and text digests): the last shard (no other shard's
        numbers move), and the ids live in another shard, which are skipped as unchanged when `skip_existing` allows
        it. An id live elsewhere with other text, or any without `skip_existing`, raises DatastoreError, as one
        store refuses a live id (`DatastoreWriter.stage`); so does `replace`, which one transaction cannot do across
        two shards."""
        if replace:
            raise DatastoreError(
                f"{self.store.path} is sharded: --replace is not supported there; remove the documents "
                "(`bertknn remove --doc ID`), then add the new text"
            )
        ids, last = list(digests), self.shards[-1]
        elsewhere = set(self.store.documents.states(ids)) - set(last.store.documents.states(ids))
        if elsewhere and not skip_existing:
            raise DatastoreError(f"document id(s) already in the datastore: {sorted(elsewhere)[:5]}; remove them first")
        held = self.store.documents.live_digests(sorted(elsewhere))
        changed = sorted(i for i in elsewhere if held.get(i) not in (None, digests[i]))
        if changed:
            raise DatastoreError(
                f"document id(s) {changed[:5]} are in {self.store.path} with other text; remove them first "
                "(`bertknn remove --doc ID`), then add the new text"
            )
        return last, sorted(elsewhere)

    def remove(self, ids: list[str]) -> tuple[list[str], list[str]]:
        """Remove documents from the shards holding them; return (removed now, removed before). An unknown id raises
        DatastoreError before anything changes. Each shard removes its part in one transaction; a crash between
        shards leaves some removed, and a rerun finishes (reporting those as removed before)."""
        ids = list(dict.fromkeys(str(i) for i in ids))
        views = self.store.shards
        owners = {i: s for s, view in enumerate(views) for i in view.documents.states(ids)}
        unowned = [i for i in ids if i not in owners]
        before = set().union(*(view.documents.removed_ids(unowned) for view in views))
        unknown = [i for i in ids if i not in owners and i not in before]
        if unknown:
            raise DatastoreError(
                f"no document with id {', '.join(map(repr, unknown[:5]))} in {self.store.path}; nothing was removed"
            )
        removed = []
        for s in dict.fromkeys(owners.values()):
            removed += self.shards[s].remove([i for i in ids if owners.get(i) == s])[0]
        self.store.recount()
        return removed, [i for i in ids if i in before]


StoreWriter = DatastoreWriter | ShardedWriter  # the writer of any datastore, as `open_writer` gives it
