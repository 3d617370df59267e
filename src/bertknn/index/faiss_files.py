"""The FAISS index's files in a datastore directory: the parts (faiss.index, then `faiss_add_{first}_{end}.index`
files) and the trained, empty index (faiss_trained.index); their settings (faiss.json, and the copy SQLite keeps);
reading, writing and deleting them; the list of parts a datastore made before its parts were committed has on disk;
what keeps a reader from opening them (`problems`, for `bertknn verify`). The index itself is faiss_index.py."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from functools import partial
from pathlib import Path

import faiss

from bertknn.index import NPROBE, parts
from bertknn.store import atomic
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.integrity import Checksums
from bertknn.store.records import Part

INDEX_FILE, SETTINGS_FILE, TRAINED_FILE = "faiss.index", "faiss.json", "faiss_trained.index"
SETTINGS_COPY = "faiss_settings"  # the key of the copy of faiss.json that SQLite keeps (`bertknn repair` reads it)
DELTA_PREFIX = "faiss_add_"
KIND = "faiss"  # the FAISS index's parts in the datastore's commit point
AUTO = "auto"
FLAT_BELOW = 20_000  # keys; exact search over fewer is already fast
READ_CHECK = 64 << 20  # bytes: `verify` reads a FAISS file this small whole


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


def read_settings(path: Path) -> dict | None:
    file = path / SETTINGS_FILE
    if not file.is_file():
        return None
    try:
        settings = json.loads(file.read_bytes().decode("utf-8"))
        if not isinstance(settings, dict) or not isinstance(settings.get("nprobe"), int):
            raise ValueError("no nprobe")
    except ValueError as err:  # JSON and UTF-8 errors included
        raise DatastoreError(f"{file} is damaged ({err}); {repair_hint(path)}") from None
    return settings


def repair_hint(path: Path) -> str:
    """What to do about a damaged FAISS file of the datastore at `path`."""
    return f"`bertknn repair {path}` rebuilds the FAISS index"


def unreadable(file: Path, err: RuntimeError) -> str:
    """Why FAISS could not read `file`, for a message naming it: a directory in its place, or the file truncated with
    its size (FAISS's "read error": the file ends before the index does; FAISS appends an errno left over from an
    earlier call, "No such file or directory" say, that is no reason), else FAISS's own reason."""
    if file.is_dir():
        return absent(file)
    reason = str(err).splitlines()[-1]
    if "read error" in reason:
        return f"truncated: its {file.stat().st_size:,} bytes end before the index does"
    return reason


def absent(file: Path) -> str:
    """How a listed FAISS file is not there, for a message: missing, or a directory in its place."""
    return "a directory, not a file" if file.is_dir() else "missing"


def problems(path: Path) -> list[str]:
    """What would keep a reader from opening the FAISS index of a datastore directory (`bertknn verify`): damaged
    settings, a listed part missing (or a directory in its place), or a FAISS file that FAISS cannot read (read whole
    up to `READ_CHECK` bytes; a larger one is only checked for being empty: its checksums cover the rest)."""
    try:
        settings = read_settings(path)
    except DatastoreError as err:
        return [str(err)]
    if settings is None:
        return []
    try:
        with Datastore(path, check=False) as store:
            listed = store.parts(KIND)
    except DatastoreError:  # SQLite itself is damaged: `verify` names it
        return []
    if listed == []:  # settings but no part committed yet: an index being built (or interrupted), not damage
        return []
    names = [INDEX_FILE, *(name for _, _, name in deltas(path))] if listed is None else [p.name for p in listed]
    missing = [path / name for name in names if not (path / name).is_file()]
    if missing:
        return [f"{missing[0]} is {absent(missing[0])} (its settings, {SETTINGS_FILE}, are there): {repair_hint(path)}"]
    found = []
    for file in [*(path / name for name in names), path / TRAINED_FILE]:
        size = file.stat().st_size if file.is_file() else None
        if file.is_dir():
            found.append(f"{file} is {absent(file)}: {repair_hint(path)}")
        elif size == 0:
            found.append(f"{file} is empty: {repair_hint(path)}")
        elif size is not None and size <= READ_CHECK:
            try:
                faiss.read_index(str(file))
            except RuntimeError as err:
                found.append(f"{file} is damaged ({unreadable(file, err)}): {repair_hint(path)}")
    return found


def writer_settings(store: Datastore) -> dict | None:
    """faiss.json as its writer reads it: one left unreadable by an interrupted writer (it dropped the file's
    checksums before writing it in place, as bertknn did before writing it whole) counts as none, so a rerun of
    `bertknn index` builds the index again; a checksummed one that is damaged stays an error."""
    try:
        return read_settings(store.path)
    except DatastoreError:
        if SETTINGS_FILE in Checksums(store.path).files:
            raise
        return None


def read_part(store: Datastore, name: str = INDEX_FILE) -> faiss.Index:
    """One FAISS file of a datastore; DatastoreError naming the file when it is damaged."""
    rebuild = repair_hint(store.path)
    if store.faiss_damage:
        raise DatastoreError(
            f"{store.path / store.faiss_damage[0].file} is damaged ({store.faiss_damage[0].problem}); {rebuild}"
        )
    try:
        index = faiss.read_index(str(store.path / name))
    except RuntimeError as err:
        if not (store.path / name).exists():
            raise FileNotFoundError(store.path / name) from None
        raise DatastoreError(
            f"{store.path / name} is damaged ({unreadable(store.path / name, err)}); {rebuild}"
        ) from None
    if index.d != store.dim:
        raise DatastoreError(
            f"{store.path / name} does not fit the datastore (keys of width {index.d}, the store's are {store.dim}); "
            f"{rebuild}"
        )
    return index


