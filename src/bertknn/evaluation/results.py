"""Result files of `eval lama`: one JSON line per fact, in a file named after the run (`results_name`: layer,
settings, ranking vocabulary, subject use) so that a report directory holds runs side by side; reading them back,
cut lines skipped, and what each run's file name says it holds (`results_run`, `summarize_runs`).
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from bertknn.evaluation.metrics import summarize

RESULTS_NAME = re.compile(
    r"results-L(?P<layer>\d+)-(?P<hparams>n\d+-k\d+-T[^-]+-l[^-]+?)(?:-dt(?P<dt>[0-9.]+))?(?:-(?P<lam_by>entropy))?"
    r"(?P<loglin>-loglin)?(?P<options>(?:-(?:w|b|st|sf|ct|f)[0-9.]+)*)(?:-c(?P<conflicts>vote))?(?P<named>-named)?"
    r"(?P<linked>-linked)?-(?P<vocab>full|common)(?P<nosubject>-nosubject)?\.jsonl"
)
OPTION_TAGS = {
    "w": "lm_words",
    "b": "word_bonus",
    "st": "sentence_temperature",
    "sf": "sentence_floor",
    "ct": "confidence_temperature",
    "f": "lm_floor",
}  # `Settings.file_tag`'s


def results_name(reader, vocab: str, with_subject: bool = True) -> str:
    """File name of a run's per-fact results: one file per layer, settings, ranking vocabulary and subject use."""
    tag = reader.settings.file_tag()
    return f"results-L{reader.store.manifest.layer}-{tag}-{vocab}{'' if with_subject else '-nosubject'}.jsonl"


def results_run(name: str) -> dict[str, str] | None:
    """What a results file holds, read back from its name (`results_name`'s inverse): block, hyperparameters, vote,
    mixture, lambda rule, the other options on, ranking vocabulary and questions; None for a name `results_name` does
    not make."""
    found = RESULTS_NAME.fullmatch(name)
    if not found:
        return None
    dt = found["dt"]
    return {
        "block": found["layer"],
        "hyperparameters": found["hparams"],
        "vote": f"retrieval-aware (doc_temperature {dt})" if dt else "the paper's",
        "mixture": "log-linear" if found["loglin"] else "linear",
        "lambda": "adaptive (entropy)" if found["lam_by"] else "constant",
        "options": ", ".join(
            [f"{OPTION_TAGS[tag]} {value}" for tag, value in re.findall(r"-([a-z]+)([0-9.]+)", found["options"])]
            + (["conflicts vote"] if found["conflicts"] else [])
            + (["entity filter"] if found["named"] else [])
            + (["subject linking"] if found["linked"] else [])
        )
        or "none",
        "vocabulary": found["vocab"],
        "questions": "without the subject" if found["nosubject"] else "with the subject",
    }


def read_results(path: Path) -> dict[str, dict]:
    """A results file's rows by fact key; a line cut by a kill is skipped (and recomputed by a resumed run)."""
    done: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            done[row["key"]] = row
    return done


def summarize_runs(directory: str | Path) -> dict[str, tuple[dict[str, str], dict]]:
    """Every run whose results file is in `directory`: its file name -> (what it holds, `summarize` of its rows), so
    that a report can set the runs side by side."""
    runs = {}
    for path in sorted(Path(directory).glob("results-*.jsonl")):
        described, rows = results_run(path.name), list(read_results(path).values())
        if described and rows:
            runs[path.name] = (described, summarize(rows))
    return runs
