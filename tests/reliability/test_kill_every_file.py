"""kill -9 at random moments of `bertknn build` and `add`, then a rerun to completion: every file of the datastore
directory must equal the uninterrupted run's.

test_kill.py compares what the store holds (entries, keys, values, three tables, FAISS vectors, answers); this test
compares the directories themselves: the same file and folder names (write.lock aside) and, file by file, the same
bytes. A few files may hold other bytes for the same content, and are compared by content instead (`_compare_file`
says why for each): store.sqlite (every table's rows and the schema), checksums.json (parsed; its record of
store.sqlite must match the rerun's own store.sqlite), keys.f16 and values.i32 (the committed prefix, and no bytes
past it) and manifest.json (parsed). Where such a file's bytes differ nonetheless, the trial counts it as a note
(`bytes_differ`), not a failure. Everything else (the TF-IDF arrays, tfidf_ndocs.txt, segment folders, FAISS files)
must be byte for byte the same.

Kill delays are drawn as in test_kill.py; trials kill 1, 2 or 3 times before the final rerun. Default: 3 trials per
command; `--long`: 20, with a busy-loop process keeping one core loaded for the trials (BERTKNN_LOAD=1 adds it in
the default mode too): a loaded machine stretches the short windows between two writes.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from .conftest import Setup, committed, dim

COMMANDS = ("build", "add")
LOCK = "write.lock"
SQLITE = "store.sqlite"
BY_CONTENT = ("store.sqlite", "checksums.json", "keys.f16", "values.i32", "manifest.json")
OWN = ("store_id", "commits")  # meta rows of store.sqlite (and fields of checksums.json) that tell this store's own
PAGE = 4096  # SQLite's default page size: where two store.sqlite files first differ is reported in pages
STATS: dict[str, dict] = {}


@pytest.fixture()
def cpu_load(long):
    """One busy-loop process for the test's duration, in long mode (or with BERTKNN_LOAD=1)."""
    if not (long or os.environ.get("BERTKNN_LOAD") == "1"):
        yield False
        return
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield True
    finally:
        busy.kill()
        busy.wait()