def deltas(path: Path) -> list[tuple[int, int, str]]:
    """The added parts on disk as (first entry, end, file name), in entry order, larger ranges first."""
    found = []
    for file in path.glob(f"{DELTA_PREFIX}*.index"):
        first, _, end = file.stem[len(DELTA_PREFIX) :].partition("_")
        if first.isdigit() and end.isdigit():
            found.append((int(first), int(end), file.name))
    return sorted(found, key=lambda d: (d[0], -d[1]))


def delta_name(first: int, end: int) -> str:
    return f"{DELTA_PREFIX}{first:012d}_{end:012d}.index"


def save(index: faiss.Index, store: Datastore, name: str = INDEX_FILE) -> None:
    """Write the index whole (`atomic.write_file`: FAISS's own file writer does not report a full disk)."""
    atomic.write_file(
        store.path / name,
        lambda handle: faiss.write_index(index, faiss.PyCallbackIOWriter(handle.write)),
        before_rename=partial(_replacing, store, name),
    )


def _replacing(store: Datastore, name: str) -> None:
    """Before a FAISS file is written in place: its checksums dropped (so an interrupted rewrite is not taken for
    damage), and a directory standing in its place deleted (damage no reader can open; a rename cannot replace it)."""
    store.writer.rewriting(name)
    if (store.path / name).is_dir() and not (store.path / name).is_symlink():
        shutil.rmtree(store.path / name)


def delete(store: Datastore, name: str) -> None:
    """Delete a FAISS file of the store (or a directory in its place), its checksums dropped first (so its absence is
    not taken for damage)."""
    _replacing(store, name)
    (store.path / name).unlink(missing_ok=True)


def listing(store: Datastore) -> list[Part]:
    """The parts of a datastore made before its parts were committed, from its directory: faiss.index and the added
    parts that follow it (faiss.index is read for its size only when added parts follow it; a damaged one is listed
    as it is, for its readers to report). A writer commits this list once (`build.writer`)."""
    if not (store.path / INDEX_FILE).is_file():
        return []
    listed = [Part(INDEX_FILE, 0, -1)]
    for first, stop, name in deltas(store.path):
        if listed[-1].stop < 0:
            try:
                listed[0] = Part(INDEX_FILE, 0, int(read_part(store).ntotal))
            except DatastoreError:
                return listed
        if first == listed[-1].stop:  # else replaced by a merge that was not cleaned up
            listed.append(Part(name, first, stop))
    return listed


def on_disk(path: Path) -> list[str]:
    """The FAISS parts in a datastore directory, listed or not (a directory in the place of one included)."""
    return ([INDEX_FILE] if (path / INDEX_FILE).exists() else []) + [name for _, _, name in deltas(path)]


def retire(store: Datastore) -> list[str]:
    """Delete the FAISS parts that the committed list does not name (`parts.retire`)."""
    return parts.retire(store, KIND, on_disk(store.path), partial(delete, store))


def complete_settings(settings: object) -> dict | None:
    """Settings as `bertknn index` writes them (factory, train_size, nprobe, seed), or None when they are not."""
    if not isinstance(settings, dict):
        return None
    factory, train_size = settings.get("factory"), settings.get("train_size")
    nprobe, seed = settings.get("nprobe"), settings.get("seed", 0)
    ints = [value for value in (nprobe, seed, train_size) if value is not None]
    if not isinstance(factory, str) or nprobe is None or not all(type(value) is int for value in ints):
        return None
    return {"factory": factory, "train_size": train_size, "nprobe": nprobe, "seed": seed}


FROM_FILE, FROM_COPY, FROM_DEFAULTS = SETTINGS_FILE, "store.sqlite", "defaults"  # where `rebuild_settings` found them


def rebuild_settings(store: Datastore, damaged: bool) -> tuple[dict, str]:
    """The settings to build a damaged FAISS index again with (`bertknn repair`), and where they come from: faiss.json
    (FROM_FILE) unless it is `damaged` or unreadable, else the copy SQLite keeps of it (FROM_COPY), else the defaults
    of `bertknn index` (FROM_DEFAULTS)."""
    if not damaged:
        with contextlib.suppress(DatastoreError):
            settings = complete_settings(read_settings(store.path))
            if settings is not None:
                return settings, FROM_FILE
    with contextlib.suppress(ValueError):  # JSON errors included
        settings = complete_settings(json.loads(store.read_meta(SETTINGS_COPY) or "null"))
        if settings is not None:
            return settings, FROM_COPY
    defaults = {"factory": auto_factory(store.size, store.dim), "train_size": None, "nprobe": NPROBE, "seed": 0}
    return defaults, FROM_DEFAULTS


def sound_trained(store: Datastore) -> faiss.Index | None:
    """The trained, empty index in faiss_trained.index, or None when it is missing, unreadable or does not fit the
    store (the caller also leaves it out when its checksums found it damaged)."""
    file = store.path / TRAINED_FILE
    if not file.is_file():
        return None
    try:
        index = faiss.read_index(str(file))
    except RuntimeError:
        return None
    return index if index.d == store.dim and index.is_trained and index.ntotal == 0 else None


def write_settings(store: Datastore, settings: dict) -> None:
    """Write faiss.json whole, and the copy SQLite keeps of it (for the writer: its checksums are dropped first)."""
    _replacing(store, SETTINGS_FILE)
    atomic.write_json(store.path / SETTINGS_FILE, settings)
    store.writer.write_meta(SETTINGS_COPY, json.dumps(settings))
