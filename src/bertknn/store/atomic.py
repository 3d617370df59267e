"""Files written whole: the one way bertknn writes a file of a datastore (tests/test_atomic.py holds every other
module to it).

A file is written under a temporary name (`NAME.tmp`, which readers, checksums and `create` ignore), flushed,
fsynced, renamed over its name, and its directory fsynced: a reader, a crash (kill -9 or a power cut, on a file
system that keeps the order of fsync and rename, as ext4, xfs and btrfs do) or a full disk leaves either the old
file or the new one, never a part. A folder of files (an IR segment) is published the same way. Append-only files
(keys, values) are extended in place past their committed length, which SQLite records only after the fsync here.

Running out of space is one error, `DiskFullError`, that names the file and how many bytes the write needed; the
temporary file is removed and the old file is left as it was.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

TMP = ".tmp"
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over the file system's file size limit


class DiskFullError(OSError):
    """A write that did not fit on its file system; nothing was damaged (what was written is not in place)."""

    def __init__(self, path: Path, needed: int | None = None) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.path, self.needed = Path(path), needed

    def __str__(self) -> str:
        free = _free(self.path)
        need = f"needs {self.needed:,} bytes" if self.needed is not None else "does not fit"
        have = f", {free:,} bytes are free there" if free is not None else ""
        return (
            f"no space left for {self.path}: the write {need}{have}. Nothing was damaged: free some space, "
            "then rerun the command"
        )


def _free(path: Path) -> int | None:
    """Bytes free to this user on the file system holding `path` (None when it cannot be told)."""
    for where in (path.parent, path.parent.parent):
        try:
            stat = os.statvfs(where)
            return stat.f_bavail * stat.f_frsize
        except OSError:
            continue
    return None


def is_full(err: BaseException) -> bool:
    """True for an error that says a file system (or a quota) is full."""
    return isinstance(err, OSError) and err.errno in FULL


@contextmanager
def naming(path: Path, needed: int | None = None) -> Iterator[None]:
    """Turn an out-of-space OSError raised within into a DiskFullError naming `path`."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if is_full(err):
            raise DiskFullError(path, needed) from None
        raise


def tmp_path(path: Path) -> Path:
    """The temporary name a file or folder is written under before it is renamed into place."""
    return path.with_name(path.name + TMP)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(handle: BinaryIO, data: bytes | memoryview) -> None:
    """Write all of `data` to an unbuffered file (which may take it in parts). Unbuffered: a buffer that a full disk
    left unwritten would fail again when the file is truncated or closed, outside any handler."""
    view = memoryview(data)
    view = view.cast("B") if view.nbytes else view[:0]  # a view of no bytes cannot be cast, nor needs writing
    while view.nbytes:
        view = view[handle.write(view) :]


class _Counting:
    """A file's writer that counts what it is given: once the disk is full it keeps counting without writing, so
    the error can say how much the whole write needed."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.written, self.full = handle, 0, False

    def write(self, data: bytes | memoryview) -> int:
        size = memoryview(data).nbytes
        self.written += size
        if not self.full:
            try:
                _write_all(self.handle, data)
            except OSError as err:
                if not is_full(err):
                    raise
                self.full = True
        return size


def write_file(
    path: str | Path, write: Callable[[_Counting], object], before_rename: Callable[[], object] | None = None
) -> int:
    """Write `path` whole: `write(handle)` writes the content (handle.write takes bytes), then flush, fsync,
    `before_rename()`, rename, fsync the directory. Returns the bytes written. Out of space: DiskFullError, and
    nothing at `path` changed."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        with naming(path), tmp.open("wb", buffering=0) as raw:
            handle = _Counting(raw)
            write(handle)
            if not handle.full:
                try:
                    os.fsync(raw.fileno())
                except OSError as err:
                    if not is_full(err):
                        raise
                    handle.full = True
            if handle.full:
                raise DiskFullError(path, handle.written)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with naming(path):
        fsync_dir(path.parent)
    return handle.written


def write_bytes(path: str | Path, data: bytes) -> int:
    """`write_file` of bytes."""
    return write_file(path, lambda handle: handle.write(data))


def write_text(path: str | Path, text: str) -> int:
    """`write_file` of UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: object, indent: int | None = 2) -> int:
    """`write_file` of JSON."""
    return write_text(path, json.dumps(obj, indent=indent))


def append(path: str | Path, offset: int, data: bytes | memoryview) -> None:
    """Write `data` at `offset` of an append-only file (dropping whatever lay past `offset`: bytes of a write that
    was never committed), then fsync. Out of space: DiskFullError, and the file is cut back to `offset`."""
    path = Path(path)
    size = memoryview(data).nbytes
    with path.open("r+b" if path.exists() else "wb", buffering=0) as handle:
        handle.truncate(offset)
        try:
            with naming(path, size):
                handle.seek(offset)
                _write_all(handle, data)
                os.fsync(handle.fileno())
        except DiskFullError:
            handle.truncate(offset)
            raise
    if offset == 0:
        with naming(path):
            fsync_dir(path.parent)


def allocate(path: Path, size: int) -> None:
    """Reserve `size` bytes for a file that will be filled through a memory map, so that a full disk is an error
    now, not a SIGBUS when a page of the map is written back."""
    with naming(path, size):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, max(1, size))
        finally:
            os.close(fd)


def new_npy(path: Path, dtype: type, length: int) -> np.memmap:
    """A new .npy file of `length` items of `dtype`, memory-mapped for filling, its space reserved (`allocate`)
    so a full disk is an error here. For a temporary folder that will be `publish`ed."""
    with naming(path, np.dtype(dtype).itemsize * length):
        array = np.lib.format.open_memmap(path, "w+", dtype, (length,))
    allocate(path, path.stat().st_size)
    return array


def new_folder(path: Path) -> Path:
    """An empty temporary folder to fill and then `publish` as `path` (what an earlier, interrupted run left there
    is deleted first)."""
    tmp = tmp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def copy(source: Path, target: Path) -> None:
    """Copy a file or a folder into a temporary folder that will be `publish`ed."""
    with naming(target):
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)


def _sync_tree(folder: Path) -> None:
    for item in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):  # files before the folders holding them
        if item.is_dir():
            fsync_dir(item)
        else:
            with item.open("rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(folder)


def publish(folder: Path, path: Path) -> None:
    """Rename a temporary folder filled by this process to `path` (every file and folder in it fsynced first), and
    fsync the directory holding it. An existing `path` must be an empty folder, or a file."""
    _sync_tree(folder)
    os.replace(folder, path)
    fsync_dir(path.parent)


def remove_temporary(directory: Path, pattern: str = "*") -> None:
    """Delete the temporary files and folders an interrupted writer left in `directory` (matching `pattern`)."""
    for left in directory.glob(pattern + TMP):
        if left.is_dir():
            shutil.rmtree(left, ignore_errors=True)
        else:
            left.unlink(missing_ok=True)
