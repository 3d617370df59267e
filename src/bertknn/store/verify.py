"""`bertknn verify`: every check of a datastore that needs no model, beside the checksums it compares (integrity.py):
the manifest, SQLite's own integrity check, every checksum block, keys and entry ranges, and the indexes' own checks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertknn.store import names, wal
from bertknn.store.datastore import (
    APPEND_ONLY,
    COUNTS,
    SQLITE,
    VALUES,
    Datastore,
    DatastoreError,
)
from bertknn.store.evidence import VIEWS, exists
from bertknn.store.integrity import ChecksumError, Checksums, Damage, data_files
from bertknn.store.writer import open_datastore_writer

EVIDENCE_SAMPLE = 65_536  # live entries whose evidence texts `verify` looks up (the references are summed in full)


@dataclass
class Report:
    """What `verify` found: problems (damage) and notes (what could not be checked, and why)."""

    problems: list[str]
    notes: list[str]
    blocks: int = 0
    damage: list[Damage] = field(default_factory=list)  # the checksum findings among `problems`, by file and block


def verify(
    path: str | Path,
    progress: Callable[[int, int], None] | None = None,
    readers: Iterable[Callable[[Path], list[str]]] = (),
) -> Report:
    """Every check of a datastore that needs no model: manifest, SQLite's own integrity check, every checksum
    block of every file, finite keys and entry ranges, and what each of `readers` (the indexes' own checks:
    `retrieval.problems`, `faiss_files.problems`) finds. `progress(done, total)` follows the checksum blocks."""
    path = Path(path)
    try:
        store = Datastore(path, check=False)
    except DatastoreError as err:
        return Report([str(err)], [])
    report = Report([], [])
    try:
        rows = [r[0] for r in store.db.execute("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as err:  # too damaged for SQLite to check: that is the finding
        rows = [str(err)]
    if rows != ["ok"]:
        report.problems.append(f"{path / SQLITE}: {'; '.join(rows[:5])}")
    try:
        sums = Checksums(path)
    except ChecksumError as err:
        return Report([*report.problems, str(err)], [])
    if not sums.files:
        report.notes.append(
            "no checksums recorded (a datastore made before bertknn recorded them, or never "
            "finished): `bertknn verify --record` records them"
        )
    unrecorded = sorted(set(data_files(path)) - set(sums.files))
    if unrecorded:
        report.notes.append(f"not yet checksummed (written by an interrupted command): {', '.join(unrecorded[:5])}")
    if SQLITE in sums.files and not wal.as_sealed(path / SQLITE, store.db, sums.meta):
        report.notes.append(
            f"{SQLITE} was committed to after its checksums were recorded (an interrupted writer, or a reader in "
            "another process that held its log back); its blocks were checked by SQLite's integrity check only, and "
            "the next write records them"
        )
    try:
        damage = store.check(progress=progress)
    except DatastoreError:  # SQLite cannot even be read: compare every file's blocks, SQLite's included
        damage = sums.verify(progress=progress, growing=APPEND_ONLY)
    report.blocks = sum(len(r["blocks"]) for r in sums.files.values())
    report.damage = list(damage)
    report.problems += [str(d) for d in damage]
    try:
        report.problems += _entry_problems(store) + names.problems(store.db)
    except DatastoreError as err:
        report.problems.append(str(err))
    for reader in readers:
        report.problems += reader(path)
    return report


def _entry_problems(store: Datastore, rows: int = 1 << 16) -> list[str]:
    """Non-finite keys, values that are no word (negative, or a lexicon number the lexicon lacks), counts under 1 (a
    pruned store), and document ranges that point past the committed entries."""
    problems = []
    lexicon = np.asarray(list(store.lexicon.words(None)), np.int64)
    first = store.manifest.get("words_from", np.iinfo(np.int32).max)  # format 1: no lexicon
    for start in range(0, store.size, rows):
        keys, values, counts = _read_rows(store, start, min(start + rows, store.size))
        finite = np.isfinite(keys).all(axis=1)
        if not finite.all():
            bad = (start + np.flatnonzero(~finite))[:5].tolist()
            problems.append(f"{store.path / store.keys_file()[0]}: entries {bad} hold non-finite values")
        unknown = (values < 0) | ((values >= first) & ~np.isin(values, lexicon))
        bad = (start + np.flatnonzero(unknown))[:5].tolist()
        if bad:
            problems.append(f"{store.path / VALUES}: entries {bad} hold values that are no word of the store")
        if counts is not None and (counts < 1).any():
            bad = (start + np.flatnonzero(counts < 1))[:5].tolist()
            problems.append(f"{store.path / COUNTS}: entries {bad} stand for fewer than one context")
    problems += _evidence_problems(store)
    with store.sqlite_errors():
        outside = store.db.execute(
            "SELECT count(*) FROM documents WHERE start < 0 OR end > ? OR end < start", (store.size,)
        ).fetchone()[0]
    if outside:
        problems.append(f"{store.path / SQLITE}: {outside} document(s) with entry ranges outside the datastore")
    return problems


def _read(path: Path, dtype: type, width: int, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a file of `width` items of `dtype` a row, read (not mapped: no page of a file stays in
    the process once its rows are checked, so `verify`'s memory is one chunk's however large the store is)."""
    count = (stop - start) * width
    rows = np.fromfile(path, dtype, count=count, offset=start * width * np.dtype(dtype).itemsize)
    if len(rows) < count:  # shorter than committed: the checksums name it
        raise DatastoreError(f"{path} holds fewer rows than the datastore's {stop:,} entries")
    return rows.reshape(stop - start, width)


