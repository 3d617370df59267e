"""LAMA's facts as cloze questions: reading its relations (in the layout `lama_data` downloads) into `Fact`s, the
filters of SPEC §6, the samples `eval lama` and `tune` draw, and what each fact says about itself (its key, the
subject IR retrieves by, the LAMA-UHN filter, the subject-token baseline).

Questions: the relation's template with [X] = subject and [Y] = [MASK] (lowercased for uncased models); SQuAD
carries its own masked sentence. A fact is skipped when a label is missing, when its object is not one token of the
model's vocabulary after the model's own normalisation, when it is outside the common vocabulary (if one is given),
and, for Google-RE, when more raters said "no" than "yes". Template questions keep one fact per (subject, object).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertknn.text import MASK, question_error

GROUPS = ("T-REx", "Google-RE", "ConceptNet", "SQuAD")  # LAMA's groups: what `eval lama` evaluates by default
TUNED_GROUPS = ("T-REx", "Google-RE", "SQuAD")  # what `bertknn tune` tunes on
KB_GROUPS = ("T-REx", "Google-RE", "ConceptNet")
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


def is_uncased(tokenizer) -> bool:
    """True for a tokenizer that lowercases its input (an uncased model)."""
    return tokenizer.tokenize("A") == ["a"]


def _question(template: str, subject: str, lowercase: bool) -> str:
    text = template.replace("[X]", subject)
    return text.lower().replace("[y]", MASK) if lowercase else text.replace("[Y]", MASK)


def _answer_id(tokenizer, answer: str, common: set[str] | None) -> int | None:
    """The object's token id when it is a single token of the vocabulary (and in `common`), else None."""
    pieces = tokenizer.tokenize(answer)
    if len(pieces) != 1 or pieces[0] == tokenizer.unk_token or (common is not None and answer not in common):
        return None
    return tokenizer.convert_tokens_to_ids(pieces[0])


def _group_files(data: Path, group: str) -> list[tuple[str, Path, str | None]]:
    """(relation, file, template or None when the lines carry their own masked sentence) of a LAMA group."""
    if group == "T-REx":
        relations = _read_jsonl(data / "relations.jsonl") if (data / "relations.jsonl").is_file() else []
        return [
            (r["relation"], data / "TREx" / f"{r['relation']}.jsonl", r["template"])
            for r in relations
            if (data / "TREx" / f"{r['relation']}.jsonl").is_file()
        ]
    if group == "Google-RE":
        return [(rel, data / "Google_RE" / f"{rel}_test.jsonl", t) for rel, t in GOOGLE_RE.items()]
    if group == "ConceptNet":
        return [("conceptnet", data / "ConceptNet" / "test.jsonl", None)]
    if group == "SQuAD":
        return [("squad", data / "Squad" / "test.jsonl", None)]
    raise ValueError(f"unknown LAMA group {group!r}; known: T-REx, Google-RE, ConceptNet, SQuAD")


def _raw_facts(root: Path, groups: Iterable[str], warn) -> Iterable[tuple[str, str, dict, str | None]]:
    """(group, relation, line, template) for every line of the requested groups; a missing group is reported once."""
    data = root / "data" if (root / "data").is_dir() else root
    for group in groups:
        files = _group_files(data, group)
        missing = [f for _, f, _ in files if not f.is_file()]
        if not files or missing:
            warn(f"LAMA {group}: {', '.join(map(str, missing)) or data} not found; {group} skipped")
            continue
        for relation, path, template in files:
            for line in _read_jsonl(path):
                yield group, line.get("pred", relation) if group == "ConceptNet" else relation, line, template


