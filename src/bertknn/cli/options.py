"""The query settings as command-line options, made from their declarations in `Settings` (query/settings.py): a
command that declares `settings: QuerySettings` gets one option for every `Settings` field (its help, bounds and
default as declared there), `--paper` and `--no-sentence-weights`, and is called with the settings given as a dict.
"""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from bertknn.query.settings import DEFAULT, PAPER, SPECS, TUNED, TYPES

QuerySettings = dict  # a command's parameter `settings: QuerySettings` stands for the options made here
PaperOption = Annotated[
    bool,
    typer.Option(
        "--paper",
        help="the paper's method exactly: its vote, mixture, n_docs, k, temperature and lambda (options given with it "
        "still apply)",
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
FLAGS = {"paper": (PaperOption, False), "no_sentence_weights": (NoSentenceWeightsOption, False)}


def _shown(value: object) -> str:
    """A default as the help shows it: on / off for a switch."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _help(name: str, spec) -> str:
    """A setting's help: what it does, its choices or bounds, its default (a tuned one's: the datastore's) and the
    paper's value where it differs."""
    default, paper = (_shown(getattr(settings, name)) for settings in (DEFAULT, PAPER))
    allowed = " or ".join(spec.choices) if spec.choices else spec.range()
    shown = [f"default: the datastore's tuned value, else {default}" if name in TUNED else f"default: {default}"]
    shown += [f"the paper's: {paper}"] if paper != default else []
    shown += [spec.note] if spec.note else []
    return f"{spec.help} [{allowed}] [{'; '.join(shown)}]" if allowed else f"{spec.help} [{'; '.join(shown)}]"


def _option(field, spec) -> inspect.Parameter:
    """The option of one `Settings` field: None (not given) by default."""
    flag = spec.flag or "--" + field.name.replace("_", "-")
    kind = TYPES[field.type]
    decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
    option = typer.Option(*decls, help=_help(field.name, spec), show_default=False)
    annotation = Annotated[kind | None, option]
    return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


OPTIONS = [_option(field, spec) for field, spec in SPECS]


def exposed(signature: inspect.Signature) -> inspect.Signature:
    """`signature` (evaluated) with its `settings: QuerySettings` parameter, if any, replaced by the settings'
    options, --paper and --no-sentence-weights: what the command line reads."""
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.annotation is QuerySettings and p.name == "settings"), None)
    if at is None:
        return signature
    flags = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, (annotation, default) in FLAGS.items()
    ]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[at + 1 :]]
    return signature.replace(parameters=[*params[:at], *OPTIONS, *flags, *rest])


def gathered(arguments: dict) -> dict:
    """`arguments` of an exposed signature with the settings' options taken out into `settings`: those given (not
    None), over the paper's when --paper, the sentence temperature 0 with --no-sentence-weights."""
    rest = dict(arguments)
    given = {option.name: rest.pop(option.name, None) for option in OPTIONS}
    paper, off = rest.pop("paper", False), rest.pop("no_sentence_weights", False)
    base = {name: value for name, value in PAPER.as_dict().items() if name != "retrieval"} if paper else {}
    weights = {"sentence_temperature": 0.0} if off else {}
    return {**rest, "settings": base | {k: v for k, v in given.items() if v is not None} | weights}
