"""kill -9 at random moments of `bertknn build`, `add`, `remove`, `index`, `convert-keys` and `prune`, then a rerun to
completion: the result must equal an uninterrupted run of the same commands in another directory, byte for byte.

Each command runs as its own process (conftest.Spawner). Kill delays are drawn uniformly between the process's start
and the duration of the uninterrupted run (measured once); every other kill is drawn from the second half of that
span, where the writes of the short commands (remove, index) happen. Trials kill 1, 2 or 3 times before the final
rerun.
Default: 3 trials per command; `--long`: 20.

Random moments rarely land inside a short write. So each command is also killed exactly at its writes: an
uninterrupted run lists its durable steps (every fsync and rename, in order: conftest's `steps` hook), then a run is
killed just before one of them and rerun. `--long` kills at every step; the default at the first step of each kind
(the same path and operation, numbers aside), at most SHORT_STEPS of them, spread evenly: the same steps every run.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import REMOVED, REPLACED, Setup, connect_ro, counts, entry_multiset, faiss_vectors, keys_values, tables

COMMANDS = ("build", "add", "replace", "remove", "index", "convert-keys", "prune")  # replace: `add --replace`
SHORT_STEPS = 6  # exact kill points per command in the default mode
STATS: dict[str, dict] = {}
EXACT: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def record(figures, setup):
    yield
    if STATS:
        lines = [
            "| command | trials | kills | kills that landed mid-run | kills after writing began | lost entries | "
            "duplicated entries | tracebacks | verify damage after a kill | reruns not exit 0 | mismatches |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for command, s in STATS.items():
            lines.append(
                f"| {command} | {s['trials']} | {s['kills']} | {s['landed']} | {s['after_writing']} | {s['lost']} | "
                f"{s['duplicated']} | {s['tracebacks']} | {s['verify_damage_after_kill']} | {s['failed_reruns']} | "
                f"{len(s['problems'])} |"
            )
        durations = ", ".join(f"{c} {d:.2f} s" for c, d in setup.durations.items())
        lines += ["", f"Uninterrupted run (kill delays drawn in [0, this]): {durations}."]
        problems = [f"- {c}: {p}" for c, s in STATS.items() for p in s["problems"][:10]]
        if problems:
            lines += ["", "Mismatches (first 10 per command):", *problems]
        figures.add("kill -9 (test_kill.py)", STATS, "\n".join(lines))
    if EXACT:
        lines = ["| command | durable steps | killed at | kinds of step | problems |", "|---|---|---|---|---|"]
        for command, s in EXACT.items():
            lines.append(f"| {command} | {s['steps']} | {s['killed']} | {s['kinds']} | {len(s['problems'])} |")
        problems = [f"- {c}: {p}" for c, s in EXACT.items() for p in s["problems"][:10]]
        figures.add(
            "kill -9 at each write (test_kill.py)", EXACT, "\n".join(lines + (["", *problems] if problems else []))
        )


def _fingerprint(store: Path) -> tuple:
    """What changes when a command writes: the files' sizes and modification times (the lock file aside)."""
    if not store.exists():
        return ()
    files = [p for p in store.rglob("*") if p.name != "write.lock"]
    return tuple(sorted((str(p.relative_to(store)), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def _replaced_state(store: Path) -> str:
    """'old' or 'new' when the two replaced documents are each live once with the text of before or after the
    replacement (both the same), else what is wrong."""
    with connect_ro(store) as db:
        rows = db.execute(
            "SELECT d.id, group_concat(s.text, ' ') FROM documents d JOIN sentences s ON s.doc = d.idx "
            "WHERE d.state = 'live' AND d.id IN (?, ?) GROUP BY d.idx",
            REPLACED,
        ).fetchall()
    if sorted(r[0] for r in rows) != sorted(REPLACED):
        return f"live as {sorted(r[0] for r in rows)}"
    new = {"Newport" in text for _, text in rows}
    return "mixed" if len(new) > 1 else ("new" if new.pop() else "old")


def _pair_state(store: Path) -> str:
    """'live', 'removed' or 'mixed' for the two documents of the removal."""
    with connect_ro(store) as db:
        live = {r[0] for r in db.execute("SELECT id FROM documents WHERE state = 'live' AND id IN (?, ?)", REMOVED)}
        gone = {r[0] for r in db.execute("SELECT removed_id FROM documents WHERE removed_id IN (?, ?)", REMOVED)}
    if live == set(REMOVED) and not gone:
        return "live"
    if gone == set(REMOVED) and not live:
        return "removed"
    return f"mixed (live {sorted(live)}, removed {sorted(gone)})"


def _compare(setup: Setup, command: str, store: Path, stats: dict, problems: list[str]) -> None:
    """The store after the rerun against the uninterrupted reference."""
    ref = setup.refs[command]
    want, got = entry_multiset(ref), entry_multiset(store)
    stats["lost"] += sum((want - got).values())
    stats["duplicated"] += sum((got - want).values())
    ref_keys, ref_values = keys_values(ref)
    keys, values = keys_values(store)
    if keys.shape != ref_keys.shape:
        problems.append(f"{keys.shape[0]} entries, the uninterrupted run has {ref_keys.shape[0]}")
    elif not np.array_equal(keys, ref_keys):
        problems.append("the keys differ from the uninterrupted run's")
    if values != ref_values:
        problems.append("values.i32 differs from the uninterrupted run's")
    if (ref / "counts.i32").exists() and counts(store) != counts(ref):
        problems.append("counts.i32 differs from the uninterrupted run's")
    want_tables, got_tables = tables(ref), tables(store)
    for name in want_tables:
        if want_tables[name] != got_tables[name]:
            problems.append(f"table {name} differs from the uninterrupted run's")
    want_faiss, got_faiss = faiss_vectors(ref), faiss_vectors(store)
    if (want_faiss is None) != (got_faiss is None):
        problems.append(f"faiss.index {'missing' if got_faiss is None else 'present'}, unlike the uninterrupted run")
    elif want_faiss is not None:
        stats["lost"] += max(0, len(want_faiss) - len(got_faiss))
        stats["duplicated"] += max(0, len(got_faiss) - len(want_faiss))
        if not np.array_equal(want_faiss, got_faiss):
            problems.append(f"faiss.index holds {len(got_faiss)} vectors unlike the reference's {len(want_faiss)}")
        if json.loads((ref / "faiss.json").read_text()) != json.loads((store / "faiss.json").read_text()):
            problems.append("faiss.json differs from the uninterrupted run's")
    if command == "remove" and _pair_state(store) != "removed":
        problems.append(f"after the rerun the removed documents are {_pair_state(store)}")


def _answers(setup: Setup, command: str, store: Path, stats: dict, problems: list[str]) -> None:
    for question in setup.questions(command):
        want = setup.reference_answer(command, question)
        got = setup.cli.run(["ask", store, *question])
        stats["tracebacks"] += got.traceback
        if got.rc != 0 or got.out != want.out:
            problems.append(f"`ask {' '.join(question[:1] + question[-2:])}` differs: {got.describe()}")
    verify = setup.cli.run(["verify", store])
    stats["tracebacks"] += verify.traceback
    if verify.rc != 0:
        problems.append(f"verify after the rerun: {verify.describe()}")


@pytest.mark.parametrize("command", COMMANDS)
def test_kill_9_then_rerun_equals_the_uninterrupted_run(setup, command, long, rng, tmp_path):
    cli, duration = setup.cli, setup.durations[command]
    trials = 20 if long else 3
    stats = STATS[command] = dict(
        trials=0,
        kills=0,
        landed=0,
        after_writing=0,
        lost=0,
        duplicated=0,
        tracebacks=0,
        verify_damage_after_kill=0,
        failed_reruns=0,
        uninterrupted_s=round(duration, 3),
        problems=[],
    )
    for trial in range(trials):
        store = tmp_path / f"trial-{trial}"
        setup.start_state(command, store)
        problems: list[str] = []
        for _ in range(1 + trial % 3):  # 1, 2 or 3 kills before the final rerun
            before = _fingerprint(store)
            proc = cli.start(setup.args(command, store))
            time.sleep(rng.uniform(0 if stats["kills"] % 2 else duration / 2, duration))  # half in the 2nd half
            proc.kill()
            result = proc.wait()
            stats["kills"] += 1
            stats["tracebacks"] += result.traceback
            if result.killed:
                stats["landed"] += 1
                stats["after_writing"] += _fingerprint(store) != before
            elif result.rc != 0:
                problems.append(f"a run before the kill failed: {result.describe()}")
            if command == "remove" and (state := _pair_state(store)) not in ("live", "removed"):
                problems.append(f"after a kill the two removed documents are {state}")
            if command == "replace" and (state := _replaced_state(store)) not in ("old", "new"):
                problems.append(f"after a kill the two replaced documents are {state}")
            if (store / "manifest.json").exists():
                check = cli.run(["verify", store])
                stats["tracebacks"] += check.traceback
                stats["verify_damage_after_kill"] += check.rc != 0
        rerun = cli.run(setup.args(command, store))
        stats["tracebacks"] += rerun.traceback
        if rerun.rc != 0:
            stats["failed_reruns"] += 1
            problems.append(f"rerun: {rerun.describe()}")
        else:
            _compare(setup, command, store, stats, problems)
            _answers(setup, command, store, stats, problems)
        stats["problems"] += [f"trial {trial}: {p}" for p in problems]
        stats["trials"] += 1
        shutil.rmtree(store, ignore_errors=True)
    print(f"{command}: {json.dumps({k: v for k, v in stats.items() if k != 'problems'})}")
    assert stats["problems"] == []
    assert stats["lost"] == stats["duplicated"] == stats["tracebacks"] == stats["failed_reruns"] == 0


def _steps(setup: Setup, command: str, root: Path) -> list[str]:
    """The durable steps (fsync or rename, with the path; the store's shown as STORE, the folder holding it as
    PARENT) of an uninterrupted run."""
    store, trace = root / "traced", root / "steps.txt"
    setup.start_state(command, store)
    setup._ok(setup.cli.run(setup.args(command, store), trace=str(trace)))
    shutil.rmtree(store)
    lines = trace.read_text(encoding="utf-8").splitlines()
    return [line.replace(str(store), "STORE").replace(str(root), "PARENT") for line in lines]


def _renames_not_durable(steps: list[str]) -> list[str]:
    """Renames into the store not preceded by an fsync of what is renamed, or not followed by one of its directory:
    such a rename survives kill -9 but may not survive a power cut."""
    bad = []
    for i, step in enumerate(steps):
        if not step.startswith("rename STORE"):
            continue
        target = Path(step.removeprefix("rename "))
        source = target.with_name(target.name + ".tmp")
        earlier = steps[:i][::-1]
        last_rename = earlier.index(step) if step in earlier else len(earlier)
        if f"fsync {source}" not in earlier[:last_rename]:  # since this target was last renamed to
            bad.append(f"{step}: {source} was not fsynced before")
        parent = "PARENT" if target == Path("STORE") else target.parent  # a store made whole, then renamed (prune)
        if steps[i + 1 : i + 2] != [f"fsync {parent}"]:
            bad.append(f"{step}: its directory is not fsynced after it")
    return bad


def _kind(step: str) -> str:
    return re.sub(r"\d+", "#", step)


def _picked(steps: list[str], long: bool) -> list[int]:
    """The steps (1-based) to kill at: all in long mode, else the first of each kind, at most SHORT_STEPS."""
    if long:
        return list(range(1, len(steps) + 1))
    first: dict[str, int] = {}
    for number, step in enumerate(steps, 1):
        first.setdefault(_kind(step), number)
    kinds = sorted(first.values())
    return kinds[:: -(-len(kinds) // SHORT_STEPS)]


@pytest.mark.parametrize("command", COMMANDS)
def test_kill_exactly_at_each_write_then_rerun_equals_the_uninterrupted_run(setup, command, long, tmp_path):
    steps = _steps(setup, command, tmp_path)
    assert steps, f"`bertknn {command}` made no durable write"
    assert _renames_not_durable(steps) == []
    picked = _picked(steps, long)
    stats = EXACT[command] = dict(steps=len(steps), killed=len(picked), kinds=len({_kind(s) for s in steps}))
    problems: list[str] = []
    for number in picked:
        store = tmp_path / f"step-{number}"
        setup.start_state(command, store)
        found: list[str] = []
        killed = setup.cli.run(setup.args(command, store), crash_at=number)
        if not killed.killed:
            found.append(f"not killed there: {killed.describe()}")
        if (store / "manifest.json").exists() and (check := setup.cli.run(["verify", store])).rc != 0:
            found.append(f"verify after the kill: {check.describe()}")
        rerun = setup.cli.run(setup.args(command, store))
        if rerun.rc != 0 or rerun.traceback:
            found.append(f"rerun: {rerun.describe()}")
        else:
            counts = {"lost": 0, "duplicated": 0}
            _compare(setup, command, store, counts, found)
            found += [f"{n} {what} entries" for what, n in counts.items() if n]
            if long:
                _answers(setup, command, store, {"tracebacks": 0}, found)
        problems += [f"killed before step {number} ({steps[number - 1]}): {p}" for p in found]
        shutil.rmtree(store, ignore_errors=True)
    stats["problems"] = problems
    print(f"{command}: killed at {len(picked)} of {len(steps)} durable steps")
    assert problems == []
