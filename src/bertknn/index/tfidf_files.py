"""The TF-IDF index's files in a datastore directory: segments of documents (the base segment in the directory
itself, added and merged ones in `tfidf_add_*` folders), each four .npy arrays and tfidf_ndocs.txt; reading them
(memory-mapped, their shapes checked), the list of segments a datastore made before its parts were committed has on
disk, deleting those no list names, and merging runs of them (`compact`, streaming by hash range). The index itself
is retrieval.py."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from tokenize import TokenError

import numpy as np

from bertknn.index import parts
from bertknn.index.merging import FACTOR, merge_plan
from bertknn.store import atomic
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.records import Part

NUM_BUCKETS = 2**24  # the hashed features' space
FILES = ("tfidf_hashes.npy", "tfidf_indptr.npy", "tfidf_docs.npy", "tfidf_logtf.npy")
SEGMENT_PREFIX = "tfidf_add_"
NDOCS = "tfidf_ndocs.txt"
KIND = "tfidf"  # the IR index's parts in the datastore's commit point
OPENED_SEGMENTS = 128  # segments kept open by the files they are (`open_part`): a large store lists a few dozen
BASE = "."  # the name of the segment from document 0 written in the datastore directory itself
MERGE_CHUNK = 1 << 22  # entries a merge holds in memory at a time (about 100 MB)


@dataclass(frozen=True)
class Segment:
    """log1p(count) per (feature, document) for a run of documents, column-wise: feature -> documents."""

    hashes: np.ndarray  # uint32, sorted: the features that occur
    indptr: np.ndarray  # int64, column c holds docs[indptr[c]:indptr[c + 1]]
    docs: np.ndarray  # int32 document indices (absolute)
    logtf: np.ndarray  # float32
    offset: int = 0  # added to `docs`: the documents of the shards before this one's (a sharded datastore)

    def lookup(self, qh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(column of each query feature, whether the segment has it)."""
        if not len(self.hashes):
            return np.zeros(len(qh), np.int64), np.zeros(len(qh), bool)
        qh = qh.astype(self.hashes.dtype)  # another dtype would convert (copy) the whole column list per query
        cols = np.minimum(np.searchsorted(self.hashes, qh), len(self.hashes) - 1)
        return cols, self.hashes[cols] == qh


def repair_hint(part: Path) -> str:
    """What to do about a damaged segment (`part`: its folder, or the datastore directory for the base)."""
    directory = part.parent if part.name.startswith(SEGMENT_PREFIX) else part
    return f"`bertknn repair {directory}` rebuilds it from the stored documents (`bertknn verify` checks the store)"


