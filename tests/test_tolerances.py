"""The rule of tests/README.md, checked: a tolerance below MODEL_RTOL says why, and no test rounds a probability to
compare it; the ranking helpers accept near-ties and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from .tolerances import MODEL_RTOL, assert_neighbours_close, assert_ranking_close

TESTS = Path(__file__).parent


def test_a_tolerance_below_the_model_s_says_why_and_no_probability_is_rounded():
    unexplained, rounded = [], []
    for file in sorted(TESTS.rglob("*.py")):
        lines = file.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            where = f"{file.relative_to(TESTS)}:{n + 1}"
            for value in re.findall(r"\b(?:rtol|rel)=([0-9.e-]+)", line):
                if float(value) < MODEL_RTOL and "#" not in line and not lines[n - 1].lstrip().startswith("#"):
                    unexplained.append(where)
            if re.search(r"round\([^)]*probabilit", line):
                rounded.append(where)
    assert unexplained == [] and rounded == []


def test_rankings_may_swap_near_ties_only():
    expected = [("paris", 0.5), ("lyon", 0.2), ("nice", 0.2 - 1e-7), ("oslo", 0.1)]
    assert_ranking_close([("paris", 0.5), ("nice", 0.2), ("lyon", 0.2 - 1e-7), ("oslo", 0.1)], expected)
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_ranking_close([("paris", 0.5), ("oslo", 0.2), ("nice", 0.2), ("lyon", 0.1)], expected)
    with pytest.raises(AssertionError):
        assert_ranking_close([("paris", 0.5), ("lyon", 0.3), ("nice", 0.2), ("oslo", 0.1)], expected)
    tied_at_the_end = [("a", 0.5), ("b", 0.25), ("c", 0.25)]  # "d" tied with the last one, ranked past the end
    assert_ranking_close([("a", 0.5), ("b", 0.25), ("d", 0.25)], tied_at_the_end)
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_ranking_close([("a", 0.5), ("d", 0.26), ("c", 0.25)], [("a", 0.5), ("b", 0.26), ("c", 0.25)], atol=1e-3)
    ids, dist = np.array([4, 7, 9]), np.array([1.0, 2.0, 2.0 + 1e-6])
    assert_neighbours_close(np.array([4, 9, 7]), dist, ids, dist)
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_neighbours_close(np.array([7, 4, 9]), dist, ids, dist)
