"""The knowledge-editing report of `edits.evaluate_edits`: edits.md (tables per settings row and checkpoint, with and
without subjects, per relation where the edits name one, the cost per edit and the undo check), edits.json (the whole
result) and edits.png (each score against the number of edits)."""

from __future__ import annotations

import datetime
from pathlib import Path

from bertknn.evaluation.edits_answers import SCORES
from bertknn.store import atomic

ROW_NAMES = {"bertknn": "BERT-kNN, bertknn's settings", "paper": "BERT-kNN, the paper's", "lm": "BERT alone (the LM)"}
MODE_NAMES = {"subjects": "with subjects", "no_subjects": "without subjects"}
SCORE_NAMES = {
    "efficacy": "efficacy",
    "generalisation": "generalisation",
    "locality": "locality",
    "efficacy_score": "efficacy score",
    "paraphrase_score": "paraphrase score",
    "neighbourhood_score": "neighbourhood score",
}
MEANING = [
    "Scores in %, over the edits made so far. Top-1 rates: **efficacy**, the edited prompt's top-1 word is the new",
    "target; **generalisation**, the paraphrase's is; **locality**, the top-1 word of a prompt about another subject",
    "is the one it was before any edit. ROME's scores (Meng et al. 2022): **efficacy score**, P(new) > P(true) on",
    "the prompt; **paraphrase score**, the same on the paraphrase; **neighbourhood score**, P(true) > P(new) on the",
    "locality prompt (a target absent from the answer's words has probability 0; two zeros fail). Edits: 0 is before",
    "any edit (the questions of every edit). The LM alone cannot change with edits: it shows what the datastore adds.",
]


def row_name(row: str) -> str:
    """A settings row as the report names it."""
    return ROW_NAMES.get(row, row)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _setting(setting: dict) -> list[str]:
    """The setting as a list, the rows' settings spelt out."""
    out = ["## Setting", ""]
    for key, value in setting.items():
        if key == "rows":
            for row, values in value.items():
                shown = "the LM's own ranking" if values is None else ", ".join(f"{k}={v}" for k, v in values.items())
                out.append(f"- row {row_name(row)}: {shown}")
        elif key == "began":
            out.append(f"- began: {datetime.datetime.fromtimestamp(value).isoformat(timespec='seconds')}")
        elif key == "seconds":
            out.append(f"- run time: {value:,.0f} s")
        else:
            out.append(f"- {key}: {value}")
    return out


def _scores_table(result: dict, mode: str) -> list[str]:
    """Every checkpoint's scores of every row, asked in one mode."""
    body = []
    for point in result["checkpoints"]:
        for row, scores in point["scores"].get(mode, {}).items():
            edits = f"{point['edits']:,}" + (" (before)" if not point["edits"] else "")
            body.append([edits, row_name(row), *(_pct(scores["all"][name]) for name in SCORES)])
    if not body:
        return []
    header = ["edits", "method", *(SCORE_NAMES[name] for name in SCORES)]
    return ["", f"## Scores {MODE_NAMES[mode]} (%)", "", *_table(header, body)]


def _relations(result: dict) -> list[str]:
    """The last checkpoint's scores per relation, where the edits name their relations."""
    last = result["checkpoints"][-1]
    body = []
    for mode, by_row in last["scores"].items():
        for row, scores in by_row.items():
            for relation, s in scores.get("relations", {}).items():
                cells = [_pct(s[name]) for name in SCORES]
                body.append([relation, MODE_NAMES[mode], row_name(row), str(s["edits"]), *cells])
    if not body:
        return []
    header = ["relation", "asked", "method", "edits", *(SCORE_NAMES[name] for name in SCORES)]
    title = f"## Per relation, after {last['edits']:,} edits (%)"
    return ["", title, "", *_table(header, sorted(body, key=lambda r: (r[0], r[1])))]


def _cost(result: dict) -> list[str]:
    """Seconds and bytes per edit at each checkpoint."""
    body = [
        [f"{p['edits']:,}", f"{p['seconds_per_edit']:.4f}", f"{p['bytes_per_edit']:,.0f}"]
        for p in result["checkpoints"]
        if p["edits"]
    ]
    out = [
        "",
        "## Cost per edit",
        "",
        "Wall time of the adds and growth of the datastore's folder, over the edits so far.",
    ]
    return [*out, "", *_table(["edits", "seconds per edit", "bytes per edit"], body)]


def _undo(undo: dict) -> list[str]:
    """The undo check: answers whose top-k words differ after every edit document was removed."""
    body = [
        [row_name(row), f"{c['asked']:,}", f"{c['changed']:,}", "yes" if c["exact"] else "no"]
        for row, c in undo["rows"].items()
    ]
    out = ["", "## Undo", "", f"Every edit document removed ({undo['seconds']:.2f} s), every question asked again."]
    return [*out, "", *_table(["method", "answers", "top-k words changed", "undo exact"], body)]


def _examples(result: dict, n: int = 6) -> list[str]:
    """The first `n` edits: the prompt's top-1 word before and after, per row, asked with subjects when it was."""
    mode = next(iter(result["checkpoints"][0]["scores"]), None)
    if mode is None or not result.get("records"):
        return []
    rows = list(result["checkpoints"][0]["scores"][mode])
    body = [
        [
            r["prompt"],
            r["target_new"],
            r["ground_truth"],
            *(" → ".join(r["answers"][mode][row]["rewrite"]) for row in rows),
        ]
        for r in result["records"][:n]
    ]
    header = ["prompt", "new", "true", *(f"{row_name(row)}: before → after" for row in rows)]
    return ["", f"## Examples ({MODE_NAMES[mode]}; top-1 word)", "", *_table(header, body)]


def markdown(result: dict) -> str:
    """edits.md's text."""
    out = ["# Knowledge edits with BERT-kNN", "", *_setting(result["setting"]), "", "## What the scores mean", ""]
    out += MEANING
    for mode in MODE_NAMES:
        out += _scores_table(result, mode)
    out += _relations(result) + _cost(result) + _undo(result["undo"]) + _examples(result)
    return "\n".join(out) + "\n\n![scores against the number of edits](edits.png)\n"


def plot(result: dict, path: str | Path) -> None:
    """Each score against the number of edits (1 and up, log scale), a line per row and mode, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["checkpoints"] if p["edits"]]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.4), sharex=True, sharey=True)
    colors = ["#2f6fb3", "#e0a030", "#9aa5b1", "#3a9a5b", "#b33f2f"]
    for ax, name in zip(axes.flat, SCORES):
        for mode, style in zip(MODE_NAMES, ("-", "--")):
            for row, color in zip(points[0]["scores"].get(mode, {}), colors * 4):
                ys = [p["scores"][mode][row]["all"][name] for p in points]
                label = f"{row_name(row)}, {MODE_NAMES[mode]}"
                ax.plot([p["edits"] for p in points], ys, style, marker="o", color=color, label=label)
        ax.set_title(SCORE_NAMES[name])
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks([p["edits"] for p in points], [f"{p['edits']:,}" for p in points])
        ax.set_ylim(-3, 103)
    for ax in axes[1]:
        ax.set_xlabel("edits made")
    for ax in axes[:, 0]:
        ax.set_ylabel("%")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_edits_report(directory: str | Path, result: dict) -> Path:
    """Write edits.md, edits.json and edits.png of an `evaluate_edits` result into `directory`; the markdown's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic.write_json(directory / "edits.json", result, indent=None)  # compact: a record per edit adds up
    plot(result, directory / "edits.png")
    md = directory / "edits.md"
    atomic.write_text(md, markdown(result))
    return md
