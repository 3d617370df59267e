"""Commands of the LAMA probe: data lama, eval lama, tune; and train-head (the offline default model)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from bertknn.cli.main import (
    DATA_DIR,
    BackendOption,
    DeviceOption,
    DtypeOption,
    Int8Option,
    PackOption,
    ThreadsOption,
    command,
    data_app,
    eval_app,
)
from bertknn.cli.options import QuerySettings
from bertknn.console import console, p_at_1_table, phase_progress
from bertknn.evaluation.facts import GROUPS
from bertknn.model.default_model import DEFAULT_MODEL, HEAD_FILE
from bertknn.model.runtime import CLI_BACKEND
from bertknn.query.settings import PAPER


@command(name="train-head", example="bertknn train-head evidence_docs.jsonl --out my_head.safetensors")
def train_head_cmd(
    corpus: Annotated[Path, typer.Argument(help="JSONL corpus to train on (held-out documents are skipped)")],
    out: Annotated[Path, typer.Option(help="safetensors file to write")] = HEAD_FILE,
    steps: Annotated[int, typer.Option(help="optimiser steps")] = 3000,
    batch_size: Annotated[int, typer.Option(help="sentences per step")] = 32,
    max_length: Annotated[int, typer.Option(help="tokens per sentence")] = 48,
    rank: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    lr: Annotated[float, typer.Option(help="peak learning rate (linear warm-up and decay)")] = 1e-3,
    init: Annotated[
        Path | None, typer.Option(help="head file (same --rank) to go on training from [default: a fresh head]")
    ] = None,
    threads: ThreadsOption = 0,
) -> None:
    """Train the offline default model's MLM head, [MASK] embedding and adapters on the MiniLM-L6 encoder."""
    from bertknn.model.train_head import train_head

    options = {"steps": steps, "batch_size": batch_size, "max_length": max_length, "rank": rank, "lr": lr}
    info = train_head(corpus, out, init=init, log=console.print, **options)
    console.print(f"wrote {out}: held-out {info['heldout_metrics']}")


def _lama_data_errors() -> tuple[type[Exception], ...]:
    from bertknn.evaluation.lama_data import LamaDataError  # imported when an error is handled: start-up stays light

    return (LamaDataError, OSError)


@command(data_app, "lama", errors=_lama_data_errors, example="bertknn data lama --dest lama")
def data_lama(
    dest: Annotated[Path, typer.Option(help="directory for LAMA's data (it gets data/TREx/... inside)")] = DATA_DIR,
    verify_only: Annotated[bool, typer.Option(help="only check the files against LAMA's git blob hashes")] = False,
) -> None:
    """Download LAMA's official data.zip and verify every file against the shipped list of git blob hashes."""
    from bertknn.evaluation.lama_data import download, report_lines, verify

    result = verify(dest) if verify_only else verify(download(dest, console=console))
    for line in report_lines(result):
        console.print(escape(line))
    if not result.passed:
        raise typer.Exit(1)


CorpusOption = Annotated[Path, typer.Option(help="corpus the datastore is built from, lazily (any format build reads)")]
ModelOption = Annotated[str, typer.Option(help="HF masked LM")]
LamaDirOption = Annotated[Path, typer.Option(help="LAMA directory (official layout)")]
SamplePerRelationOption = Annotated[int | None, typer.Option(help="facts per relation [default: all]")]
SamplingSeedOption = Annotated[int, typer.Option(help="sampling seed")]
GroupsOption = Annotated[str | None, typer.Option(help=f"comma-separated LAMA groups [default: {','.join(GROUPS)}]")]
VocabOption = Annotated[str, typer.Option(help="ranking vocabulary: full (the paper) or common (LAMA's)")]
LayersOption = Annotated[str | None, typer.Option(help="blocks to compare, e.g. 4,5,6 [default: second-to-last]")]
HeldoutOnlyOption = Annotated[bool, typer.Option(help="only facts whose subject the default head never saw")]
NoSubjectOption = Annotated[
    bool, typer.Option(help="ask without the subject: documents retrieved from the question's text, as users ask")
]
ReportDirOption = Annotated[Path, typer.Option(help="report directory (results there are resumed)")]
MaxMinutesOption = Annotated[
    float | None, typer.Option(help="stop starting new facts after this long; report those done (a random subset)")
]


