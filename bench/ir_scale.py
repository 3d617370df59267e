"""The TF-IDF index at scale: build time, merges, bytes, memory and query latency on a synthetic corpus.

    python bench/ir_scale.py [--docs 1000000] [--checkpoints 250000,500000,1000000] [--queries 500] [--smoke]

Synthetic corpus, shaped like English Wikipedia: a Zipfian vocabulary (exponent 1.0, 2M word types, the 150 most
frequent types are stopwords), document lengths log-normal (median 300 words, sigma 1.13: a mean of about 570 words).
Documents are generated as their hashed features, as `retrieval.ngram_hashes` would give them: unigrams and bigrams
of non-stopwords, word types hashed by a fixed random table and bigrams by an integer mix into the same 2^24 buckets
(statistically what murmur3 of the strings gives). Text-to-feature cost (`ngram_hashes`, pure Python) is measured
apart, on the evidence corpus, and added in the extrapolation.

The index is built as `Writer.index_documents` builds it: `TfidfIndex.from_features` per segment of 5,000 documents,
saved, then `tfidf_files.compact` after each segment. At each checkpoint, queries run against the index as loaded from
disk (memory-mapped, warm): "subject" queries (2 consecutive non-stopwords of a random document, as a LAMA subject
names its article) and "question" queries (6 non-stopwords of a random document). Printed: documents, postings, build
seconds, merges, segments, bytes on disk, peak RSS (and peak anonymous RSS: what is not page cache of the mapped index),
query p50/p99 in ms, and the 5.07M-article extrapolation. Peak memory includes the generator's tables (~0.1 GB).
--smoke: 1,000 documents in segments of 100 (one merge), 20 queries, ngram_hashes timed on 20 documents.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from evidence import SMOKE

from bertknn.index.merging import FACTOR
from bertknn.index.retrieval import TfidfIndex, ngram_hashes
from bertknn.index.tfidf_files import BASE, FILES, NDOCS, NUM_BUCKETS, compact, on_disk
from bertknn.text import iter_corpus

VOCAB, STOP, SEGMENT = 2_000_000, 150, 5000
PAPER_DOCS = 5_070_000


class Corpus:
    """Documents as word-type ids (Zipfian) and their hashed features."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
        self.cdf = np.cumsum(1.0 / ranks)
        self.cdf /= self.cdf[-1]
        self.bucket = rng.integers(0, NUM_BUCKETS, VOCAB, dtype=np.int64)
        self.rng = rng

    def documents(self, n: int) -> list[np.ndarray]:
        lengths = np.maximum(1, self.rng.lognormal(np.log(300), 1.13, n).astype(np.int64))
        words = np.searchsorted(self.cdf, self.rng.random(int(lengths.sum())))
        return np.split(words, np.cumsum(lengths)[:-1])

    def features(self, words: np.ndarray) -> np.ndarray:
        """Unigrams and bigrams of non-stopwords, hashed (ids < STOP are stopwords)."""
        keep = words >= STOP
        uni = self.bucket[words[keep]]
        pair = keep[:-1] & keep[1:]
        a, b = words[:-1][pair].astype(np.uint64), words[1:][pair].astype(np.uint64)
        x = a * np.uint64(0x9E3779B97F4A7C15) ^ (b + np.uint64(0x632BE59BD9B4E019))
        x ^= x >> np.uint64(31)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(29)
        return np.concatenate([uni, (x & np.uint64(NUM_BUCKETS - 1)).astype(np.int64)])

    def query(self, words: np.ndarray, kind: str) -> np.ndarray | None:
        content = words[words >= STOP]
        if kind == "subject":
            runs = np.flatnonzero((words[:-1] >= STOP) & (words[1:] >= STOP))
            if not len(runs):
                return None
            at = int(self.rng.choice(runs))
            return self.features(words[at : at + 2])
        if len(content) < 6:
            return None
        return self.features(self.rng.choice(content, 6, replace=False))


def text_rate(n_docs: int) -> tuple[float, float]:
    """(documents/s, words/s) of `ngram_hashes` on the evidence corpus's first `n_docs` documents, one core."""
    data = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[1] / "../shared/data"))
    texts = []
    for doc in iter_corpus(data / "wiki" / "lama_evidence_docs.jsonl"):
        texts.append(" ".join(doc.passages))
        if len(texts) == n_docs:
            break
    began = time.perf_counter()
    for text in texts:
        ngram_hashes(text)
    took = time.perf_counter() - began
    return len(texts) / took, sum(len(t.split()) for t in texts) / took


