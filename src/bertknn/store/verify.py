"""`bertknn verify`: every check of a datastore that needs no model, beside the checksums it compares (integrity.py):
the manifest, SQLite's own integrity check, every checksum block, keys and entry ranges, and the indexes' own checks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertknn.store import names
from bertknn.store.datastore import (
    APPEND_ONLY,
    COUNTS,
    SQLITE,
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
    if SQLITE in sums.files and sums.meta.get("sqlite_changes") != store.sqlite_changes():
        report.notes.append(
            f"{SQLITE} was committed to after its checksums were recorded (an interrupted writer); "
            "its blocks were checked by SQLite's integrity check only"
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
        finite = np.isfinite(store.keys[start : start + rows]).all(axis=1)
        if not finite.all():
            bad = (start + np.flatnonzero(~finite))[:5].tolist()
            problems.append(f"{store.path / store.keys_file()[0]}: entries {bad} hold non-finite values")
        values = np.asarray(store.values[start : start + rows], np.int64)
        unknown = (values < 0) | ((values >= first) & ~np.isin(values, lexicon))
        bad = (start + np.flatnonzero(unknown))[:5].tolist()
        if bad:
            problems.append(f"{store.path / 'values.i32'}: entries {bad} hold values that are no word of the store")
        counts = store.counts_of(np.arange(start, min(start + rows, store.size)))
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


def _evidence_problems(store: Datastore, sample: int = EVIDENCE_SAMPLE) -> list[str]:
    """In a store with evidence vectors (evidence.py): references that do not add up to the texts of the entries
    not removed (a remove releases its entries'; those of an add not yet published count), vectors of another size
    than the others, and, of `sample` such entries drawn at random (all of a smaller store), those whose texts have no
    vector."""
    if not store.evidence.model:
        return []
    live = np.arange(store.size)
    with store.sqlite_errors():
        removed = [r[0] for r in store.db.execute("SELECT idx FROM documents WHERE state = 'removed'")]
    live = live[~np.isin(store.documents.of(live), removed)] if removed and len(live) else live
    problems, where = [], store.path / SQLITE
    refs, sizes = 0, {}
    with store.sqlite_errors():
        if exists(store.db):  # the first writer makes the table
            refs = store.db.execute("SELECT coalesce(sum(refs), 0) FROM evidence").fetchone()[0]
            sizes = dict(store.db.execute("SELECT length(vector), count(*) FROM evidence GROUP BY 1").fetchall())
    if refs != VIEWS * len(live):
        problems.append(f"{where}: the evidence vectors count {refs:,} references, not {VIEWS * len(live):,}")
    if len(sizes) > 1:  # every vector of a store has one size: the sentence encoder's width, and its scale
        usual = max(sizes, key=sizes.get)
        problems.append(f"{where}: {sum(sizes.values()) - sizes[usual]:,} evidence vectors have the wrong size")
    chosen = np.sort(np.random.default_rng(0).choice(live, sample, replace=False)) if len(live) > sample else live
    ids = store.evidence.ids(chosen.tolist())
    lacking = chosen[~np.isin(ids, list(store.evidence.held(ids.ravel().tolist()))).all(axis=1)]
    if len(lacking):
        problems.append(
            f"{where}: {len(lacking):,} of {len(chosen):,} entries checked lack their evidence vectors (the first: "
            f"entry {lacking[0]}); rebuild the datastore, or restore it from a copy"
        )
    return problems


def record_checksums(path: str | Path) -> None:
    """Record the checksums of a datastore's files as they are now (for a store made before checksums existed, or
    after restoring files from a copy): only do this for files known to be sound."""
    with open_datastore_writer(path, check_tails=False) as writer, writer.commit():
        (writer.store.path / "checksums.json").unlink(missing_ok=True)  # the commit's end records them all anew
