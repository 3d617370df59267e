"""A full disk during `bertknn build`, `add`, `remove`, `index`, `convert-keys` and `prune`: the store lives on a tmpfs
of a size made too small for the command (made by the test itself with `mount -t tmpfs`; skipped, with the reason,
where the machine forbids mounting). Each run must end with exit 0, or exit 2 and one line naming the file ("no
space left for ...") with no traceback and no temporary file left; `verify` must find the store sound; after the file
system is grown, the same command, rerun, must give exactly the uninterrupted run's result.

Sizes: the start state's bytes plus a fraction of what the uninterrupted run adds (default: 2 fractions per command;
`--long`: 10).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Setup
from .test_kill import COMMANDS, _compare

PAGE = 4096
SLACK = 256 << 10  # bytes a tmpfs of the full size gets beyond the uninterrupted run's result
FRACTIONS = {False: (0.3, 0.8), True: tuple(i / 10 for i in range(10))}
STATS: dict[str, dict] = {}


def _mount(point: Path, size: int, remount: bool = False) -> None:
    options = f"{'remount,' if remount else ''}size={max(PAGE, size - size % PAGE)}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True, capture_output=True)


@contextlib.contextmanager
def _tmpfs(point: Path, size: int) -> Iterator[Path]:
    point.mkdir(parents=True, exist_ok=True)
    _mount(point, size)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory) -> None:
    point = tmp_path_factory.mktemp("probe")
    try:
        with _tmpfs(point, 1 << 20):
            pass
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        reason = getattr(err, "stderr", b"") or str(err)
        pytest.skip(f"this machine forbids mounting a tmpfs: {reason!r}")


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _made(ref: Path, start: Path) -> int:
    """Bytes of the files a command made (absent where it started): what it needs while the files they replace are
    still there (`convert-keys` writes keys.codes before it deletes keys.f16)."""
    files = [f for f in ref.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files if not (start / f.relative_to(ref)).exists())


def _journal(start: Path) -> int:
    """What SQLite's rollback journal may need while a command commits: the original of every page a transaction
    changes, up to the whole of store.sqlite (a remove rewrites the evidence rows its entries used, spread over the
    table by their hashed ids, so its few rows touch many pages)."""
    db = start / "store.sqlite"
    return db.stat().st_size if db.exists() else 0


@pytest.fixture(scope="module", autouse=True)
def record(figures):
    yield
    if STATS:
        lines = [
            "| command | runs | stopped by the full disk (exit 2) | finished anyway | tracebacks | other failures | "
            "verify damage | temporary files left | reruns not equal |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for command, s in STATS.items():
            lines.append(
                f"| {command} | {s['runs']} | {s['full']} | {s['finished']} | {s['tracebacks']} | {s['other']} | "
                f"{s['verify']} | {s['tmp_left']} | {s['unequal']} |"
            )
        figures.add("disk full (test_disk_full.py)", STATS, "\n".join(lines))


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_disk_stops_a_command_cleanly_and_a_rerun_finishes_it(setup: Setup, command, long, can_mount, tmp_path):
    start = tmp_path / "start"
    setup.start_state(command, start)
    ref = setup.refs[command]
    used, grown = _bytes(start), max(_bytes(ref) - _bytes(start), _made(ref, start), _journal(start))
    stats = STATS[command] = dict(runs=0, full=0, finished=0, tracebacks=0, other=0, verify=0, tmp_left=0, unequal=0)
    problems: list[str] = []
    for fraction in FRACTIONS[long]:
        size = used + int(fraction * max(grown, 0)) + 16 * PAGE
        with _tmpfs(tmp_path / f"fs-{fraction}", size) as point:
            store = point / "store"
            if start.exists():
                shutil.copytree(start, store)
            first = setup.cli.run(setup.args(command, store))
            stats["runs"] += 1
            where = f"{command} on {size:,} bytes ({fraction:.0%} of what it adds)"
            stats["tracebacks"] += first.traceback
            if first.rc == 0:
                stats["finished"] += 1
            elif first.rc == 2 and "no space left for" in first.text and not first.traceback:
                stats["full"] += 1
            else:
                stats["other"] += 1
                problems.append(f"{where}: {first.describe()}")
            left = [str(p.relative_to(point)) for p in point.rglob("*.tmp")]
            stats["tmp_left"] += bool(left)
            if left:
                problems.append(f"{where}: temporary files left: {left[:5]}")
            if (store / "manifest.json").exists() and (check := setup.cli.run(["verify", store])).rc != 0:
                stats["verify"] += 1
                problems.append(f"{where}: verify after the full disk: {check.describe()}")
            _mount(point, used + 2 * max(grown, 0) + SLACK, remount=True)
            rerun = setup.cli.run(setup.args(command, store))
            found: list[str] = []
            if rerun.rc != 0:
                found.append(f"rerun: {rerun.describe()}")
            else:
                counts = {"lost": 0, "duplicated": 0}
                _compare(setup, command, store, counts, found)
                found += [f"{n} {what} entries" for what, n in counts.items() if n]
            stats["unequal"] += bool(found)
            problems += [f"{where}: {p}" for p in found]
    stats["problems"] = problems
    print(f"{command}: {stats}")
    assert problems == []
