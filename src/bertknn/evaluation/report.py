"""Evaluation reports: markdown tables in the paper's layouts, the JSON behind them, and the P@k bar chart."""

from __future__ import annotations

import time
from pathlib import Path

from bertknn.model.sentences import FLOOR
from bertknn.query.settings import HPARAMS, PAPER, Settings
from bertknn.store import atomic

NAMES = {"bert": "BERT", "knn": "kNN", "bert_knn": "BERT-kNN", "frequency": "Freq. word"}


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(summary: dict, rows: list[dict], setting: dict, examples: int = 6, runs: dict | None = None) -> str:
    """The report: setting, Table 1 (LAMA, LAMA-UHN), Table 2 (groups), ceilings and baselines, relations, the
    directory's runs side by side (`results.summarize_runs`, when it holds more than one), examples."""
    sets = summary["sets"]
    groups = [g for g in ("Google-RE", "T-REx", "ConceptNet", "SQuAD") if g in sets]
    out = ["# BERT-kNN on LAMA", "", "## Setting", ""]
    out += [f"- {key}: {value}" for key, value in setting.items()]
    out += _lama_and_uhn(sets)
    out += _layer_ablation(summary.get("layers"))
    out += _per_group(sets, groups)
    out += _all_metrics(sets, groups)
    out += _calibration(sets.get("LAMA", {}).get("calibration"))
    out += _per_relation(summary["relations"])
    out += _side_by_side(runs or {})
    out += _examples(rows, examples)
    return "\n".join(out) + "\n"


def _lama_and_uhn(sets: dict) -> list[str]:
    """Table 1: P@1 of each method on LAMA and LAMA-UHN."""
    out = ["", "## LAMA and LAMA-UHN (P@1, macro over relations; Table 1 layout)", ""]
    return out + _table(
        ["set", "facts", "BERT", "kNN", "BERT-kNN"],
        [
            [name, str(sets[name]["facts"])]
            + [_pct(sets[name]["metrics"][m].get("P@1")) for m in NAMES if m != "frequency"]
            for name in ("LAMA", "LAMA-UHN")
            if name in sets
        ],
    )


def _layer_ablation(layers: dict | None) -> list[str]:
    """Table 3: LAMA P@1 with keys from each block, when several were evaluated."""
    if not layers:
        return []
    out = ["", "## Layer ablation (LAMA P@1; Table 3 layout)", ""]
    return out + _table(
        ["keys from block", "BERT", "kNN", "BERT-kNN"],
        [
            [layer, *(_pct((m or {}).get(x, {}).get("P@1")) for x in ("bert", "knn", "bert_knn"))]
            for layer, m in layers.items()
        ],
    )


def _per_group(sets: dict, groups: list[str]) -> list[str]:
    """Table 2: P@1 of each method per LAMA group."""
    out = ["", "## Per group (P@1; Table 2 layout)", ""]
    return out + _table(
        ["group", "facts", "relations", "BERT", "kNN", "BERT-kNN"],
        [
            [g, str(sets[g]["facts"]), str(sets[g]["relations"])]
            + [_pct(sets[g]["metrics"][m].get("P@1")) for m in ("bert", "knn", "bert_knn")]
            for g in groups
        ],
    )


def _all_metrics(sets: dict, groups: list[str]) -> list[str]:
    """P@1/5/10 and MRR of every method per group, LAMA and LAMA-UHN, with the ceiling and the model-free baselines."""
    out = ["", "## P@1 / P@5 / P@10 / MRR, ceilings and model-free baselines", ""]
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
    return out + _table(header, body)


def _per_relation(relations: dict) -> list[str]:
    """P@1 of each method and the frequency baseline per relation."""
    out = ["", "## Per relation (P@1)", ""]
    return out + _table(
        ["relation", "facts", "BERT", "kNN", "BERT-kNN", "Freq. word"],
        [[rel, str(v["facts"]), *(_pct(v[m]["P@1"]) for m in NAMES)] for rel, v in sorted(relations.items())],
    )