def load_segment(part: Path) -> Segment:
    """A segment's arrays, memory-mapped and checked for the shapes that make them one index."""
    arrays = []
    for name in FILES:
        try:
            arrays.append(np.load(part / name, mmap_mode="r"))
        # numpy's header parser raises TokenError or SyntaxError, not ValueError, for some damaged headers
        except (ValueError, OSError, EOFError, TokenError, SyntaxError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise DatastoreError(f"{part / name} is damaged ({err}); {repair_hint(part)}") from None
    segment = Segment(*arrays)
    ok = (
        segment.hashes.ndim == segment.indptr.ndim == segment.docs.ndim == segment.logtf.ndim == 1
        and len(segment.indptr) == len(segment.hashes) + 1
        and len(segment.docs) == len(segment.logtf)
        and (len(segment.indptr) == 0 or segment.indptr[-1] == len(segment.docs))
    )
    if not ok:
        raise DatastoreError(f"the IR index in {part} is damaged (its arrays do not fit together); {repair_hint(part)}")
    return segment


@dataclass(frozen=True)
class _Found:
    """A segment found by listing the directory (a datastore made before its parts were committed): the directory
    itself (the base, from document 0) or a segment folder, `tfidf_add_{first}` (its end in tfidf_ndocs.txt) or,
    made by a merge, `tfidf_add_{first}_{end}`."""

    path: Path
    first: int
    end: int | None  # None: read from tfidf_ndocs.txt

    @property
    def files(self) -> list[Path]:
        return [self.path / name for name in (*FILES, NDOCS)]

    def read_end(self) -> int:
        """The document after the last this part indexes."""
        if self.end is not None:
            return self.end
        try:
            return int((self.path / NDOCS).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} has no IR index ({NDOCS} missing): rerun `bertknn build`") from None
        except (ValueError, UnicodeDecodeError):
            raise DatastoreError(f"{self.path / NDOCS} is damaged; {repair_hint(self.path)}") from None


def _found(directory: Path) -> list[_Found]:
    """The segments on disk (half-written `.tmp` folders skipped), in document order, larger ranges first."""
    parts = [_Found(directory, 0, None)] if any((directory / n).exists() for n in (*FILES, NDOCS)) else []
    for folder in directory.glob(f"{SEGMENT_PREFIX}*"):
        bounds = folder.name[len(SEGMENT_PREFIX) :].split("_")
        if folder.is_dir() and all(b.isdigit() for b in bounds) and len(bounds) in (1, 2):
            parts.append(_Found(folder, int(bounds[0]), int(bounds[1]) if len(bounds) == 2 else None))
    return sorted(parts, key=lambda p: (p.first, -(p.end or 0), p.path != directory))


def listing(directory: Path) -> list[Part]:
    """The parts of a datastore made before its parts were committed, from its directory: those that index
    documents 0.. without overlap (a merged segment before the segments it replaced; what a gap cuts off is not
    read). A writer commits this list once (`build.writer`), readers of such a store use it until then."""
    chosen, pos = [], 0
    for part in _found(directory):
        if part.first == pos:
            pos = part.read_end()
            chosen.append(Part(BASE if part.path == directory else part.path.name, part.first, pos))
    return chosen


def on_disk(directory: Path) -> list[str]:
    """The names of the segments on disk, listed or not (for `retire`: half-written `.tmp` folders excluded)."""
    return [
        BASE if part.path == directory else part.path.name
        for part in _found(directory)
        if not part.path.name.endswith(atomic.TMP)
    ]


def is_written(directory: Path, part: Part) -> bool:
    """Whether a listed segment's files are there (tfidf_ndocs.txt is written last)."""
    return (segment_path(directory, part.name) / NDOCS).is_file()


def top_names(listed: list[Part]) -> list[str]:
    """The files and folders of the datastore directory that hold the listed segments (what a copy takes)."""
    return [name for part in listed for name in ([*FILES, NDOCS] if part.name == BASE else [part.name])]


def segment_path(directory: Path, name: str) -> Path:
    return directory if name == BASE else directory / name


def part_files(name: str) -> list[str]:
    """A segment's files relative to the datastore."""
    return [*FILES, NDOCS] if name == BASE else [f"{name}/{file}" for file in (*FILES, NDOCS)]


def delete(store: Datastore, name: str) -> None:
    """Delete a segment no list names, its checksums dropped first (so its absence is not taken for damage)."""
    store.writer.rewriting(*part_files(name))
    if name == BASE:
        for file in part_files(BASE):
            (store.path / file).unlink(missing_ok=True)
    else:
        shutil.rmtree(store.path / name, ignore_errors=True)


def retire(store: Datastore) -> list[str]:
    """Delete the segments that the committed list does not name (`parts.retire`)."""
    return parts.retire(store, KIND, on_disk(store.path), partial(delete, store))


def folder_name(first: int, end: int | None = None) -> str:
    """The name of a segment folder: `tfidf_add_{first}` (an added segment), `tfidf_add_{first}_{end}` (a merge)."""
    return f"{SEGMENT_PREFIX}{first:09d}" + ("" if end is None else f"_{end:09d}")


def open_part(directory: Path, part: Part, kept: bool = True) -> Segment:
    """One listed segment, checked to be whole and to index the documents it is listed for. A segment is written
    whole and never changed after (a merge or a repair writes new files), so one already opened with the same files
    (`_file_ids`) is given again (`kept`): an add, the reader that takes it in and a service's next request do not
    open every segment anew. Without `kept` (a search for damage), it is read from its files."""
    path = segment_path(directory, part.name)
    files = _Found(path, part.first, None).files
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{path} has no IR index ({', '.join(missing)} missing): {repair_hint(path)}")
    try:
        ids = _file_ids(files)
    except FileNotFoundError:  # deleted since (a merge retired it): opened as usual, which names what is missing
        ids = None
    return _opened(path, part.first, part.stop, ids) if ids and kept else _open(path, part.first, part.stop)


def _file_ids(files: list[Path]) -> tuple[tuple[int, int, int, int], ...]:
    """Which files these are: device, inode, size and modification time of each (a rewrite changes them)."""
    return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in (f.stat() for f in files))


@functools.lru_cache(maxsize=OPENED_SEGMENTS)
def _opened(path: Path, first: int, stop: int, ids: tuple) -> Segment:
    """`_open`, kept for the same files (`ids`); an error is not kept."""
    return _open(path, first, stop)


