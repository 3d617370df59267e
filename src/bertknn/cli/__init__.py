"""The command line, `bertknn`: the app, its one error handler and its shared options, here; the commands, by what they
work on, in store.py (build, ask, index, add, remove, verify), lama.py (data lama, eval lama, tune, train-head) and
serve.py (serve, demo). Commands only wire options to the library: what they do is in the module of its concept.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer
import typer.core
from rich.markup import escape

from bertknn.console import console, phase_progress, show_log, shown
from bertknn.model.runtime import Runtime
from bertknn.query.settings import (
    DEFAULT,
    DOC_TEMPERATURE,
    LM_WORDS,
    MIXTURE,
    MIXTURES,
    PAPER,
    SENTENCE_TEMPERATURE,
    WORD_BONUS,
)

HELP = (
    "BERT-kNN: a masked language model that answers cloze questions from a text collection it searches.\n\n"
    "Start with `bertknn demo`. Each command's --help ends with an example."
)
# the order a user meets the commands in; `bertknn --help` lists them so (click would sort them by name)
ORDER = (
    "demo", "build", "ask", "add", "remove", "index", "sentences", "convert-keys", "prune", "serve", "verify", "repair",
    "eval", "tune", "data", "train-head",
)  # fmt: skip
if TYPE_CHECKING:  # the commands import the model and the library when they run: `--help` does not wait for them
    from bertknn.model.encoder import Encoder
    from bertknn.query.pipeline import BertKNN

PLAIN = {"rich_markup_mode": None}  # help texts as written: their "[default: ...]" is not rich markup


class _Ordered(typer.core.TyperGroup):
    """The commands listed in ORDER, any other after them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))


app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP, cls=_Ordered, **PLAIN)
data_app = typer.Typer(no_args_is_help=True, help="Get and verify evaluation data.", **PLAIN)
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate BERT, kNN and BERT-kNN.", **PLAIN)
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
TUNED = "default: the datastore's tuned value, else "


