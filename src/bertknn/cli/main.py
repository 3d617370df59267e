"""The command line's app: its one error handler, its shared options and the wiring that every command goes through
(`command`); the commands themselves are in the modules named by what they work on (`bertknn.cli`)."""

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

from bertknn.cli import options
from bertknn.console import console, phase_progress, show_log, shown
from bertknn.model.runtime import Runtime
from bertknn.store.lock import lock_holder, lock_wait

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
    A command that declares `settings: QuerySettings` gets the query settings' options (cli/options.py) and is called
    with the settings given, as a dict. `example` (command lines, one per line) ends the command's help."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        declared = inspect.signature(fn, eval_str=True)
        signature = options.exposed(declared)
        takes_settings = signature is not declared

        @functools.wraps(fn)  # typer reads the command's help through __wrapped__, its signature in __signature__
        def run(*args: object, **kwargs: object) -> None:
            arguments = signature.bind(*args, **kwargs).arguments
            if takes_settings:  # the settings' options, gathered into `settings`
                arguments = options.gathered(arguments)
            try:
                if "backend" in arguments:  # the command gets, in `backend`, the Runtime made of its model options
                    chosen = (arguments[name] for name in ("backend", "threads", "device", "dtype"))
                    runtime = Runtime.of(*chosen, remote=arguments.get("engine") == "ray")
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
                shown_arguments = {name: shown(str(value)) for name, value in arguments.items()}
                console.print(f"[yellow]interrupted[/]: {interrupted.format(**shown_arguments)}")
                raise typer.Exit(130) from None

        run.__signature__ = signature
        lines = "".join(f"\n  {line}" for line in example.splitlines())
        return group.command(name, epilog=f"\b\nExample:{lines}" if example else None)(run)

    return wrap


WaitOption = Annotated[
    float, typer.Option(min=0, help="seconds to wait for another process writing to the datastore (one at a time)")
]


@contextlib.contextmanager
def _writer_wait(datastore: Path, wait: float) -> Iterator[None]:
    """Let this command's writes wait up to `wait` seconds for another writer, and say so when one is at work."""
    holder = lock_holder(datastore) if datastore.is_dir() else None
    if holder and wait:
        console.print(
            f"[yellow]waiting[/] up to {wait:g} s for {shown(holder)} to finish writing {shown(str(datastore))}"
        )
    with lock_wait(wait):
        yield


DatastoreArg = Annotated[Path, typer.Argument(help="datastore directory made by `bertknn build`")]
ThreadsOption = Annotated[int, typer.Option(help="CPU threads [default: all cores]", show_default=False)]
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


def _build(corpus: Path, out: Path, model: str | Encoder, layer: int | None, **options: object) -> BertKNN:
    """Build with progress bars (reading, then embedding documents), then say what the datastore holds."""
    from bertknn.query.pipeline import BertKNN

    began = time.time()
    with phase_progress() as report:
        knn = BertKNN.build(corpus, out, model, layer, progress=report, **options)
    store = knn.store
    embedded = store.n_documents - len(store.documents.pending())
    console.print(
        f"datastore {shown(str(out))}: {store.n_documents:,} documents ({embedded:,} embedded), {store.size:,} "
        f"contexts, model {shown(knn.encoder.name)}, layer {store.manifest.layer} ({time.time() - began:,.0f}s)"
    )
    return knn
