"""FAISS index over every key of a datastore: kNN without the IR step (SPEC §4).

Any FAISS index factory string ("Flat", "IVF4096,PQ64", "HNSW32", ...) works; "auto" picks one by size. The index is
trained on a random sample of keys (the trained, empty index is kept as faiss_trained.index) and filled in entry
order, in parts: faiss.index holds entries 0.. and `faiss_add_{first}_{end}.index` files the entries after it, each
a chunk of keys added by a build or an `add`. Every file is written once and renamed into place, so the files on
disk are always a consistent index and an add never rewrites the large one; adjacent parts of one size are merged
(`merging.merge_plan`, FAISS's `merge_from`: inverted lists moved, nothing re-encoded), and a finished build merges
all into faiss.index. How far the parts reach says how far filling got: a build resumes there, and `update` appends
entries added later. Settings are in faiss.json. Candidates are re-ranked with exact distances from the stored keys
(float16, or their codes in a store with compressed keys: the index holds no copy of them)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import faiss
import numpy as np

from bertknn.index import NPROBE
from bertknn.index.exact import nearest
from bertknn.index.faiss_files import (
    AUTO,
    INDEX_FILE,
    KIND,
    SETTINGS_COPY,
    SETTINGS_FILE,
    TRAINED_FILE,
    absent,
    auto_factory,
    auto_train_size,
    delta_name,
    listing,
    read_part,
    read_settings,
    repair_hint,
    retire,
    save,
    write_settings,
    writer_settings,
)
from bertknn.index.merging import merge_plan
from bertknn.index.parts import open_listed
from bertknn.store import atomic
from bertknn.store.datastore import Datastore, DatastoreError, file_stat
from bertknn.store.protocol import Store
from bertknn.store.records import Part
from bertknn.store.writers import open_writer


@dataclass
class Loaded:
    """A part of the FAISS index in memory: an index over entries first..first + ntotal (its sequential ids count
    from `first`), read from the file `name`."""

    first: int
    index: faiss.Index
    name: str

    @property
    def end(self) -> int:
        return self.first + int(self.index.ntotal)


def _merged(loaded: list[Loaded], trained: faiss.Index, store: Datastore) -> faiss.Index:
    """One index of adjacent parts: the first takes the others' codes (`merge_from`; an IVF index shifts their
    ids by its size); indexes without `merge_from` (HNSW) are filled again from the stored keys."""
    merged = loaded[0].index
    try:
        ivf = faiss.extract_index_ivf(merged) is not None
    except RuntimeError:
        ivf = False
    try:
        for part in loaded[1:]:
            merged.merge_from(part.index, int(merged.ntotal) if ivf else 0)
        return merged
    except RuntimeError:
        merged = faiss.clone_index(trained)
        merged.add(np.asarray(store.keys[loaded[0].first : loaded[-1].end], np.float32))
        return merged


def _set_nprobe(index: faiss.Index, nprobe: int) -> None:
    with contextlib.suppress(RuntimeError):  # not an IVF index: nothing to probe
        faiss.extract_index_ivf(index).nprobe = nprobe


def train(store, factory: str, train_size: int | None, seed: int) -> tuple[faiss.Index, int]:
    """An empty index of `factory` trained on `train_size` random keys of `store` (None: `auto_train_size`), and
    the train size used. `store` may be sharded: the sample is drawn from all its keys."""
    try:
        index = faiss.index_factory(store.dim, factory, faiss.METRIC_L2)
    except RuntimeError as err:
        raise ValueError(f"bad FAISS factory string {factory!r}: {str(err).splitlines()[-1]}") from None
    if train_size is None:
        train_size = auto_train_size(index, store.size)
    if not index.is_trained:  # Flat, HNSW...: nothing to learn, no sample to read
        sample = np.sort(np.random.default_rng(seed).permutation(store.size)[:train_size])
        try:
            index.train(np.asarray(store.keys[sample], np.float32))
        except RuntimeError as err:
            raise ValueError(
                f"cannot train FAISS index {factory!r} on {len(sample):,} keys ({str(err).splitlines()[-1]}); "
                "use a larger --train-size or fewer IVF lists"
            ) from None
    return index, train_size


class FaissIndex:
    """A trained FAISS index over a datastore's keys, in parts (faiss.index, then added parts), with exact re-ranking.

    `index` is faiss.index, the part from entry 0: after a build, the whole index.
    """

    def __init__(self, parts: list[Loaded], trained: faiss.Index, store: Datastore, settings: dict) -> None:
        self.parts, self.trained, self.store, self.settings = parts, trained, store, settings
        for part in parts:
            _set_nprobe(part.index, int(settings["nprobe"]))

    @property
    def index(self) -> faiss.Index:
        return self.parts[0].index

    @property
    def ntotal(self) -> int:
        """Entries the index holds (0..ntotal)."""
        return self.parts[-1].end if self.parts else 0

    @property
    def where(self) -> str:
        """Where it is kept, for messages."""
        return str(self.store.path / INDEX_FILE)

    def listed(self) -> list[Part]:
        """The parts as the commit point lists them."""
        return [Part(p.name, p.first, p.end) for p in self.parts]

    @staticmethod
    def disk_state(store: Datastore) -> list:
        """What changes when another process writes the FAISS index: its committed parts and settings (the files'
        sizes and times in a datastore made before parts were committed)."""
        listed = store.parts(KIND)
        if listed is None:
            files = sorted(store.path.glob("faiss*"))
            return [(f.name, *(file_stat(f) or [])) for f in files if f.suffix in (".index", ".json")]
        return [listed, file_stat(store.path / SETTINGS_FILE)]

    @classmethod
    def load(cls, store: Datastore) -> FaissIndex | None:
        """The datastore's FAISS index as its commit point lists it, or None when it has none."""
        settings = read_settings(store.path)
        if settings is None:
            return None
        return open_listed(store, KIND, partial(cls.open, store, settings), partial(cls._load_listing, store, settings))

    @classmethod
    def _load_listing(cls, store: Datastore, settings: dict) -> FaissIndex:
        """A datastore made before parts were committed: faiss.index and the added parts that follow it."""
        if not (store.path / INDEX_FILE).is_file():
            raise DatastoreError(
                f"{store.path / INDEX_FILE} is {absent(store.path / INDEX_FILE)} (its settings, {SETTINGS_FILE}, are "
                f"there): {repair_hint(store.path)}"
            )
        return cls.open(store, settings, listing(store))

    @classmethod
    def open(cls, store: Datastore, settings: dict, listed: list[Part]) -> FaissIndex:
        """Exactly the listed parts, each checked to hold the keys it is listed for (a stop below 0: not known)."""
        if not listed:
            raise DatastoreError(
                f"the FAISS index of {store.path} is incomplete (being built, or its build was interrupted): rerun "
                f"`bertknn index {store.path}`"
            )
        missing = [store.path / part.name for part in listed if not (store.path / part.name).is_file()]
        if missing:
            raise DatastoreError(
                f"{missing[0]} is {absent(missing[0])} (its settings, {SETTINGS_FILE}, are there): "
                f"{repair_hint(store.path)}"
            )
        loaded, pos = [], 0
        for part in listed:
            index = read_part(store, part.name)
            if part.first != pos or (part.stop >= 0 and part.first + int(index.ntotal) != part.stop):
                raise DatastoreError(
                    f"{store.path / part.name} holds {int(index.ntotal)} keys, not entries {part.first}..{part.stop}"
                )
            loaded.append(Loaded(part.first, index, part.name))
            pos = loaded[-1].end
        if pos > store.size:
            raise DatastoreError(
                f"the FAISS index of {store.path} holds {pos:,} keys, the store has {store.size:,}: "
                f"{repair_hint(store.path)}"
            )
        if (store.path / TRAINED_FILE).is_file():
            trained = read_part(store, TRAINED_FILE)
        else:  # made before the trained index was kept apart
            trained = faiss.clone_index(loaded[0].index)
            trained.reset()
        return cls(loaded, trained, store, settings)

    @classmethod
    def build(
        cls,
        store: Datastore,
        factory: str = AUTO,
        train_size: int | None = None,
        nprobe: int = NPROBE,
        chunk: int = 65_536,
        seed: int = 0,
        progress: Callable[[int, int], None] | None = None,
        trained: faiss.Index | None = None,
    ) -> FaissIndex:
        """Train (on `train_size` random keys) and fill an index over all keys; resumes an interrupted build.
        `trained`: an index trained already (on a sample of all shards of a sharded datastore), used as it is.

        `factory` "auto" and `train_size` None choose by the datastore's size (auto_factory, auto_train_size), or
        take those of the index being resumed. Keys are added in parts of `chunk`, each saved as it is done; when all
        are in, the parts are merged into faiss.index.
        """
        if not store.manifest.complete:
            raise DatastoreError(f"the datastore at {store.path} is not fully embedded; a FAISS index needs all keys")
        with store.writer.commit():
            built = cls._build(store, factory, train_size, nprobe, chunk, seed, progress, trained)
            built._compact(everything=True)
            built._name_base()
            built.commit()
            return built

    @classmethod
    def _build(cls, store, factory, train_size, nprobe, chunk, seed, progress, trained) -> FaissIndex:
        known = writer_settings(store)
        resuming = known is not None and bool(store.parts(KIND))
        if factory == AUTO:
            factory = known["factory"] if resuming else auto_factory(store.size, store.dim)
        if train_size is None and resuming:
            train_size = known["train_size"]
        settings = {"factory": factory, "train_size": train_size, "nprobe": nprobe, "seed": seed}
        if resuming:
            if any(known.get(k) != settings[k] for k in ("factory", "train_size", "seed")):
                raise DatastoreError(
                    f"{store.path} has a FAISS index {known['factory']!r} (train size {known['train_size']}); "
                    "delete faiss.index and faiss.json to build another"
                )
            built = cls.load(store)
            built.settings = settings
        else:
            if trained is not None:
                index = faiss.clone_index(trained)
            else:
                index, settings["train_size"] = train(store, factory, train_size, seed)
            store.writer.commit_parts(faiss=[])  # what an index deleted by hand left is no part of the new one
            retire(store)
            save(index, store, TRAINED_FILE)
            built = cls([], faiss.clone_index(index), store, settings)
        if settings != known:
            store.writer.rewriting(SETTINGS_FILE)
            atomic.write_json(store.path / SETTINGS_FILE, settings)
        store.writer.write_meta(
            SETTINGS_COPY, json.dumps(settings)
        )  # what `bertknn repair` goes by if faiss.json is lost
        for part in built.parts:
            _set_nprobe(part.index, nprobe)
        built.update(chunk, progress)
        return built

    @classmethod
    def rebuild(
        cls,
        store: Datastore,
        settings: dict,
        trained: faiss.Index | None = None,
        kept: bool = False,
        chunk: int = 65_536,
        progress: Callable[[int, int], None] | None = None,
    ) -> FaissIndex:
        """The index of `settings` made again over every key (`bertknn repair`), in place of a damaged one: filled
        from the stored keys on `trained` (`kept`: as faiss_trained.index holds it, sound; else written there), or on
        an index trained again as the settings say, with faiss.json written anew. Its parts are written under names
        the committed list does not hold and committed in one transaction in place of the listed ones, which the
        caller then deletes (`retire`: `bertknn repair` does once every index is committed, and says what is left
        where that fails); so readers open the damaged index or the new one, never a part of it, and a crash leaves
        one of the two (a rerun of the repair finds the damage again, or finds none). `store`: a writer's view."""
        if not store.manifest.complete:
            raise DatastoreError(f"the datastore at {store.path} is not fully embedded; a FAISS index needs all keys")
        settings = dict(settings)
        with store.writer.commit():
            if trained is None:
                trained, settings["train_size"] = train(
                    store, settings["factory"], settings["train_size"], settings["seed"]
                )
            if not kept:
                save(trained, store, TRAINED_FILE)
            write_settings(store, settings)
            built = cls([], faiss.clone_index(trained), store, settings)
            built.update(chunk, progress, commit=False)
            built._compact(everything=True)
            store.writer.commit_parts(faiss=built.listed())  # the damaged parts replaced by the new ones
            built._name_base()
            store.writer.commit_parts(faiss=built.listed())
            return built

    def update(
        self, chunk: int = 65_536, progress: Callable[[int, int], None] | None = None, commit: bool = True
    ) -> int:
        """Add the datastore's entries the index does not hold yet (in entry order), each chunk as a new part
        merged as `merge_plan` says; return how many. For the datastore's writer: with `commit`, each chunk's list
        of parts is committed (and what it replaced retired), else the caller commits `listed()`. Parts that no list
        names (left by a writer that died before its commit) are deleted first."""
        retire(self.store)
        start = done = self.ntotal
        while done < self.store.size:
            stop = min(done + chunk, self.store.size)
            part = faiss.clone_index(self.trained)
            part.add(np.asarray(self.store.keys[done:stop], np.float32))
            _set_nprobe(part, int(self.settings["nprobe"]))
            self.parts.append(Loaded(done, part, delta_name(done, stop)))
            save(part, self.store, self.parts[-1].name)
            self._compact()
            if commit:
                self.commit()
            done = stop
            if progress:
                progress(done, self.store.size)
        return done - start

    def commit(self) -> None:
        """Commit the parts as they are in memory, then delete those no list names."""
        self.store.writer.commit_parts(faiss=self.listed())
        retire(self.store)

    def _taken(self) -> set[str]:
        """The names no new part may take: those in memory and those the commit point lists."""
        return {p.name for p in self.parts} | {p.name for p in self.store.parts(KIND) or []}

    def _name_base(self) -> None:
        """A finished build's one part written as faiss.index, when that name is free."""
        if len(self.parts) == 1 and INDEX_FILE not in self._taken():
            save(self.parts[0].index, self.store, INDEX_FILE)
            self.parts[0].name = INDEX_FILE

    def _compact(self, everything: bool = False) -> None:
        """Merge runs of parts (`merge_plan`; all of them with `everything`), each written whole under a name no
        list holds (with `everything`, faiss.index when it is free); the caller commits and retires."""
        while True:
            run = (0, len(self.parts)) if everything else merge_plan([int(p.index.ntotal) for p in self.parts])
            if run is None or run[1] - run[0] < 2:
                return
            picked = self.parts[run[0] : run[1]]
            first, end = picked[0].first, picked[-1].end
            whole = everything and first == 0 and INDEX_FILE not in self._taken()  # a finished build: faiss.index
            name = INDEX_FILE if whole else delta_name(first, end)
            merged = Loaded(first, _merged(picked, self.trained, self.store), name)
            _set_nprobe(merged.index, int(self.settings["nprobe"]))
            save(merged.index, self.store, merged.name)
            self.parts[run[0] : run[1]] = [merged]

    def search(
        self, query: np.ndarray, k: int, hidden: np.ndarray | None = None, rerank: int = 8
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k entries nearest to `query` as (entries, squared distances), nearest first.

        FAISS proposes `rerank` x k candidates (k when rerank is 0: its own approximate distances are returned);
        entries of `hidden` documents are dropped, and the rest are re-ranked by exact distance to the stored keys.
        """
        want = min(k * max(rerank, 1), self.ntotal)
        if want == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        query32 = np.asarray(query, np.float32).reshape(1, -1)
        found = [
            (p.first, *p.index.search(query32, min(want, int(p.index.ntotal)))) for p in self.parts if p.index.ntotal
        ]
        dist = np.concatenate([d[0] for _, d, _ in found])[None]
        ids = np.concatenate([np.where(i[0] >= 0, i[0] + first, -1) for first, _, i in found])[None]
        best = np.argsort(dist[0], kind="stable")[:want]
        dist, ids = dist[:, best], ids[:, best]
        keep = (ids[0] >= 0) & (ids[0] < self.store.size)
        ids, dist = ids[0][keep].astype(np.int64), dist[0][keep]
        if hidden is not None and len(hidden) and len(ids):
            visible = ~np.isin(self.store.documents.of(ids), hidden)
            ids, dist = ids[visible], dist[visible]
        if rerank:
            return nearest(self.store.keys, ids, query, k)
        return ids[:k], dist[:k]


class ShardedFaiss:
    """The FAISS indexes of a sharded datastore's shards, trained once on a sample of all keys (`build`) and searched
    side by side: each shard proposes and re-ranks its candidates, the exact distances are merged."""

    def __init__(self, store: Store, parts: list[FaissIndex]) -> None:
        self.store, self.parts = store, parts

    @property
    def ntotal(self) -> int:
        return sum(p.ntotal for p in self.parts)

    @property
    def where(self) -> str:
        """Where it is kept, for messages."""
        return self.parts[0].where if len(self.parts) == 1 else "the faiss.index of each shard"

    @property
    def settings(self) -> dict:
        """The settings every shard's index was built with (faiss.json)."""
        return self.parts[0].settings

    @classmethod
    def build(
        cls,
        store: Store,
        factory: str = AUTO,
        train_size: int | None = None,
        nprobe: int = NPROBE,
        chunk: int = 65_536,
        seed: int = 0,
        progress: Callable[[int, int], None] | None = None,
        on_ray: bool = False,
    ) -> ShardedFaiss:
        """Train one index on `train_size` keys drawn from all shards, then fill a copy of it per shard (each
        resumable as `FaissIndex.build`); every shard's index shares the one quantizer. `on_ray`: the shards are
        filled by parallel Ray tasks (Ray started by the caller), one CPU each."""
        factory = auto_factory(store.size, store.dim) if factory == AUTO else factory
        trained, train_size = train(store, factory, train_size, seed)
        settings = (factory, train_size, nprobe, chunk, seed)
        if on_ray:
            import ray

            fill = ray.remote(num_cpus=1)(_fill_shard)
            blob = ray.put(faiss.serialize_index(trained))
            pending, done = [fill.remote(str(shard.path), *settings, blob) for shard in store.shards], 0
            while pending:
                ready, pending = ray.wait(pending)
                done += sum(ray.get(ready))
                if progress:
                    progress(done, store.size)
            store.reopen_if_changed()
            return cls(store, [FaissIndex.load(shard) for shard in store.shards])
        parts, done = [], 0
        for shard in store.shards:
            step = (lambda d, t, base=done: progress(base + d, store.size)) if progress else None
            parts.append(FaissIndex.build(shard, *settings[:4], seed, step, trained))
            done += shard.size
        return cls(store, parts)

    def search(
        self, query: np.ndarray, k: int, hidden: np.ndarray | None = None, rerank: int = 8
    ) -> tuple[np.ndarray, np.ndarray]:
        """`FaissIndex.search` over every shard (global entry numbers), nearest first."""
        local = self.store.split_documents(hidden)
        return self.store.merge_nearest([p.search(query, k, h, rerank) for p, h in zip(self.parts, local)], k)


def load(store: Store) -> FaissIndex | ShardedFaiss | None:
    """The FAISS index of a datastore over its shards (`protocol.Shards`): its one shard's own index, or the
    shards' indexes searched side by side; None when a shard has none."""
    parts = [FaissIndex.load(shard) for shard in store.shards]
    if any(part is None for part in parts):
        return None
    return parts[0] if len(parts) == 1 else ShardedFaiss(store, parts)  # type: ignore[arg-type]


def build(
    store: Store,
    factory: str = AUTO,
    train_size: int | None = None,
    nprobe: int = NPROBE,
    progress: Callable[[int, int], None] | None = None,
    on_ray: bool = False,
) -> FaissIndex | ShardedFaiss:
    """Train and fill the FAISS index of a datastore (resumably): one shard's as `FaissIndex.build`, several
    shards' with one quantizer trained on a sample of all their keys (`ShardedFaiss.build`, which `on_ray` fills
    by a Ray task per shard)."""
    if len(store.shards) == 1 and not on_ray:
        return FaissIndex.build(store, factory, train_size, nprobe, progress=progress)  # type: ignore[arg-type]
    return ShardedFaiss.build(store, factory, train_size, nprobe, progress=progress, on_ray=on_ray)


def _fill_shard(
    path: str, factory: str, train_size: int, nprobe: int, chunk: int, seed: int, trained: np.ndarray
) -> int:
    """A Ray task: fill one shard's index from the serialized trained index, through the shard's writer (opened in
    this task's process); return the shard's keys."""
    with open_writer(path) as writer:
        shard = writer.store
        FaissIndex.build(shard, factory, train_size, nprobe, chunk, seed, None, faiss.deserialize_index(trained))
        return shard.size