@command(
    eval_app,
    "lama",
    example="bertknn eval lama --corpus my_docs.jsonl --data lama --sample-per-relation 30 --out report",
)
def eval_lama(
    corpus: CorpusOption,
    model: ModelOption = DEFAULT_MODEL,
    data: LamaDirOption = DATA_DIR,
    sample_per_relation: SamplePerRelationOption = None,
    seed: SamplingSeedOption = 0,
    groups: GroupsOption = None,
    vocab: VocabOption = "full",
    layers: LayersOption = None,
    heldout_only: HeldoutOnlyOption = False,
    no_subject: NoSubjectOption = False,
    out: ReportDirOption = Path("lama-report"),
    max_minutes: MaxMinutesOption = None,
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    settings: QuerySettings = None,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """LAMA probe: BERT, kNN and BERT-kNN side by side; writes report.md, report.json and p_at_k.png."""
    from bertknn.evaluation.facts import common_vocab, select_facts
    from bertknn.evaluation.report import lama_setting, write_report
    from bertknn.evaluation.run import evaluate_layers
    from bertknn.model.encoder import Encoder

    began = time.time()
    if vocab not in ("full", "common"):
        raise ValueError(f"--vocab must be 'full' or 'common', not {vocab!r}")
    encoder = Encoder.load(model, runtime=backend)
    common = common_vocab(data, encoder.tokenizer) if vocab == "common" else None
    facts = select_facts(
        data, encoder.tokenizer, groups, common, heldout_only, sample_per_relation, seed, console.print
    )
    blocks = [int(x) for x in layers.split(",")] if layers else None
    options = {"phases": phase_progress, "max_seconds": max_minutes * 60 if max_minutes else None, "seed": seed}
    options |= {"pack": pack, "int8_keys": int8_keys, "with_subject": not no_subject}
    summary, rows, reader = evaluate_layers(corpus, encoder, facts, out, blocks, common, **options, **settings)
    asked = {"per_relation": sample_per_relation, "seed": seed, "heldout_only": heldout_only, "vocab": vocab}
    asked |= {"given": settings, "began": began, "with_subject": not no_subject}
    setting = lama_setting(encoder, reader, len(facts), len(rows), corpus, **asked)
    console.print(f"report: {write_report(out, summary, rows, setting)}")
    console.print(p_at_1_table(summary))


@command(example="bertknn tune --corpus my_docs.jsonl --data lama --out lama-tune")
def tune(
    corpus: CorpusOption,
    model: ModelOption = DEFAULT_MODEL,
    data: LamaDirOption = DATA_DIR,
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
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Grid search of n_docs, lambda, k and temperature on a dev split; the best is stored with the datastore."""
    from bertknn.evaluation.facts import load_lama
    from bertknn.evaluation.report import write_grid
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit, cache_facts, grid_search, store_best
    from bertknn.model.encoder import Encoder

    split = DevSplit(dev_per_relation, squad_dev, exclude_sample_per_relation, seed, heldout_only, embedded_only)
    encoder = Encoder.load(model, runtime=backend)
    facts = load_lama(data, encoder.tokenizer, GROUPS, warn=console.print)  # the eval sample is drawn from all
    with phase_progress() as report:
        reader = lama_reader(corpus, encoder, progress=report, pack=pack, int8_keys=int8_keys)
        dev = split.choose(facts, reader)
        cache = cache_facts(reader, dev, report)
    grid = grid_search(dev, cache)
    description = split.describe(dev)
    store_best(reader, grid, description)
    grid_md = write_grid(out, description, grid)
    (best, best_scores), paper = grid[0], next((scores for s, scores in grid if s == PAPER), None)
    paper_p1 = f"{100 * paper['P@1']:.1f}" if paper else "not in the grid"
    console.print(f"{len(grid):,} settings scored on {description}")
    console.print(
        f"best: {best.tuned} P@1 {100 * best_scores['P@1']:.1f} (the paper's "
        f"{'/'.join(map(str, PAPER.tuned.values()))}: {paper_p1}); "
        f"stored in {reader.store.path / 'manifest.json'}; whole grid in {grid_md}"
    )
