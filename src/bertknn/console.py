"""Terminal output of the command line: the console, a prediction's tables, result tables and progress bars."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from bertknn.text import eta, printable

if TYPE_CHECKING:
    from bertknn.query.prediction import Prediction

console = Console()
# bidi marks, embeddings, overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9), line and paragraph separators
LAYOUT = re.compile("[\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
LOG_EVERY_S = 30  # a progress line this often when the output is not a terminal (a log file, CI)


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever sys.stderr is when it writes (a test runner swaps it per command)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


def show_log() -> None:
    """Show what the library logs at INFO and above on the `bertknn` logger (the progress of embedding a lazy
    datastore's documents on demand, say) on stderr, a line each, a terminal or not; stdout stays the command's."""
    logger = logging.getLogger("bertknn")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def prob(p: float) -> str:
    """A probability as shown next to a word: 3 decimals, or 1e-05 style when smaller (never a bare 0.000)."""
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.0e}"


def shown(text: str) -> str:
    """A user or corpus string (an id, a path, an error naming them) as rich markup that prints it as it is, on one
    line and in its own order: control characters escaped (\\x1b, \\x0a), and so are the characters that reorder or
    break the text around them without being controls (bidi overrides and isolates, line separators: \\u202e)."""
    return escape(LAYOUT.sub(lambda m: f"\\u{ord(m.group()):04x}", printable(text)))


@contextlib.contextmanager
def phase_progress() -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars for long work: `report(phase, done, total)` draws one bar per phase, with rate and ETA."""
    columns = (
        TextColumn("[bold]{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        tasks: dict[str, tuple[int, int, float]] = {}
        logged = [time.time()]  # when the last log line was printed (output that is not a terminal)

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:  # the first report of a phase says where a resumed run starts
                tasks[phase] = (progress.add_task(phase, total=total, completed=done, rate=""), done, time.time())
                return
            task, first, began = tasks[phase]
            rate = (done - first) / max(time.time() - began, 1e-9)
            progress.update(task, completed=done, total=total, rate=f"{rate:,.1f}/s")
            if not console.is_terminal and (time.time() - logged[0] >= LOG_EVERY_S or done == total):
                logged[0] = time.time()
                left = f", {eta(total - done, rate)} left" if done < total and rate > 0 else ""
                console.log(f"{phase}: {done:,} of {total:,} ({rate:,.1f}/s{left})")

        yield report


def render(prediction: Prediction, top_k: int = 10, evidence_words: int = 3) -> Group:
    """The three ranked lists side by side, then the evidence sentences of the top kNN words."""
    table = Table(title=shown(prediction.question), title_justify="left")
    table.add_column("#", justify="right", style="dim")
    for name in ("BERT", "kNN", "BERT-kNN"):
        table.add_column(name)
        table.add_column("p", justify="right", style="dim")
    lists = (prediction.bert, prediction.knn, prediction.bert_knn)
    for i in range(top_k):
        cells = [str(i + 1)]
        for ranked in lists:
            cells += [shown(ranked[i].token), prob(ranked[i].probability)] if i < len(ranked) else ["", ""]
        table.add_row(*cells)
    docs = ", ".join(prediction.documents) or "none (BERT alone answers)"
    lines = [f"[dim]documents:[/] {shown(docs)}"]
    if prediction.linked is not None:  # asked without a subject: the one the question names
        found = prediction.linked
        lines.insert(
            0, f"[dim]subject:[/] {shown(found.subject)} [dim](linked from {shown(repr(found.text))}, {found.by})[/]"
        )
    for word, neighbours in list(prediction.evidence.items())[:evidence_words]:
        for n in neighbours:
            a, b = n.span
            sentence = f"{shown(n.sentence[:a])}[bold yellow]{shown(n.sentence[a:b])}[/]{shown(n.sentence[b:])}"
            merged = f" [dim](stands for {n.count} contexts)[/]" if n.count > 1 else ""
            dated = f" ({n.date[:10]})" if n.date and len(prediction.documents) > 1 else ""  # which version said it
            source = f"[dim]{shown(n.title)}{dated}:[/]"
            lines.append(f"[bold]{shown(word)}[/] d²={n.distance:.1f} {source} {sentence}{merged}")
    for n in prediction.superseded:  # what an older document about the subject said, outvoted by a newer one
        a, b = n.span
        sentence = f"{shown(n.sentence[:a])}[bold]{shown(n.sentence[a:b])}[/]{shown(n.sentence[b:])}"
        dated = f" ({n.date[:10]})" if n.date else ""
        lines.append(f"[dim]superseded{dated} {shown(n.title)}:[/] {sentence}")
    return Group(table, Panel("\n".join(lines), title="evidence", title_align="left"))


def p_at_1_table(summary: dict) -> Table:
    """`eval lama`'s result on the terminal: P@1 of BERT, kNN and BERT-kNN and the ceiling for each set of facts."""
    table = Table(title="P@1 (macro over relations)")
    for col in ("set", "facts", "BERT", "kNN", "BERT-kNN", "ceiling"):
        table.add_column(col)
    for name, s in summary["sets"].items():
        table.add_row(
            name,
            str(s["facts"]),
            *(f"{100 * s['metrics'][m]['P@1']:.1f}" for m in ("bert", "knn", "bert_knn")),
            f"{100 * s['ceiling']:.1f}",
        )
    return table
