"""The options beyond the paper, measured: kNN votes, mixtures, lambda rules and key transforms on a LAMA dev split,
with and without subjects, and the fresh-facts set before and after `add`, in one run.

    python bench/accuracy.py [--dev-per-relation 5] [--fresh-base-docs 2000] [--skip-lama] [--skip-fresh] [--corpus F]
                             [--smoke]

LAMA dev: `tune.DevSplit` (T-REx and Google-RE, --dev-per-relation facts per relation, seed 1, disjoint from the
report's sample of 30 per relation drawn with seed 0), on the lazy datastore of the evidence corpus that `eval lama`
uses (cached). Each dev question runs through the model and the search once per subject mode; every variant is then
scored from the same neighbours through `BertKNN.distributions` (the code path of `predict`). Key transforms
(centering, whitening, cosine) are tried by re-ranking the same searched entries with transformed keys, fitted on
the keys of those entries. Printed: macro P@1 over relations of BERT, kNN, BERT-kNN per variant and mode, and the
model-free frequency baseline.

Fresh facts (bench/fresh_facts/: 40 invented documents, 120 questions phrased unlike their evidence): a lazy datastore
of the first --fresh-base-docs evidence documents, asked before and after `add_documents` of the 40 documents,
with and without subjects, for the paper's settings and the variants given by --fresh-variants.
Last line: BERT-kNN's dev P@1 with bertknn's default settings against the paper's, with and without subjects.
--corpus: LAMA dev on another corpus than the evidence corpus (its lazy datastore cached alike). --smoke: fresh facts
on the first 3 evidence documents with 4 of the 40 documents added; LAMA dev on a lazy datastore of the first 40
evidence documents (in a temporary directory), 1 fact per relation of the first 8 relations.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from evidence import (
    DATA,
    EVIDENCE,
    SMOKE,
    SMOKE_FACTS,
    SMOKE_FRESH,
    first_documents,
    first_fresh,
    scratch,
    smoke_corpus,
)

from bertknn.query.settings import DEFAULT

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "paper": {},
    "doc_temperature=0.05": {"doc_temperature": 0.05},
    "doc_temperature=0.1": {"doc_temperature": 0.1},
    "doc_temperature=0.2": {"doc_temperature": 0.2},
    "doc_temperature=0.5": {"doc_temperature": 0.5},
    "lam=0.5": {"lam": 0.5},
    "lam_by=entropy, lam=0.5": {"lam_by": "entropy", "lam": 0.5},
    "lam_by=entropy, lam=0.7": {"lam_by": "entropy", "lam": 0.7},
    "lam_by=entropy, lam=0.9": {"lam_by": "entropy", "lam": 0.9},
    "doc_temperature=0.1, lam_by=entropy, lam=0.7": {"doc_temperature": 0.1, "lam_by": "entropy", "lam": 0.7},
    # the temperature `bertknn tune` found for this model on its dev split (reports/lama-tune-pack2), with lam 0.6
    "T=34.51, lam=0.6": {"temperature": 34.51, "lam": 0.6},
    "T=34.51, lam=0.6, doc_temperature=0.05": {"temperature": 34.51, "lam": 0.6, "doc_temperature": 0.05},
    "T=34.51, lam=0.6, doc_temperature=0.1": {"temperature": 34.51, "lam": 0.6, "doc_temperature": 0.1},
    "T=34.51, lam=0.6, doc_temperature=0.2": {"temperature": 34.51, "lam": 0.6, "doc_temperature": 0.2},
    "T=34.51, lam_by=entropy, lam=0.9": {"temperature": 34.51, "lam_by": "entropy", "lam": 0.9},
    "T=100, lam=0.6": {"temperature": 100.0, "lam": 0.6},
    "T=1000, lam=0.6": {"temperature": 1000.0, "lam": 0.6},
    "T=100, lam=0.6, doc_temperature=0.1": {"temperature": 100.0, "lam": 0.6, "doc_temperature": 0.1},
    "k=512, T=100, lam=0.6": {"k": 512, "temperature": 100.0, "lam": 0.6},
    "k=512, T=100, lam=0.6, doc_temperature=0.1": {"k": 512, "temperature": 100.0, "lam": 0.6, "doc_temperature": 0.1},
    "T=34.51, lam=0.6, doc_temperature=0.1, lam_by=entropy": {
        "temperature": 34.51,
        "lam": 0.6,
        "doc_temperature": 0.1,
        "lam_by": "entropy",
    },
    **{f"mixture=log-linear, lam={lam}": {"mixture": "log-linear", "lam": lam} for lam in (0.3, 0.4, 0.5, 0.6, 0.7)},
    **{
        f"doc_temperature=0.2, mixture=log-linear, lam={lam}": {
            "doc_temperature": 0.2,
            "mixture": "log-linear",
            "lam": lam,
        }
        for lam in (0.4, 0.5, 0.6)
    },
    **{
        f"T={t}, doc_temperature=0.2, mixture=log-linear, lam={lam}": {
            "temperature": t,
            "doc_temperature": 0.2,
            "mixture": "log-linear",
            "lam": lam,
        }
        for t, lam in ((12.0, 0.5), (34.51, 0.7), (34.51, 0.85))
    },
}
VARIANTS["bertknn default"] = {name: value for name, value in DEFAULT.as_dict().items() if name != "retrieval"}
VARIANTS["bertknn default, no entity filter"] = VARIANTS["bertknn default"] | {"entity_filter": False}
VARIANTS["paper, entity filter"] = {"entity_filter": True}


def key_transforms(keys: np.ndarray) -> dict:
    """Functions mapping float32 keys (rows) to the space they are compared in, fitted on `keys`."""
    mean = keys.mean(0)
    cov = np.cov((keys - mean).T)
    values, vectors = np.linalg.eigh(cov)
    whiten = vectors / np.sqrt(values + 1e-3 * values.max())

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    return {
        "keys: centered": lambda x: x - mean,
        "keys: whitened": lambda x: (x - mean) @ whiten,
        "keys: cosine": unit,
        "keys: centered cosine": lambda x: unit(x - mean),
    }


def transformed_neighbours(knn, found, state: np.ndarray, transform, k: int):
    """The k nearest of the searched entries under `transform` (squared L2 there), as Neighbours; distances rescaled
    so that their median equals the plain keys' (the temperature keeps its meaning)."""
    from bertknn.query.search import Neighbours

    if not len(found.searched):
        return found
    rows = np.asarray(knn.store.keys[found.searched], np.float32)
    plain = ((rows - state) ** 2).sum(1)
    diff = transform(rows) - transform(state[None])[0]
    dist = (diff**2).sum(1)
    dist = dist * (np.median(plain) / max(np.median(dist), 1e-12))
    order = np.lexsort((found.searched, dist))[:k]
    entries = found.searched[order]
    values = np.asarray(knn.store.values[entries])
    return Neighbours(found.documents, entries, dist[order].astype(np.float32), values, found.searched, found.scores)


