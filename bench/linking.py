"""Subject linking (`query.linking`, on by default): questions asked without a subject, and dated updates however
they are titled.

    python bench/linking.py [--base-docs 1000] [--lama-dev 5] [--synthetic 5000000] [--skip-updates] [--skip-lama]
                            [--skip-cost] [--skip-candidates] [--smoke]

- Updates (bench/fresh_facts/updates_*.jsonl, written for this check): 8 invented subjects, each an article with three
  facts, then a later dated update of one of them, titled by the subject (4) or as a news item (4), over the first
  --base-docs evidence documents in a lazy datastore. Questions: the updated fact in the update's words and in the
  article's, and two facts the update does not touch; with the subject, without it (linked), without it and linking
  off. dev: subjects 0, 1, 4, 5, test: 2, 3, 6, 7 (each half two updates titled by the subject, two as news).
- LAMA dev: `tune.DevSplit` (--lama-dev facts per T-REx and Google-RE relation, seed 1, disjoint from the reports'
  sample) over the lazy datastore of the whole evidence corpus: macro P@1 with the subject, without it linked, and
  without it with linking off (the paper's search); how many questions were linked.
- Cost: linking's time per question (LAMA dev's questions, one thread) over the evidence corpus's names index, and
  the names index of --synthetic titles (invented two- and three-word names, the paper's 5.07M articles by default;
  the store's SQL lookup and spans, without TF-IDF's check of a part's commonness): time and bytes.
- Several candidates: over every LAMA T-REx and Google-RE question, how many link a subject and how many the fact's
  own; how many meet a title or alias that several titles share; and how many links change, and how many to the
  fact's own subject, where a part of a title that names two titles is linked by TF-IDF's pick instead of to none.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import time
from collections import defaultdict
from contextlib import closing
from pathlib import Path

from evidence import DATA, EVIDENCE, SMOKE, SMOKE_FACTS, first_documents, lama_dev, scratch, smoke_corpus

FRESH = Path(__file__).resolve().parent / "fresh_facts"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def updates(args) -> None:
    from bertknn.query.pipeline import BertKNN

    docs, news = _jsonl(FRESH / "updates_documents.jsonl"), _jsonl(FRESH / "updates_news.jsonl")
    questions = _jsonl(FRESH / "updates_questions.jsonl")
    if args.smoke:
        docs, news = docs[:2], news[:2]
        questions = [q for q in questions if q["document"] in {d["id"] for d in docs}]
    work = scratch()
    knn = BertKNN.build(
        first_documents(args.base_docs, work / "base.jsonl"), work / "store", args.model, lazy=True, runtime="onnx"
    )
    knn.add_documents(docs)
    knn.add_documents(news)  # later, dated: each changes one fact of its subject
    print(f"\n## Updates: {len(docs)} articles and {len(news)} dated updates over {args.base_docs} evidence documents")
    print("BERT-kNN P@1 (old answer kept); dev: subjects 0, 1, 4, 5; test: 2, 3, 6, 7\n")
    print("| questions | update titled | mode | dev | test |\n|---|---|---|---|---|")
    modes = {"subject": {}, "no subject, linked": {}, "no subject, linking off": {"link": False}}
    for mode, options in modes.items():
        subjects = [q["subject"] if mode == "subject" else None for q in questions]
        found = knn.predict_batch([q["question"] for q in questions], subjects, top_k=1, evidence=0, **options)
        hits, old = defaultdict(list), defaultdict(list)
        for q, p in zip(questions, found):
            half = _half(q)
            answer = p.bert_knn[0].token.lower() if p.bert_knn else ""
            for key in ((q["kind"], q["update_title"], half), (q["kind"], "all", half)):
                hits[key].append(answer == q["answer"])
                old[key].append(answer == q.get("old"))
        for kind, titled in sorted({k[:2] for k in hits}):
            cells = []
            for half in ("dev", "test"):
                got = hits[(kind, titled, half)]
                kept = f" ({sum(old[(kind, titled, half)])} old)" if kind.startswith("updated") else ""
                cells.append(f"{sum(got)}/{len(got)}{kept}" if got else "-")
            print(f"| {kind} | {titled} | {mode} | {' | '.join(cells)} |", flush=True)


def _half(q: dict) -> str:
    """dev: subjects 0, 1, 4, 5; test: 2, 3, 6, 7 (each half two updates titled by the subject, two as news)."""
    return "dev" if int(q["document"].rsplit("-", 1)[1]) // 2 % 2 == 0 else "test"


def lama(args):
    from bertknn.evaluation.facts import ir_subject
    from bertknn.evaluation.metrics import macro_metrics, rank_of

    encoder, reader, dev = lama_dev(args)
    if args.skip_lama:
        return reader, [f.question for f in dev]
    print(f"\n## LAMA dev: {len(dev)} facts ({args.lama_dev} per T-REx/Google-RE relation, seed 1); macro P@1\n")
    print("| mode | BERT | kNN | BERT-kNN | linked | s |\n|---|---|---|---|---|---|")
    modes = {"subject": {}, "no subject, linked": {}, "no subject, linking off": {"link": False}}
    for mode, options in modes.items():
        began = time.perf_counter()
        subjects = [ir_subject(f) if mode == "subject" else None for f in dev]
        found = reader.predict_batch([f.question for f in dev], subjects, top_k=1, evidence=0, batch_size=32, **options)
        size = encoder.vocab_size
        cells = [
            macro_metrics(dev, [rank_of(getattr(p, name), f.answer_id, None, size) for p, f in zip(found, dev)])
            for name in ("p_bert", "p_knn", "p")
        ]
        p1 = " | ".join(f"{100 * c['macro']['P@1']:.1f}" for c in cells)
        linked = sum(p.linked is not None for p in found)
        print(f"| {mode} | {p1} | {linked} | {time.perf_counter() - began:.0f} |", flush=True)
    return reader, [f.question for f in dev]


def candidates(args, reader) -> None:
    """How often a question's span names several titles, over every LAMA T-REx and Google-RE question (the subject
    filled in): a title or alias several titles share (`linking._best_scored` picks one), and a part of a title that
    names two (linked to none; with TF-IDF's pick instead, how many links change, and to the fact's own subject)."""
    from unittest import mock

    from bertknn.evaluation.facts import GROUPS, load_lama
    from bertknn.query import linking
    from bertknn.store import names
    from bertknn.text import normalize_title

    facts = load_lama(DATA / "lama", reader.encoder.tokenizer, GROUPS, warn=lambda m: None)
    facts = facts[: 5 * SMOKE_FACTS] if args.smoke else facts
    store, index, several = reader.store, reader.index, []
    real = linking._best_scored

    def scored(*a):
        several.append(a[-1])
        return real(*a)

    def parts_too(rows):  # a part naming two titles names both (three or more: still none)
        kind = min(k for _, k in rows) if rows else None
        titles = sorted({t for t, k in rows if k == kind})
        return None if not rows or len(titles) > 2 else (titles, kind)

    def two_parts(spans):  # the lookup, with the first three live titles of a part that names several (not MORE)
        rows = names.lookup(store.db, spans) or []
        several = sorted({r[0] for r in rows if r[1] == names.MORE and r[2] == names.PART})
        return [r for r in rows if r[1] != names.MORE] + [
            row
            for name in several
            for row in store.db.execute(
                "SELECT q.name, q.title, q.kind, min(d.title) FROM names q JOIN documents d ON d.norm_title = q.title "
                "AND d.state = 'live' WHERE q.name = ? AND q.kind = ? GROUP BY q.title ORDER BY q.title LIMIT 3",
                (name, names.PART),
            )
        ]

    links = {}
    with mock.patch.object(linking, "_best_scored", scored):
        for f in facts:
            found = linking.link(store, index, f.question)
            links[f] = found and normalize_title(found.subject)
    own = sum(links[f] == normalize_title(f.subject) for f in facts)
    print(f"\n## Several candidates: {len(facts):,} LAMA questions\n")
    print(f"{sum(v is not None for v in links.values()):,} linked, {own:,} to the fact's own subject; "
          f"{len(several)} met a title or alias that names several titles")  # fmt: skip
    changed = right = 0
    with mock.patch.object(linking, "_titles", parts_too), mock.patch.object(store.documents, "named", two_parts):
        for f in facts:
            found = linking.link(store, index, f.question)
            now = found and normalize_title(found.subject)
            changed += now != links[f]
            right += now != links[f] and now == normalize_title(f.subject)
    print(
        f"a part naming two titles linked by TF-IDF instead of none: {changed:,} links change, {right:,} of them "
        "to the fact's own subject",
        flush=True,
    )


def cost(args, reader, questions: list[str]) -> None:
    print("\n## Linking's cost per question (one thread)\n")
    print("| names index | titles | rows | bytes | ms per question |\n|---|---|---|---|---|")
    evidence_cost(reader, questions)
    synthetic_cost(args.synthetic, questions)


def evidence_cost(reader, questions: list[str]) -> None:
    from bertknn.query.linking import link

    for q in questions[:20]:  # warm: the pages the lookups read
        link(reader.store, reader.index, q)
    began = time.perf_counter()
    for q in questions:
        link(reader.store, reader.index, q)
    ms = 1000 * (time.perf_counter() - began) / len(questions)
    with closing(sqlite3.connect(reader.store.path / "store.sqlite")) as db:
        rows = db.execute("SELECT count(*) FROM names").fetchone()[0]
        titles = db.execute("SELECT count(DISTINCT norm_title) FROM documents").fetchone()[0]
        size = _bytes(db)
    print(f"| evidence corpus (link, whole) | {titles:,} | {rows:,} | {size} | {ms:.3f} |", flush=True)


def synthetic_cost(n: int, questions: list[str]) -> None:
    from bertknn.query.linking import spans
    from bertknn.store import names
    from bertknn.text import normalize_title

    db = _synthetic(scratch() / "names.sqlite", n)
    texts = [sorted({normalize_title(q[a:b]) for a, b, *_ in spans(q)}) for q in questions]
    for spanned in texts[:20]:
        names.lookup(db, spanned)
    began = time.perf_counter()
    for q, spanned in zip(questions, texts):
        spans(q)
        names.lookup(db, spanned)
    ms = 1000 * (time.perf_counter() - began) / len(questions)
    rows = db.execute("SELECT count(*) FROM names").fetchone()[0]
    size = _bytes(db)
    print(f"| synthetic (spans and lookup) | {n:,} | {rows:,} | {size} | {ms:.3f} |", flush=True)


def _synthetic(path: Path, n: int) -> sqlite3.Connection:
    """A store.sqlite's documents and names tables for `n` invented titles (two or three invented words each)."""
    from bertknn.store import names
    from bertknn.store.schema import SCHEMA

    rng = random.Random(0)
    syllables = ["ka", "ri", "mo", "ten", "sel", "vor", "an", "dra", "lu", "bel", "os", "quin", "ya", "zu", "fer"]

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))).capitalize()

    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    began = time.perf_counter()
    with db:
        for idx in range(n):
            title = " ".join(word() for _ in range(rng.choice((2, 2, 3))))
            db.execute(
                "INSERT INTO documents (idx, id, title, norm_title) VALUES (?, ?, ?, ?)",
                (idx, str(idx), title, title.lower()),
            )
            names.add(db, title)
    print(f"(synthetic names index of {n:,} titles written in {time.perf_counter() - began:.0f} s)", flush=True)
    return db


def _bytes(db: sqlite3.Connection) -> str:
    """The bytes of the names table and its index (SQLite's dbstat)."""
    used = db.execute(
        "SELECT sum(pgsize) FROM dbstat WHERE name IN ('names', 'names_title', 'sqlite_autoindex_names_1')"
    ).fetchone()[0]
    return f"{used or 0:,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--base-docs", type=int, default=1000)
    parser.add_argument("--lama-dev", type=int, default=5, help="LAMA dev facts per relation")
    parser.add_argument("--synthetic", type=int, default=5_070_000, help="titles of the synthetic names index")
    parser.add_argument("--corpus", type=Path, default=EVIDENCE)
    parser.add_argument("--skip-updates", action="store_true")
    parser.add_argument("--skip-lama", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-candidates", action="store_true")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.base_docs, args.lama_dev, args.synthetic, args.corpus = 20, 1, 2000, smoke_corpus()
        import torch

        torch.set_num_threads(1)
    if not args.skip_updates:
        updates(args)
    if not args.skip_lama or not args.skip_cost or not args.skip_candidates:
        reader, questions = lama(args)
        if not args.skip_cost:
            cost(args, reader, questions)
        if not args.skip_candidates:
            candidates(args, reader)


if __name__ == "__main__":
    main()
