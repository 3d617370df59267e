"""Whole words as answers, measured: answers of several wordpieces before and after `add`, and what storing whole
words (and multi-word names, `--names`) costs, against the paper's targets (words of one wordpiece, datastore format
1), in one run.

    python bench/words.py [--base-docs 2000] [--cost-docs 500] [--bonus 1,10] [--skip-accuracy] [--skip-cost]
        [--smoke]

Accuracy: a lazy datastore of the first --base-docs evidence documents for each kind of targets, asked the fresh-facts
questions (bench/fresh_facts/: words_*.jsonl, 40 invented documents whose answers have 1-5 wordpieces or two
words, and the single-wordpiece set documents/questions.jsonl) before and after `add_documents` of their 80
documents, with and without subjects, with bertknn's default settings, and after `add` with each --bonus as
`word_bonus` (and, for whole words, without the sentence weights: sentence_temperature 0). Printed: BERT-kNN P@1 (its
top word equals the answer) per number of wordpieces of the answer, for the questions of even-numbered documents
(dev: where `word_bonus` was chosen) and odd-numbered ones (test).

Cost: an eager build of the first --cost-docs evidence documents in each format, in this process: contexts per
document, bytes of keys, values and SQLite, build seconds, and the p50 of one question asked alone (the fresh-facts
questions without subjects, each asked --repeats times, formats alternating); whole words also with `lm_words=0` (the
LM scores every word of several wordpieces the neighbours hold). --smoke: the first 4 documents of each fresh-facts
set (and their questions) over the first 3 evidence documents, cost builds of the first 2, each question asked once,
one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

from evidence import SMOKE, SMOKE_FRESH, first_documents, first_fresh, scratch

ROOT = Path(__file__).resolve().parents[1]
FRESH = ROOT / "bench" / "fresh_facts"
FORMATS = {  # the targets a datastore stores: BertKNN.build's options
    "one wordpiece (format 1)": {"whole_words": False},
    "whole words": {},
    "whole words + names": {"names": True},
}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _questions(most: int | None = None) -> tuple[list[dict], list[dict]]:
    """The fresh-facts documents and questions of both sets (the first `most` documents of each and their questions);
    a question's "pieces" and "words" are counted here for the single-wordpiece set."""
    words, asked = first_fresh(_jsonl(FRESH / "words_documents.jsonl"), _jsonl(FRESH / "words_questions.jsonl"), most)
    single, more = first_fresh(_jsonl(FRESH / "documents.jsonl"), _jsonl(FRESH / "questions.jsonl"), most)
    return words + single, asked + [{**q, "pieces": 1, "words": 1} for q in more]


def _bucket(q: dict) -> str:
    return f"{q['words']} words" if q["words"] > 1 else f"{q['pieces']} piece{'s' * (q['pieces'] > 1)}"


def _split(q: dict) -> str:
    """dev (even-numbered documents: where settings are chosen) or test (odd-numbered)."""
    return "dev" if int(q["document"].rsplit("-", 1)[1]) % 2 == 0 else "test"


def _share(hits: list[bool]) -> str:
    return f"{100 * sum(hits) / len(hits):.1f}" if hits else "-"