def _examples(rows: list[dict], examples: int) -> list[str]:
    """Table 4: up to `examples` questions with each method's top 3, half of them (first) where BERT-kNN is right and
    BERT is not, the rest where BERT-kNN is wrong."""
    out = ["", "## Examples (top-3 with probabilities; Table 4 layout)", ""]
    picked = [r for r in rows if r["ranks"]["bert_knn"] == 1 and r["ranks"]["bert"] > 1][: examples // 2]
    picked += [r for r in rows if r["ranks"]["bert_knn"] > 1 and r not in picked][: examples - len(picked)]
    return out + _table(
        ["question", "gold", "BERT", "kNN", "BERT-kNN"],
        [
            [r["question"], r["answer"]]
            + [", ".join(f"{t} ({p:.2f})" for t, p in r["top3"][m]) for m in ("bert", "knn", "bert_knn")]
            for r in picked
        ],
    )


def _calibration(calibration: dict | None) -> list[str]:
    """The calibration section: each method's expected calibration error and BERT-kNN's reliability table."""
    if not calibration:
        return []
    out = ["", "## Calibration (LAMA: the top answer's probability against how often it is right)", ""]
    out += [
        "ECE: expected calibration error, the mean |accuracy - confidence| over 10 confidence bins weighted by their",
        "answers (0: a shown 0.8 is right 80% of the time). Plot: reliability.png.",
        "",
    ]
    out += _table(
        ["method", "ECE", "answers"], [[NAMES[m], _pct(c["ece"]), str(c["answers"])] for m, c in calibration.items()]
    )
    out += ["", "BERT-kNN by confidence:", ""]
    out += _table(
        ["confidence", "answers", "mean confidence", "accuracy"],
        [
            [f"{b['low']:.1f}-{b['high']:.1f}", str(b["answers"]), _pct(b["confidence"]), _pct(b["accuracy"])]
            for b in calibration["bert_knn"]["bins"]
        ],
    )
    return out


def reliability_chart(calibration: dict, path: str | Path) -> None:
    """Accuracy against mean confidence per bin for each method (a reliability diagram) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    ax.plot([0, 1], [0, 1], color="#bbbbbb", linestyle="--", label="calibrated")
    for method, color in (("bert", "#9aa5b1"), ("knn", "#e0a030"), ("bert_knn", "#2f6fb3")):
        bins = calibration[method]["bins"]
        label = f"{NAMES[method]} (ECE {100 * calibration[method]['ece']:.1f})"
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", color=color, label=label)
    ax.set_xlabel("mean probability of the top answer")
    ax.set_ylabel("share right")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _side_by_side(runs: dict[str, tuple[dict, dict]]) -> list[str]:
    """Every run of the report's directory in one table per level (LAMA, then per relation): what each change does,
    fact for fact, with and without subjects."""
    if len(runs) < 2:
        return []
    ids = {name: chr(ord("A") + i) if i < 26 else str(i) for i, name in enumerate(runs)}
    fields = ["block", "hyperparameters", "vote", "mixture", "lambda", "options", "vocabulary", "questions"]
    out = ["", "## Runs side by side (the results files in this directory; P@1, kNN / BERT-kNN)", ""]
    out += _table(
        ["run", *fields, "facts", "results file"],
        [
            [ids[name], *(described[f] for f in fields), str(summary["sets"].get("LAMA", {}).get("facts", 0)), name]
            for name, (described, summary) in runs.items()
        ],
    )

    def cell(values: dict | None) -> str:
        return "" if not values else " / ".join(_pct(values[m]["P@1"]) for m in ("knn", "bert_knn"))

    out += [""]
    out += _table(
        ["run", "LAMA", "LAMA-UHN", "Freq. word (LAMA)"],
        [
            [ids[name]]
            + [cell(summary["sets"].get(s, {}).get("metrics")) for s in ("LAMA", "LAMA-UHN")]
            + [_pct(summary["sets"].get("LAMA", {}).get("metrics", {}).get("frequency", {}).get("P@1"))]
            for name, (_, summary) in runs.items()
        ],
    )
    relations = sorted({rel for _, summary in runs.values() for rel in summary["relations"]})
    out += [""]
    out += _table(
        ["relation", *ids.values()],
        [[rel, *(cell(summary["relations"].get(rel)) for _, summary in runs.values())] for rel in relations],
    )
    return out


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
    """Write report.md, report.json, p_at_k.png and reliability.png into `directory`; return the markdown path.
    Every run whose results are in `directory` is set side by side in report.md."""
    from bertknn.evaluation.results import summarize_runs

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic.write_json(directory / "report.json", {"setting": setting, **summary})
    bar_chart(summary, directory / "p_at_k.png")
    calibration = summary["sets"].get("LAMA", {}).get("calibration")
    if calibration:
        reliability_chart(calibration, directory / "reliability.png")
    md = directory / "report.md"
    text = markdown(summary, rows, setting, runs=summarize_runs(directory))
    plots = "\n![P@k](p_at_k.png)\n" + ("\n![reliability](reliability.png)\n" if calibration else "")
    atomic.write_text(md, text + plots)
    return md


def lama_setting(
    encoder,
    reader,
    facts: int,
    rows: int,
    corpus: str | Path,
    per_relation: int | None,
    seed: int,
    heldout_only: bool,
    vocab: str,
    given: dict,
    began: float,
    with_subject: bool = True,
) -> dict[str, str]:
    """The report's "Setting" section: what was evaluated and how, in words, so that a reader can judge the numbers.

    `reader`: the main layer's BertKNN; `facts`/`rows`: the facts selected/evaluated; `vocab`: "full" or "common";
    `given`: the settings given on the command line (only those); `began`: when the run began.
    """
    from bertknn.model.default_model import DEFAULT_MODEL

    store = reader.store
    kind = "offline default, a weaker stand-in for bert-base-uncased" if encoder.name == DEFAULT_MODEL else "as given"
    sample = f"sample of {per_relation} per relation, seed {seed}" if per_relation else "all"
    paper = ", ".join(f"{k}={v}" for k, v in PAPER.hparams.items())
    if reader.settings.hparams == PAPER.hparams:
        origin = " (the paper's)"
    elif any(name in given for name in HPARAMS):
        origin = " (as given on the command line where set)"
    elif store.manifest.get("tuned"):
        origin = " (tuned, stored with the datastore)"
    else:
        origin = f" (bertknn's defaults; the paper's: {paper})"
    return {
        "model": f"{encoder.name} ({kind})",
        "layer": f"{store.manifest.layer} of {encoder.model.config.num_hidden_layers}",
        "corpus": f"{corpus} ({store.n_documents:,} documents; {store.size:,} contexts embedded so far). "
        "Results depend on the corpus: the paper used full English Wikipedia",
        "datastore": str(store.path),
        "keys": (
            "exact (one masked target per pass)"
            if store.manifest.pack == 1
            else f"approximate: up to {store.manifest.pack} non-adjacent targets masked per pass (--pack)"
        )
        + ("; computed in int8 (--int8-keys)" if store.manifest.int8_keys else ""),
        "facts": f"{rows:,} evaluated of {facts:,} ({sample}"
        f"{', subjects held out from head training only' if heldout_only else ''})"
        + ("" if rows == facts else "; PARTIAL: a random subset, rerun the same command to complete it"),
        "ranking vocabulary": "LAMA common vocabulary"
        if vocab == "common"
        else f"full model vocabulary ({encoder.vocab_size:,})",
        "hyperparameters": ", ".join(f"{k}={v}" for k, v in reader.settings.hparams.items()) + origin,
        "vote, sentences, mixture, lambda, probabilities": _options_beyond_paper(reader.settings),
        "questions": "with the subject: its document by title, else TF-IDF on the subject (the paper)"
        if with_subject
        else "WITHOUT the subject (--no-subject): documents retrieved by TF-IDF on the question's own text",
        "LAMA-UHN": "string-match filter applied; person-name filter not applied (it needs a cased BERT)",
        "wall time": f"{time.time() - began:,.0f} s (this run; cached embeddings and results are reused)",
    }


def _options_beyond_paper(settings: Settings) -> str:
    """The kNN vote, sentence weights, mixture, lambda rule and calibration of a run in words."""
    vote = (
        f"retrieval-aware (doc_temperature={settings.doc_temperature})"
        if settings.doc_temperature
        else "the paper's (all neighbours vote together)"
    )
    lam = "adaptive by the kNN's entropy (lam_by=entropy)" if settings.lam_by == "entropy" else "constant (the paper's)"
    mixture = (
        "log-linear, p_kNN^lam p_LM^(1-lam) renormalised (mixture=log-linear)"
        if settings.mixture == "log-linear"
        else "linear (the paper's)"
    )
    sentences = (
        f"each neighbour weighted by exp(score / {settings.sentence_temperature}), score how well its sentence and "
        f"clause say what the question asks, at least {FLOOR}, for the words the LM finds possible answers "
        "(sentence_temperature)"
        if settings.sentence_temperature
        else "all alike (the paper's)"
    )
    probabilities = (
        f"calibrated (confidence_temperature={settings.confidence_temperature}, lm_floor={settings.lm_floor})"
        if (settings.confidence_temperature, settings.lm_floor) != (1, 0)
        else "as combined (the paper's)"
    )
    return f"vote {vote}; sentences {sentences}; mixture {mixture}; lambda {lam}; probabilities {probabilities}"


def write_grid(directory: str | Path, description: str, grid: list[tuple[Settings, dict]]) -> Path:
    """Write `bertknn tune`'s grid, best first, as grid.json and as the table grid.md into `directory`; return the
    markdown path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rows = [settings.tuned | scores for settings, scores in grid]
    atomic.write_json(directory / "grid.json", {"dev": description, "grid": rows}, indent=1)
    header = ["n_docs", "k", "temperature", "lambda", "mixture", "P@1", "P@10", "MRR"]
    fields = ("n_docs", "k", "temperature", "lam", "mixture")
    body = [[str(r[h]) for h in fields] + [_pct(r[m]) for m in header[len(fields) :]] for r in rows]
    md = directory / "grid.md"
    atomic.write_text(md, "\n".join([f"# Grid search ({description})", "", *_table(header, body)]) + "\n")
    return md
