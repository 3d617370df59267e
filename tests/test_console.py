"""Terminal output: probabilities, the P@1 table of `eval lama`, and progress lines in a log."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from bertknn import console as terminal


def test_prob_never_shows_a_bare_zero():
    assert [terminal.prob(p) for p in (0.5, 1e-3, 4.2e-5, 0.0)] == ["0.500", "0.001", "4e-05", "0e+00"]


def test_p_at_1_table_lists_every_set_in_percent():
    metrics = {"bert": {"P@1": 0.25}, "knn": {"P@1": 0.5}, "bert_knn": {"P@1": 0.125}}
    summary = {"sets": {"T-REx": {"facts": 8, "metrics": metrics, "ceiling": 0.75}}}
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(terminal.p_at_1_table(summary))
    rows = [
        re.split(r"\s*[│┃]\s*", line.strip("│┃ ")) for line in out.getvalue().splitlines() if "│" in line or "┃" in line
    ]
    assert rows == [
        ["set", "facts", "BERT", "kNN", "BERT-kNN", "ceiling"],
        ["T-REx", "8", "25.0", "50.0", "12.5", "75.0"],
    ]


def test_progress_in_a_log_file_prints_a_line_when_a_phase_ends(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=out, width=200, force_terminal=False))
    with terminal.phase_progress() as report:
        report("embedding", 0, 4)
        report("embedding", 2, 4)  # not yet LOG_EVERY_S since the start: no line
        report("embedding", 4, 4)
    logged = [line for line in out.getvalue().splitlines() if "of 4" in line]
    assert len(logged) == 1 and re.search(r"embedding: 4 of 4 \([\d,.]+/s\)", logged[0])


def test_progress_in_a_log_file_says_how_long_is_left(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=out, width=200, force_terminal=False))
    monkeypatch.setattr(terminal, "LOG_EVERY_S", 0)
    with terminal.phase_progress() as report:
        report("embedding", 0, 1000)
        time.sleep(0.05)
        report("embedding", 10, 1000)  # ~200/s: 990 left take a few seconds
    (line,) = [line for line in out.getvalue().splitlines() if "of 1,000" in line]
    assert re.search(r"embedding: 10 of 1,000 \([\d,.]+/s, \d+s left\)", line)
    assert [terminal.eta(n, 1.0) for n in (42, 425, 11520)] == ["42s", "7m05s", "3h12m"]