def load_lama(
    root: str | Path,
    tokenizer,
    groups: Iterable[str] = TUNED_GROUPS,
    common_vocab: set[str] | None = None,
    warn=print,
) -> list[Fact]:
    """The LAMA facts that pass the filters, as questions for a model with this tokenizer."""
    lowercase = is_uncased(tokenizer)
    seen: set[tuple[str, str, str]] = set()
    facts = []
    for group, relation, line, template in _raw_facts(Path(root), groups, warn):
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
            question = (line.get("masked_sentences") or [""])[0]
            if question_error(question):  # not a usable cloze question: skipped
                continue
        else:
            if (relation, subject, answer) in seen:
                continue
            seen.add((relation, subject, answer))
            question = _question(template, subject, lowercase)
        facts.append(Fact(group, relation, subject, answer, question, answer_id))
    return facts


def common_vocab(root: str | Path, tokenizer) -> set[str]:
    """LAMA's common vocabulary for this tokenizer (the lowercased list for uncased models)."""
    root = Path(root)
    lowercase = is_uncased(tokenizer)
    path = root / ("common_vocab_lowercased.txt" if lowercase else "common_vocab_cased.txt")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the common-vocabulary setting needs LAMA's common_vocab files")
    return {w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()}


def vocab_ids(words: set[str] | None, tokenizer) -> np.ndarray | None:
    """Token ids of a word list (None means the full vocabulary)."""
    if words is None:
        return None
    return np.unique(np.asarray(tokenizer.convert_tokens_to_ids(sorted(words)), dtype=np.int64))


def sample_per_relation(facts: list[Fact], n: int, seed: int = 0) -> list[Fact]:
    """At most n facts of each relation, drawn with a fixed seed (order kept)."""
    by_relation: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        by_relation[f.relation].append(i)
    rng = random.Random(seed)
    keep = {i for rel in sorted(by_relation) for i in rng.sample(by_relation[rel], min(n, len(by_relation[rel])))}
    return [f for i, f in enumerate(facts) if i in keep]


def held_out(facts: list[Fact]) -> list[Fact]:
    """The facts whose subject the default head never saw in training, and every SQuAD question (it has none)."""
    from bertknn.model.train_head import is_heldout  # the trainer (and torch) only when asked

    return [f for f in facts if f.group not in KB_GROUPS or is_heldout(f.subject)]


def select_facts(
    data: str | Path,
    tokenizer,
    groups: str | None = None,
    common: set[str] | None = None,
    heldout_only: bool = False,
    per_relation: int | None = None,
    seed: int = 0,
    warn=print,
) -> list[Fact]:
    """The facts `eval lama` evaluates: those of the comma-separated LAMA `groups` (None: all of GROUPS), of held-out
    subjects only if asked, at most `per_relation` per relation (seeded); ValueError when none is left."""
    chosen = [g.strip() for g in groups.split(",")] if groups else GROUPS
    facts = load_lama(data, tokenizer, chosen, common, warn=warn)
    if heldout_only:
        facts = held_out(facts)
    if per_relation:
        facts = sample_per_relation(facts, per_relation, seed)
    if not facts:
        raise ValueError(f"no LAMA facts to evaluate in {data} for groups {', '.join(chosen)}")
    return facts


def fact_key(fact: Fact) -> str:
    """A stable identifier of a fact (its group, relation, subject, answer and question)."""
    return "\t".join((fact.group, fact.relation, fact.subject, fact.answer, fact.question))


def ir_subject(fact: Fact) -> str | None:
    """The IR query subject: the fact's subject for knowledge-base groups, none for free questions (SQuAD)."""
    return fact.subject if fact.group in KB_GROUPS else None


def uhn_string_match(fact: Fact) -> bool:
    """LAMA-UHN filter (a): True when the lowercased answer is a substring of the lowercased subject (dropped)."""
    return fact.answer.lower() in fact.subject.lower()


def subject_has_answer(fact: Fact, tokenizer) -> bool:
    """Baseline: is the answer one of the tokens of the subject's name?"""
    return tokenizer.convert_ids_to_tokens(fact.answer_id) in tokenizer.tokenize(fact.subject)
