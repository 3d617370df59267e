"""Sentence-level evidence, measured: telling the facts of one document apart (born in one city, died in another) with
and without the sentence weights (`sentence_temperature`), on the fresh facts, a LAMA dev split, and the cost of a
question, in one run.

    python bench/sentences.py [--base-docs 1000] [--temperatures 0.01,0.02] [--lama-dev 5] [--cost-docs 300]
                              [--skip-fresh] [--skip-lama] [--skip-cost] [--skip-judge] [--device cpu] [--corpus F]
                              [--smoke]

Fresh facts: a lazy datastore of the first --base-docs evidence documents, with the several-facts set
(bench/fresh_facts/several_*.jsonl: 40 invented people with four cities and two languages each, 20 companies founded
in one city and run from another; made by make_several.py), the held-out several-facts set (heldout_*.jsonl: 30
hand-written documents with distractor facts about other people, never used to choose a setting) and the single-fact
set (documents.jsonl) added. Each question is asked with and without its subject: without sentence weights (0),
with bertknn's default temperature and each of --temperatures, reading the store's evidence vectors, and with the
default temperature embedding every evidence text at the question in float32 (the weights before the vectors were
stored). Printed: BERT-kNN and kNN P@1 for the questions of even-numbered documents (dev: where settings are
chosen) and odd-numbered ones (test; the held-out set is all test), the expected calibration error of BERT-kNN's
top answer as shown (%), then BERT-kNN per relation.

LAMA dev: `tune.DevSplit` (--lama-dev facts per T-REx and Google-RE relation, seed 1, disjoint from the report's
sample) on the lazy datastore of the evidence corpus that `eval lama` uses (cached; one made before evidence vectors
answers without the weights until `bertknn sentences` fills it), through `predict_batch`, with and without subjects:
macro P@1 over relations, in the runs above.

Sentence choice (no datastore): for each several-facts question, the candidate answers of its document (its cities,
languages and years) scored by their sentence alone, the document's names taken out: by word overlap (content words,
scikit-learn's English stopwords dropped), by the sentence encoder's cosine of the question and the sentence alone,
and by `sentences.SentenceMatch.scores` (three views less the background: what the sentence weights use). Printed:
how often the top-scored candidate is the answer (ties shared), dev / test.

The LM reads the evidence (with the fresh facts, unless --skip-judge): the several-facts questions at bertknn's
temperature, BERT-kNN's 3 best words re-ranked by log p + beta log p_LM(word | evidence sentence, question), each
word's nearest evidence sentence read alone or the three together; measured, not kept in bertknn.

Cost: eager builds of the first --cost-docs evidence documents (on CPU the ONNX backend, the CLI's default there;
with `--device cuda`, PyTorch in float32 on the GPU) then an add of the several-facts documents, without and with
evidence vectors in turn, --repeats times each: their median seconds and the stores' bytes per context. Then, on the
store with evidence, the p50 of one question asked alone (the several-facts questions without subjects, the runs in
turn, each first as often as the others): without sentence weights (the former default), bertknn's defaults with
the sentence-vector cache emptied before each question (a question about documents not asked of before) and kept,
and the weights with every evidence text embedded at the question (before the vectors were stored); before those, a
service's stream (each question once in a shuffled order, the cache emptied at the start only), without and with
the weights; then what those questions embed per kind of text (`sentences.TEXTS`): distinct texts and tokens.

--corpus: LAMA dev on another corpus than the evidence corpus (its lazy datastore cached alike). --smoke: the first
4 documents of each fresh-facts set (and their questions) over the first 3 evidence documents (the cost: the first
2), each question asked once; LAMA dev on a lazy datastore of the first 40 evidence documents (in a temporary
directory), 1 fact per relation of the first 8 relations; one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

from evidence import (
    EVIDENCE,
    SMOKE,
    SMOKE_FRESH,
    first_documents,
    first_fresh,
    lama_dev,
    scratch,
    smoke_corpus,
)

FRESH = Path(__file__).resolve().parent / "fresh_facts"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _set(prefix: str, args) -> tuple[list[dict], list[dict]]:
    """A fresh-facts set's documents and questions (those of its first documents in a smoke form)."""
    docs, questions = _jsonl(FRESH / f"{prefix}documents.jsonl"), _jsonl(FRESH / f"{prefix}questions.jsonl")
    return first_fresh(docs, questions, SMOKE_FRESH if args.smoke else None)


