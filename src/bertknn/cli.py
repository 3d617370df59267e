"""Command line: build, ask, index, add, remove, demo, data lama, eval lama, tune, train-head."""

from __future__ import annotations

import contextlib
import json
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
from bertknn.pipeline import BertKNN, set_threads
from bertknn.settings import PAPER
from bertknn.text import printable

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
data_app = typer.Typer(no_args_is_help=True, help="Get and verify evaluation data.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate BERT, kNN and BERT-kNN.")
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
TUNED = "default: the datastore's tuned value, else "
DATA_DIR = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "lama"
console = Console()
LOG_EVERY_S = 30  # a progress line this often when the output is not a terminal (a log file, CI)
USER_ERRORS = (ValueError, OSError)  # bertknn's errors are ValueErrors; OSError: disk full, permissions...


def _fail(err: Exception) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(printable(str(err)))}")
    return typer.Exit(2)


WaitOption = Annotated[
    float, typer.Option(min=0, help="seconds to wait for another process writing to the datastore (one at a time)")
]
WAIT_S = 60.0


@contextlib.contextmanager
def _writer_wait(datastore: Path, wait: float) -> Iterator[None]:
    """Let this command's writes wait up to `wait` seconds for another writer, and say so when one is at work."""
    from bertknn.datastore import lock_holder, lock_wait

    holder = lock_holder(datastore) if datastore.is_dir() else None
    if holder and wait:
        console.print(
            f"[yellow]waiting[/] up to {wait:g} s for {escape(holder)} to finish writing {_shown(str(datastore))}"
        )
    with lock_wait(wait):
        yield


def _threads(threads: int, backend: str = "torch") -> None:
    set_threads(threads or os.cpu_count() or 1, backend)


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
                console.log(f"{phase}: {done:,} of {total:,} ({rate:,.1f}/s)")

        yield report


NDocsOption = Annotated[int | None, typer.Option(help=f"documents retrieved [{TUNED}{PAPER.n_docs}]")]
KOption = Annotated[int | None, typer.Option(help=f"nearest neighbours [{TUNED}{PAPER.k}]")]
TemperatureOption = Annotated[
    float | None, typer.Option(help=f"kNN temperature l in exp(-d/l) [{TUNED}{PAPER.temperature}]")
]
LamOption = Annotated[float | None, typer.Option("--lambda", help=f"weight of p_kNN [{TUNED}{PAPER.lam}]")]
PackOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="targets masked per encoder pass: 1 = exact keys (the paper); m > 1 = up to m non-adjacent targets per "
        "pass, fewer passes, approximate keys (bench/README.md gives the fidelity)",
    ),
]
Int8Option = Annotated[
    bool,
    typer.Option(
        "--int8-keys",
        help="compute keys with the model quantised to int8 (ONNX Runtime, per channel): faster, approximate keys "
        "(speed and fidelity: bench/README.md)",
    ),
]
BackendOption = Annotated[
    str,
    typer.Option(
        help="run the model in onnx (ONNX Runtime: the same numbers, faster on CPU; exported once to the cache), "
        "torch, or onnx-int8 (questions in int8: faster still, approximate); speeds in bench/README.md"
    ),
]


def _build(
    corpus: Path,
    out: Path,
    model: str | Encoder,
    layer: int | None,
    lazy: bool = False,
    pack: int = 1,
    backend: str = "onnx",
    int8: bool = False,
) -> BertKNN:
    """Build with progress bars (reading, then embedding documents)."""
    began = time.time()
    with phase_progress() as report:
        knn = BertKNN.build(
            corpus, out, model, layer, lazy=lazy, pack=pack, backend=backend, int8=int8, progress=report
        )
    store = knn.store
    console.print(
        f"datastore {out}: {store.n_documents:,} documents ({store.n_documents - len(store.pending()):,} embedded), "
        f"{store.size:,} contexts, model {knn.encoder.name}, layer {store.layer} ({time.time() - began:,.0f}s)"
    )
    return knn


def _prob(p: float) -> str:
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.0e}"


def _shown(text: str) -> str:
    """A user or corpus string as rich markup that prints it as it is, control characters escaped (\\x1b)."""
    return escape(printable(text))