@pytest.fixture(scope="module", autouse=True)
def record(figures, setup):
    yield
    if STATS:
        lines = [
            "| command | trials | kills | kills that landed mid-run | under load | trials with a differing file | "
            "files that differed (trials) | same content, other bytes (trials) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for command, s in STATS.items():
            differ = ", ".join(f"{n} ({c})" for n, c in sorted(s["differ"].items())) or "none"
            notes = ", ".join(f"{n} ({c})" for n, c in sorted(s["bytes_differ"].items())) or "none"
            lines.append(
                f"| {command} | {s['trials']} | {s['kills']} | {s['landed']} | {s['load']} | "
                f"{s['failed_trials']} | {differ} | {notes} |"
            )
        problems = [f"- {c}: {p}" for c, s in STATS.items() for p in s["problems"][:10]]
        if problems:
            lines += ["", "Differences (first 10 per command):", *problems]
        figures.add("kill -9, every file compared (test_kill_every_file.py)", STATS, "\n".join(lines))


def _tree(store: Path) -> tuple[set[str], set[str]]:
    """(files, folders) of a datastore directory, relative; the writer lock is no part of the result, nor SQLite's
    log and shared memory (store.sqlite-wal, -shm: there while a connection is open; read through SQLite)."""
    files = {
        str(p.relative_to(store))
        for p in store.rglob("*")
        if p.is_file() and p.name != LOCK and not p.name.endswith(("-wal", "-shm"))
    }
    folders = {str(p.relative_to(store)) for p in store.rglob("*") if p.is_dir()}
    return files, folders


def _sqlite_content(path: Path) -> dict:
    """The schema (name, type, table, SQL: not the root page numbers, which follow the order pages were allocated)
    and every table's rows in key order."""
    db = sqlite3.connect(path)
    try:
        schema = db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        content: dict = {"schema": schema}
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
            columns = [row[1] for row in db.execute(f'PRAGMA table_info("{name}")')]
            order = ", ".join(f'"{c}"' for c in columns)
            content[name] = db.execute(f'SELECT * FROM "{name}" ORDER BY {order}').fetchall()
        # the store's id is its own, and a run killed and rerun commits more often than an uninterrupted one: both
        # are compared with the store's other files by `_own_identity`, not with the reference
        content["meta"] = [row for row in content["meta"] if row[0] not in OWN]
        return content
    finally:
        db.close()


def _held(store: Path) -> dict:
    """store.sqlite's id and commit count (`identity.held`)."""
    db = sqlite3.connect(store / SQLITE)
    try:
        return dict(db.execute("SELECT key, value FROM meta WHERE key IN (?, ?)", OWN).fetchall())
    finally:
        db.close()


def _sqlite_bytes(a: bytes, b: bytes) -> str:
    """Where two SQLite files differ: sizes, change counters (header bytes 24-27), differing pages."""
    counter = [int.from_bytes(x[24:28], "big") for x in (a, b)]
    pages = [i for i in range(0, max(len(a), len(b)), PAGE) if a[i : i + PAGE] != b[i : i + PAGE]]
    return (
        f"{len(a)} vs {len(b)} bytes, change counter {counter[0]} vs {counter[1]}, "
        f"pages {[p // PAGE + 1 for p in pages[:8]]}{'...' if len(pages) > 8 else ''} differ"
    )


def _checksums_content(store: Path) -> tuple[dict, list[str]]:
    """checksums.json parsed without its record of store.sqlite, and what is wrong with that record: it must be
    the record of this directory's own store.sqlite (its length, and its change counter)."""
    data = json.loads((store / "checksums.json").read_text(encoding="utf-8"))
    files, paged, meta = dict(data["files"]), dict(data.get("paged", {})), dict(data.get("meta", {}))
    problems = []
    own = paged.pop(SQLITE, None) or files.pop(SQLITE, None)  # kept apart with its block size (integrity.py)
    db = (store / SQLITE).read_bytes()
    if own is None or own.get("length") != len(db):
        problems.append(f"checksums.json records store.sqlite as {own and own.get('length')} bytes, not {len(db)}")
    if meta.pop("sqlite_changes", None) != int.from_bytes(db[24:28], "big"):
        problems.append("checksums.json's sqlite_changes is not store.sqlite's change counter")
    held = _held(store)
    if (meta.pop("store_id", None), meta.pop("commits", None)) != (held.get("store_id"), int(held.get("commits", -1))):
        problems.append(f"checksums.json's store id and commits are not store.sqlite's ({held})")
    return {**data, "files": files, "paged": paged, "meta": meta}, problems


def _compare_file(ref: Path, store: Path, name: str, notes: list[str]) -> list[str]:
    """Problems with file `name` of `store` against the reference's; `notes` gets the by-content files whose bytes
    differ though their content is the same."""
    want, got = (ref / name).read_bytes(), (store / name).read_bytes()
    if name not in BY_CONTENT:  # IR arrays, tfidf_ndocs.txt, segment folders, FAISS files: byte for byte
        return [] if want == got else [f"{name}: {len(got)} bytes differ from the reference's {len(want)}"]
    if want == got:
        return []
    if name == SQLITE:
        # SQLite's bytes hold more than its rows: the change counter (one per committed transaction), the order in
        # which pages were allocated, freed pages. Two files with the same rows can differ there, so the rows and
        # the schema are what must be equal; the bytes are reported as a note.
        detail = _sqlite_bytes(want, got)
        if _sqlite_content(ref / name) != _sqlite_content(store / name):
            diff = [t for t, rows in _sqlite_content(ref / name).items() if _sqlite_content(store / name)[t] != rows]
            return [f"store.sqlite: the rows of {diff} differ from the reference's ({detail})"]
        notes.append(f"store.sqlite: same rows, other bytes ({detail})")
        return []
    if name == "checksums.json":
        # Records store.sqlite's blocks and change counter, which may differ with store.sqlite's bytes (above); the
        # rest (the other files' blocks) must be equal, and the store.sqlite record must be this directory's own.
        (want_sums, _), (got_sums, own) = _checksums_content(ref), _checksums_content(store)
        problems = own + ([] if want_sums == got_sums else ["checksums.json: other records than the reference's"])
        if not problems:
            notes.append("checksums.json: same records (store.sqlite's aside), other bytes")
        return problems
    if name in ("keys.f16", "values.i32"):
        # Append-only: only the committed prefix (SQLite's entry count) is data. Bytes past it are not data, but a
        # finished rerun must not leave any: the file must be exactly the reference's, which has none.
        width = 4 if name == "values.i32" else 2 * dim(store)
        size = committed(store) * width
        past = [f"{name}: {len(got) - size} bytes past the committed entries"] if len(got) > size else []
        same = got[:size] == want[:size] and len(want) == size
        return past + ([] if same else [f"{name}: the committed entries differ from the reference's"])
    # manifest.json: compared parsed (the same fields and values, the store's own id aside, which must be the one
    # its store.sqlite holds); no field holds a time.
    want, got = json.loads(want), json.loads(got)
    if got.pop("store_id", None) != _held(store).get("store_id"):
        return ["manifest.json: its store id is not store.sqlite's"]
    if {k: v for k, v in want.items() if k != "store_id"} != got:
        return ["manifest.json: other fields or values than the reference's"]
    notes.append("manifest.json: same fields, other bytes (field order or layout)")
    return []


def differences(ref: Path, store: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of datastore `store` against the uninterrupted reference `ref`, file by file."""
    (want_files, want_folders), (got_files, got_folders) = _tree(ref), _tree(store)
    problems = []
    for kind, want, got in (("folders", want_folders, got_folders), ("files", want_files, got_files)):
        if got != want:
            problems.append(f"{kind}: extra {sorted(got - want)}, missing {sorted(want - got)}")
    notes: list[str] = []
    for name in sorted(want_files & got_files):
        problems += _compare_file(ref, store, name, notes)
    return problems, notes


def _answers_differ(setup: Setup, command: str, store: Path) -> list[str]:
    """The `bertknn ask` answers of test_kill.py's questions, against the reference's."""
    problems = []
    for question in setup.questions(command):
        want, got = setup.reference_answer(command, question), setup.cli.run(["ask", store, *question])
        if got.rc != 0 or got.out != want.out:
            problems.append(f"`ask {' '.join(question[:1] + question[-2:])}` differs: {got.describe()}")
    return problems


@pytest.mark.parametrize("command", COMMANDS)
def test_kill_9_then_rerun_leaves_every_file_of_the_uninterrupted_run(setup, command, long, rng, tmp_path, cpu_load):
    cli, duration = setup.cli, setup.durations[command]
    trials = int(os.environ.get("BERTKNN_TRIALS") or (20 if long else 3))
    stats = STATS[command] = dict(
        trials=0,
        kills=0,
        landed=0,
        load=cpu_load,
        failed_trials=0,
        differ=Counter(),
        bytes_differ=Counter(),
        uninterrupted_s=round(duration, 3),
        problems=[],
        notes=[],
    )
    for trial in range(trials):
        store = tmp_path / f"trial-{trial}"
        setup.start_state(command, store)
        delays = []
        for _ in range(1 + trial % 3):  # 1, 2 or 3 kills before the final rerun
            proc = cli.start(setup.args(command, store))
            delays.append(rng.uniform(0 if stats["kills"] % 2 else duration / 2, duration))  # half in the 2nd half
            time.sleep(delays[-1])
            proc.kill()
            result = proc.wait()
            stats["kills"] += 1
            stats["landed"] += result.killed
        rerun = cli.run(setup.args(command, store))
        problems, notes = [], []
        if rerun.rc != 0:
            problems.append(f"rerun: {rerun.describe()}")
        else:
            problems, notes = differences(setup.refs[command], store)
            if problems:
                problems += _answers_differ(setup, command, store)
        stats["differ"].update({p.split(":")[0] for p in problems})
        stats["bytes_differ"].update({n.split(":")[0] for n in notes})
        stats["failed_trials"] += bool(problems)
        when = ", ".join(f"{d:.2f}" for d in delays)
        stats["problems"] += [f"trial {trial} (killed at {when} s): {p}" for p in problems]
        stats["notes"] += [f"trial {trial} (killed at {when} s): {n}" for n in notes]
        stats["trials"] += 1
        if problems:
            kept = tmp_path / f"differing-{trial}"
            store.rename(kept)  # kept for a look (pytest keeps its last temporary directories)
            print(f"{command} trial {trial}: {problems}; kept in {kept}")
        else:
            shutil.rmtree(store, ignore_errors=True)
    print(f"{command}: {json.dumps({k: v for k, v in stats.items() if k not in ('problems', 'notes')})}")
    for line in stats["notes"]:
        print(f"{command} note: {line}")
    assert stats["problems"] == []


def test_kill_between_the_manifest_and_the_identity_then_rerun_leaves_every_file(setup, tmp_path):
    """A build killed at one exact point, just after its new manifest.json was renamed into place (before the
    directory's fsync, so before SQLite holds anything): random kills land there rarely."""
    store = tmp_path / "store"
    trace = tmp_path / "steps.txt"
    setup._ok(setup.cli.run(setup.args("build", tmp_path / "traced"), trace=str(trace)))
    steps = trace.read_text(encoding="utf-8").splitlines()
    at = steps.index(f"rename {tmp_path / 'traced' / 'manifest.json'}") + 2  # the fsync of the directory after it
    assert setup.cli.run(setup.args("build", store), crash_at=at).killed
    assert (store / "manifest.json").is_file()
    setup._ok(setup.cli.run(setup.args("build", store)))
    problems, _ = differences(setup.refs["build"], store)
    assert problems == []
