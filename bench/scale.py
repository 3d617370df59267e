"""A datastore's costs as it grows: every stage measured at each size, the model's two stages stood in.

    python bench/scale.py [--contexts 1000000,10000000] [--questions 200] [--threads 2] [--factory auto] [--work DIR]
        [--keep] [--smoke]

For each size N, a corpus of about N contexts is made from the evidence corpus (its documents repeated under new ids
and titles: "Title (2)"; their lengths and titles as Wikipedia's articles have them), then built through bertknn's
own build path: reading, sentence splitting, tokenising, values, entries, evidence texts, TF-IDF, the commit and the
checksums. Only the two model stages are stood in, by vectors of their real shapes at memory speed through the same
code paths: the keys (`Encoder.embed`, random float32 rows of the model's width) and the sentence encoder's evidence
vectors (random 384-wide rows). The GPU key stage is measured apart (bench/gpu_run.sh). Questions run the real model.

Measured at each size, each in a process of its own where its memory is reported: the build's time by phase and its
peak RSS; disk per context by file; opening the store (`open_store` with its sampled check, and the TF-IDF index),
cold (the page cache dropped, where this machine allows it) and warm; a question's p50 and p99 over the IR subset,
with and without the subject (exact search over the documents TF-IDF picks); an add of 1 (the median of 5) and of
100 documents, a remove of 1 (the median of 5) and a `--replace` of 1 (the stand-in keys: the rest of the write path
as it is); `verify`'s time and peak RSS; `bertknn index` (FAISS, its automatic factory) and the questions' p50 and
p99 through it; `bertknn repair` of a TF-IDF segment and of the FAISS index, each cut to half its bytes. Then the
growth table: each figure at each size and its growth exponent between the two largest sizes (log of the ratio of
the figures over log of the ratio of the sizes: 1 is linear, 0 constant).

--smoke: sizes of 10,000 and 18,000 contexts, FAISS Flat, 10 questions, one thread.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from evidence import EVIDENCE, SMOKE

SENTENCE_DIM = 384  # the sentence encoder's width (all-MiniLM-L6-v2)
SINGLES = 5  # adds and removes of one document timed at each size: the median is reported
CONTEXTS_PER_WORD = 0.6  # the evidence corpus's contexts per word (\w+ run), seen at this bench's smoke sizes


def stand_in_models() -> None:
    """Replace the two model stages of a build or an add by random vectors of their shapes (this process only)."""
    from bertknn.ingest import evidence_encoding
    from bertknn.model.encoder import Encoder

    rng = np.random.default_rng(0)

    def keys(self, sentences, token_budget=None, pack=1, int8_keys=False):
        return rng.standard_normal((sum(len(s.positions) for s in sentences), self.dim), dtype=np.float32)

    class Sentences:
        def sentence_vectors(self, texts):
            return rng.standard_normal((len(texts), SENTENCE_DIM), dtype=np.float32)

    Encoder.embed = keys
    evidence_encoding.sentence_encoder = lambda runtime: Sentences()


def text_of(doc: dict) -> str:
    """A corpus document's text (the evidence corpus keeps it as a list of passages)."""
    return doc["text"] if "text" in doc else " ".join(doc["sentences"])


def write_corpus(out: Path, contexts: int) -> int:
    """The evidence corpus's documents, repeated under new ids and titles, until they hold about `contexts` contexts
    (`CONTEXTS_PER_WORD`); how many documents."""
    words = docs = copy = 0
    with out.open("w", encoding="utf-8") as dst:
        while words * CONTEXTS_PER_WORD < contexts:
            with EVIDENCE.open(encoding="utf-8") as src:
                for line in src:
                    doc = json.loads(line)
                    if copy:
                        doc = {**doc, "id": f"{doc['id']}-{copy}", "title": f"{doc['title']} ({copy + 1})"}
                    dst.write(json.dumps(doc) + "\n")
                    words, docs = words + len(re.findall(r"\w+", text_of(doc))), docs + 1
                    if words * CONTEXTS_PER_WORD >= contexts:
                        break
            copy += 1
    return docs