def render(prediction: Prediction, top_k: int = 10, evidence_words: int = 3) -> Group:
    """The three ranked lists side by side, then the evidence sentences of the top kNN words."""
    table = Table(title=_shown(prediction.question), title_justify="left")
    table.add_column("#", justify="right", style="dim")
    for name in ("BERT", "kNN", "BERT-kNN"):
        table.add_column(name)
        table.add_column("p", justify="right", style="dim")
    lists = (prediction.bert, prediction.knn, prediction.bert_knn)
    for i in range(top_k):
        cells = [str(i + 1)]
        for ranked in lists:
            cells += [_shown(ranked[i].token), _prob(ranked[i].probability)] if i < len(ranked) else ["", ""]
        table.add_row(*cells)
    docs = ", ".join(prediction.documents) or "none (BERT alone answers)"
    lines = [f"[dim]documents:[/] {_shown(docs)}"]
    for word, neighbours in list(prediction.evidence.items())[:evidence_words]:
        for n in neighbours:
            a, b = n.span
            sentence = f"{_shown(n.sentence[:a])}[bold yellow]{_shown(n.sentence[a:b])}[/]{_shown(n.sentence[b:])}"
            lines.append(f"[bold]{_shown(word)}[/] d²={n.distance:.1f} [dim]{_shown(n.title)}:[/] {sentence}")
    return Group(table, Panel("\n".join(lines), title="evidence", title_align="left"))