def _split(q: dict) -> str:
    """dev (even-numbered documents: where settings are chosen) or test (odd-numbered; every held-out document)."""
    held_out = q["document"].startswith("heldout-")
    return "dev" if not held_out and int(q["document"].rsplit("-", 1)[1]) % 2 == 0 else "test"


def _share(hits: list[bool]) -> str:
    return f"{100 * sum(hits) / len(hits):.1f}" if hits else "-"


def _temperatures(args) -> list[float]:
    """0 (no weights: `--no-sentence-weights`), bertknn's default, then --temperatures."""
    from bertknn.query.settings import SENTENCE_TEMPERATURE

    extra = [float(t) for t in args.temperatures.split(",")] if args.temperatures else []
    return list(dict.fromkeys([0.0, SENTENCE_TEMPERATURE, *extra]))


def _runs(args) -> list[tuple[str, float, bool]]:
    """(label, sentence temperature, evidence read from the store) of each fresh-facts and LAMA run: each
    temperature with the store's int8 evidence vectors, and bertknn's default with every evidence text embedded at
    the question in float32 (the weights before the vectors were stored)."""
    from bertknn.query.settings import SENTENCE_TEMPERATURE

    runs = [(f"{t:g}", t, True) for t in _temperatures(args)]
    return [*runs, (f"{SENTENCE_TEMPERATURE:g}, embedded at the question", SENTENCE_TEMPERATURE, False)]


def fresh(args) -> None:
    from bertknn.evaluation.metrics import calibration
    from bertknn.query.pipeline import BertKNN

    sets = {"several": "several_", "held-out": "heldout_", "single": ""}
    docs = [d for prefix in sets.values() for d in _set(prefix, args)[0]]
    questions = [{**q, "set": name} for name, prefix in sets.items() for q in _set(prefix, args)[1]]
    work = scratch()
    knn = BertKNN.build(
        first_documents(args.base_docs, work / "base.jsonl"), work / "store", args.model, lazy=True, runtime="onnx"
    )
    knn.add_documents(docs)
    print(f"\n## Fresh facts: {len(docs)} documents added to a lazy datastore of {args.base_docs} evidence documents")
    print("P@1 of BERT-kNN (kNN); dev: questions of even-numbered documents, test: odd-numbered (held-out: all)\n")
    print("| set | subject | sentence_temperature | dev | test | ECE dev / test |\n|---|---|---|---|---|---|")
    per_relation = defaultdict(list)
    for mode in ("subject", "no subject"):
        subjects = [q["subject"] if mode == "subject" else None for q in questions]
        for label, t, stored in _runs(args):
            knn.sentence_match.stored = knn.store.evidence if stored else None
            knn.sentence_match.clear()
            found = knn.predict_batch(
                [q["question"] for q in questions], subjects, top_k=1, evidence=0, sentence_temperature=t
            )
            hits, shown = defaultdict(list), defaultdict(list)
            for q, p in zip(questions, found):
                shown[(q["set"], _split(q))].append(p.bert_knn[0].probability)
                for method in ("bert_knn", "knn"):
                    ranked = getattr(p, method)
                    hit = bool(ranked) and ranked[0].token.lower() == q["answer"]
                    hits[(q["set"], _split(q), method)].append(hit)
                    if method == "bert_knn":
                        per_relation[(q["set"], q["relation"], mode, label, _split(q))].append(hit)
            for name in sets:
                cells = [
                    f"{_share(hits[(name, s, 'bert_knn')])} ({_share(hits[(name, s, 'knn')])})" for s in ("dev", "test")
                ]
                ece = [100 * calibration(shown[(name, s)], hits[(name, s, "bert_knn")])["ece"] for s in ("dev", "test")]
                cells.append(" / ".join(f"{e:.1f}" for e in ece))
                print(f"| {name} | {mode} | {label} | " + " | ".join(cells) + " |", flush=True)
    knn.sentence_match.stored = knn.store.evidence
    if not args.skip_judge:
        judge(knn, [q for q in questions if q["set"] == "several"], _temperatures(args)[1])
    print("\nBERT-kNN P@1 per relation, dev / test\n")
    temps = [label for label, *_ in _runs(args)]
    print("| set | relation | subject | " + " | ".join(f"T_s {t}" for t in temps) + " |")
    print("|---" * (len(temps) + 3) + "|")
    for name, relation in sorted({(k[0], k[1]) for k in per_relation}):
        for mode in ("subject", "no subject"):
            cells = [
                f"{_share(per_relation[(name, relation, mode, t, 'dev')])} / "
                f"{_share(per_relation[(name, relation, mode, t, 'test')])}"
                for t in temps
            ]
            print(f"| {name} | {relation} | {mode} | " + " | ".join(cells) + " |")


