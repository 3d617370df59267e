"""Evaluation stage: LAMA facts as cloze questions and the rank metrics of SPEC §6.

Questions: the relation's template with [X] = subject and [Y] = [MASK] (lowercased for uncased models); SQuAD
carries its own masked sentence. A fact is skipped when a label is missing, when its object is not one token of the
model's vocabulary after the model's own normalisation, when it is outside the common vocabulary (if one is given),
and, for Google-RE, when more raters said "no" than "yes". Template questions keep one fact per (subject, object).
Metrics: the rank of the gold token (1 + the number of tokens scored strictly higher), P@1/5/10 and MRR per fact,
averaged per relation, then over relations (macro).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertknn.text import MASK

GOOGLE_RE = {
    "place_of_birth": "[X] was born in [Y] .",
    "date_of_birth": "[X] (born [Y]).",
    "place_of_death": "[X] died in [Y] .",
}


@dataclass(frozen=True)
class Fact:
    """One LAMA fact as a cloze question."""

    group: str
    relation: str
    subject: str
    answer: str
    question: str
    answer_id: int


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _question(template: str, subject: str, lowercase: bool) -> str:
    text = template.replace("[X]", subject)
    return text.lower().replace("[y]", MASK) if lowercase else text.replace("[Y]", MASK)


def _answer_id(tokenizer, answer: str, common: set[str] | None) -> int | None:
    """The object's token id when it is a single token of the vocabulary (and in `common`), else None."""
    pieces = tokenizer.tokenize(answer)
    if len(pieces) != 1 or pieces[0] == tokenizer.unk_token or (common is not None and answer not in common):
        return None
    return tokenizer.convert_tokens_to_ids(pieces[0])


def _raw_facts(root: Path, groups: Iterable[str]) -> Iterable[tuple[str, str, dict, str | None]]:
    """(group, relation, line, template) for every line of the requested groups."""
    data = root / "data" if (root / "data").is_dir() else root
    for group in groups:
        if group == "T-REx":
            for rel in _read_jsonl(data / "relations.jsonl"):
                path = data / "TREx" / f"{rel['relation']}.jsonl"
                if path.is_file():
                    yield from ((group, rel["relation"], f, rel["template"]) for f in _read_jsonl(path))
        elif group == "Google-RE":
            for rel, template in GOOGLE_RE.items():
                yield from ((group, rel, f, template) for f in _read_jsonl(data / "Google_RE" / f"{rel}_test.jsonl"))
        elif group == "SQuAD":
            yield from ((group, "squad", f, None) for f in _read_jsonl(data / "Squad" / "test.jsonl"))
        else:
            raise ValueError(f"unknown LAMA group {group!r}; known: T-REx, Google-RE, SQuAD")


def load_lama(
    root: str | Path,
    tokenizer,
    groups: Iterable[str] = ("T-REx", "Google-RE", "SQuAD"),
    common_vocab: set[str] | None = None,
) -> list[Fact]:
    """The LAMA facts that pass the filters, as questions for a model with this tokenizer."""
    lowercase = bool(getattr(tokenizer, "do_lower_case", False)) or tokenizer.tokenize("A") == ["a"]
    seen: set[tuple[str, str, str]] = set()
    facts = []
    for group, relation, line, template in _raw_facts(Path(root), groups):
        subject, answer = line.get("sub_label"), line.get("obj_label")
        if not subject or not answer:
            continue
        if group == "Google-RE":
            votes = [j.get("judgment") for j in line.get("judgments", [])]
            if votes.count("no") > votes.count("yes"):
                continue
        answer_id = _answer_id(tokenizer, answer.lower() if lowercase else answer, common_vocab)
        if answer_id is None:
            continue
        if template is None:
            question = line["masked_sentences"][0]
            if question.count(MASK) != 1:
                continue
        else:
            if (relation, subject, answer) in seen:
                continue
            seen.add((relation, subject, answer))
            question = _question(template, subject, lowercase)
        facts.append(Fact(group, relation, subject, answer, question, answer_id))
    return facts


def sample_per_relation(facts: list[Fact], n: int, seed: int = 0) -> list[Fact]:
    """At most n facts of each relation, drawn with a fixed seed (order kept)."""
    by_relation: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        by_relation[f.relation].append(i)
    rng = random.Random(seed)
    keep = {i for rel in sorted(by_relation) for i in rng.sample(by_relation[rel], min(n, len(by_relation[rel])))}
    return [f for i, f in enumerate(facts) if i in keep]


def rank_of(p: np.ndarray, gold: int) -> int:
    """1 + the number of tokens with a strictly higher score than the gold token."""
    return 1 + int(np.count_nonzero(p > p[gold]))


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