def run_stage(stage: str, **options: object) -> tuple[dict, float]:
    """`stage` in a process of its own: its JSON result and its peak RSS in GB."""
    command = [sys.executable, __file__, "--stage", stage, "--options", json.dumps(options)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status:
        raise SystemExit(f"stage {stage} failed ({status}):\n{out[-3000:]}")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss / 1e6  # ru_maxrss: kB on Linux


def stage_build(corpus: str, store: str, threads: int) -> dict:
    """The build, by phase (first to last progress call of each phase), with the stand-in models."""
    from bertknn.ingest.ingester import Writer
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime

    stand_in_models()
    encoder = Encoder.load(runtime=Runtime(threads=threads))
    seen: dict[str, list[float]] = {}

    def progress(phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        seen.setdefault(phase, [now, now])[1] = now

    began = time.perf_counter()
    with Writer.build(corpus, store, encoder, n_workers=1, progress=progress) as writer:
        size = writer.store.size
    phases = {phase: round(b - a, 2) for phase, (a, b) in seen.items()}
    return {"seconds": round(time.perf_counter() - began, 2), "contexts": size, "phases": phases}


def _drop_caches() -> bool:
    """Drop the page cache (root, where the machine allows it); False where it does not."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def stage_open(store: str, cold: bool) -> dict:
    """Opening the store and its TF-IDF index, cold (page cache dropped first) or warm."""
    from bertknn.index.retrieval import TfidfIndex
    from bertknn.store.shards import open_store

    dropped = cold and _drop_caches()
    began = time.perf_counter()
    with open_store(store) as opened:
        TfidfIndex.load(opened)
    return {"seconds": round(time.perf_counter() - began, 4), "cold": dropped}


def _questions(store, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` cloze questions made from the store's documents' first sentences (the last word masked), with titles."""
    rng = np.random.default_rng(seed)
    out = []
    for doc in rng.permutation(store.n_documents)[: n * 3].tolist():
        row = store.documents.provenance([store.documents.ranges([doc])[0][0]])[0]
        words = row.sentence.rstrip(" .").split()
        if len(words) >= 6:
            out.append((" ".join(words[:-1]) + " [MASK] .", row.title))
        if len(out) == n:
            break
    return out


def _timed(call) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


def stage_use(store: str, questions: int, threads: int, corpus: str) -> dict:
    """Questions (p50, p99 in ms, with and without the subject) and writes (ms) on the store."""
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN

    stand_in_models()
    knn = BertKNN.load(store, runtime=Runtime(threads=threads))
    asked = _questions(knn.store, questions)
    knn.predict(asked[0][0], subject=asked[0][1])  # warm: the model's first pass
    out: dict = {}
    for name, given in (("with subject", True), ("without subject", False)):
        times = [_timed(lambda q=q, t=t, g=given: knn.predict(q, subject=t if g else None)) for q, t in asked]
        out[f"question p50, {name}"] = round(statistics.median(times), 2)
        out[f"question p99, {name}"] = round(float(np.percentile(times, 99)), 2)
    with open(corpus, encoding="utf-8") as lines:
        texts = [json.loads(next(lines)) for _ in range(SINGLES + 100)]
    new = [{"id": f"scale-add-{i}", "title": f"Scale addition {i}", "text": text_of(d)} for i, d in enumerate(texts)]
    singles = [_timed(lambda d=d: knn.add_documents([d])) for d in new[:SINGLES]]
    out["add of 1"] = round(statistics.median(singles), 1)
    out["add of 100"] = round(_timed(lambda: knn.add_documents(new[SINGLES:])), 1)
    removes = [_timed(lambda d=d: knn.remove_documents([d["id"]])) for d in new[:SINGLES]]
    out["remove of 1"] = round(statistics.median(removes), 1)
    changed = {**new[SINGLES], "text": new[SINGLES + 1]["text"]}
    out["replace of 1"] = round(_timed(lambda: knn.add_documents([changed], replace=True)), 1)
    knn.close()
    return out


def stage_faiss(store: str, questions: int, threads: int, factory: str) -> dict:
    """`bertknn index` (FAISS with `factory`; auto: Flat below 20k keys, else IVF-PQ) and questions searched through
    it (8x re-ranked), with and without the subject."""
    import faiss

    from bertknn.ingest.ingester import Writer
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN
    from bertknn.store.shards import open_store

    faiss.omp_set_num_threads(threads)
    began = time.perf_counter()
    with Writer(open_store(store)) as writer:
        factory = writer.index_keys(factory).settings["factory"]
    out: dict = {"FAISS index s": round(time.perf_counter() - began, 2), "FAISS factory": factory}
    knn = BertKNN.load(store, runtime=Runtime(threads=threads), read_only=True)
    asked = _questions(knn.store, questions)
    knn.predict(asked[0][0], retrieval="faiss")
    for name, given in (("with subject", True), ("without subject", False)):
        times = [
            _timed(lambda q=q, t=t, g=given: knn.predict(q, subject=t if g else None, retrieval="faiss"))
            for q, t in asked
        ]
        out[f"question p50 over FAISS, {name} ms"] = round(statistics.median(times), 2)
        out[f"question p99 over FAISS, {name} ms"] = round(float(np.percentile(times, 99)), 2)
    knn.close()
    return out


def stage_verify(store: str) -> dict:
    """`bertknn verify`'s check of every block and SQLite."""
    from bertknn.index import faiss_files, retrieval
    from bertknn.store import verify

    began = time.perf_counter()
    report = verify.verify(Path(store), readers=(retrieval.problems, faiss_files.problems))
    return {"seconds": round(time.perf_counter() - began, 2), "problems": len(report.problems)}


def stage_repair(store: str) -> dict:
    """`bertknn repair` of a damaged TF-IDF segment, then (where the store has one) of a damaged FAISS index: each
    file cut to half its bytes, then repaired; the time of each and whether `verify` finds the store sound after."""
    from bertknn.index import faiss_files, retrieval
    from bertknn.ingest.repair import repair
    from bertknn.store import verify

    out: dict = {}
    for what, name in (("TF-IDF segment", "tfidf_docs.npy"), ("FAISS index", "faiss.index")):
        found = sorted(Path(store).rglob(name), key=lambda file: file.stat().st_size)
        if found:  # the largest segment's
            target = found[-1]
            os.truncate(target, target.stat().st_size // 2)
            out[f"repair of a damaged {what} s"] = round(_timed(lambda: repair(store)) / 1000, 2)
    report = verify.verify(Path(store), readers=(retrieval.problems, faiss_files.problems))
    return {**out, "problems after repair": len(report.problems)}


STAGES = {"build": stage_build, "open": stage_open, "use": stage_use, "verify": stage_verify, "faiss": stage_faiss}
STAGES["repair"] = stage_repair


def disk(store: Path, contexts: int) -> dict[str, float]:
    """Bytes per context by file (the TF-IDF segments and the FAISS files summed by kind)."""
    sizes: dict[str, int] = {}
    for path in store.rglob("*"):
        if path.is_file():
            name = path.relative_to(store).parts[0]
            name = "tfidf (all segments)" if name.startswith("tfidf") else name
            sizes[name] = sizes.get(name, 0) + path.stat().st_size
    return {name: round(size / contexts, 1) for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])}


def measure(n: int, work: Path, args: argparse.Namespace) -> dict:
    """Every figure at one size."""
    corpus, store = work / f"corpus-{n}.jsonl", work / f"store-{n}"
    shutil.rmtree(store, ignore_errors=True)
    docs = write_corpus(corpus, n)
    built, build_rss = run_stage("build", corpus=str(corpus), store=str(store), threads=args.threads)
    cold, _ = run_stage("open", store=str(store), cold=True)
    warm, _ = run_stage("open", store=str(store), cold=False)
    verified, verify_rss = run_stage("verify", store=str(store))
    options = {"questions": args.questions, "threads": args.threads}
    used, use_rss = run_stage("use", store=str(store), corpus=str(corpus), **options)
    indexed, faiss_rss = run_stage("faiss", store=str(store), factory=args.factory, **options)
    repaired, repair_rss = run_stage("repair", store=str(store))
    figures = {
        "documents": docs,
        "contexts": built["contexts"],
        "build s": built["seconds"],
        **{f"build: {phase} s": s for phase, s in built["phases"].items()},
        "build peak RSS GB": round(build_rss, 2),
        "bytes per context": round(sum(disk(store, built["contexts"]).values()), 1),
        "open, cold s" if cold["cold"] else "open, cold s (cache not dropped)": cold["seconds"],
        "open, warm s": warm["seconds"],
        **{f"{k} ms": v for k, v in used.items()},
        "questions and writes: peak RSS GB": round(use_rss, 2),
        **indexed,
        "FAISS index and questions: peak RSS GB": round(faiss_rss, 2),
        "verify s": verified["seconds"],
        "verify peak RSS GB": round(verify_rss, 2),
        **repaired,
        "repair peak RSS GB": round(repair_rss, 2),
    }
    print(f"{n:,}: {json.dumps(figures)}", flush=True)
    print(f"  disk per context by file: {json.dumps(disk(store, built['contexts']))}", flush=True)
    if not args.keep:
        shutil.rmtree(store, ignore_errors=True)
        corpus.unlink()
    return figures


def growth(results: dict[int, dict]) -> None:
    """The growth table: each figure at each size and its exponent between the two largest."""
    sizes = sorted(results)
    names = list(dict.fromkeys(k for n in sizes for k in results[n]))
    print("| figure | " + " | ".join(f"{results[n]['contexts']:,} contexts" for n in sizes) + " | growth exponent |")
    print("|---" * (len(sizes) + 2) + "|")
    for name in names:
        row = [results[n].get(name) for n in sizes]
        exponent = "-"
        a, b = sizes[-2:] if len(sizes) > 1 else (None, None)
        if a and all(isinstance(results[m].get(name), (int, float)) and results[m].get(name) > 0 for m in (a, b)):
            ratio = results[b]["contexts"] / results[a]["contexts"]
            exponent = f"{math.log(results[b][name] / results[a][name]) / math.log(ratio):.2f}"
        shown = ["-" if v is None else f"{v:,}" if isinstance(v, (int, float)) else str(v) for v in row]
        print(f"| {name} | " + " | ".join(shown) + f" | {exponent} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="1000000,10000000", help="sizes, comma-separated")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--factory", default="auto", help="FAISS factory of `bertknn index` [default: auto]")
    parser.add_argument("--work", type=Path, default=None, help="where stores are built [default: a temporary folder]")
    parser.add_argument("--keep", action="store_true", help="keep each size's store and corpus")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    parser.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        print(json.dumps(STAGES[args.stage](**json.loads(args.options))))
        return
    if args.smoke:
        args.contexts, args.questions, args.threads, args.factory = "10000,18000", 10, 1, "Flat"
    from evidence import scratch

    work = args.work or scratch()
    work.mkdir(parents=True, exist_ok=True)
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores; {args.threads} thread(s); the keys and evidence vectors stood in")
    results = {n: measure(n, work, args) for n in sorted(int(float(x)) for x in args.contexts.split(","))}
    growth(results)


if __name__ == "__main__":
    main()
