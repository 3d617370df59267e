"""Command line: build, ask, index, add, remove, demo, data lama, eval lama, tune, train-head."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from bertknn.console import console, p_at_1_table, phase_progress, render, shown
from bertknn.default_model import DEFAULT_MODEL, HEAD_FILE
from bertknn.encoder import Encoder
from bertknn.pipeline import BertKNN
from bertknn.runtime import Runtime
from bertknn.settings import PAPER

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
data_app = typer.Typer(no_args_is_help=True, help="Get and verify evaluation data.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate BERT, kNN and BERT-kNN.")
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
TUNED = "default: the datastore's tuned value, else "
DATA_DIR = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "lama"
USER_ERRORS = (ValueError, OSError)  # bertknn's errors are ValueErrors; OSError: disk full, permissions...


def command(
    group: typer.Typer = app,
    name: str | None = None,
    interrupted: str | None = None,
    errors: Callable[[], tuple[type[Exception], ...]] = lambda: USER_ERRORS,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a command on `group` with the one error handler of all commands, so that a user sees a line, not a
    traceback: `errors()` print the red `error:` line (exit 2); Ctrl+C prints `interrupted` (formatted with the
    arguments; exit 130) where one is given. A command's `threads` (and `backend`) arguments set the threads first."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)  # typer reads the command's signature and help through __wrapped__
        def run(*args: object, **kwargs: object) -> None:
            arguments = signature.bind(*args, **kwargs).arguments
            try:
                if "threads" in arguments:
                    Runtime.of(arguments.get("backend", "torch"), arguments["threads"]).apply()
                fn(*args, **kwargs)
            except errors() as err:  # evaluated only when an exception is raised
                console.print(f"[bold red]error:[/] {shown(str(err))}")
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                if interrupted is None:
                    raise
                console.print(f"[yellow]interrupted[/]: {interrupted.format(**arguments)}")
                raise typer.Exit(130) from None

        return group.command(name)(run)

    return wrap


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
            f"[yellow]waiting[/] up to {wait:g} s for {escape(holder)} to finish writing {shown(str(datastore))}"
        )
    with lock_wait(wait):
        yield


DatastoreArg = Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")]
ThreadsOption = Annotated[int, typer.Option(help="CPU threads [default: all cores]")]
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


def _build(corpus: Path, out: Path, model: str | Encoder, layer: int | None, **options: object) -> BertKNN:
    """Build with progress bars (reading, then embedding documents), then say what the datastore holds."""
    began = time.time()
    with phase_progress() as report:
        knn = BertKNN.build(corpus, out, model, layer, progress=report, **options)
    store = knn.store
    console.print(
        f"datastore {out}: {store.n_documents:,} documents ({store.n_documents - len(store.pending()):,} embedded), "
        f"{store.size:,} contexts, model {knn.encoder.name}, layer {store.layer} ({time.time() - began:,.0f}s)"
    )
    return knn


@command(interrupted="what was committed is kept; rerun the same command to resume {out}")
def build(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus: one {id, title, text} document per line")],
    out: Annotated[Path, typer.Option("--out", "-o", help="datastore directory to create (or resume)")],
    model: Annotated[str, typer.Option(help="HF masked LM: hub name or local directory")] = DEFAULT_MODEL,
    layer: Annotated[int | None, typer.Option(help="block whose states are keys [default: second-to-last]")] = None,
    lazy: Annotated[bool, typer.Option(help="embed each document only when retrieval first picks it")] = False,
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    backend: BackendOption = "onnx",
    threads: ThreadsOption = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Embed every target word of a corpus into a datastore and index its documents. Rerun to resume."""
    with _writer_wait(out, wait):
        _build(corpus, out, model, layer, lazy=lazy, pack=pack, runtime=backend, int8_keys=int8_keys)


@command()
def ask(
    datastore: DatastoreArg,
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
    threads: ThreadsOption = 0,
) -> None:
    """Answer a cloze question: BERT, kNN and BERT-kNN side by side, with the evidence sentences."""
    knn = BertKNN.load(datastore, model, runtime=backend, n_docs=n_docs, k=k, temperature=temperature, lam=lam)
    console.print(render(knn.predict(question, subject=subject, top_k=top_k, retrieval=retrieval), top_k))


