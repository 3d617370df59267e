"""FAISS index over every key of a datastore: kNN without the IR step (SPEC §4).

Any FAISS index factory string ("Flat", "IVF4096,PQ64", "HNSW32", ...) works; "auto" picks one by size. The index is
trained on a random sample of keys, filled in entry order (so FAISS's sequential ids are entry indices) and saved
beside the datastore as faiss.index (always replaced whole by a rename, so the file on disk is a consistent index)
with its settings in faiss.json. Its `ntotal` says how far filling got: a build resumes there, and `update` appends
entries added later. Candidates are re-ranked with exact distances from the stored float16 keys."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

from bertknn.datastore import Datastore, DatastoreError
from bertknn.knn import nearest

INDEX_FILE, SETTINGS_FILE = "faiss.index", "faiss.json"
AUTO = "auto"
FLAT_BELOW = 20_000  # keys; exact search over fewer is already fast


def auto_factory(size: int, dim: int) -> str:
    """The factory "auto" stands for: Flat (exact) below 20k keys, else IVF with about 4 sqrt(n) lists and PQ codes of
    dim/12 bytes. At 1M 768-wide keys this is IVF4096,PQ64; its recall and latency against other factories (IVF1024
    lists scan more codes) are measured by bench/faiss_scale.py (bench/README.md)."""
    if size < FLAT_BELOW:
        return "Flat"
    nlist = 2 ** round(math.log2(4 * math.sqrt(size)))
    bytes_per_code = max(d for d in range(1, max(1, dim // 12) + 1) if dim % d == 0)
    return f"IVF{nlist},PQ{bytes_per_code}"


def auto_train_size(index: faiss.Index, size: int) -> int:
    """Keys to train on when none is given: 50 per IVF list (FAISS warns below 39), at least 100k, at most all."""
    with contextlib.suppress(RuntimeError):  # not an IVF index
        return min(size, max(100_000, 50 * faiss.extract_index_ivf(index).nlist))
    return min(size, 100_000)


def _settings(path: Path) -> dict | None:
    file = path / SETTINGS_FILE
    if not file.is_file():
        return None
    try:
        settings = json.loads(file.read_bytes().decode("utf-8"))
        if not isinstance(settings, dict) or not isinstance(settings.get("nprobe"), int):
            raise ValueError("no nprobe")
    except ValueError as err:  # JSON and UTF-8 errors included
        raise DatastoreError(
            f"{file} is damaged ({err}); delete {SETTINGS_FILE} and {INDEX_FILE}, then rerun `bertknn index`"
        ) from None
    return settings


def _read(store: Datastore) -> faiss.Index:
    """faiss.index of a datastore; DatastoreError naming the file when it is damaged."""
    if store.faiss_damage:
        raise DatastoreError(
            f"{store.path / INDEX_FILE} is damaged ({store.faiss_damage[0].problem}); delete {INDEX_FILE} and "
            f"{SETTINGS_FILE}, then rerun `bertknn index {store.path}`"
        )
    try:
        index = faiss.read_index(str(store.path / INDEX_FILE))
    except RuntimeError as err:
        raise DatastoreError(
            f"{store.path / INDEX_FILE} is damaged ({str(err).splitlines()[-1]}); delete {INDEX_FILE} and "
            f"{SETTINGS_FILE}, then rerun `bertknn index {store.path}`"
        ) from None
    if index.d != store.dim or index.ntotal > store.size:
        raise DatastoreError(
            f"{store.path / INDEX_FILE} does not fit the datastore ({index.ntotal:,} keys of width {index.d}, the "
            f"store has {store.size:,} of width {store.dim}); delete it and {SETTINGS_FILE}, then rerun `bertknn index`"
        )
    return index


def _save(index: faiss.Index, store: Datastore) -> None:
    """Write the index to a temporary file, then rename it over the old one."""
    tmp = store.path / f"{INDEX_FILE}.tmp"
    faiss.write_index(index, str(tmp))
    store.rewriting(INDEX_FILE)
    tmp.replace(store.path / INDEX_FILE)


def _set_nprobe(index: faiss.Index, nprobe: int) -> None:
    with contextlib.suppress(RuntimeError):  # not an IVF index: nothing to probe
        faiss.extract_index_ivf(index).nprobe = nprobe


class FaissIndex:
    """A trained FAISS index over a datastore's keys, with exact re-ranking."""

    def __init__(self, index: faiss.Index, store: Datastore, settings: dict) -> None:
        self.index, self.store, self.settings = index, store, settings
        _set_nprobe(index, int(settings["nprobe"]))

    @classmethod
    def load(cls, store: Datastore) -> FaissIndex | None:
        """The datastore's FAISS index, or None when it has none."""
        settings = _settings(store.path)
        if settings is None:
            return None
        if not (store.path / INDEX_FILE).is_file():
            raise DatastoreError(
                f"{store.path / INDEX_FILE} is missing (its settings, {SETTINGS_FILE}, are there): rerun "
                f"`bertknn index {store.path}`"
            )
        return cls(_read(store), store, settings)

    @classmethod
    def build(
        cls,
        store: Datastore,
        factory: str = AUTO,
        train_size: int | None = None,
        nprobe: int = 16,
        chunk: int = 65_536,
        seed: int = 0,
        progress: Callable[[int, int], None] | None = None,
    ) -> FaissIndex:
        """Train (on `train_size` random keys) and fill an index over all keys; resumes an interrupted build.

        `factory` "auto" and `train_size` None choose by the datastore's size (auto_factory, auto_train_size), or
        take those of the index being resumed.
        """
        if not store.complete:
            raise DatastoreError(f"the datastore at {store.path} is not fully embedded; a FAISS index needs all keys")
        with store.writing():
            return cls._build(store, factory, train_size, nprobe, chunk, seed, progress)

    @classmethod
    def _build(cls, store, factory, train_size, nprobe, chunk, seed, progress) -> FaissIndex:
        known = _settings(store.path)
        resuming = known is not None and (store.path / INDEX_FILE).is_file()
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
            index = _read(store)
        else:
            try:
                index = faiss.index_factory(store.dim, factory, faiss.METRIC_L2)
            except RuntimeError as err:
                raise ValueError(f"bad FAISS factory string {factory!r}: {str(err).splitlines()[-1]}") from None
            if train_size is None:
                settings["train_size"] = train_size = auto_train_size(index, store.size)
            if not index.is_trained:  # Flat, HNSW...: nothing to learn, no sample to read
                sample = np.sort(np.random.default_rng(seed).permutation(store.size)[:train_size])
                try:
                    index.train(np.asarray(store.keys[sample], np.float32))
                except RuntimeError as err:
                    raise ValueError(
                        f"cannot train FAISS index {factory!r} on {len(sample):,} keys ({str(err).splitlines()[-1]}); "
                        "use a larger --train-size or fewer IVF lists"
                    ) from None
            _save(index, store)
        store.rewriting(SETTINGS_FILE)
        (store.path / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        built = cls(index, store, settings)
        built.update(chunk, progress)
        return built

    def update(self, chunk: int = 65_536, progress: Callable[[int, int], None] | None = None) -> int:
        """Add the datastore's entries the index does not hold yet (in entry order); return how many."""
        start = done = int(self.index.ntotal)
        while done < self.store.size:
            stop = min(done + chunk, self.store.size)
            self.index.add(np.asarray(self.store.keys[done:stop], np.float32))
            _save(self.index, self.store)
            done = stop
            if progress:
                progress(done, self.store.size)
        return done - start

    def search(
        self, query: np.ndarray, k: int, hidden: np.ndarray | None = None, rerank: int = 8
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k entries nearest to `query` as (entries, squared distances), nearest first.

        FAISS proposes `rerank` x k candidates (k when rerank is 0: its own approximate distances are returned);
        entries of `hidden` documents are dropped, and the rest are re-ranked by exact distance to the stored keys.
        """
        want = min(k * max(rerank, 1), int(self.index.ntotal))
        if want == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        dist, ids = self.index.search(np.asarray(query, np.float32).reshape(1, -1), want)
        keep = (ids[0] >= 0) & (ids[0] < self.store.size)
        ids, dist = ids[0][keep].astype(np.int64), dist[0][keep]
        if hidden is not None and len(hidden) and len(ids):
            visible = ~np.isin(self.store.documents_of(ids), hidden)
            ids, dist = ids[visible], dist[visible]
        if rerank:
            return nearest(self.store.keys, ids, query, k)
        return ids[:k], dist[:k]
