"""The CPU stages of a build in worker processes: documents/s of sentence splitting and of IR hashing by workers.

    python bench/cpu_stages.py [--copies 6] [--workers 1,2] [--docs N] [--smoke]

Reads the evidence corpus ($BERTKNN_DATA/wiki/lama_evidence_docs.jsonl) `--copies` times over (so that starting the
workers is a small part of the time), then runs `corpus.record_located` (sentence splitting: sentencex and pysbd on a
tenth of the documents) and `retrieval.feature_array` (IR hashing) through `workers.ordered_map` with each number of
workers, in one process, the pool started inside the timing as a build starts it. --docs: only the first N documents
of the corpus; --smoke: the first 40 documents, once.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from itertools import islice

from evidence import EVIDENCE, SMOKE

from bertknn.index.retrieval import feature_array
from bertknn.ingest import workers
from bertknn.ingest.corpus import open_corpus, record_located


def rate(fn, items: list, n: int) -> float:
    began = time.perf_counter()
    for _ in workers.ordered_map(fn, items, n):
        pass
    return len(items) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--docs", type=int, default=None, help="only the first N documents of the corpus")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.docs, args.copies = 40, 1
    docs = list(islice(open_corpus(EVIDENCE).located(), args.docs)) * args.copies
    texts = [" ".join(doc.passages) for _, doc in docs]
    print(f"# {len(docs):,} documents, {os.cpu_count()} cores")
    print("| workers | split, sentencex (docs/s) | split, pysbd (docs/s) | IR hashing (docs/s) |")
    print("|---:|---:|---:|---:|")
    for n in [int(w) for w in args.workers.split(",")]:
        sentencex = rate(partial(record_located, splitter="sentencex"), docs, n)
        pysbd = rate(partial(record_located, splitter="pysbd"), docs[: len(docs) // 10], n)
        hashing = rate(feature_array, texts, n)
        print(f"| {n} | {sentencex:,.0f} | {pysbd:,.0f} | {hashing:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