@command(interrupted="what was saved is kept; rerun the same command to resume {datastore}")
def index(
    datastore: DatastoreArg,
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
    threads: ThreadsOption = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Index every key of a datastore with FAISS (for `--retrieval faiss`). Rerun to resume."""
    import faiss

    from bertknn.datastore import Datastore
    from bertknn.faiss_index import FaissIndex

    faiss.omp_set_num_threads(threads or os.cpu_count() or 1)
    began = time.time()
    store = Datastore(datastore)
    with _writer_wait(datastore, wait), phase_progress() as report:
        report("indexing", 0, store.size)
        built = FaissIndex.build(
            store, factory, train_size, nprobe, progress=lambda done, total: report("indexing", done, total)
        )
    console.print(
        f"FAISS index {built.settings['factory']!r} over {built.index.ntotal:,} keys in {datastore / 'faiss.index'} "
        f"({time.time() - began:,.0f}s); ask with --retrieval faiss"
    )


@command(interrupted="nothing half-added is searchable; rerun the same command to finish")
def add(
    datastore: DatastoreArg,
    corpus: Annotated[Path, typer.Argument(help="JSONL documents to add ({id, title, text} per line)")],
    backend: BackendOption = "onnx",
    threads: ThreadsOption = 0,
    wait: WaitOption = WAIT_S,
) -> None:
    """Add documents: embedded and indexed in place, searchable at once. Rerun after a crash to complete it."""
    from bertknn.text import iter_corpus

    docs = list(iter_corpus(corpus))  # the whole file is read first: a bad line changes nothing
    knn = BertKNN.load(datastore, runtime=backend)
    known = knn.store.states([d.id for d in docs])
    with _writer_wait(datastore, wait), phase_progress() as report:
        added = knn.add_documents(docs, skip_existing=True, progress=lambda n: report("embedding", n, len(docs)))
    skipped = sum(state == "live" for state in known.values())
    console.print(
        f"added {len(docs) - skipped:,} documents ({added:,} contexts) to {datastore}"
        + (f"; {skipped:,} were there already" if skipped else "")
    )


@command()
def remove(
    datastore: DatastoreArg,
    doc: Annotated[list[str], typer.Option("--doc", help="id of a document to hide (repeatable)")],
    wait: WaitOption = WAIT_S,
) -> None:
    """Remove documents: hidden from IR, kNN and FAISS search at once, all or none (their stored rows are kept)."""
    from bertknn.datastore import Datastore

    store = Datastore(datastore)
    with _writer_wait(datastore, wait), store.writing():
        removed, before = store.remove(doc)
    console.print(
        f"removed {len(removed)} document(s) from {escape(str(datastore))}"
        + (f"; already removed before: {escape(', '.join(before))}" if before else "")
    )


@command()
def verify(
    datastore: DatastoreArg,
    record: Annotated[
        bool, typer.Option(help="record the checksums of the files as they are now (only for files known sound)")
    ] = False,
) -> None:
    """Check a datastore: every checksum block of every file, SQLite's integrity, keys. Exit status 1 on damage."""
    from bertknn import datastore as ds

    if record:
        ds.record_checksums(datastore)
    with phase_progress() as report:
        found = ds.verify(datastore, progress=lambda done, total: report("verifying", done, total))
    for note in found.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    for problem in found.problems:
        console.print(f"[bold red]damaged:[/] {escape(problem)}")
    if found.problems:
        raise typer.Exit(1)
    console.print(f"{escape(str(datastore))}: sound ({found.blocks:,} checksum blocks checked)")


@command()
def demo(
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    backend: BackendOption = "onnx",
    threads: ThreadsOption = 0,
) -> None:
    """Build the embedded demo corpus's datastore (cached) and answer its questions."""
    from bertknn.demo import DEMO_CORPUS, demo_path, intro, narration

    encoder = Encoder.load(model, runtime=backend)
    out = demo_path(encoder)
    console.print(intro(model, out))
    knn = _build(DEMO_CORPUS, out, encoder, None)
    for part in narration(knn):
        console.print(part)


@command(name="train-head")
def train_head_cmd(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus to train on (held-out documents are skipped)")],
    out: Annotated[Path, typer.Option(help="safetensors file to write")] = HEAD_FILE,
    steps: Annotated[int, typer.Option(help="optimiser steps")] = 3000,
    batch_size: Annotated[int, typer.Option(help="sentences per step")] = 32,
    max_length: Annotated[int, typer.Option(help="tokens per sentence")] = 48,
    rank: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    threads: ThreadsOption = 0,
) -> None:
    """Train the offline default model's MLM head, [MASK] embedding and adapters on the MiniLM-L6 encoder."""
    from bertknn.train_head import train_head

    info = train_head(
        corpus, out, steps=steps, batch_size=batch_size, max_length=max_length, rank=rank, log=console.print
    )
    console.print(f"wrote {out}: held-out {info['heldout_metrics']}")


def _lama_data_errors() -> tuple[type[Exception], ...]:
    from bertknn.lama_data import LamaDataError  # imported when an error is handled: start-up stays light

    return (LamaDataError, OSError)


@command(data_app, "lama", errors=_lama_data_errors)
def data_lama(
    dest: Annotated[Path, typer.Option(help="directory for LAMA's data (it gets data/TREx/... inside)")] = DATA_DIR,
    verify_only: Annotated[bool, typer.Option(help="only check the files against LAMA's git blob hashes")] = False,
) -> None:
    """Download LAMA's official data.zip and verify every file against the shipped list of git blob hashes."""
    from bertknn.lama_data import download, report_lines, verify

    result = verify(dest) if verify_only else verify(download(dest, console=console))
    for line in report_lines(result):
        console.print(escape(line))
    if not result.passed:
        raise typer.Exit(1)


@command(eval_app, "lama")
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
    threads: ThreadsOption = 0,
) -> None:
    """LAMA probe: BERT, kNN and BERT-kNN side by side; writes report.md, report.json and p_at_k.png."""
    from bertknn import evaluation as ev
    from bertknn.report import lama_setting, write_report

    began = time.time()
    if vocab not in ("full", "common"):
        raise ValueError(f"--vocab must be 'full' or 'common', not {vocab!r}")
    encoder = Encoder.load(model, runtime=backend)
    common = ev.common_vocab(data, encoder.tokenizer) if vocab == "common" else None
    facts = ev.select_facts(
        data, encoder.tokenizer, groups, common, heldout_only, sample_per_relation, seed, console.print
    )
    given = {"n_docs": n_docs, "k": k, "temperature": temperature, "lam": lam}
    max_seconds = max_minutes * 60 if max_minutes else None
    blocks = [int(x) for x in layers.split(",")] if layers else None
    summary, rows, knn = ev.evaluate_layers(
        corpus, encoder, facts, out, blocks, common, phase_progress, max_seconds, seed, pack, int8_keys, **given
    )
    setting = lama_setting(
        encoder, knn, len(facts), len(rows), corpus, sample_per_relation, seed, heldout_only, vocab, given, began
    )
    console.print(f"report: {write_report(out, summary, rows, setting)}")
    console.print(p_at_1_table(summary))