def run_questions(knn, texts: list[str], subjects: list[str | None], k: int, entity_filter: bool = False):
    """(p_bert, state, Neighbours) of every question under the paper's settings with `k` neighbours (variants take
    their own k nearest of them): the model and search once. `entity_filter`: TF-IDF's documents kept only where
    they name the question's entity (bertknn's default retrieval; the paper's keeps them all)."""
    from bertknn.query.settings import PAPER

    settings = PAPER.replace(k=k, entity_filter=entity_filter)
    queries = knn.preprocess(texts, subjects)
    out = []
    for start in range(0, len(queries), 64):
        batch = queries[start : start + 64]
        probs, states = knn.encoder.query_ids([(q.ids, q.mask) for q in batch])
        found = knn.search("ir").batch_search([q.text for q in batch], [q.subject for q in batch], states, settings)
        out += list(zip(probs, states, found))
    return out


def macro_p1(facts, ranks) -> float:
    from bertknn.evaluation.metrics import macro_metrics

    return 100 * macro_metrics(facts, ranks)["macro"]["P@1"]


def lama_dev(args) -> dict:
    from bertknn.evaluation.facts import GROUPS, ir_subject, load_lama
    from bertknn.evaluation.metrics import rank_of
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit
    from bertknn.model.encoder import Encoder
    from bertknn.query.settings import PAPER

    encoder = Encoder.load(args.model)
    facts = load_lama(DATA / "lama", encoder.tokenizer, GROUPS, warn=lambda m: None)
    dev = DevSplit(per_relation=args.dev_per_relation, squad=0).choose(facts)
    directory = None
    if args.smoke:
        dev, directory = dev[:SMOKE_FACTS], args.corpus.parent / "store"
    reader = lama_reader(args.corpus, encoder, directory)
    print(f"# LAMA dev: {len(dev)} facts ({args.dev_per_relation} per T-REx/Google-RE relation, seed 1, disjoint from")
    store = reader.store
    print(f"# the report's sample); evidence corpus datastore {store.path.name}, layer {store.manifest.layer}")
    results = {}
    for mode in ("subject", "no subject"):
        began = time.perf_counter()
        subjects = [ir_subject(f) if mode == "subject" else None for f in dev]
        runs = run_questions(reader, [f.question for f in dev], subjects, k=512)
        sample = np.unique(np.concatenate([found.searched for _, _, found in runs]))
        rng = np.random.default_rng(0)
        sample = rng.choice(sample, min(20_000, len(sample)), replace=False)
        transforms = key_transforms(np.asarray(reader.store.keys[np.sort(sample)], np.float32))
        rows = {}
        counts = []
        for p_bert, _, found in runs:
            values = np.asarray(reader.store.values[found.searched])
            counts.append(np.bincount(values, minlength=len(p_bert)).astype(float) if len(values) else None)
        rows["frequency baseline (no model)"] = (
            macro_p1(dev, [rank_of(c, f.answer_id) for c, f in zip(counts, dev)]),
            None,
        )
        bert = macro_p1(dev, [rank_of(p, f.answer_id) for (p, _, _), f in zip(runs, dev)])
        for name, options in VARIANTS.items():
            s = PAPER.replace(**options)
            dists = [reader.distributions(p, found.top(s.k), s) for p, _, found in runs]
            rows[name] = tuple(macro_p1(dev, [rank_of(d[i], f.answer_id) for d, f in zip(dists, dev)]) for i in (0, 1))
        named = run_questions(reader, [f.question for f in dev], subjects, k=512, entity_filter=True)
        changed = sum(a.documents != b.documents for (_, _, a), (_, _, b) in zip(runs, named))
        for name in ("paper, entity filter", "bertknn default"):  # with their own documents
            s = PAPER.replace(**VARIANTS[name])
            dists = [reader.distributions(p, found.top(s.k), s) for p, _, found in named]
            rows[name] = tuple(macro_p1(dev, [rank_of(d[i], f.answer_id) for d, f in zip(dists, dev)]) for i in (0, 1))
        for name, transform in transforms.items():
            moved = [transformed_neighbours(reader, found, state, transform, PAPER.k) for _, state, found in runs]
            for label in ("paper", "T=34.51, lam=0.6"):
                s = PAPER.replace(**VARIANTS[label])
                dists = [reader.distributions(p, found, s) for (p, _, _), found in zip(runs, moved)]
                rows[f"{name}, {label}"] = tuple(
                    macro_p1(dev, [rank_of(d[i], f.answer_id) for d, f in zip(dists, dev)]) for i in (0, 1)
                )
        print(f"\n## LAMA dev, {mode} (BERT alone: {bert:.1f}; {time.perf_counter() - began:.0f} s)\n")
        print(f"The entity filter changes the documents of {changed} of {len(dev)} facts.\n")
        print("| variant | kNN P@1 | BERT-kNN P@1 |\n| --- | --- | --- |")
        for name, (knn_p1, both) in rows.items():
            print(f"| {name} | {knn_p1:.1f} | {'' if both is None else f'{both:.1f}'} |")
        results[mode] = {"bert": bert, **rows}
    return results