@app.command()
def build(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus: one {id, title, text} document per line")],
    out: Annotated[Path, typer.Option("--out", "-o", help="datastore directory to create (or resume)")],
    model: Annotated[str, typer.Option(help="HF masked LM: hub name or local directory")] = DEFAULT_MODEL,
    layer: Annotated[int | None, typer.Option(help="block whose states are keys [default: second-to-last]")] = None,
    lazy: Annotated[bool, typer.Option(help="embed each document only when retrieval first picks it")] = False,
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Embed every target word of a corpus into a datastore and index its documents. Rerun to resume."""
    _threads(threads, backend)
    try:
        with _writer_wait(out, wait):
            _build(corpus, out, model, layer, lazy, pack, backend, int8_keys)
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
    top_k: Annotated[int, typer.Option(min=1, max=1000, help="answers to list")] = 10,
    n_docs: NDocsOption = None,
    k: KOption = None,
    temperature: TemperatureOption = None,
    lam: LamOption = None,
    retrieval: Annotated[
        str, typer.Option(help="neighbours from: ir (the paper), faiss (whole datastore; `bertknn index`), ir+faiss")
    ] = PAPER.retrieval,
    model: Annotated[str | None, typer.Option(help="model [default: the datastore's]")] = None,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Answer a cloze question: BERT, kNN and BERT-kNN side by side, with the evidence sentences."""
    _threads(threads, backend)
    try:
        knn = BertKNN.load(datastore, model, backend=backend, n_docs=n_docs, k=k, temperature=temperature, lam=lam)
        prediction = knn.predict(question, subject=subject, top_k=top_k, retrieval=retrieval)
    except USER_ERRORS as err:
        raise _fail(err) from None
    console.print(render(prediction, top_k))


@app.command()
def index(
    datastore: Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")],
    factory: Annotated[
        str,
        typer.Option(
            help="FAISS index factory string (Flat, IVF4096,PQ64, HNSW32...); auto: Flat below 20k keys, "
            "else IVF with ~4 sqrt(n) lists and PQ dim/12"
        ),
    ] = "auto",
    train_size: Annotated[
        int | None, typer.Option(min=1, help="random keys to train on [default: 50 per IVF list, at least 100k]")
    ] = None,
    nprobe: Annotated[int, typer.Option(min=1, help="IVF lists searched per query")] = 16,
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Index every key of a datastore with FAISS (for `--retrieval faiss`). Rerun to resume."""
    import faiss

    from bertknn.datastore import Datastore
    from bertknn.faiss_index import FaissIndex

    _threads(threads)
    faiss.omp_set_num_threads(threads or os.cpu_count() or 1)
    began = time.time()
    try:
        store = Datastore(datastore)
        with _writer_wait(datastore, wait), phase_progress() as report:
            report("indexing", 0, store.size)
            built = FaissIndex.build(
                store, factory, train_size, nprobe, progress=lambda done, total: report("indexing", done, total)
            )
    except USER_ERRORS as err:
        raise _fail(err) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: what was saved is kept; rerun the same command to resume {datastore}")
        raise typer.Exit(130) from None
    console.print(
        f"FAISS index {built.settings['factory']!r} over {built.index.ntotal:,} keys in {datastore / 'faiss.index'} "
        f"({time.time() - began:,.0f}s); ask with --retrieval faiss"
    )


@app.command()
def add(
    datastore: Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")],
    corpus: Annotated[Path, typer.Argument(help="JSONL documents to add ({id, title, text} per line)")],
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Add documents: embedded and indexed in place, searchable at once. Rerun after a crash to complete it."""
    from bertknn.text import iter_corpus

    _threads(threads, backend)
    try:
        docs = list(iter_corpus(corpus))  # the whole file is read first: a bad line changes nothing
        knn = BertKNN.load(datastore, backend=backend)
        known = knn.store.states([d.id for d in docs])
        with _writer_wait(datastore, wait), phase_progress() as report:
            added = knn.add_documents(docs, skip_existing=True, progress=lambda n: report("embedding", n, len(docs)))
    except USER_ERRORS as err:
        raise _fail(err) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: nothing half-added is searchable; rerun the same command to finish")
        raise typer.Exit(130) from None
    skipped = sum(state == "live" for state in known.values())
    console.print(
        f"added {len(docs) - skipped:,} documents ({added:,} contexts) to {datastore}"
        + (f"; {skipped:,} were there already" if skipped else "")
    )


@app.command()
def remove(
    datastore: Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")],
    doc: Annotated[list[str], typer.Option("--doc", help="id of a document to hide (repeatable)")],
    wait: WaitOption = WAIT_S,
) -> None:
    """Remove documents: hidden from IR, kNN and FAISS search at once, all or none (their stored rows are kept)."""
    from bertknn.datastore import Datastore

    try:
        store = Datastore(datastore)
        with _writer_wait(datastore, wait), store.writing():
            removed, before = store.remove(doc)
    except USER_ERRORS as err:
        raise _fail(err) from None
    console.print(
        f"removed {len(removed)} document(s) from {escape(str(datastore))}"
        + (f"; already removed before: {escape(', '.join(before))}" if before else "")
    )


@app.command()
def verify(
    datastore: Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")],
    record: Annotated[
        bool, typer.Option(help="record the checksums of the files as they are now (only for files known sound)")
    ] = False,
) -> None:
    """Check a datastore: every checksum block of every file, SQLite's integrity, keys. Exit status 1 on damage."""
    from bertknn import datastore as ds

    try:
        if record:
            ds.record_checksums(datastore)
        with phase_progress() as report:
            found = ds.verify(datastore, progress=lambda done, total: report("verifying", done, total))
    except USER_ERRORS as err:
        raise _fail(err) from None
    for note in found.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    for problem in found.problems:
        console.print(f"[bold red]damaged:[/] {escape(problem)}")
    if found.problems:
        raise typer.Exit(1)
    console.print(f"{escape(str(datastore))}: sound ({found.blocks:,} checksum blocks checked)")


@app.command()
def demo(
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Build the embedded demo corpus's datastore (cached) and answer its questions."""
    from bertknn.demo import (
        DEMO_CORPUS,
        FRESH_DOCUMENT,
        FRESH_QUESTION,
        demo_path,
        demo_questions,
        fixed_by_knn,
        fresh_facts,
    )

    _threads(threads, backend)
    try:
        encoder = Encoder.load(model, backend=backend)
        out = demo_path(encoder)
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
    console.print(
        f"\n[bold]Fresh facts[/]: {FRESH_QUESTION['question']} (gold: {FRESH_QUESTION['answer']}), asked before and "
        f"after `bertknn add` of {FRESH_DOCUMENT['text']!r}, then after `bertknn remove` (on a copy of the datastore)"
    )
    for stage, p in fresh_facts(knn):
        top = ", ".join(f"{t.token} {_prob(t.probability)}" for t in p.bert_knn[:3])
        console.print(f"{stage:>12}: BERT-kNN {escape(top)}; documents: {escape(', '.join(p.documents) or 'none')}")


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


@data_app.command("lama")
def data_lama(
    dest: Annotated[Path, typer.Option(help="directory for LAMA's data (it gets data/TREx/... inside)")] = DATA_DIR,
    verify_only: Annotated[bool, typer.Option(help="only check the files against LAMA's git blob hashes")] = False,
) -> None:
    """Download LAMA's official data.zip and verify every file against the shipped list of git blob hashes."""
    from bertknn.lama_data import LamaDataError, download, report_lines, verify

    try:
        result = verify(dest) if verify_only else verify(download(dest, console=console))
    except (LamaDataError, OSError) as err:
        raise _fail(err) from None
    for line in report_lines(result):
        console.print(escape(line))
    if not result.passed:
        raise typer.Exit(1)


def _layers(spec: str | None, default: int) -> list[int]:
    return [int(x) for x in spec.split(",")] if spec else [default]


@eval_app.command("lama")
def eval_lama(
    corpus: Annotated[Path, typer.Option(help="JSONL corpus the datastore is built from (lazily)")],
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    data: Annotated[Path, typer.Option(help="LAMA directory (official layout)")] = DATA_DIR,
    sample_per_relation: Annotated[int | None, typer.Option(help="facts per relation [default: all]")] = None,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    groups: Annotated[str, typer.Option(help="comma-separated LAMA groups")] = "T-REx,Google-RE,ConceptNet,SQuAD",
    vocab: Annotated[str, typer.Option(help="ranking vocabulary: full (the paper) or common (LAMA's)")] = "full",
    layers: Annotated[str | None, typer.Option(help="blocks to compare, e.g. 4,5,6 [default: second-to-last]")] = None,
    heldout_only: Annotated[bool, typer.Option(help="only facts whose subject the default head never saw")] = False,
    out: Annotated[Path, typer.Option(help="report directory (results there are resumed)")] = Path("lama-report"),
    max_minutes: Annotated[
        float | None, typer.Option(help="stop starting new facts after this long; report those done (a random subset)")
    ] = None,
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    n_docs: NDocsOption = None,
    k: KOption = None,
    temperature: TemperatureOption = None,
    lam: LamOption = None,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """LAMA probe: BERT, kNN and BERT-kNN side by side; writes report.md, report.json and p_at_k.png."""
    from bertknn import evaluation as ev
    from bertknn.report import write_report
    from bertknn.train_head import is_heldout

    _threads(threads, backend)
    began = time.time()
    try:
        if vocab not in ("full", "common"):
            raise ValueError(f"--vocab must be 'full' or 'common', not {vocab!r}")
        encoder = Encoder.load(model, backend=backend)
        tok = encoder.tokenizer
        common = ev.common_vocab(data, tok) if vocab == "common" else None
        facts = ev.load_lama(data, tok, [g.strip() for g in groups.split(",")], common, warn=console.print)
        if heldout_only:
            facts = [f for f in facts if f.group not in ev.KB_GROUPS or is_heldout(f.subject)]
        if sample_per_relation:
            facts = ev.sample_per_relation(facts, sample_per_relation, seed)
        if not facts:
            raise ValueError(f"no LAMA facts to evaluate in {data} for groups {groups}")
        out.mkdir(parents=True, exist_ok=True)
        runs = {}
        for layer in _layers(layers, encoder.layer):
            enc = encoder if layer == encoder.layer else Encoder(encoder.model, tok, model, layer, backend)
            with phase_progress() as report:
                knn = ev.lama_knn(
                    corpus,
                    enc,
                    progress=report,
                    pack=pack,
                    int8=int8_keys,
                    n_docs=n_docs,
                    k=k,
                    temperature=temperature,
                    lam=lam,
                )
                rows = ev.evaluate_facts(
                    knn,
                    facts,
                    out / ev.results_name(knn, vocab),
                    ev.vocab_ids(common, tok),
                    progress=report,
                    max_seconds=max_minutes * 60 if max_minutes else None,
                    seed=seed,
                )
            runs[layer] = (ev.summarize(rows), rows, knn)
    except USER_ERRORS as err:
        raise _fail(err) from None
    main = encoder.layer if encoder.layer in runs else next(iter(runs))
    summary, rows, knn = runs[main]
    if len(runs) > 1:
        summary["layers"] = {str(layer): run[0]["sets"].get("LAMA", {}).get("metrics") for layer, run in runs.items()}
    kind = "offline default, a weaker stand-in for bert-base-uncased" if model == DEFAULT_MODEL else "as given"
    sample = f"sample of {sample_per_relation} per relation, seed {seed}" if sample_per_relation else "all"
    tuned = " (tuned, stored with the datastore)" if knn.store.manifest.get("tuned") else " (the paper's)"
    if any(v is not None for v in (n_docs, k, temperature, lam)):
        tuned = " (as given on the command line where set)"
    setting = {
        "model": f"{model} ({kind})",
        "layer": f"{main} of {encoder.model.config.num_hidden_layers}",
        "corpus": f"{corpus} ({knn.store.n_documents:,} documents; {knn.store.size:,} contexts embedded so far). "
        "Results depend on the corpus: the paper used full English Wikipedia",
        "datastore": str(knn.store.path),
        "keys": (
            "exact (one masked target per pass)"
            if knn.store.pack == 1
            else f"approximate: up to {knn.store.pack} non-adjacent targets masked per pass (--pack)"
        )
        + ("; computed in int8 (--int8-keys)" if knn.store.int8 else ""),
        "facts": f"{len(rows):,} evaluated of {len(facts):,} ({sample}"
        f"{', subjects held out from head training only' if heldout_only else ''})"
        + ("" if len(rows) == len(facts) else "; PARTIAL: a random subset, rerun the same command to complete it"),
        "ranking vocabulary": "LAMA common vocabulary" if common else f"full model vocabulary ({encoder.vocab_size:,})",
        "hyperparameters": ", ".join(f"{k}={v}" for k, v in knn.settings.hparams.items()) + tuned,
        "LAMA-UHN": "string-match filter applied; person-name filter not applied (it needs a cased BERT)",
        "wall time": f"{time.time() - began:,.0f} s (this run; cached embeddings and results are reused)",
    }
    path = write_report(out, summary, rows, setting)
    console.print(f"report: {path}")
    sets = summary["sets"]
    table = Table(title="P@1 (macro over relations)")
    for col in ("set", "facts", "BERT", "kNN", "BERT-kNN", "ceiling"):
        table.add_column(col)
    for name, s in sets.items():
        table.add_row(
            name,
            str(s["facts"]),
            *(f"{100 * s['metrics'][m]['P@1']:.1f}" for m in ("bert", "knn", "bert_knn")),
            f"{100 * s['ceiling']:.1f}",
        )
    console.print(table)


@app.command()
def tune(
    corpus: Annotated[Path, typer.Option(help="JSONL corpus the datastore is built from (lazily)")],
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    data: Annotated[Path, typer.Option(help="LAMA directory (official layout)")] = DATA_DIR,
    dev_per_relation: Annotated[int, typer.Option(help="dev facts per T-REx/Google-RE relation")] = 10,
    squad_dev: Annotated[
        int | None, typer.Option(help="SQuAD dev questions [default: all not in the eval sample]")
    ] = None,
    heldout_only: Annotated[bool, typer.Option(help="as in `eval lama`: subjects the default head never saw")] = False,
    embedded_only: Annotated[bool, typer.Option(help="only dev facts whose documents are embedded already")] = False,
    exclude_sample_per_relation: Annotated[int, typer.Option(help="eval sample to keep out of dev")] = 30,
    seed: Annotated[int, typer.Option(help="seed of that eval sample (dev uses seed + 1)")] = 0,
    out: Annotated[Path, typer.Option(help="where grid.json and grid.md go")] = Path("lama-tune"),
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Grid search of n_docs, lambda, k and temperature on a dev split; the best is stored with the datastore."""
    from bertknn import builder
    from bertknn import evaluation as ev
    from bertknn.train_head import is_heldout
    from bertknn.tune import cache_facts, grid_search

    _threads(threads, backend)
    try:
        encoder = Encoder.load(model, backend=backend)
        facts = ev.load_lama(data, encoder.tokenizer, ("T-REx", "Google-RE", "SQuAD"), warn=console.print)
        if heldout_only:
            facts = [f for f in facts if f.group not in ev.KB_GROUPS or is_heldout(f.subject)]
        held = {ev.fact_key(f) for f in ev.sample_per_relation(facts, exclude_sample_per_relation, seed)}
        rest = [f for f in facts if ev.fact_key(f) not in held]
        with phase_progress() as report:
            knn = ev.lama_knn(corpus, encoder, progress=report, pack=pack, int8=int8_keys)
            if embedded_only:  # dev facts whose documents are embedded already: tuning costs no embedding
                rest = [f for f in rest if not knn.store.pending(knn.retrieve(f.question, ev.ir_subject(f), n_docs=5))]
            dev = ev.sample_per_relation([f for f in rest if f.group != "SQuAD"], dev_per_relation, seed + 1)
            dev += [f for f in rest if f.group == "SQuAD"][:squad_dev]
            if not dev:
                raise ValueError("no dev facts left to tune on (see --embedded-only and --exclude-sample-per-relation)")
            docs = sorted({d for f in dev for d in knn.retrieve(f.question, ev.ir_subject(f), n_docs=5)})
            pending = knn.store.pending(docs)
            report("embedding", 0, len(pending))
            builder.embed(knn.store, pending, encoder, progress=lambda n: report("embedding", n, len(pending)))
            report("caching", 0, len(dev))
            cache = cache_facts(knn, dev, progress=lambda n: report("caching", n, len(dev)))
        grid = grid_search(dev, cache)
    except USER_ERRORS as err:
        raise _fail(err) from None
    best, best_scores = grid[0]
    description = (
        f"{len(dev)} dev facts: {sum(f.group == 'SQuAD' for f in dev)} SQuAD + {dev_per_relation} per T-REx/Google-RE "
        f"relation (seed {seed + 1}){', documents already embedded' if embedded_only else ''}"
        f"{', held-out subjects' if heldout_only else ''}, "
        f"disjoint from the eval sample of {exclude_sample_per_relation} per relation (seed {seed})"
    )
    with knn.store.writing():
        knn.store.set_manifest(tuned={"hparams": best.hparams, "dev": description, "P@1": best_scores["P@1"]})
    rows = [settings.hparams | scores for settings, scores in grid]
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps({"dev": description, "grid": rows}, indent=1), encoding="utf-8")
    lines = [
        f"# Grid search ({description})",
        "",
        "| n_docs | k | temperature | lambda | P@1 | P@10 | MRR |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['n_docs']} | {r['k']} | {r['temperature']} | {r['lam']} | {100 * r['P@1']:.1f} | "
        f"{100 * r['P@10']:.1f} | {100 * r['MRR']:.1f} |"
        for r in rows
    ]
    (out / "grid.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    paper = next((scores for settings, scores in grid if settings == PAPER), None)
    paper_tag = "/".join(map(str, PAPER.hparams.values()))
    paper_p1 = f"{100 * paper['P@1']:.1f}" if paper else "not in the grid"
    console.print(f"{len(grid):,} settings scored on {description}")
    console.print(
        f"best: {best.hparams} P@1 {100 * best_scores['P@1']:.1f} (the paper's {paper_tag}: {paper_p1}); "
        f"stored in {knn.store.path / 'manifest.json'}; whole grid in {out / 'grid.md'}"
    )


@app.command()
def serve(
    datastore: Annotated[
        str, typer.Argument(help="datastore directory, or `demo` for the demo corpus's (built and cached on first use)")
    ],
    host: Annotated[str, typer.Option(help="interface to bind (loopback: this machine only)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    writable: Annotated[bool, typer.Option(help="allow POST /documents and DELETE /documents/{id}")] = False,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="BERTKNN_TOKEN",
            show_default=False,
            help="token that writes need (Authorization: Bearer TOKEN); required for --writable off loopback. "
            "Prefer the environment variable: a command line is visible to other users",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            show_default=False,
            help="Host header value to answer, repeatable (default: the loopback names; binding another address "
            "adds it and this machine's names and addresses)",
        ),
    ] = None,
    backend: BackendOption = "onnx",
    threads: Annotated[int, typer.Option(help="CPU threads [default: all cores]")] = 0,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web page: ask a question, see the three answers and evidence."""
    import uvicorn

    from bertknn.demo import build_demo
    from bertknn.service import allowed_hosts_for, create_app, is_loopback

    token = token or None
    network = not is_loopback(host)
    if writable and network and not token:
        raise _fail(ValueError(f"--writable on {host} needs a token: pass --token or set BERTKNN_TOKEN"))
    hosts = allowed_host or allowed_hosts_for(host)
    _threads(threads, backend)
    try:
        if datastore == "demo":
            with phase_progress() as report:
                knn = build_demo(backend=backend, progress=report)
        else:
            knn = BertKNN.load(datastore, backend=backend)
        knn.encoder.query(["[MASK] ."])  # the first request should not pay for loading (or exporting) the model
    except USER_ERRORS as err:
        raise _fail(err) from None
    if network:
        console.print(
            f"[bold yellow]warning:[/] bound to {escape(host)}: the service is reachable from the network, by anyone "
            "who can connect to this machine"
        )
    mode = ("writable, with token" if token else "writable") if writable else "read-only"
    console.print(
        f"datastore {knn.store.path} ({knn.store.n_documents:,} documents, {knn.store.size:,} contexts, {mode}), "
        f"model {knn.encoder.name}\nserving on [bold]http://{escape(host)}:{port}/[/] for the Host names "
        f"{escape(', '.join(hosts))} (--allowed-host sets others; Ctrl+C stops)"
    )
    service = create_app(knn, writable=writable, token=token, allowed_hosts=hosts)
    uvicorn.run(service, host=host, port=port, log_level="warning")