def judge(knn, questions: list[dict], t: float) -> None:
    """The LM as a judge of the evidence (measured, not kept): BERT-kNN's 3 best words re-ranked by log p + beta log
    p_LM, p_LM the LM's probability of the word with evidence before the question: each word's nearest neighbour's
    sentence ("per word", one pass per word), or the three sentences together ("together", one pass)."""
    import numpy as np

    print(f"\n## The LM reads the evidence: several-facts questions, T_s {t:g}, BERT-kNN P@1 dev / test\n")
    print("| subject | judge | beta 0 | 0.25 | 0.5 | 1 |\n|---|---|---|---|---|---|")
    for mode in ("subject", "no subject"):
        subjects = [q["subject"] if mode == "subject" else None for q in questions]
        found = knn.predict_batch([q["question"] for q in questions], subjects, 3, 1, sentence_temperature=t)
        sentences = [
            [p.evidence[w.token][0].sentence if p.evidence.get(w.token) else "" for w in p.bert_knn] for p in found
        ]
        texts = {
            "per word": [f"{s} {q['question']}" for q, mine in zip(questions, sentences) for s in mine],
            "together": [" ".join(dict.fromkeys(mine)) + " " + q["question"] for q, mine in zip(questions, sentences)],
        }
        for name, read in texts.items():
            probs, _ = knn.encoder.query_ids([(x.ids, x.mask) for x in knn.preprocess(read, [None] * len(read))])
            at = 0
            hits = defaultdict(list)
            for q, p in zip(questions, found):
                ids = [w.id for w in p.bert_knn]
                rows = probs[at : at + len(ids)] if name == "per word" else [probs[at]] * len(ids)
                at += len(ids) if name == "per word" else 1
                judged = np.log(np.maximum([row[i] for row, i in zip(rows, ids)], 1e-12))
                base = np.log(np.maximum([w.probability for w in p.bert_knn], 1e-12))
                for beta in (0, 0.25, 0.5, 1):
                    best = p.bert_knn[int(np.argmax(base + beta * judged))]
                    hits[(beta, _split(q))].append(best.token == q["answer"])
            cells = [f"{_share(hits[(b, 'dev')])} / {_share(hits[(b, 'test')])}" for b in (0, 0.25, 0.5, 1)]
            print(f"| {mode} | {name} | " + " | ".join(cells) + " |", flush=True)