def _open(path: Path, first: int, stop: int) -> Segment:
    """The segment at `path`, checked to index documents first..stop."""
    if _Found(path, first, None).read_end() != stop:
        raise DatastoreError(
            f"the IR index segment {path} does not index documents {first}..{stop}; {repair_hint(path)}"
        )
    return load_segment(path)


def listed(store: Datastore) -> list[Part]:
    """The segments readers open: the committed list, or in a datastore made before lists, the `listing` of its
    directory (none where that cannot be read)."""
    committed = store.parts(KIND)
    if committed is not None:
        return committed
    try:
        return listing(store.path)
    except (FileNotFoundError, DatastoreError):
        return []


def write_merged(segments: list[Segment], out: Path, n_docs: int, chunk_entries: int) -> None:
    """One segment from segments of consecutive documents, written into `out` in hash ranges of about
    `chunk_entries` entries, so memory is bounded by a range, not by the merged size."""
    mark = np.zeros(NUM_BUCKETS, bool)
    for seg in segments:
        mark[np.asarray(seg.hashes)] = True
    hashes = np.flatnonzero(mark).astype(np.uint32)
    del mark
    total = sum(len(seg.docs) for seg in segments)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_file(out / FILES[0], partial(np.save, arr=hashes))
    indptr = atomic.new_npy(out / FILES[1], np.int64, len(hashes) + 1)
    docs = atomic.new_npy(out / FILES[2], np.int32, total)
    logtf = atomic.new_npy(out / FILES[3], np.float32, total)
    indptr[0] = pos = 0
    bounds = np.linspace(0, len(hashes), max(1, -(-total // chunk_entries)) + 1).astype(np.int64)
    for a, b in pairwise(bounds):
        if a == b:
            continue
        cols = hashes[a:b]
        counts = np.zeros(len(cols), np.int64)
        parts_docs, parts_tf, parts_col = [], [], []
        for seg in segments:
            lo, hi = np.searchsorted(seg.hashes, [cols[0], cols[-1] + 1])
            if lo == hi:
                continue
            where = np.searchsorted(cols, seg.hashes[lo:hi])
            lengths = np.diff(seg.indptr[lo : hi + 1])
            counts[where] += lengths
            e0, e1 = seg.indptr[lo], seg.indptr[hi]
            parts_docs.append(seg.docs[e0:e1])
            parts_tf.append(seg.logtf[e0:e1])
            parts_col.append(np.repeat(where, lengths))
        order = np.argsort(np.concatenate(parts_col), kind="stable")  # segments in document order: docs stay sorted
        n = int(counts.sum())
        docs[pos : pos + n] = np.concatenate(parts_docs)[order]
        logtf[pos : pos + n] = np.concatenate(parts_tf)[order]
        indptr[a + 1 : b + 1] = pos + np.cumsum(counts)
        pos += n
    for array in (indptr, docs, logtf):
        array.flush()
    del indptr, docs, logtf
    atomic.write_text(out / NDOCS, str(n_docs))


def compact(
    directory: Path,
    listed: list[Part],
    forget: Callable[[list[str]], None] = lambda names: None,
    factor: int = FACTOR,
    chunk_entries: int = MERGE_CHUNK,
) -> list[Part]:
    """Merge runs of the segments `listed` as `merge_plan` says; return the list with each run replaced by its
    merge. For the writer of the datastore, who commits the list (`DatastoreWriter.commit_parts`, or `publish` with the
    documents it indexes) and then `retire`s what it replaced: each merged segment is written whole (a `.tmp` folder
    renamed) under a name no list holds, so readers never wait and a crash leaves the committed index as it was.
    `forget` (the store's `rewriting`) is told the files about to be written anew.
    """
    atomic.remove_temporary(directory, f"{SEGMENT_PREFIX}*")
    listed = list(listed)
    while (run := merge_plan([p.stop - p.first for p in listed], factor)) is not None:
        picked = listed[run[0] : run[1]]
        merged = Part(folder_name(picked[0].first, picked[-1].stop), picked[0].first, picked[-1].stop)
        forget(part_files(merged.name))  # a leftover of an interrupted merge is written anew
        tmp = atomic.new_folder(directory / merged.name)
        segments = [load_segment(segment_path(directory, part.name)) for part in picked]
        write_merged(segments, tmp, merged.stop, chunk_entries)
        atomic.publish(tmp, directory / merged.name)
        listed[run[0] : run[1]] = [merged]
    return listed
