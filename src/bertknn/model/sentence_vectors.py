"""Sentence vectors kept on disk: the sentence encoder's vectors of a datastore's evidence texts, computed ahead
(`bertknn sentences`), so that a question weighed by its sentences (`--sentence-temperature`) about documents not
asked of before embeds only its own text, not its neighbours' sentences, clauses and words.

One SQLite file in bertknn's cache directory per sentence encoder, keyed by the text itself: a stored vector is the
text's whatever the datastore, so the file serves every datastore and a removed document's rows do no harm. Each row
carries a CRC of its text and vector; a row that fails it is read as missing (embedded again), so damage costs time,
never an answer. Questions only read the file; `bertknn sentences` is its one writer (SQLite's transactions: a run
killed keeps what it committed, and a rerun skips the texts stored).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from bertknn.model.encoder import cache_dir

log = logging.getLogger(__name__)
READ_WAIT_S = 0.05  # how long a question waits for the file when a writer holds it, before embedding its texts


def default_path(model: str) -> Path:
    """The file of a sentence encoder's vectors in bertknn's cache directory."""
    name = re.sub(r"[^\w.-]+", "_", model)
    return cache_dir() / f"sentence-vectors-{name}.sqlite"


def _crc(text: str, vector: bytes) -> int:
    return zlib.crc32(vector, zlib.crc32(text.encode("utf-8")))


def _key(text: str) -> int:
    """A text's row id: 64 bits of its BLAKE2b hash (a rowid table keeps a row's vector in its page, where a table
    keyed by the text itself spills rows of this size to overflow pages)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def _keys(texts: Sequence[str]) -> str:
    return json.dumps([_key(t) for t in texts])


class StoredVectors:
    """A sentence encoder's stored vectors (`model`'s, float32) at `path`: `get` reads them, `add` writes."""

    def __init__(self, path: Path, model: str) -> None:
        self.path, self.model, self.dim = Path(path), model, 0
        self._reader: sqlite3.Connection | None = None
        self._off = False  # set when the file turned out unreadable or another encoder's: read no more
        self.damaged = 0  # rows read as missing because their CRC failed

    def _open_reader(self) -> sqlite3.Connection | None:
        if self._reader is None and not self._off and self.path.is_file():
            try:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                db = sqlite3.connect(uri, uri=True, timeout=READ_WAIT_S, check_same_thread=False)
                self._check(db)
                self._reader = db
            except (sqlite3.DatabaseError, ValueError) as err:
                self._disable(err)
        return self._reader

    def _check(self, db: sqlite3.Connection) -> None:
        """ValueError unless the file holds this encoder's vectors; their dimension read into `dim`."""
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("model") != self.model:
            raise ValueError(f"it holds the vectors of another sentence encoder, {meta.get('model')!r}")
        self.dim = int(meta["dim"])

    def _disable(self, err: Exception) -> None:
        self._off, self._reader = True, None
        log.warning("%s is not read (%s): sentence vectors are embedded as questions need them", self.path, err)

    def get(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of `texts` the file holds (none without a readable file)."""
        db = self._open_reader()
        if db is None or not texts:
            return {}
        try:
            query = "SELECT text, vector, crc FROM vectors WHERE id IN (SELECT value FROM json_each(?))"
            rows = db.execute(query, (_keys(texts),)).fetchall()
        except sqlite3.OperationalError as err:  # busy, say: this question embeds its texts, the next one reads
            log.debug("%s not read this time: %s", self.path, err)
            return {}
        except sqlite3.DatabaseError as err:
            self._disable(err)
            return {}
        found, wanted = {}, set(texts)
        for text, vector, crc in rows:
            if text not in wanted:  # another text of the same hash (never seen): this one is embedded
                continue
            if len(vector) != 4 * self.dim or _crc(text, vector) != crc:
                self.damaged += 1
                log.warning("%s: the vector of %r is damaged; embedded again", self.path, text[:60])
                continue
            found[text] = np.frombuffer(vector, np.float32)
        return found

    def put(self, vectors: dict[str, np.ndarray]) -> None:
        """Store `vectors` (text: vector, at least one) in one transaction, creating the file when there is none."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path)
        try:
            db.execute("PRAGMA page_size = 16384")  # a new file's: 10 vectors a page, where 4,096 bytes hold 2
            db.execute("PRAGMA journal_mode = WAL")  # questions read while `bertknn sentences` writes
            with db:
                db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS vectors (id INTEGER PRIMARY KEY, text TEXT NOT NULL, vector BLOB NOT "
                    "NULL, crc INTEGER NOT NULL)"
                )
                dim = len(next(iter(vectors.values())))
                db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", [("model", self.model), ("dim", str(dim))])
                self._check(db)
                if dim != self.dim:
                    raise ValueError(f"{self.path} holds vectors of {self.dim} dimensions, not {dim}")
                rows = [(t, np.asarray(v, np.float32).tobytes()) for t, v in vectors.items()]
                db.executemany(
                    "INSERT OR REPLACE INTO vectors VALUES (?, ?, ?, ?)", [(_key(t), t, b, _crc(t, b)) for t, b in rows]
                )
        except sqlite3.DatabaseError as err:  # disk full, a damaged file: the transaction is rolled back
            raise OSError(
                f"cannot store sentence vectors in {self.path} ({err}); nothing of this batch was kept"
            ) from None
        finally:
            db.close()

    def stored(self, texts: Sequence[str]) -> set[str]:
        """Those of `texts` the file holds sound (the writer's view: a rerun skips them and stores damaged ones
        again)."""
        if not self.path.is_file():
            return set()
        db = sqlite3.connect(self.path)
        try:
            query = "SELECT text, vector, crc FROM vectors WHERE id IN (SELECT value FROM json_each(?))"
            return {t for t, vector, crc in db.execute(query, (_keys(texts),)) if _crc(t, vector) == crc}
        except sqlite3.DatabaseError as err:
            raise OSError(f"{self.path} cannot be read ({err}); delete it and rerun `bertknn sentences`") from None
        finally:
            db.close()

    def add(self, texts: Iterable[str], embed: Callable[[list[str]], np.ndarray]) -> int:
        """Embed (`embed`) those of `texts` not stored yet and store them in one transaction; how many that was."""
        texts = list(dict.fromkeys(texts))
        known = self.stored(texts)
        todo = [t for t in texts if t not in known]
        if todo:
            self.put(dict(zip(todo, embed(todo))))
        return len(todo)
