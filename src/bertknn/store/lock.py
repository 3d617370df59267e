"""The writer lock: one process writes a datastore at a time (an flock on write.lock, naming its holder), and how
long each kind of writer waits for another to finish."""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bertknn.store.manifest import DatastoreError

LOCK_FILE = "write.lock"
CLI_WAIT_S = 60.0  # a command's wait (`--wait`'s default)
SERVICE_WAIT_S = 20.0  # a service's write, before it answers 503
LAZY_WAIT_S = 600.0  # a lazy store's reader, before it embeds the documents a question needs


class BusyError(DatastoreError):
    """Another process holds the datastore's writer lock (and did not let go within the time given)."""


LOCK_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("lock_wait", default=0.0)


@contextlib.contextmanager
def lock_wait(seconds: float) -> Iterator[None]:
    """Within this block, writers wait up to `seconds` for another writer to finish (default: they fail at once)."""
    token = LOCK_WAIT.set(seconds)
    try:
        yield
    finally:
        LOCK_WAIT.reset(token)


def lock_holder(path: str | Path) -> str | None:
    """Who holds a datastore's writer lock now ("pid N (command)"), or None when nobody does."""
    file = Path(path) / LOCK_FILE
    if not file.is_file():
        return None
    with file.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return handle.read().strip() or "another process"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def acquire_lock(path: Path, wait: float):
    """The datastore's writer lock (an open, flocked file), waiting up to `wait` seconds for the holder."""
    handle = (path / LOCK_FILE).open("a+", encoding="utf-8")
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                serving = " (a writable service holds it while it runs: add through its POST /documents)"
                raise BusyError(
                    f"{path} is being written by {holder}; one writer at a time: rerun when it has finished"
                    + (serving if "serve" in holder else "")
                ) from None
            time.sleep(0.05)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} ({' '.join(os.path.basename(a) for a in sys.argv[:2])})")
    handle.flush()
    return handle
