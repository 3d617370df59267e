"""The knowledge-editing command: eval edits (CounterFact-style edits as documents, measured as the editing field
measures them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from bertknn.cli.main import BackendOption, DatastoreArg, DeviceOption, DtypeOption, ThreadsOption, command, eval_app
from bertknn.console import console, phase_progress
from bertknn.model.runtime import CLI_BACKEND

SHOWN = {  # the scores on the terminal, by short names (edits.md spells them out)
    "efficacy": "efficacy",
    "generalisation": "general.",
    "locality": "locality",
    "efficacy_score": "ES",
    "paraphrase_score": "PS",
    "neighbourhood_score": "NS",
}
ROWS = {"bertknn": "bertknn's", "paper": "paper's", "lm": "LM alone"}


def edits_table(result: dict) -> Table:
    """The last checkpoint's scores per mode and row, with the cost per edit and the undo check in the title."""
    last = result["checkpoints"][-1]
    undo = "exact" if all(c["exact"] for c in result["undo"]["rows"].values()) else "NOT exact"
    table = Table(
        title=f"after {last['edits']:,} edits (%): {last['seconds_per_edit']:.3f} s and "
        f"{last['bytes_per_edit']:,.0f} bytes per edit; undo {undo}",
        caption="ES, PS, NS: ROME's efficacy, paraphrase and neighbourhood scores",
    )
    for col in ("subjects", "method", *SHOWN.values()):
        table.add_column(col)
    for mode, by_row in last["scores"].items():
        for row, scores in by_row.items():
            cells = ("" if scores["all"][n] is None else f"{scores['all'][n]:.1f}" for n in SHOWN)
            table.add_row("with" if mode == "subjects" else "without", ROWS.get(row, row), *cells)
    return table


@command(
    eval_app,
    "edits",
    example="bertknn eval edits my_store counterfact-train.json --n 1000 --split test --out edits-report",
)
def eval_edits(
    datastore: DatastoreArg,
    edits_file: Annotated[
        Path, typer.Argument(help="CounterFact edits: JSON or JSON Lines, EasyEdit's flat layout or ROME's")
    ],
    n: Annotated[int | None, typer.Option(min=1, help="edits to make, the first of the split [default: all]")] = None,
    batch: Annotated[int, typer.Option(min=1, help="edits added per write")] = 100,
    split: Annotated[
        str, typer.Option(help="dev (even case_ids), test (odd ones) or all; fixed before any tuning")
    ] = "all",
    out: Annotated[Path, typer.Option(help="report directory: edits.md, edits.json, edits.png")] = Path("edits-report"),
    subjects: Annotated[
        bool | None,
        typer.Option(
            "--subjects/--no-subjects",
            help="ask only with the edits' subjects (IR's title shortcut) or only without [default: both]",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[int, typer.Option(min=1, help="answers per question the undo check compares")] = 10,
    in_place: Annotated[
        bool, typer.Option("--in-place", help="edit the datastore itself, not a temporary copy (the edits are removed)")
    ] = False,
    model: Annotated[str | None, typer.Option(help="model [default: the datastore's]")] = None,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Knowledge editing: each edit a document added, then efficacy, generalisation, locality and ROME's scores as
    the edits accumulate, with bertknn's settings, the paper's and the LM alone; writes edits.md, edits.json and
    edits.png. The datastore is copied first (to $TMPDIR) and left as it was."""
    from bertknn.evaluation.edits import evaluate_edits
    from bertknn.evaluation.edits_data import load_edits, split_edits
    from bertknn.evaluation.edits_report import write_edits_report
    from bertknn.query.pipeline import BertKNN

    records = split_edits(load_edits(edits_file), split, n)
    if not records:
        raise ValueError(f"{edits_file} has no edits in the {split} split")
    modes = ("subjects", "no_subjects") if subjects is None else ("subjects",) if subjects else ("no_subjects",)
    reader = BertKNN.load(datastore, model, runtime=backend)
    with phase_progress() as report:
        options = {"batch": batch, "modes": modes, "top_k": top_k, "in_place": in_place, "progress": report}
        result = evaluate_edits(reader, records, **options)
    result["setting"] = {"edits file": str(edits_file), "split": split} | result["setting"]
    console.print(f"report: {write_edits_report(out, result)}")
    console.print(edits_table(result))