def fresh_facts(args) -> None:
    from bertknn.evaluation.metrics import rank_of
    from bertknn.query.pipeline import BertKNN
    from bertknn.query.settings import PAPER

    fresh = ROOT / "bench" / "fresh_facts"
    docs = [json.loads(line) for line in (fresh / "documents.jsonl").read_text(encoding="utf-8").splitlines()]
    questions = [json.loads(line) for line in (fresh / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    docs, questions = first_fresh(docs, questions, SMOKE_FRESH if args.smoke else None)
    work = scratch()
    corpus = first_documents(args.fresh_base_docs, work / "base.jsonl")
    knn = BertKNN.build(corpus, work / "store", args.model, lazy=True)
    tok = knn.encoder.tokenizer
    gold = [tok.convert_tokens_to_ids(q["answer"]) for q in questions]
    assert all(len(tok.tokenize(q["answer"])) == 1 for q in questions)
    texts = [q["question"] for q in questions]
    print(f"\n## Fresh facts: {len(docs)} invented documents, {len(questions)} questions; base: {args.fresh_base_docs}")
    print("evidence documents (lazy datastore)\n")
    print("| when | subject | variant | BERT | kNN | BERT-kNN |\n| --- | --- | --- | --- | --- | --- |")
    for when in ("before add", "after add"):
        if when == "after add":
            knn.add_documents(docs)
        for mode in ("subject", "no subject"):
            subjects = [q["subject"] if mode == "subject" else None for q in questions]
            plain = run_questions(knn, texts, subjects, k=512)
            named = run_questions(knn, texts, subjects, k=512, entity_filter=True)
            for name in args.fresh_variants.split(";"):
                s = PAPER.replace(**VARIANTS[name])
                runs = named if s.entity_filter else plain  # each variant with its own retrieval
                dists = [knn.distributions(p, found.top(s.k), s) for p, _, found in runs]
                share = [
                    100 * np.mean([rank_of(p, g) == 1 for p, g in zip(col, gold)])
                    for col in ([p for p, _, _ in runs], [d[0] for d in dists], [d[1] for d in dists])
                ]
                print(f"| {when} | {mode} | {name} | {share[0]:.1f} | {share[1]:.1f} | {share[2]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev-per-relation", type=int, default=5)
    parser.add_argument("--fresh-base-docs", type=int, default=2000)
    parser.add_argument(
        "--fresh-variants",
        default="paper;doc_temperature=0.2;mixture=log-linear, lam=0.5;"
        "bertknn default, no entity filter;bertknn default",
    )
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--skip-lama", action="store_true")
    parser.add_argument("--skip-fresh", action="store_true")
    parser.add_argument(
        "--corpus", type=Path, default=EVIDENCE, help="LAMA dev's corpus [default: the evidence corpus]"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.dev_per_relation, args.fresh_base_docs, args.corpus = 1, 3, smoke_corpus()
    from bertknn.model.runtime import Runtime

    Runtime(threads=1 if args.smoke else os.cpu_count() or 1).apply()
    if not args.skip_fresh:
        fresh_facts(args)
    if not args.skip_lama:
        results = lama_dev(args)
        print(
            "BERT-kNN P@1 on dev, bertknn default vs the paper's: "
            + "; ".join(
                f"{mode} {results[mode]['bertknn default'][1]:.1f} vs {results[mode]['paper'][1]:.1f}"
                for mode in ("subject", "no subject")
            )
        )


if __name__ == "__main__":
    main()
