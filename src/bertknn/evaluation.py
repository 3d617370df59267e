"""Evaluation stage: LAMA facts as cloze questions and the rank metrics of SPEC §6.

Questions: the relation's template with [X] = subject and [Y] = [MASK] (lowercased for uncased models); SQuAD
carries its own masked sentence. A fact is skipped when a label is missing, when its object is not one token of the
model's vocabulary after the model's own normalisation, when it is outside the common vocabulary (if one is given),
and, for Google-RE, when more raters said "no" than "yes". Template questions keep one fact per (subject, object).
Metrics: the rank of the gold token (1 + the number of tokens scored strictly higher; a gold token with probability 0
is never a hit), P@1/5/10 and MRR per fact,
averaged per relation, then over relations (macro).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertknn.combine import METHODS
from bertknn.text import MASK, question_error

GROUPS = ("T-REx", "Google-RE", "ConceptNet", "SQuAD")  # LAMA's groups: what `eval lama` evaluates by default
TUNED_GROUPS = ("T-REx", "Google-RE", "SQuAD")  # what `bertknn tune` tunes on
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


def sample_per_relation(facts: list[Fact], n: int, seed: int = 0) -> list[Fact]:
    """At most n facts of each relation, drawn with a fixed seed (order kept)."""
    by_relation: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(facts):
        by_relation[f.relation].append(i)
    rng = random.Random(seed)
    keep = {i for rel in sorted(by_relation) for i in rng.sample(by_relation[rel], min(n, len(by_relation[rel])))}
    return [f for i, f in enumerate(facts) if i in keep]


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


KB_GROUPS = ("T-REx", "Google-RE", "ConceptNet")


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


def _top3(ranked_list) -> list[list]:
    return [[t.token, round(t.probability, 4)] for t in ranked_list[:3]]


RESULTS_NAME = re.compile(
    r"results-L(?P<layer>\d+)-(?P<hparams>n\d+-k\d+-T[^-]+-l[^-]+?)(?:-dt(?P<dt>[0-9.]+))?(?:-(?P<lam_by>entropy))?"
    r"(?P<loglin>-loglin)?(?P<options>(?:-(?:w|b|st|ct|f)[0-9.]+)*)-(?P<vocab>full|common)(?P<nosubject>-nosubject)?"
    r"\.jsonl"
)
OPTION_TAGS = {
    "w": "lm_words",
    "b": "word_bonus",
    "st": "sentence_temperature",
    "ct": "confidence_temperature",
    "f": "lm_floor",
}  # `Settings.file_tag`'s


def results_name(knn, vocab: str, with_subject: bool = True) -> str:
    """File name of a run's per-fact results: one file per layer, settings, ranking vocabulary and subject use."""
    return f"results-L{knn.store.layer}-{knn.settings.file_tag()}-{vocab}{'' if with_subject else '-nosubject'}.jsonl"


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
            f"{OPTION_TAGS[tag]} {value}" for tag, value in re.findall(r"-([a-z]+)([0-9.]+)", found["options"])
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


def evaluate_facts(
    knn,
    facts: list[Fact],
    results_path: str | Path,
    vocab: np.ndarray | None = None,
    batch_size: int = 32,
    progress=None,
    max_seconds: float | None = None,
    seed: int = 0,
    with_subject: bool = True,
) -> list[dict]:
    """Rank every fact's gold token under BERT, kNN, BERT-kNN and the frequency baseline; resumable. Without
    `with_subject` no question gets its subject: documents are retrieved from the question's own text, as a user
    asks.

    Facts are taken in a seeded random order, a batch at a time: the batch's documents are embedded (in a lazy
    datastore; `progress` reports "embedding" then, counting documents), then its results are appended to
    `results_path` (JSON lines). A rerun skips the facts already there,
    and a run stopped early (a kill, or `max_seconds` spent) holds a random subsample of the facts. Returns the
    results of the facts done, in the order of `facts`.
    """
    results_path = Path(results_path)
    done = read_results(results_path) if results_path.exists() else {}
    todo = [f for f in facts if fact_key(f) not in done]
    todo = random.Random(seed).sample(todo, len(todo))
    report = progress or (lambda phase, n, total: None)
    deadline = time.time() + max_seconds if max_seconds else None
    report("facts", len(facts) - len(todo), len(facts))
    embedded = 0  # documents of a lazy datastore this run has embedded
    with results_path.open("a", encoding="utf-8") as out:
        for start in range(0, len(todo), batch_size):
            if deadline and time.time() >= deadline:
                break
            batch = todo[start : start + batch_size]
            subjects = [ir_subject(f) if with_subject else None for f in batch]
            queries = knn.preprocess([f.question for f in batch], subjects)
            if knn.store.lazy:  # the batch's documents embedded first, in view: one bar over the run
                embedded += knn.embed_retrieved(
                    queries,
                    knn.settings.n_docs,
                    lambda done, total, e=embedded: report("embedding", e + done, e + total),
                )[1]
            preds = knn.predict_batch(queries, top_k=3, evidence=0)
            size = knn.encoder.vocab_size  # LAMA's protocol: answers of one token, ranked over the vocabulary
            for fact, pred in zip(batch, preds):
                values = np.asarray(knn.store.values[pred.neighbours.searched])  # the frequency baseline's words
                values = values[values < size]
                counts = np.bincount(values, minlength=size).astype(np.float64) if len(values) else None
                row = {
                    "key": fact_key(fact),
                    "group": fact.group,
                    "relation": fact.relation,
                    "subject": fact.subject,
                    "answer": fact.answer,
                    "question": fact.question,
                    "documents": pred.documents,
                    "ranks": {
                        "bert": rank_of(pred.p_bert, fact.answer_id, vocab, size),
                        "knn": rank_of(pred.p_knn, fact.answer_id, vocab, size),
                        "bert_knn": rank_of(pred.p, fact.answer_id, vocab, size),
                        "frequency": rank_of(counts, fact.answer_id, vocab, size),
                    },
                    "top3": {"bert": _top3(pred.bert), "knn": _top3(pred.knn), "bert_knn": _top3(pred.bert_knn)},
                    "ceiling": bool(len(values)) and bool(np.any(values == fact.answer_id)),
                    "subject_token": subject_has_answer(fact, knn.encoder.tokenizer),
                    "uhn_string_match": uhn_string_match(fact),
                }
                out.write(json.dumps(row) + "\n")
                done[row["key"]] = row
            out.flush()
            report("facts", len(facts) - len(todo) + min(start + batch_size, len(todo)), len(facts))
    return [done[fact_key(f)] for f in facts if fact_key(f) in done]


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


