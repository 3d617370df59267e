"""Evaluation reports: markdown tables in the paper's layouts, the JSON behind them, and the P@k bar chart."""

from __future__ import annotations

import json
from pathlib import Path

NAMES = {"bert": "BERT", "knn": "kNN", "bert_knn": "BERT-kNN", "frequency": "Freq. word"}


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(summary: dict, rows: list[dict], setting: dict, examples: int = 6) -> str:
    """The report: setting, Table 1 (LAMA, LAMA-UHN), Table 2 (groups), ceilings and baselines, relations, examples."""
    sets = summary["sets"]
    out = ["# BERT-kNN on LAMA", "", "## Setting", ""]
    out += [f"- {key}: {value}" for key, value in setting.items()]
    out += ["", "## LAMA and LAMA-UHN (P@1, macro over relations; Table 1 layout)", ""]
    out += _table(
        ["set", "facts", "BERT", "kNN", "BERT-kNN"],
        [
            [name, str(sets[name]["facts"])]
            + [_pct(sets[name]["metrics"][m].get("P@1")) for m in NAMES if m != "frequency"]
            for name in ("LAMA", "LAMA-UHN")
            if name in sets
        ],
    )
    if summary.get("layers"):
        out += ["", "## Layer ablation (LAMA P@1; Table 3 layout)", ""]
        out += _table(
            ["keys from block", "BERT", "kNN", "BERT-kNN"],
            [
                [layer, *(_pct((m or {}).get(x, {}).get("P@1")) for x in ("bert", "knn", "bert_knn"))]
                for layer, m in summary["layers"].items()
            ],
        )
    out += ["", "## Per group (P@1; Table 2 layout)", ""]
    groups = [g for g in ("Google-RE", "T-REx", "ConceptNet", "SQuAD") if g in sets]
    out += _table(
        ["group", "facts", "relations", "BERT", "kNN", "BERT-kNN"],
        [
            [g, str(sets[g]["facts"]), str(sets[g]["relations"])]
            + [_pct(sets[g]["metrics"][m].get("P@1")) for m in ("bert", "knn", "bert_knn")]
            for g in groups
        ],
    )
    out += ["", "## P@1 / P@5 / P@10 / MRR, ceilings and model-free baselines", ""]
    out += [
        "Ceiling: share of facts whose gold token is among the stored entries of the selected documents (the most kNN",
        "could reach). Freq. word: rank by frequency among those entries (no model). Subject token: share of answers",
        "that are a token of the subject's name.",
        "",
    ]
    header = ["set", *(f"{NAMES[m]} P@1/5/10/MRR" for m in NAMES), "ceiling", "subject token"]
    body = []
    for name in (*groups, "LAMA", "LAMA-UHN"):
        if name not in sets:
            continue
        metrics = sets[name]["metrics"]
        cells = ["/".join(_pct(metrics[m].get(k)) for k in ("P@1", "P@5", "P@10", "MRR")) for m in NAMES]
        body.append([name, *cells, _pct(sets[name]["ceiling"]), _pct(sets[name]["subject_token"])])
    out += _table(header, body)
    out += ["", "## Per relation (P@1)", ""]
    out += _table(
        ["relation", "facts", "BERT", "kNN", "BERT-kNN", "Freq. word"],
        [
            [rel, str(v["facts"]), *(_pct(v[m]["P@1"]) for m in NAMES)]
            for rel, v in sorted(summary["relations"].items())
        ],
    )
    out += ["", "## Examples (top-3 with probabilities; Table 4 layout)", ""]
    picked = [r for r in rows if r["ranks"]["bert_knn"] == 1 and r["ranks"]["bert"] > 1][: examples // 2]
    picked += [r for r in rows if r["ranks"]["bert_knn"] > 1 and r not in picked][: examples - len(picked)]
    out += _table(
        ["question", "gold", "BERT", "kNN", "BERT-kNN"],
        [
            [r["question"], r["answer"]]
            + [", ".join(f"{t} ({p:.2f})" for t, p in r["top3"][m]) for m in ("bert", "knn", "bert_knn")]
            for r in picked
        ],
    )
    return "\n".join(out) + "\n"


def bar_chart(summary: dict, path: str | Path) -> None:
    """P@1, P@5, P@10 of BERT and BERT-kNN per group (the paper's Figure 2) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [s for s in ("Google-RE", "T-REx", "ConceptNet", "SQuAD", "LAMA") if s in summary["sets"]]
    fig, axes = plt.subplots(1, len(sets), figsize=(3.2 * len(sets), 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], sets):
        metrics = summary["sets"][name]["metrics"]
        xs = range(3)
        for offset, (method, color) in zip((-0.2, 0.2), (("bert", "#9aa5b1"), ("bert_knn", "#2f6fb3"))):
            values = [100 * metrics[method][k] for k in ("P@1", "P@5", "P@10")]
            ax.bar([x + offset for x in xs], values, width=0.4, color=color, label=NAMES[method])
        ax.set_xticks(list(xs), ["P@1", "P@5", "P@10"])
        ax.set_title(name)
    axes[0][0].set_ylabel("%")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(directory: str | Path, summary: dict, rows: list[dict], setting: dict) -> Path:
    """Write report.md, report.json and p_at_k.png into `directory`; return the markdown path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps({"setting": setting, **summary}, indent=2), encoding="utf-8")
    bar_chart(summary, directory / "p_at_k.png")
    md = directory / "report.md"
    md.write_text(markdown(summary, rows, setting) + "\n![P@k](p_at_k.png)\n", encoding="utf-8")
    return md
