"""Bytes of store.sqlite read through one descriptor per file and process, kept open (checksums, its header).

POSIX drops every lock a process holds on a file when any of its descriptors of that file is closed, SQLite's own
included (https://www.sqlite.org/howtocorrupt.html, section 2.2). In WAL mode every connection holds a shared lock on
the database file while it is open, which tells another process's connection that closes that it is not the last;
were a checksum read to open and close store.sqlite, the lock of this process's readers would be gone, the other
process would take itself for the last, copy the log into the file and delete it with its shared memory, and the
readers here would go on reading the commit they knew. So store.sqlite is read with `os.pread` through a descriptor
opened once per file (device and inode) and not closed while the file exists; those of deleted files are closed when
the next one is opened.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_OPEN: dict[tuple[int, int], int] = {}  # (device, inode) -> a read-only descriptor
_LOCK = threading.Lock()


def _descriptor(path: Path) -> int:
    status = os.stat(path)
    key = (status.st_dev, status.st_ino)
    with _LOCK:
        if key not in _OPEN:
            for old, held in list(_OPEN.items()):
                if os.fstat(held).st_nlink == 0:  # deleted: no lock of a live file goes with it
                    os.close(_OPEN.pop(old))
            _OPEN[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return _OPEN[key]


def read(path: Path, offset: int, size: int) -> bytes:
    """`size` bytes of the file at `path` from `offset` (fewer at its end)."""
    descriptor, chunks = _descriptor(path), []
    while size > 0 and (chunk := os.pread(descriptor, size, offset)):
        chunks.append(chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    return b"".join(chunks)