def lama_knn(
    corpus: str | Path,
    encoder,
    directory: str | Path | None = None,
    progress=None,
    pack: int = 1,
    int8_keys: bool = False,
    **hparams,
):
    """A BertKNN over a lazy datastore of `corpus` (a path in any format `bertknn build` reads) for this model,
    layer, pack and key precision, cached.

    `hparams`: BertKNN's settings (n_docs, k, temperature, lam, ...; None = the datastore's tuned value, else
    bertknn's default).

    A new one starts from the registered documents and IR index of a cached datastore of the same corpus (another
    model or layer), since those do not depend on the model.
    """
    from bertknn.builder import copy_registration
    from bertknn.corpus import open_corpus
    from bertknn.datastore import VERSION, Datastore
    from bertknn.encoder import cache_dir
    from bertknn.pipeline import BertKNN

    stem = f"lazy-{Path(corpus).stem}-{hashlib.sha256(str(Path(corpus).resolve()).encode()).hexdigest()[:10]}"
    if directory is None:
        dtype = encoder.runtime.dtype
        suffix = (
            (f"-pack{pack}" if pack > 1 else "") + ("-int8" if int8_keys else "") + f"-{dtype}" * (dtype != "float32")
        )
        directory = cache_dir() / f"{stem}-{encoder.cache_tag}{suffix}-v{VERSION}"  # a new format: a new datastore
    if not Path(directory).exists():
        sha = open_corpus(corpus).fingerprint()  # any format `bertknn build` reads
        for other in sorted(cache_dir().glob(f"{stem}-*")):
            with contextlib.suppress(Exception):  # any unusable candidate is simply not a source
                known = Datastore(other).manifest.get("corpus") or {}
                if known.get("sha256") == sha and Datastore(other).n_documents == known.get("documents"):
                    copy_registration(other, directory, encoder, pack, int8_keys)
                    break
    return BertKNN.build(
        corpus, directory, encoder, lazy=True, pack=pack, int8_keys=int8_keys, progress=progress, **hparams
    )


def held_out(facts: list[Fact]) -> list[Fact]:
    """The facts whose subject the default head never saw in training, and every SQuAD question (it has none)."""
    from bertknn.train_head import is_heldout  # the trainer (and torch) only when asked

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


def evaluate_layers(
    corpus: str | Path,
    encoder,
    facts: list[Fact],
    out: str | Path,
    layers: list[int] | None = None,
    common: set[str] | None = None,
    phases: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    max_seconds: float | None = None,
    seed: int = 0,
    pack: int = 1,
    int8_keys: bool = False,
    with_subject: bool = True,
    **hparams,
) -> tuple[dict, list[dict], Any]:
    """Evaluate `facts` with keys from each of `layers` (default: the encoder's), results resumed in `out`, so that
    layers can be compared (the paper's Table 3). `phases()` gives each layer's run its progress `report`.

    Returns the main layer's (the encoder's if among them, else the first) summary, rows and BertKNN; the summary's
    "layers" holds every layer's LAMA metrics when there are several.
    """
    Path(out).mkdir(parents=True, exist_ok=True)
    vocab = vocab_ids(common, encoder.tokenizer)
    runs = {}
    for layer in layers or [encoder.layer]:
        enc = encoder.at_layer(layer)
        with phases() as report:
            knn = lama_knn(corpus, enc, progress=report, pack=pack, int8_keys=int8_keys, **hparams)
            name = results_name(knn, "full" if common is None else "common", with_subject)
            options = {"progress": report, "max_seconds": max_seconds, "seed": seed, "with_subject": with_subject}
            rows = evaluate_facts(knn, facts, Path(out) / name, vocab, **options)
        runs[layer] = (summarize(rows), rows, knn)
    main = encoder.layer if encoder.layer in runs else next(iter(runs))
    summary, rows, knn = runs[main]
    if len(runs) > 1:
        summary["layers"] = {str(layer): run[0]["sets"].get("LAMA", {}).get("metrics") for layer, run in runs.items()}
    return summary, rows, knn
