"""The rank metrics of SPEC §6 and the top answer's calibration, as pure functions of ranks and result rows.

Metrics: the rank of the gold token (1 + the number of tokens scored strictly higher; a gold token with probability 0
is never a hit), P@1/5/10 and MRR per fact, averaged per relation, then over relations (macro). `summarize` gives
them per method for each group, for LAMA (T-REx + Google-RE) and LAMA-UHN; `calibration` the expected calibration
error (ECE) and a reliability diagram's bins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from bertknn.evaluation.facts import Fact
from bertknn.query.prediction import METHODS

UNRANKED = 10**9  # the rank of a gold token with probability 0, or with no distribution: never a hit


def rank_of(p: np.ndarray | None, gold: int, vocab: np.ndarray | None = None, size: int | None = None) -> int:
    """1 + the number of tokens (of `vocab`, default the first `size`: the model's vocabulary, not the words of
    several tokens a prediction also ranks) scored strictly higher than the gold token."""
    if p is None or p[gold] <= 0:
        return UNRANKED
    return 1 + int(np.count_nonzero((p[:size] if vocab is None else p[vocab]) > p[gold]))


def fact_metrics(rank: int) -> dict[str, float]:
    """P@1, P@5, P@10 and reciprocal rank of one fact."""
    return {"P@1": float(rank <= 1), "P@5": float(rank <= 5), "P@10": float(rank <= 10), "MRR": 1.0 / rank}


def macro_metrics(facts: list[Fact], ranks: list[int]) -> dict:
    """Per-relation means of the fact metrics, and their mean over relations (macro), per group and overall."""
    per_relation: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for fact, rank in zip(facts, ranks):
        per_relation[(fact.group, fact.relation)].append(fact_metrics(rank))
    relations = {
        key: {m: float(np.mean([x[m] for x in rows])) for m in rows[0]} | {"facts": len(rows)}
        for key, rows in per_relation.items()
    }

    def mean_over(keys: list[tuple[str, str]]) -> dict[str, float]:
        return {m: float(np.mean([relations[k][m] for k in keys])) for m in ("P@1", "P@5", "P@10", "MRR")}

    groups = sorted({g for g, _ in relations})
    return {
        "relations": {f"{g}/{r}": v for (g, r), v in sorted(relations.items())},
        "groups": {g: mean_over([k for k in relations if k[0] == g]) for g in groups},
        "macro": mean_over(list(relations)),
    }


def calibration(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> dict:
    """How well the top answer's probability predicts that it is right: the expected calibration error (ECE: the
    mean over equal-width confidence bins of |accuracy - mean confidence|, weighted by the bin's share of answers;
    Guo et al. 2017) and, per non-empty bin, its range, answers, mean confidence and accuracy (a reliability diagram's
    points)."""
    conf, hit = np.asarray(confidence, np.float64), np.asarray(correct, np.float64)
    which = np.minimum((conf * bins).astype(int), bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        mine = which == b
        if mine.any():
            rows.append(
                {
                    "low": b / bins,
                    "high": (b + 1) / bins,
                    "answers": int(mine.sum()),
                    "confidence": float(conf[mine].mean()),
                    "accuracy": float(hit[mine].mean()),
                }
            )
            ece += mine.mean() * abs(hit[mine].mean() - conf[mine].mean())
    return {"ece": float(ece), "answers": len(conf), "bins": rows}


def top_answer_calibration(rows: list[dict], method: str) -> dict:
    """`calibration` of a method's top answers as a user sees them: its probability, and whether it is the gold
    answer, case aside as an uncased model's answers are (no answer: probability 0, wrong)."""
    tops = [r["top3"][method][0] if r["top3"][method] else ["", 0.0] for r in rows]
    right = [t.casefold() == r["answer"].casefold() for (t, _), r in zip(tops, rows)]
    return calibration([p for _, p in tops], right)


def summarize(rows: list[dict]) -> dict:
    """Macro metrics per method for each group, for LAMA (T-REx + Google-RE) and LAMA-UHN, plus per relation."""

    def macro(selected: list[dict], method: str) -> dict:
        facts = [Fact(r["group"], r["relation"], r["subject"], r["answer"], r["question"], 0) for r in selected]
        return macro_metrics(facts, [r["ranks"][method] for r in selected]) if selected else {}

    def share(selected: list[dict], field: str) -> float:
        return float(np.mean([r[field] for r in selected])) if selected else 0.0

    lama = [r for r in rows if r["group"] in ("T-REx", "Google-RE")]
    uhn = [r for r in lama if not r["uhn_string_match"]]
    sets = {g: [r for r in rows if r["group"] == g] for g in sorted({r["group"] for r in rows})}
    sets |= {"LAMA": lama, "LAMA-UHN": uhn}
    methods = (*METHODS, "frequency")
    out = {"sets": {}, "relations": {}}
    for name, selected in sets.items():
        if not selected:
            continue
        results = {m: macro(selected, m) for m in methods}
        out["sets"][name] = {
            "facts": len(selected),
            "relations": len({(r["group"], r["relation"]) for r in selected}),
            "metrics": {m: results[m]["macro"] for m in methods},
            "ceiling": share(selected, "ceiling"),
            "subject_token": share(selected, "subject_token"),
            "calibration": {m: top_answer_calibration(selected, m) for m in METHODS},
        }
    for method in methods:
        for rel, values in macro(rows, method)["relations"].items():
            out["relations"].setdefault(rel, {"facts": values["facts"]})[method] = {
                k: v for k, v in values.items() if k != "facts"
            }
    return out
