"""Checksums of a datastore's files, per block, so that damage is found and located (`bertknn verify`).

checksums.json records, for each data file, its checked length and a blake2b-128 digest of every block of
`block_size` bytes (the last one may be shorter). Blocks are hashed by a thread pool (hashlib releases the GIL), so a
large store is checked in parallel, and one block can be re-checked alone. Append-only files (keys, values) are extended
by hashing only their new tail; SQLite, rewritten in place a page at a time, is checked in smaller blocks
(`block_size`) and its commits hash again only the blocks holding the pages they wrote (`update`, wal.py); files
rewritten whole (FAISS, IR segments) are hashed again when their writer finishes. Storage only: nothing here knows the
model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bertknn.store import descriptors
from bertknn.store.atomic import write_json
from bertknn.store.lock import LOCK_FILE

CHECKSUMS = "checksums.json"
ALGORITHM = "blake2b-128"
BLOCK = 16 << 20  # bytes per checksum block: a 1 TB store has ~65k of them
PAGED_BLOCK = 1 << 20  # SQLite's: a commit's pages lie scattered over its B-trees, a block hashed again for each


def block_size(name: str) -> int:
    """The bytes per checksum block of a datastore's file: smaller for SQLite, whose commits rewrite pages in place."""
    return PAGED_BLOCK if name.endswith(".sqlite") else BLOCK


class ChecksumError(ValueError):
    """checksums.json itself is unreadable."""


@dataclass(frozen=True)
class Damage:
    """One block of one file that does not match its checksum (or a file that is missing or short)."""

    file: str
    block: int | None  # None: the whole file (missing or shorter than recorded)
    problem: str
    size: int | None = field(default=None, compare=False)  # the file's bytes per block (None: BLOCK)

    def __str__(self) -> str:
        if self.block is None:
            return f"{self.file}: {self.problem}"
        size = self.size or BLOCK
        start = self.block * size
        return f"{self.file} block {self.block} (bytes {start:,}-{start + size - 1:,}): {self.problem}"


def _digest(path: Path, block: int, length: int, size: int | None = None) -> str:
    """blake2b-128 of bytes [block * size, min((block + 1) * size, length)) of a file (size: BLOCK if None)."""
    size = size or BLOCK
    start = block * size
    if path.name.endswith(".sqlite"):  # never a descriptor of it closed: SQLite's locks would go with it
        data = descriptors.read(path, start, min(size, length - start))
    else:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(min(size, length - start))
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)))


def _hash_blocks(path: Path, length: int, blocks: Iterable[int], size: int | None = None) -> list[str]:
    """Digests of the given blocks of the first `length` bytes of a file, in parallel."""
    with _pool() as pool:
        return list(pool.map(lambda b: _digest(path, b, length, size), blocks))