def _version(wanted: bool) -> None:
    """`bertknn --version`: the installed version, then exit."""
    if wanted:
        from importlib.metadata import version

        console.print(f"bertknn {version('bertknn')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """The options before any command (`--version`); the library's log shown on stderr."""
    show_log()


DATA_DIR = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "lama"
USER_ERRORS = (ValueError, OSError)  # bertknn's errors are ValueErrors; OSError: disk full, permissions...


def command(
    group: typer.Typer = app,
    name: str | None = None,
    interrupted: str | None = None,
    errors: Callable[[], tuple[type[Exception], ...]] = lambda: USER_ERRORS,
    example: str = "",
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a command on `group` with the one error handler of all commands, so that a user sees a line, not a
    traceback: `errors()` print the red `error:` line (exit 2); Ctrl+C prints `interrupted` (formatted with the
    arguments; exit 130) where one is given. A command that runs the model declares `backend`, `device`, `dtype` and
    `threads`: it is called with the `Runtime` they make (checked here, threads applied) in `backend`; under
    `--engine ray` the model runs on the cluster's workers, so the device is checked there (`Runtime.remote`).
    `example` (command lines, one per line) ends the command's help."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)  # typer reads the command's signature and help through __wrapped__
        def run(*args: object, **kwargs: object) -> None:
            arguments = signature.bind(*args, **kwargs).arguments
            try:
                if "backend" in arguments:  # the command gets, in `backend`, the Runtime made of its model options
                    options = (arguments[name] for name in ("backend", "threads", "device", "dtype"))
                    runtime = Runtime.of(*options, remote=arguments.get("engine") == "ray")
                    arguments["backend"] = runtime
                    runtime.apply()
                elif "threads" in arguments:
                    Runtime(threads=arguments["threads"]).apply()
                fn(**arguments)
            except errors() as err:  # evaluated only when an exception is raised
                console.print(f"[bold red]error:[/] {shown(str(err))}")
                raise typer.Exit(2) from None
            except KeyboardInterrupt:
                if interrupted is None:
                    raise
                console.print(f"[yellow]interrupted[/]: {interrupted.format(**arguments)}")
                raise typer.Exit(130) from None

        lines = "".join(f"\n  {line}" for line in example.splitlines())
        return group.command(name, epilog=f"\b\nExample:{lines}" if example else None)(run)

    return wrap


WaitOption = Annotated[
    float, typer.Option(min=0, help="seconds to wait for another process writing to the datastore (one at a time)")
]
WAIT_S = 60.0


@contextlib.contextmanager
def _writer_wait(datastore: Path, wait: float) -> Iterator[None]:
    """Let this command's writes wait up to `wait` seconds for another writer, and say so when one is at work."""
    from bertknn.store.datastore import lock_holder, lock_wait

    holder = lock_holder(datastore) if datastore.is_dir() else None
    if holder and wait:
        console.print(
            f"[yellow]waiting[/] up to {wait:g} s for {escape(holder)} to finish writing {shown(str(datastore))}"
        )
    with lock_wait(wait):
        yield


DatastoreArg = Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")]
ThreadsOption = Annotated[int, typer.Option(help="CPU threads [default: all cores]", show_default=False)]
NDocsOption = Annotated[int | None, typer.Option(help=f"documents retrieved [{TUNED}{DEFAULT.n_docs}]")]
KOption = Annotated[int | None, typer.Option(help=f"nearest neighbours [{TUNED}{DEFAULT.k}]")]
TemperatureOption = Annotated[
    float | None, typer.Option(help=f"kNN temperature l in exp(-d/l) [{TUNED}{DEFAULT.temperature}]")
]
LamOption = Annotated[
    float | None, typer.Option("--lambda", help=f"weight of p_kNN [{TUNED}{DEFAULT.lam}; the paper's: {PAPER.lam}]")
]
DocTemperatureOption = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="retrieval-aware kNN: each retrieved document's neighbours vote within it, weighted by a softmax of its "
        f"retrieval score over this temperature; 0: the paper's vote [default: {DOC_TEMPERATURE}]",
    ),
]
LamByOption = Annotated[
    str | None,
    typer.Option(help="lambda per question: constant (the paper) or entropy (scaled by the kNN's confidence)"),
]
MixtureOption = Annotated[
    str | None,
    typer.Option(
        help=f"how p_kNN and the LM's p combine: {' or '.join(MIXTURES)} (the paper: linear) [{TUNED}{MIXTURE}]"
    ),
]
LmWordsOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="the LM scores the answers of several tokens among the kNN's this many best words (one model pass per "
        f"word length); the log-linear mixture leaves the others out; 0: all [default: {LM_WORDS}]",
    ),
]
WordBonusOption = Annotated[
    float | None,
    typer.Option(
        help="the log-linear mixture's factor for answers of several tokens, whose LM scores are weak evidence; 1: "
        f"none [default: {WORD_BONUS}]",
    ),
]
SentenceTemperatureOption = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="weigh each neighbour within its document by exp(score / this), the score how well its sentence says what "
        f"the question asks (all-MiniLM-L6-v2); 0: every sentence alike (the paper) [default: {SENTENCE_TEMPERATURE}]",
    ),
]
NoSentenceWeightsOption = Annotated[
    bool,
    typer.Option(
        "--no-sentence-weights",
        help="every sentence alike, as in the paper (--sentence-temperature 0); a datastore made before evidence "
        "vectors answers so until `bertknn sentences` stores them",
    ),
]
ConflictsOption = Annotated[
    str | None,
    typer.Option(
        help="where documents about the subject disagree: newest (a newer document whose evidence speaks to the "
        "question about as nearly outvotes the older ones) or vote (all alike) [default: newest]",
    ),
]
EntityFilterOption = Annotated[
    bool | None,
    typer.Option(
        "--entity-filter/--no-entity-filter",
        help="keep only retrieved documents that name the question's subject (or, without one, its capitalised "
        "names), so that evidence about another entity does not answer, and leave the subject's own name in its "
        "article out of the vote [default: on; off with --paper]",
    ),
]
PaperOption = Annotated[
    bool,
    typer.Option(
        "--paper",
        help="the paper's method exactly: its vote, mixture, n_docs, k, temperature and lambda (options given with it "
        "still apply)",
    ),
]
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
DeviceOption = Annotated[
    str, typer.Option(help="where the model runs: auto (a CUDA GPU when PyTorch sees one, else cpu), cpu, cuda, cuda:N")
]
DtypeOption = Annotated[
    str,
    typer.Option(
        help="the model's precision: float32 (exact), bf16 (GPU or CPU), fp16 (GPU); keys are stored as float16"
    ),
]
BackendOption = Annotated[
    str,
    typer.Option(
        help="run the model in onnx (ONNX Runtime: the same numbers, faster on CPU; exported once to the cache), "
        "torch, or onnx-int8 (questions in int8: faster still, approximate); speeds in bench/README.md"
    ),
]


def query_options(paper: bool, no_sentence_weights: bool = False, **given: object) -> dict:
    """The query settings a command passes on: those given (not None), over the paper's when `paper` (--paper);
    `no_sentence_weights` (--no-sentence-weights) sets the sentence temperature to 0."""
    base = {name: value for name, value in PAPER.as_dict().items() if name != "retrieval"} if paper else {}
    off = {"sentence_temperature": 0.0} if no_sentence_weights else {}
    return base | {name: value for name, value in given.items() if value is not None} | off


def _build(corpus: Path, out: Path, model: str | Encoder, layer: int | None, **options: object) -> BertKNN:
    """Build with progress bars (reading, then embedding documents), then say what the datastore holds."""
    from bertknn.query.pipeline import BertKNN

    began = time.time()
    with phase_progress() as report:
        knn = BertKNN.build(corpus, out, model, layer, progress=report, **options)
    store = knn.store
    console.print(
        f"datastore {out}: {store.n_documents:,} documents ({store.n_documents - len(store.pending()):,} embedded), "
        f"{store.size:,} contexts, model {knn.encoder.name}, layer {store.layer} ({time.time() - began:,.0f}s)"
    )
    return knn


from bertknn.cli import edits, lama, serve, store  # noqa: E402 (registers their commands on the apps above)

__all__ = ["app", "command", "edits", "lama", "serve", "store"]