def accuracy(args) -> None:
    from bertknn.query.pipeline import BertKNN
    from bertknn.query.settings import WORD_BONUS

    docs, questions = _questions(SMOKE_FRESH if args.smoke else None)
    work = scratch()
    corpus = first_documents(args.base_docs, work / "base.jsonl")
    buckets = sorted({_bucket(q) for q in questions}, key=lambda b: (b.endswith("words"), b))
    print(f"\n## Fresh facts by answer length: {len(docs)} documents, {len(questions)} questions")
    print(f"base: a lazy datastore of {args.base_docs} evidence documents; BERT-kNN P@1 (bertknn's defaults:")
    print(f"word_bonus {WORD_BONUS}); dev: questions of even-numbered documents, test: odd-numbered\n")
    counts = defaultdict(int)
    for q in questions:
        counts[(_split(q), _bucket(q))] += 1
        counts[(_split(q), "all")] += 1
    columns = [*buckets, "all"]
    print("| targets | when | word_bonus | subject | split | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 5) + "|")
    bonuses = [float(b) for b in args.bonus.split(",")] if args.bonus else []
    for i, (name, options) in enumerate(FORMATS.items()):
        knn = BertKNN.build(corpus, work / f"store-{i}", args.model, lazy=True, **options)
        runs = [("before add", WORD_BONUS, {}), ("after add", WORD_BONUS, {})]
        runs += [("after add", b, {}) for b in bonuses if b != WORD_BONUS and name == "whole words"]
        if name == "whole words":  # the default before the sentence weights
            runs.append(("after add, no sentence weights", WORD_BONUS, {"sentence_temperature": 0.0}))
        for when, bonus, settings in runs:
            if when.startswith("after add") and not knn.store.n_documents > args.base_docs:
                knn.add_documents(docs)
            for mode in ("subject", "no subject"):
                subjects = [q["subject"] if mode == "subject" else None for q in questions]
                texts = [q["question"] for q in questions]
                options = {"word_bonus": bonus, **settings}
                found = knn.predict_batch(texts, subjects, top_k=1, evidence=0, **options)
                hits = defaultdict(list)
                for q, p in zip(questions, found):
                    hit = bool(p.bert_knn) and p.bert_knn[0].token.lower() == q["answer"]
                    hits[(_split(q), _bucket(q))].append(hit)
                    hits[(_split(q), "all")].append(hit)
                for split in ("dev", "test"):
                    cells = [_share(hits[(split, b)]) for b in columns]
                    row = f"| {name} | {when} | {bonus:g} | {mode} | {split} | " + " | ".join(cells) + " |"
                    print(row, flush=True)
    print("\nquestions per cell: " + ", ".join(f"{s} {b}: {n}" for (s, b), n in sorted(counts.items())))


def cost(args) -> None:
    from bertknn.model.encoder import Encoder
    from bertknn.query.pipeline import BertKNN

    _, questions = _questions(SMOKE_FRESH if args.smoke else None)
    texts = [q["question"] for q in questions]
    work = scratch()
    corpus = first_documents(args.cost_docs, work / "base.jsonl")
    encoder = Encoder.load(args.model, runtime=args.backend)
    encoder.query(texts[:8])  # warm up
    stores, rows = {}, {}
    for i, (name, options) in enumerate(FORMATS.items()):
        start = time.perf_counter()
        knn = BertKNN.build(corpus, work / f"store-{i}", encoder, **options)
        seconds = time.perf_counter() - start
        size = sum((knn.store.path / f).stat().st_size for f in ("keys.f16", "values.i32", "store.sqlite"))
        stores[name] = (knn, {})
        rows[name] = [knn.store.size / knn.store.n_documents, size / 1e6, seconds, []]
        if name == "whole words":  # the LM scoring every word of several wordpieces, not the kNN's best lm_words
            stores[f"{name}, lm_words=0"] = (knn, {"lm_words": 0})
            rows[f"{name}, lm_words=0"] = [*rows[name][:3], []]
    for _ in range(args.repeats):
        for text in texts:
            for name, (knn, options) in stores.items():
                start = time.perf_counter()
                knn.predict(text, top_k=5, evidence=3, **options)
                rows[name][3].append(time.perf_counter() - start)
    print(f"\n## Cost of whole words: eager builds of the first {args.cost_docs} evidence documents, {args.backend}\n")
    print("| targets | contexts per document | MB (keys, values, SQLite) | build s | question p50 ms |")
    print("|---|---|---|---|---|")
    for name, (per_doc, mb, seconds, times) in rows.items():
        print(f"| {name} | {per_doc:.1f} | {mb:.1f} | {seconds:.1f} | {1000 * statistics.median(times):.1f} |")
    base = next(iter(rows.values()))
    for name, row in list(rows.items())[1:]:
        ratios = [row[0] / base[0], row[1] / base[1], row[2] / base[2]]
        ratios.append(statistics.median(row[3]) / statistics.median(base[3]))
        print(f"| {name} / format 1 | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-docs", type=int, default=2000)
    parser.add_argument("--cost-docs", type=int, default=500)
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--backend", default="torch", help="the cost part's: torch, onnx or onnx-int8")
    parser.add_argument("--bonus", default="1", help="comma-separated word_bonus values also measured after add")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="times each cost question is asked")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.base_docs, args.cost_docs, args.repeats = 3, 2, 1
    from bertknn.model.runtime import Runtime

    Runtime(threads=1 if args.smoke else os.cpu_count() or 1).apply()
    if not args.skip_cost:
        cost(args)
    if not args.skip_accuracy:
        accuracy(args)


if __name__ == "__main__":
    main()