def _count(length: int, size: int) -> int:
    return -(-length // size)


class Checksums:
    """The checksums.json of a datastore directory: {file: {"length": bytes, "blocks": [digest, ...]}}. Files
    checked in blocks of another size (SQLite's) are kept apart, under "paged", with their "block": a reader made
    before them takes them for files not yet checksummed rather than reading them in the wrong blocks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, dict] = {}
        self.meta: dict[str, object] = {}  # e.g. the SQLite generation the store.sqlite record belongs to
        file = directory / CHECKSUMS
        if file.is_file():
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
                if data.get("algorithm") != ALGORITHM or data.get("block") != BLOCK:
                    raise ValueError(f"made with {data.get('algorithm')} blocks of {data.get('block')} bytes")
                self.files = dict(data["files"]) | dict(data.get("paged", {}))
                self.meta = dict(data.get("meta", {}))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise ChecksumError(f"{file} is damaged ({err}); `bertknn verify --record` rewrites it") from None

    def save(self) -> None:
        """Write checksums.json atomically."""
        paged = {name: record for name, record in self.files.items() if "block" in record}
        files = {name: record for name, record in self.files.items() if name not in paged}
        data = {"algorithm": ALGORITHM, "block": BLOCK, "meta": self.meta, "files": files, "paged": paged}
        write_json(self.directory / CHECKSUMS, data, indent=None)

    def record(self, name: str, length: int | None = None) -> None:
        """Hash a file whole (or its first `length` bytes) and record it."""
        path, size = self.directory / name, block_size(name)
        length = path.stat().st_size if length is None else length
        self._put(name, length, _hash_blocks(path, length, range(_count(length, size)), size))

    def _put(self, name: str, length: int, blocks: list[str]) -> None:
        size = block_size(name)
        self.files[name] = {"length": length, "blocks": blocks, **({"block": size} if size != BLOCK else {})}

    def update(self, name: str, blocks: Iterable[int]) -> None:
        """Record a file rewritten in place anew, hashing only `blocks` (those a writer changed) and those from its
        recorded end (or its new end, if shorter) on; the whole file where its record has another block size."""
        known, size = self.files.get(name), block_size(name)
        if known is None or known.get("block", BLOCK) != size:
            self.record(name)
            return
        length = (self.directory / name).stat().st_size
        count = _count(length, size)
        redo = sorted({b for b in blocks if 0 <= b < count} | set(range(min(known["length"], length) // size, count)))
        digests = (known["blocks"] + [""] * count)[:count]
        for block, digest in zip(redo, _hash_blocks(self.directory / name, length, redo, size)):
            digests[block] = digest
        self._put(name, length, digests)

    def extend(self, name: str, length: int) -> None:
        """Record an append-only file up to `length` bytes, hashing only blocks past the last full one recorded."""
        known = self.files.get(name)
        if known is None or known["length"] > length:
            self.record(name, length)
            return
        full = known["length"] // BLOCK
        if known["length"] % BLOCK and _digest(self.directory / name, full, known["length"]) != known["blocks"][full]:
            raise ChecksumError(f"{self.directory / name}: {Damage(name, full, 'checksum mismatch')}; `bertknn verify`")
        tail = _hash_blocks(self.directory / name, length, range(full, _count(length, BLOCK)))
        blocks = known["blocks"][:full] + tail
        self.files[name] = {"length": length, "blocks": blocks}

    def forget(self, names: Iterable[str]) -> None:
        """Drop the records of files that no longer exist or are about to be rewritten."""
        for name in names:
            self.files.pop(name, None)

    def _dropped(self, name: str) -> bool:
        """True when a writer dropped the file's record since this checksums.json was read: it deleted the file on
        purpose (a merge of index parts drops their records, then deletes them), so its absence is not damage."""
        return name not in Checksums(self.directory).files

    def verify(
        self,
        names: Iterable[str] | None = None,
        sample: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        seed: int | None = None,
        growing: Iterable[str] = (),
        only: Iterable[Damage] | None = None,
    ) -> list[Damage]:
        """Check recorded files (all, or `names`): every block, or `sample` random blocks plus each file's last one.

        `progress(done, total)` is called as blocks are checked. A file of another length than recorded is damage,
        except that the files named in `growing` (append-only) may be longer: their uncommitted tail is not checked.
        `only`: look again at damage found before (those files' lengths and those blocks).
        """
        growing = set(growing)
        if only is not None:
            only = list(only)
            names = {d.file for d in only} & set(names if names is not None else self.files)
        damage, jobs = [], []
        for name in sorted(self.files if names is None else set(names) & set(self.files)):
            record = self.files[name]
            path = self.directory / name
            have = path.stat().st_size if path.is_file() else None
            if have is None and self._dropped(name):
                continue
            if have is None or have < record["length"] or (have > record["length"] and name not in growing):
                problem = "missing" if have is None else f"{have:,} bytes, {record['length']:,} recorded"
                damage.append(Damage(name, None, problem))
                continue
            jobs += [(name, b) for b in range(len(record["blocks"]))]
        if only is not None:
            jobs = [job for job in jobs if job in {(d.file, d.block) for d in only}]
        elif sample is not None and len(jobs) > sample:
            last = {name: (name, len(self.files[name]["blocks"]) - 1) for name, _ in jobs}
            picked = random.Random(seed).sample(jobs, sample)
            jobs = sorted(set(picked) | set(last.values()))
        total, done = len(jobs), 0

        def check(job: tuple[str, int]) -> Damage | None:
            name, block = job
            record = self.files[name]
            size = record.get("block", BLOCK)
            try:
                if _digest(self.directory / name, block, record["length"], size) != record["blocks"][block]:
                    return Damage(name, block, "checksum mismatch", size)
            except FileNotFoundError:
                return None if self._dropped(name) else Damage(name, None, "missing")
            return None

        with _pool() as pool:
            for found in pool.map(check, jobs):
                done += 1
                if found:
                    damage.append(found)
                if progress and (done % 64 == 0 or done == total):
                    progress(done, total)
        return damage


def seal(sums: Checksums, files: Iterable[str], **meta: object) -> None:
    """Record what a writer left: the files among `files` not recorded yet (new, or dropped by `forget` before their
    rewrite), the records of files gone dropped, and `meta` kept with them. A file recorded before is never recorded
    again here, so damage stays visible (a file rewritten in place is recorded anew by its writer: `update`)."""
    sums.meta.update(meta)
    on_disk = set(files)
    sums.forget(set(sums.files) - on_disk)
    for name in sorted(on_disk - set(sums.files)):
        sums.record(name)
    sums.save()


INDEX_PREFIXES = ("faiss", "tfidf")  # the indexes' files (index/): made from the documents and keys kept here


def is_index_file(name: str) -> bool:
    """Whether a file of a datastore (its name relative to the datastore) belongs to an index: the TF-IDF segments
    and the FAISS files, which `bertknn repair` rebuilds from what the store keeps."""
    return name.startswith(INDEX_PREFIXES)


def damage_message(path: Path, damage: list) -> str:
    """A datastore's damage as one message: what is damaged, and the command that mends it or what to restore."""
    shown = "; ".join(str(d) for d in damage[:5]) + (f"; and {len(damage) - 5} more" if len(damage) > 5 else "")
    if all(is_index_file(d.file) for d in damage):
        return f"{path} is damaged: {shown}. These are index files: `bertknn repair {path}` rebuilds them"
    return (
        f"{path} is damaged: {shown}. `bertknn verify {path}` checks every block; restore the damaged files from a "
        f"copy, or rebuild the datastore (`bertknn repair {path}` rebuilds damaged index files and says what else a "
        "rebuild needs)"
    )


NOT_DATA = {"manifest.json", "checksums.json", LOCK_FILE}  # files of a datastore that checksums do not cover


def data_files(path: Path) -> list[str]:
    """The files of a datastore directory that checksums cover (relative names), temporary files excluded."""
    return sorted(
        str(file.relative_to(path))
        for file in [*path.iterdir(), *path.glob("tfidf_add_*/*")]
        if file.is_file()
        and file.name not in NOT_DATA
        and not file.name.endswith((".tmp", "-wal", "-shm", "-journal"))  # SQLite's own: the log, its index
        and not file.parent.name.endswith(".tmp")
    )
