"""Command line: `bertknn build`, `bertknn ask`, `bertknn demo`, `bertknn train-head`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from bertknn.combine import Prediction
from bertknn.default_model import DEFAULT_MODEL, HEAD_FILE
from bertknn.encoder import Encoder
from bertknn.pipeline import DEFAULTS, BertKNN, set_threads

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()
USER_ERRORS = (ValueError, FileNotFoundError)


def _fail(err: Exception) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(str(err))}")
    return typer.Exit(2)


def _threads(threads: int) -> None:
    set_threads(threads or os.cpu_count() or 1)


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

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:  # the first report of a phase says where a resumed run starts
                tasks[phase] = (progress.add_task(phase, total=total, completed=done, rate=""), done, time.time())
                return
            task, first, began = tasks[phase]
            rate = (done - first) / max(time.time() - began, 1e-9)
            progress.update(task, completed=done, total=total, rate=f"{rate:,.1f}/s")

        yield report


def _build(corpus: Path, out: Path, model: str | Encoder, layer: int | None, lazy: bool = False) -> BertKNN:
    """Build with progress bars (reading, then embedding documents)."""
    began = time.time()
    with phase_progress() as report:
        knn = BertKNN.build(corpus, out, model, layer, lazy=lazy, progress=report)
    store = knn.store
    console.print(
        f"datastore {out}: {store.n_documents:,} documents ({store.n_documents - len(store.pending()):,} embedded), "
        f"{store.size:,} contexts, model {knn.encoder.name}, layer {store.layer} ({time.time() - began:,.0f}s)"
    )
    return knn


def _prob(p: float) -> str:
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.0e}"


def render(prediction: Prediction, top_k: int = 10, evidence_words: int = 3) -> Group:
    """The three ranked lists side by side, then the evidence sentences of the top kNN words."""
    table = Table(title=escape(prediction.question), title_justify="left")
    table.add_column("#", justify="right", style="dim")
    for name in ("BERT", "kNN", "BERT-kNN"):
        table.add_column(name)
        table.add_column("p", justify="right", style="dim")
    lists = (prediction.bert, prediction.knn, prediction.bert_knn)
    for i in range(top_k):
        cells = [str(i + 1)]
        for ranked in lists:
            cells += [escape(ranked[i].token), _prob(ranked[i].probability)] if i < len(ranked) else ["", ""]
        table.add_row(*cells)
    docs = ", ".join(prediction.documents) or "none (BERT alone answers)"
    lines = [f"[dim]documents:[/] {escape(docs)}"]
    for word, neighbours in list(prediction.evidence.items())[:evidence_words]:
        for n in neighbours:
            a, b = n.span
            sentence = f"{escape(n.sentence[:a])}[bold yellow]{escape(n.sentence[a:b])}[/]{escape(n.sentence[b:])}"
            lines.append(f"[bold]{escape(word)}[/] d²={n.distance:.1f} [dim]{escape(n.title)}:[/] {sentence}")
    return Group(table, Panel("\n".join(lines), title="evidence", title_align="left"))


@app.command()
def build(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus: one {id, title, text} document per line")],
    out: Annotated[Path, typer.Option("--out", "-o", help="datastore directory to create (or resume)")],
    model: Annotated[str, typer.Option(help="HF masked LM: hub name or local directory")] = DEFAULT_MODEL,
    layer: Annotated[int | None, typer.Option(help="block whose states are keys [default: second-to-last]")] = None,
    lazy: Annotated[bool, typer.Option(help="embed each document only when retrieval first picks it")] = False,
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Embed every target word of a corpus into a datastore and index its documents. Rerun to resume."""
    _threads(threads)
    try:
        _build(corpus, out, model, layer, lazy)
    except USER_ERRORS as err:
        raise _fail(err) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: what was committed is kept; rerun the same command to resume {out}")
        raise typer.Exit(130) from None


@app.command()
def ask(
    datastore: Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")],
    question: Annotated[str, typer.Argument(help="cloze question with exactly one [MASK]")],
    subject: Annotated[str | None, typer.Option(help="subject of a knowledge-base question (steers retrieval)")] = None,
    top_k: Annotated[int, typer.Option(help="answers to list")] = 10,
    n_docs: Annotated[int, typer.Option(help="documents retrieved")] = DEFAULTS["n_docs"],
    k: Annotated[int, typer.Option(help="nearest neighbours")] = DEFAULTS["k"],
    temperature: Annotated[float, typer.Option(help="kNN temperature l in exp(-d/l)")] = DEFAULTS["temperature"],
    lam: Annotated[float, typer.Option("--lambda", help="weight of p_kNN")] = DEFAULTS["lam"],
    model: Annotated[str | None, typer.Option(help="model [default: the datastore's]")] = None,
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Answer a cloze question: BERT, kNN and BERT-kNN side by side, with the evidence sentences."""
    _threads(threads)
    try:
        knn = BertKNN.load(datastore, model, n_docs=n_docs, k=k, temperature=temperature, lam=lam)
        prediction = knn.predict(question, subject=subject, top_k=top_k)
    except USER_ERRORS as err:
        raise _fail(err) from None
    console.print(render(prediction, top_k))


@app.command()
def demo(
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Build the embedded demo corpus's datastore (cached) and answer its questions."""
    from bertknn.demo import DEMO_CORPUS, cache_dir, demo_questions, fixed_by_knn

    _threads(threads)
    try:
        encoder = Encoder.load(model)
        out = cache_dir() / f"demo-{encoder.weights_hash[:12]}-L{encoder.layer}"
        kind = (
            "the offline default, a weaker stand-in for bert-base-uncased" if model == DEFAULT_MODEL else "user-chosen"
        )
        console.print(f"[bold]bertknn demo[/]: model {model} ({kind}), datastore {out}")
        knn = _build(DEMO_CORPUS, out, encoder, None)
    except USER_ERRORS as err:
        raise _fail(err) from None
    questions = demo_questions()
    predictions = knn.predict_batch([q["question"] for q in questions], [q["subject"] for q in questions], top_k=5)
    fixed = []
    for q, p in zip(questions, predictions):
        console.print(render(p, top_k=5, evidence_words=1))
        if fixed_by_knn(p, q["answer"]):
            fixed.append(q)
    for q in fixed:
        console.print(
            f"[bold green]BERT-kNN knows[/] {escape(q['question'].replace('[MASK]', q['answer']))} "
            "[green]where the LM alone does not: the answer comes from the evidence sentence above.[/]"
        )
    console.print(f"{len(fixed)} of {len(questions)} questions answered right by BERT-kNN and wrong by the LM alone.")


@app.command("train-head")
def train_head_cmd(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus to train on (held-out documents are skipped)")],
    out: Annotated[Path, typer.Option(help="safetensors file to write")] = HEAD_FILE,
    steps: Annotated[int, typer.Option(help="optimiser steps")] = 3000,
    batch_size: Annotated[int, typer.Option(help="sentences per step")] = 32,
    max_length: Annotated[int, typer.Option(help="tokens per sentence")] = 48,
    rank: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Train the offline default model's MLM head, [MASK] embedding and adapters on the MiniLM-L6 encoder."""
    from bertknn.train_head import train_head

    _threads(threads)
    try:
        info = train_head(
            corpus, out, steps=steps, batch_size=batch_size, max_length=max_length, rank=rank, log=console.print
        )
    except USER_ERRORS as err:
        raise _fail(err) from None
    console.print(f"wrote {out}: held-out {info['heldout_metrics']}")