def _read_rows(store: Datastore, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The keys (decoded), values and counts (a pruned store's, else None) of entries [start, stop)."""
    name, width = store.keys_file()
    codec = store.codec
    if codec is None:
        keys = _read(store.path / name, np.float16, store.dim, start, stop)
    else:
        keys = codec.decode(_read(store.path / name, np.uint8, width, start, stop))
    values = _read(store.path / VALUES, np.int32, 1, start, stop).ravel().astype(np.int64)
    counts = _read(store.path / COUNTS, np.int32, 1, start, stop).ravel() if store.manifest.pruned else None
    return keys, values, counts


def _evidence_problems(store: Datastore, sample: int = EVIDENCE_SAMPLE) -> list[str]:
    """In a store with evidence vectors (evidence.py): references that do not add up to the texts of the entries
    not removed (a remove releases its entries'; those of an add not yet published count), vectors of another size
    than the others, and, of `sample` such entries drawn at random (all of a smaller store), those whose texts have no
    vector. Entries are counted from the documents' ranges and drawn in chunks: nothing of the store's size is held."""
    if not store.evidence.model:
        return []
    with store.sqlite_errors():
        query = "SELECT idx, start, end FROM documents WHERE state = 'removed' AND start IS NOT NULL"
        removed = store.db.execute(query).fetchall()
    live = store.size - sum(end - start for _, start, end in removed)
    problems, where = [], store.path / SQLITE
    refs, sizes = 0, {}
    with store.sqlite_errors():
        if exists(store.db):  # the first writer makes the table
            refs = store.db.execute("SELECT coalesce(sum(refs), 0) FROM evidence").fetchone()[0]
            sizes = dict(store.db.execute("SELECT length(vector), count(*) FROM evidence GROUP BY 1").fetchall())
    if refs != VIEWS * live:
        problems.append(f"{where}: the evidence vectors count {refs:,} references, not {VIEWS * live:,}")
    if len(sizes) > 1:  # every vector of a store has one size: the sentence encoder's width, and its scale
        usual = max(sizes, key=sizes.get)
        problems.append(f"{where}: {sum(sizes.values()) - sizes[usual]:,} evidence vectors have the wrong size")
    chosen = _live_sample(store, [idx for idx, _, _ in removed], sample)
    ids = store.evidence.ids(chosen.tolist())
    lacking = chosen[~np.isin(ids, list(store.evidence.held(ids.ravel().tolist()))).all(axis=1)]
    if len(lacking):
        problems.append(
            f"{where}: {len(lacking):,} of {len(chosen):,} entries checked lack their evidence vectors (the first: "
            f"entry {lacking[0]}); rebuild the datastore, or restore it from a copy"
        )
    return problems


def _live_sample(store: Datastore, removed: list[int], sample: int, rows: int = 1 << 16) -> np.ndarray:
    """Up to `sample` entries of documents not `removed`, sorted: drawn at random (seeded) from a store of more
    entries, all of a smaller one; read a chunk at a time."""
    if store.size > 2 * sample:
        picked = np.random.default_rng(0).choice(store.size, 2 * sample, replace=False)
        picked = picked[~np.isin(store.documents.of(picked), removed)] if removed else picked
        return np.sort(picked[:sample])
    kept = [
        chunk[~np.isin(store.documents.of(chunk), removed)] if removed else chunk
        for chunk in (np.arange(a, min(a + rows, store.size)) for a in range(0, store.size, rows))
    ]
    return np.concatenate(kept) if kept else np.zeros(0, np.int64)


def record_checksums(path: str | Path) -> None:
    """Record the checksums of a datastore's files as they are now (for a store made before checksums existed, or
    after restoring files from a copy): only do this for files known to be sound."""
    with open_datastore_writer(path, check_tails=False) as writer, writer.commit():
        (writer.store.path / "checksums.json").unlink(missing_ok=True)  # the commit's end records them all anew