@command()
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
    threads: ThreadsOption = 0,
) -> None:
    """Grid search of n_docs, lambda, k and temperature on a dev split; the best is stored with the datastore."""
    from bertknn import evaluation as ev
    from bertknn.report import write_grid
    from bertknn.tune import DevSplit, cache_dev, grid_search, store_best

    split = DevSplit(dev_per_relation, squad_dev, exclude_sample_per_relation, seed, heldout_only, embedded_only)
    encoder = Encoder.load(model, runtime=backend)
    facts = ev.load_lama(data, encoder.tokenizer, ("T-REx", "Google-RE", "SQuAD"), warn=console.print)
    with phase_progress() as report:
        knn = ev.lama_knn(corpus, encoder, progress=report, pack=pack, int8_keys=int8_keys)
        dev = split.choose(facts, knn)
        cache = cache_dev(knn, dev, report)
    grid = grid_search(dev, cache)
    description = split.describe(dev)
    store_best(knn, grid, description)
    grid_md = write_grid(out, description, grid)
    (best, best_scores), paper = grid[0], next((scores for s, scores in grid if s == PAPER), None)
    paper_p1 = f"{100 * paper['P@1']:.1f}" if paper else "not in the grid"
    console.print(f"{len(grid):,} settings scored on {description}")
    console.print(
        f"best: {best.hparams} P@1 {100 * best_scores['P@1']:.1f} (the paper's "
        f"{'/'.join(map(str, PAPER.hparams.values()))}: {paper_p1}); "
        f"stored in {knn.store.path / 'manifest.json'}; whole grid in {grid_md}"
    )


@command()
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
    threads: ThreadsOption = 0,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web page: ask a question, see the three answers and evidence."""
    import uvicorn

    from bertknn.demo import build_demo
    from bertknn.service import allowed_hosts_for, create_app, is_loopback

    token = token or None
    network = not is_loopback(host)
    if writable and network and not token:
        raise ValueError(f"--writable on {host} needs a token: pass --token or set BERTKNN_TOKEN")
    hosts = allowed_host or allowed_hosts_for(host)
    if datastore == "demo":
        with phase_progress() as report:
            knn = build_demo(backend=backend, progress=report)
    else:
        knn = BertKNN.load(datastore, runtime=backend)
    knn.encoder.query(["[MASK] ."])  # the first request should not pay for loading (or exporting) the model
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
    uvicorn.run(
        create_app(knn, writable=writable, token=token, allowed_hosts=hosts), host=host, port=port, log_level="warning"
    )