def choice(args) -> None:
    import re

    import numpy as np
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    from bertknn.model.sentences import SentenceMatch
    from bertknn.text import without_names

    several, questions = _set("several_", args)
    docs = {d["id"]: d for d in several}
    answers = {q["answer"] for q in questions}
    match = SentenceMatch("onnx")

    def content(text: str) -> set[str]:
        return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in ENGLISH_STOP_WORDS}

    def cosines(question: str, found: list, title: str) -> np.ndarray:
        v = match.vectors([without_names(t, title) for t in (question, *(s for s, _ in found))])
        return np.array([float(v[without_names(question, title)] @ v[without_names(s, title)]) for s, _ in found])

    hits: dict[tuple[str, str], list[float]] = defaultdict(list)
    best_scores: dict[str, list[float]] = defaultdict(list)
    for q in questions:
        title = docs[q["document"]]["title"]
        sentences = re.split(r"(?<=\.) ", docs[q["document"]]["text"])
        found = [(s, m.span()) for s in sentences for m in re.finditer(r"[A-Za-z]+|\d{4}", s)]
        found = [(s, (a, b)) for s, (a, b) in found if s[a:b].lower() in answers or s[a:b].isdigit()]
        asked = content(without_names(q["question"], title))
        mine = [(q["question"], s, span, title) for s, span in found]
        (views,) = match.views([mine])
        (full,) = match.scores([mine])
        scores = {
            "word overlap": np.array([len(asked & content(without_names(s, title))) for s, _ in found], float),
            "sentence encoder, the sentence alone (cosine)": cosines(q["question"], found, title),
            "the question against the sentence, less the background": views[:, 0],
            "the claim against the sentence, less the background": views[:, 1],
            "the placeholder against the clause, less the background": views[:, 2],
            "the sentence and the clause views (no claim), less the background": views[:, 0] + views[:, 2],
            "sentence encoder, three views less the background (`SentenceMatch.scores`)": full,
        }
        right = np.array([s[slice(*span)].lower() == q["answer"] for s, span in found])
        ok = np.isfinite(full)
        best_scores["right answer's best"].append(full[right & ok].max())
        best_scores["best wrong answer's"].append(full[~right & ok].max())
        best_scores["any candidate's"] += full[ok].tolist()
        for name, score in scores.items():
            best = np.flatnonzero(score == np.nanmax(score))
            hits[(name, _split(q))].append(float(np.mean(right[best])))
    print(f"\n## Sentence choice: {len(questions)} several-facts questions, the answer scored first (%)\n")
    print("| score | dev | test |\n|---|---|---|")
    for name in dict.fromkeys(n for n, _ in hits):
        print(f"| {name} | {100 * np.mean(hits[(name, 'dev')]):.1f} | {100 * np.mean(hits[(name, 'test')]):.1f} |")
    medians = ", ".join(f"{name} {np.median(values):.2f}" for name, values in best_scores.items())
    print(f"\nmedian `SentenceMatch.scores` (what `sentences.FLOOR` cuts): {medians}")


def lama(args) -> None:
    from bertknn.evaluation.facts import ir_subject
    from bertknn.evaluation.metrics import macro_metrics, rank_of

    encoder, reader, dev = lama_dev(args)
    per = f"{args.lama_dev} per T-REx/Google-RE relation, seed 1"
    print(f"\n## LAMA dev: {len(dev)} facts ({per}); macro P@1\n")
    print("| subject | sentence_temperature | BERT | kNN | BERT-kNN | s |\n|---|---|---|---|---|---|")
    for mode in ("subject", "no subject"):
        subjects = [ir_subject(f) if mode == "subject" else None for f in dev]
        for label, t, stored in _runs(args):
            began = time.perf_counter()
            reader.sentence_match.stored = reader.store.evidence if stored else None
            found = reader.predict_batch(
                [f.question for f in dev], subjects, top_k=1, evidence=0, batch_size=32, sentence_temperature=t
            )
            size = encoder.vocab_size
            cells = [
                macro_metrics(dev, [rank_of(getattr(p, name), f.answer_id, None, size) for p, f in zip(found, dev)])
                for name in ("p_bert", "p_knn", "p")
            ]
            p1 = " | ".join(f"{100 * c['macro']['P@1']:.1f}" for c in cells)
            print(f"| {mode} | {label} | {p1} | {time.perf_counter() - began:.0f} |", flush=True)


