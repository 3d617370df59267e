"""RELIABILITY.md names, for each promise, the tests that check it: every one it names must exist, so that a test
renamed or moved cannot leave a promise pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `file.py::name`, `dir/file.py::name` or `::name` (a test of the file named last), a parameter id allowed after it
NAMED = re.compile(r"`((?:[\w/]+\.py)?)::(\w+)(?:\[[^\]]*\])?`")


def named_tests(text: str) -> list[tuple[str, str]]:
    """The (file, test) pairs a text names, `::name` taken as a test of the file named before it."""
    pairs, last = [], ""
    for match in NAMED.finditer(text):
        last = match.group(1) or last
        pairs.append((last, match.group(2)))
    return pairs


def test_every_test_reliability_md_names_exists():
    by_name: dict[str, list[Path]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        by_name.setdefault(path.name, []).append(path)
    pairs = named_tests((ROOT / "RELIABILITY.md").read_text(encoding="utf-8"))
    assert len(pairs) > 30  # the promises' tests were found at all
    missing = []
    for file, test in pairs:
        paths = [ROOT / file] if "/" in file else by_name.get(file, [])
        if not any(path.exists() and f"def {test}(" in path.read_text(encoding="utf-8") for path in paths):
            missing.append(f"{file}::{test}")
    assert not missing, f"RELIABILITY.md names tests that do not exist: {missing}"


def test_a_name_without_a_file_is_a_test_of_the_file_named_before_it():
    text = "`a.py::one`, `::two[x]`; `tests/b.py::three` and `::four`"
    assert named_tests(text) == [("a.py", "one"), ("a.py", "two"), ("tests/b.py", "three"), ("tests/b.py", "four")]