class AnonPeak(threading.Thread):
    """The largest anonymous resident memory (RssAnon: not the page cache of the memory-mapped index) seen, sampled
    every 20 ms; ru_maxrss also counts the index pages a merge or a query maps in, which the kernel can drop."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0

    def run(self) -> None:
        while True:
            with open("/proc/self/status") as status:
                kib = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
            self.peak = max(self.peak, kib * 1024)
            time.sleep(0.02)


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def latency(index: TfidfIndex, queries: list[np.ndarray]) -> tuple[float, float]:
    for q in queries[:20]:  # warm the page cache for the columns queries touch
        index.top(q, 3)
    times = []
    for q in queries:
        began = time.perf_counter()
        index.top(q, 3)
        times.append(time.perf_counter() - began)
    return float(np.percentile(times, 50) * 1000), float(np.percentile(times, 99) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--checkpoints", default="", help="document counts to measure queries at (default: --docs)")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--text-docs", type=int, default=2000, help="evidence documents to time ngram_hashes on")
    parser.add_argument("--dir", default=None, help="where to write the index (default: a temporary directory)")
    parser.add_argument("--segment", type=int, default=SEGMENT, help="documents per segment, as a build writes them")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.docs, args.segment, args.queries, args.text_docs = 1000, 100, 20, 20
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",") if c} | {args.docs})
    out = Path(args.dir or tempfile.mkdtemp(prefix="ir_scale_"))
    out.mkdir(parents=True, exist_ok=True)
    corpus, queries, anon = Corpus(), {"subject": [], "question": []}, AnonPeak()
    anon.start()
    time.sleep(0.1)
    print(f"# anonymous RSS before building (Python, numpy, torch via bertknn's imports): {anon.peak / 2**30:.2f} GiB")
    build_s, merges, postings, rows, listed = 0.0, 0, 0, [], []
    print(f"# ir_scale: {args.docs:,} synthetic documents in {out}, {os.cpu_count()} cores", flush=True)
    for first in range(0, args.docs, args.segment):
        docs = corpus.documents(min(args.segment, args.docs - first))
        for words in docs[:: max(1, args.docs // (4 * args.queries))]:
            for kind, found in queries.items():
                q = corpus.query(words, kind)
                if q is not None:
                    found.append(q)
        features = [corpus.features(w) for w in docs]
        began = time.perf_counter()
        segment = TfidfIndex.from_features(features, first)
        postings += len(segment.segments[0].docs)
        before = len(listed) + 1
        listed = compact(out, [*listed, segment.save(out, first)])
        merges += (before - len(listed)) // (FACTOR - 1)
        for name in set(on_disk(out)) - {part.name for part in listed}:  # what merges replaced, as `retire` does
            if name == BASE:  # the first segment: files in the directory itself
                for file in (*FILES, NDOCS):
                    (out / file).unlink()
            else:
                shutil.rmtree(out / name)
        build_s += time.perf_counter() - began
        end = first + len(docs)
        if end % 100_000 == 0 or end == args.docs:
            print(f"  {end:,} documents, {build_s:.0f} s building, {merges} merges", flush=True)
        if end in checkpoints:
            index = TfidfIndex.open(out, listed)
            rng = np.random.default_rng(end)
            row = {"docs": end, "postings": postings, "build_s": build_s, "merges": merges}
            row |= {"segments": len(index.segments), "bytes": disk_bytes(out)}
            row["rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            row["anon_gib"] = anon.peak / 2**30
            for kind, found in queries.items():
                picked = [found[i] for i in rng.choice(len(found), min(args.queries, len(found)), replace=False)]
                row[f"{kind}_p50"], row[f"{kind}_p99"] = latency(index, picked)
            rows.append(row)
            print("  " + ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in row.items()))
    docs_s, words_s = text_rate(args.text_docs)
    last = rows[-1]
    print(f"ngram_hashes on the evidence corpus, one core: {docs_s:,.0f} documents/s, {words_s:,.0f} words/s")
    print(
        "| documents | postings | build s (index only) | merges | segments | index GB | peak RSS GiB (anonymous) "
        "| subject p50 / p99 ms | question p50 / p99 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['docs']:,} | {r['postings']:,} | {r['build_s']:,.0f} | {r['merges']} | {r['segments']} | "
            f"{r['bytes'] / 1e9:.2f} | {r['rss_gib']:.2f} ({r['anon_gib']:.2f}) | "
            f"{r['subject_p50']:.2f} / {r['subject_p99']:.2f} | {r['question_p50']:.2f} / {r['question_p99']:.2f} |"
        )
    scale = PAPER_DOCS / last["docs"]
    hashing_h = PAPER_DOCS * 570 / words_s / 3600
    print(
        f"extrapolated to {PAPER_DOCS:,} articles (x{scale:.2f}): index {last['bytes'] * scale / 1e9:.1f} GB, "
        f"index build ~{last['build_s'] * scale / 3600:.2f} h + ngram_hashes ~{hashing_h:.1f} core-hours "
        f"(570 words/article at the measured words/s)"
    )
    if not args.dir:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