def cost(args) -> None:
    from bertknn.ingest.ingester import Writer
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime
    from bertknn.model.sentences import sentence_encoder
    from bertknn.query.pipeline import BertKNN

    several, asked = _set("several_", args)
    questions = [q["question"] for q in asked]
    work = scratch()
    corpus = first_documents(args.cost_docs, work / "base.jsonl")
    runtime = Runtime(engine="onnx") if args.device == "cpu" else Runtime(device=args.device)
    encoder = Encoder.load(args.model, runtime=runtime)
    sentence_encoder(runtime).sentence_vectors(["warm up"])  # loaded once, before any build is timed
    spent: dict[tuple[str, bool], list[float]] = defaultdict(list)
    knn = None  # the last store built with evidence vectors: the questions' below
    for repeat in range(args.repeats):  # builds and adds without and with evidence vectors, in turn
        for evidence in (False, True) if repeat % 2 == 0 else (True, False):
            began = time.perf_counter()
            built = BertKNN.build(corpus, work / f"store-{evidence}-{repeat}", encoder, evidence_vectors=evidence)
            spent[("build", evidence)].append(time.perf_counter() - began)
            began = time.perf_counter()
            built.add_documents(several)
            spent[("add", evidence)].append(time.perf_counter() - began)
            knn = built if evidence else knn
    where = "onnx" if args.device == "cpu" else f"torch on {torch_device_name(knn)}"
    print(f"\n## Build and add: {args.cost_docs} evidence documents, then the several-facts ones added, {where}")
    print(f"{args.repeats} times each, without and with evidence vectors in turn; median seconds\n")
    print("| step | without | with | ratio |\n|---|---|---|---|")
    for step in ("build", "add"):
        a, b = (statistics.median(spent[(step, e)]) for e in (False, True))
        print(f"| {step} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    size = {e: sum(f.stat().st_size for f in (work / f"store-{e}-0").rglob("*") if f.is_file()) for e in (False, True)}
    entries = knn.store.size
    print(
        f"\nBytes per context ({entries:,} contexts): {size[False] / entries:,.0f} without evidence vectors, "
        f"{size[True] / entries:,.0f} with ({size[True] / size[False] - 1:+.1%}); distinct evidence texts per context: "
        f"{knn.store.db.execute('SELECT count(*) FROM evidence').fetchone()[0] / entries:.2f}"
    )
    knn = BertKNN(encoder, knn.store, writer=Writer(knn.store, encoder))  # a lazy store: it embeds on demand
    knn.predict_batch(questions[:8], evidence=0)  # warm up
    off = {"sentence_temperature": 0.0}
    runs = {  # name: (options, sentence cache emptied before each question, evidence vectors read from the store)
        "no sentence weights (`--no-sentence-weights`: the former default)": (off, False, True),
        "defaults: sentence weights, the store's evidence vectors, cache emptied": ({}, True, True),
        "defaults, cache kept": ({}, False, True),
        "sentence weights, every evidence text embedded at the question, cache emptied": ({}, True, False),
    }
    streams = {"stream: no sentence weights": off, "stream: defaults (cache kept)": {}}
    times = _timed(knn, questions, runs, streams, args.repeats)
    print(f"\n## Question p50: the store above with evidence, {where}")
    print(f"{len(questions)} questions without subjects, {args.repeats} times, the runs in turn\n")
    print("| run | p50 ms | p90 ms | p50 ratio |\n|---|---|---|---|")
    for names in (list(runs), list(streams)):
        base = statistics.median(times[names[0]])
        for name in names:
            values = times[name]
            p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
            print(f"| {name} | {1000 * p50:.1f} | {1000 * p90:.1f} | {p50 / base:.2f}x |")
    read(knn, questions, _temperatures(args)[1])


def torch_device_name(knn) -> str:
    import torch

    return torch.cuda.get_device_name(knn.encoder.runtime.device)


def _timed(knn, questions: list[str], runs: dict, streams: dict, repeats: int) -> dict:
    """Seconds per question of each run and stream (`cost`): the streams first (each question once in a shuffled
    order, the cache emptied at the start only: a service's stream), then the runs in turn."""
    match, times = knn.sentence_match, defaultdict(list)
    for repeat in range(repeats):
        order = random.Random(repeat).sample(questions, len(questions))
        for name, options in streams.items():
            match.clear()
            for text in order:
                start = time.perf_counter()
                knn.predict(text, top_k=5, evidence=3, **options)
                times[name].append(time.perf_counter() - start)
    names = list(runs)
    for _ in range(repeats):
        for i, text in enumerate(questions):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # each run first as often as the others
                options, cold, stored = runs[name]
                match.stored = knn.store.evidence if stored else None
                if cold:
                    match.clear()
                start = time.perf_counter()
                knn.predict(text, top_k=5, evidence=3, **options)
                times[name].append(time.perf_counter() - start)
    match.stored = knn.store.evidence
    return times


def read(knn, questions: list[str], t: float) -> None:
    """Print what the sentence weights embed for a question about documents not asked of before: the distinct texts
    of each kind (`sentences.TEXTS`) per question, and their tokens (the sentence encoder's cost)."""
    from bertknn.model.sentences import TEXTS

    match, asked = knn.sentence_match, []
    views = match.views
    match.views = lambda rows: (asked.append(rows), views(rows))[1]  # records each batch of questions' neighbours
    for text in questions:
        knn.predict(text, evidence=0, sentence_temperature=t)
    del match.views
    count, tokens = defaultdict(int), defaultdict(int)
    for mine in (mine for batch in asked for mine in batch):
        for kind, texts in zip(TEXTS, zip(*match.texts(mine))):
            count[kind] += len(set(texts))
            tokens[kind] += sum(len(ids) for ids in match.encoder.tokenizer(sorted(set(texts)))["input_ids"])
    n, total = len(questions), sum(tokens.values())
    print("\nEmbedded per question (distinct texts, their tokens with the encoder's special tokens):\n")
    print("| text | texts | tokens | share of tokens |\n|---|---|---|---|")
    for kind in TEXTS:
        print(f"| {kind} | {count[kind] / n:.1f} | {tokens[kind] / n:.1f} | {tokens[kind] / total:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-docs", type=int, default=1000)
    parser.add_argument("--cost-docs", type=int, default=300)
    parser.add_argument("--lama-dev", type=int, default=5, help="LAMA dev facts per relation")
    parser.add_argument("--repeats", type=int, default=2, help="times each cost question is asked")
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--temperatures", default="", help="sentence temperatures beside 0 and bertknn's (a, b, ...)")
    parser.add_argument("--skip-fresh", action="store_true")
    parser.add_argument("--skip-lama", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-judge", action="store_true", help="the LM as a judge of the evidence (in fresh)")
    parser.add_argument("--device", default="cpu", help="the cost's device: cpu (ONNX Runtime) or cuda[:N] (PyTorch)")
    parser.add_argument("--corpus", type=Path, default=EVIDENCE, help="LAMA dev's corpus [default: evidence]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.base_docs, args.cost_docs, args.lama_dev, args.repeats = 3, 2, 1, 1
        args.corpus = smoke_corpus()
    from bertknn.model.runtime import Runtime

    Runtime(threads=1 if args.smoke else os.cpu_count() or 1).apply()
    choice(args)
    if not args.skip_cost:
        cost(args)
    if not args.skip_fresh:
        fresh(args)
    if not args.skip_lama:
        lama(args)


if __name__ == "__main__":
    main()
