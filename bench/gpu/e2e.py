"""One datastore build end to end on one device, stage by stage, then questions over the built store: what
bench/gpu_run.sh runs on a lent GPU machine (bench/gpu_build.py measures the model's stage alone).

    python bench/gpu/e2e.py [--docs 10000] [--corpus F] [--device cuda] [--dtype bf16] [--backend auto]
                            [--store DIR] [--single 100] [--json FILE] [--smoke]

Build: `BertKNN.build` of the first --docs documents of the evidence corpus ($BERTKNN_DATA/wiki) with the offline
default model, as `bertknn build CORPUS --out DIR --device D --dtype T` runs it (backend auto, workers auto), after
one warm-up pass of the model (its time reported apart; on the GPU machine the model's base weights are those
bench/gpu/minilm.py carried: quantised, the same speed, answers nearly the package's). Each
stage is timed by wrapping the builder's functions in this process, for this run only (the library is unchanged):
the check (every document read once), sentence splitting, the rest of registering (reading, records) and its SQLite
commits, then per chunk the sentences read back from the store, tokenising (on a GPU in a thread beside the model:
its busy time, and the time the model's loop waited for it), the keys (the model), the values and the commit, then
the TF-IDF index. On a GPU its utilisation is sampled by nvidia-smi every 200 ms and averaged per phase. Printed:
contexts/s of the whole build and of its embedding phase, each stage's seconds, and what the model waits on (the
largest of the embedding phase's stages besides the keys).

Questions: the several-facts set (bench/fresh_facts/several_*.jsonl: 60 documents, 280 questions) added to the built
store (`add_documents`), then asked without and with their subjects, with bertknn's defaults and with the sentence
weights (sentence_temperature 0.015): questions/s of one `predict_batch` call over all of them (the sentence-vector
cache emptied first), the p50 and p90 of the first --single asked one at a time (`predict`; with the sentence weights
both with the cache kept, emptied once before them, and emptied before each question), and BERT-kNN's P@1.
The last line: the figures as JSON (also written to --json).
--smoke: 12 documents, 4 several-facts documents and their questions, the first 4 asked one at a time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime
from itertools import islice
from pathlib import Path

DATA = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[2] / "../shared/data"))
FRESH = Path(__file__).resolve().parents[1] / "fresh_facts"
SENTENCE_TEMPERATURE = 0.015
SMOKE_DOCS, SMOKE_FRESH, SMOKE_SINGLE = 12, 4, 4


class Sampler:
    """GPU utilisation (%) and memory used (MiB), each sample with the time nvidia-smi read it (on this process's
    perf_counter clock; its output may come in bursts through the pipe): one `nvidia-smi -lms 200` for the whole run
    (none on CPU)."""

    def __init__(self, index: int | None) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self.process = None
        if index is None or shutil.which("nvidia-smi") is None:
            return
        self.offset = time.time() - time.perf_counter()
        query = ["nvidia-smi", f"--id={index}", "--query-gpu=timestamp,utilization.gpu,memory.used"]
        self.process = subprocess.Popen(
            [*query, "--format=csv,noheader,nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
                continue
            try:  # local time, as nvidia-smi prints it: "2026/12/04 18:25:35.123"
                at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp() - self.offset
            except ValueError:
                at = time.perf_counter()
            self.samples.append((at, int(parts[1]), int(parts[2])))

    def mean(self, start: float, stop: float) -> float | None:
        inside = [u for t, u, _ in self.samples if start <= t <= stop]
        return round(statistics.mean(inside), 1) if inside else None

    def peak_memory(self) -> int | None:
        return max((m for _, _, m in self.samples), default=None)

    def close(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


class Stages:
    """Wall seconds per stage, summed over calls (from any thread), of the functions `timed` wraps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, stage: str, began: float) -> None:
        now = time.perf_counter()
        with self.lock:
            self.seconds[stage] += now - began
            self.first.setdefault(stage, began)
            self.last[stage] = now

    def wrap(self, fn, stage: str):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(stage, began)

        return timed

    def waited(self, fn, stage: str):
        """`fn` returns a function (`builder._prepare`): the calls of that one are timed as `stage`."""

        @functools.wraps(fn)
        def prepared(*args, **kwargs):
            ready = fn(*args, **kwargs)
            return self.wrap(ready, stage)

        return prepared


CHECK, REGISTER, SPLIT, COMMIT_REG = "check", "registering", "splitting", "registration commits"
EMBED, READ, TOKENS, WAIT, KEYS, VALUES, COMMIT = (
    "embedding", "sentences read", "tokenising", "tokens waited for", "keys", "values", "commit",
)  # fmt: skip
TFIDF = "tf-idf"


@contextmanager
def timed_stages(stages: Stages):
    """The builder's stage functions wrapped by `stages` while inside (restored after)."""
    from bertknn.ingest import builder
    from bertknn.ingest import corpus as corpus_module
    from bertknn.ingest.ingester import Writer
    from bertknn.store.documents import Documents
    from bertknn.store.writer import DatastoreWriter

    plan = [
        (builder, "check_corpus", CHECK, stages.wrap),
        (builder, "_register_all", REGISTER, stages.wrap),
        (corpus_module, "split_sentences", SPLIT, stages.wrap),
        (builder, "_register", COMMIT_REG, stages.wrap),
        (builder, "embed", EMBED, stages.wrap),
        (Documents, "sentences", READ, stages.wrap),
        (builder, "contexts", TOKENS, stages.wrap),
        (builder, "_prepare", WAIT, stages.waited),
        (builder, "keys", KEYS, stages.wrap),
        (builder, "values", VALUES, stages.wrap),
        (DatastoreWriter, "append", COMMIT, stages.wrap),
        (Writer, "index_documents", TFIDF, stages.wrap),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _, _ in plan]
    try:
        for owner, name, stage, how in plan:
            setattr(owner, name, how(getattr(owner, name), stage))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def first_documents(source: Path, n: int, out: Path) -> Path:
    with source.open(encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
        dst.writelines(islice(src, n) if n else src)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def build(args, work: Path, sampler: Sampler, figures: dict):
    import torch

    from bertknn.ingest.builder import contexts
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN

    runtime = Runtime.of(args.backend, 0, args.device, args.dtype)
    runtime.apply()
    began = time.perf_counter()
    encoder = Encoder.load(runtime=runtime)
    figures["model_load_s"] = round(time.perf_counter() - began, 2)
    began = time.perf_counter()  # the device's first passes (kernels chosen, memory pools) left out of the build
    encoder.embed(contexts(encoder, ["Dante was born in Florence in 1265.", "Paris is the capital of France."] * 8))
    figures["model_warmup_s"] = round(time.perf_counter() - began, 2)
    corpus = first_documents(args.corpus, args.docs, work / "corpus.jsonl")
    store = args.store or work / "store"
    shutil.rmtree(store, ignore_errors=True)
    stages = Stages()
    with timed_stages(stages):
        began = time.perf_counter()
        knn = BertKNN.build(corpus, store, encoder)
        if runtime.torch_device.type == "cuda":
            torch.cuda.synchronize()
        ended = time.perf_counter()
    n, s = knn.store.size, dict(stages.seconds)
    figures.update(
        runtime=runtime.backend,
        documents=knn.store.n_documents,
        contexts=n,
        build_s=round(ended - began, 2),
        contexts_per_s=round(n / (ended - began), 1),
        embedding_contexts_per_s=round(n / s[EMBED], 1) if s.get(EMBED) else None,
        keys_contexts_per_s=round(n / s[KEYS], 1) if s.get(KEYS) else None,
    )
    inside_embed = s.get(READ, 0) + s.get(WAIT, 0) + s.get(KEYS, 0) + s.get(VALUES, 0) + s.get(COMMIT, 0)
    table = {
        "check (every document read and parsed once)": s.get(CHECK, 0),
        "sentence splitting": s.get(SPLIT, 0),
        "registering, the rest (reading, records)": s.get(REGISTER, 0) - s.get(SPLIT, 0) - s.get(COMMIT_REG, 0),
        "registering, SQLite commits": s.get(COMMIT_REG, 0),
        "embedding: sentences read from the store": s.get(READ, 0),
        "embedding: tokenising, busy (a thread beside the model on a GPU)": s.get(TOKENS, 0),
        "embedding: tokens waited for": s.get(WAIT, 0),
        "embedding: keys (the model)": s.get(KEYS, 0),
        "embedding: values": s.get(VALUES, 0),
        "embedding: commit": s.get(COMMIT, 0),
        "embedding: the rest": s.get(EMBED, 0) - inside_embed,
        "TF-IDF index": s.get(TFIDF, 0),
        "the rest (store creation, finish, loading the reader)": (ended - began)
        - s.get(CHECK, 0)
        - s.get(REGISTER, 0)
        - s.get(EMBED, 0)
        - s.get(TFIDF, 0),
    }
    figures["stages_s"] = {name: round(v, 3) for name, v in table.items()}
    waits = {name: v for name, v in table.items() if name.startswith("embedding:") and "keys" not in name}
    waits.pop("embedding: tokenising, busy (a thread beside the model on a GPU)")
    if s.get(EMBED):
        top = max(waits, key=waits.get)
        figures["model_waits_on"] = {"stage": top, "share_of_embedding": round(waits[top] / s[EMBED], 3)}
        figures["keys_share_of_embedding"] = round(s.get(KEYS, 0) / s[EMBED], 3)
    windows = {
        "build": (began, ended),
        "embedding": (stages.first.get(EMBED, 0), stages.last.get(EMBED, 0)),
        "tf-idf": (stages.first.get(TFIDF, 0), stages.last.get(TFIDF, 0)),
        "before embedding": (began, stages.first.get(EMBED, began)),
    }
    figures["gpu_utilisation"] = {name: sampler.mean(*w) for name, w in windows.items()}
    figures["gpu_memory_used_mib_max"] = sampler.peak_memory()
    if runtime.torch_device.type == "cuda":
        figures["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(
        f"build: {figures['documents']:,} documents, {n:,} contexts in {ended - began:.1f} s: "
        f"{figures['contexts_per_s']:,.0f} contexts/s; the embedding phase {figures['embedding_contexts_per_s']} "
        f"contexts/s, the keys alone {figures['keys_contexts_per_s']} (model loaded in {figures['model_load_s']} s)"
    )
    print("| stage | s | share of the build |\n|---|---|---|")
    for name, v in table.items():
        print(f"| {name} | {v:.3f} | {v / (ended - began):.1%} |")
    print(f"GPU utilisation %: {figures['gpu_utilisation']}")
    if "model_waits_on" in figures:
        print(
            f"the model waits on: {figures['model_waits_on']} (keys {figures['keys_share_of_embedding']:.1%} of the "
            "embedding phase)"
        )
    return knn


def questions(args, knn, sampler: Sampler, figures: dict) -> None:
    docs, asked = _jsonl(FRESH / "several_documents.jsonl"), _jsonl(FRESH / "several_questions.jsonl")
    if args.smoke:
        keep = {d["id"] for d in docs[:SMOKE_FRESH]}
        docs, asked = docs[:SMOKE_FRESH], [q for q in asked if q["document"] in keep]
    began = time.perf_counter()
    knn.add_documents(docs)
    out = {"add_documents": len(docs), "add_s": round(time.perf_counter() - began, 2), "questions": len(asked)}
    figures["questions"] = out
    texts, answers = [q["question"] for q in asked], [q["answer"] for q in asked]
    match = knn.sentence_match
    weights = {"sentence_temperature": SENTENCE_TEMPERATURE}
    runs = {  # name: (options, the cache emptied before each single question)
        "default": ({}, False),
        f"sentence weights {SENTENCE_TEMPERATURE}, cache kept": (weights, False),
        f"sentence weights {SENTENCE_TEMPERATURE}, cache emptied before each": (weights, True),
    }
    print(
        f"\nquestions: {len(asked)} several-facts questions over the store with their {len(docs)} documents added "
        f"({out['add_s']} s)"
    )
    print("| subject | run | questions/s (batched) | p50 ms | p90 ms | BERT-kNN P@1 | GPU utilisation %, batched |")
    print("|---|---|---|---|---|---|---|")
    for mode in ("no subject", "subject"):
        subjects = [q["subject"] if mode == "subject" else None for q in asked]
        for options, _ in runs.values():  # warm up (the sentence encoder is loaded on first use)
            knn.predict_batch(texts[:8], subjects[:8], top_k=5, evidence=3, **options)
        for name, (options, cold) in runs.items():
            cell = {}
            if not cold:  # one batched pass: the same for both cache settings, so measured once per option set
                match.clear()
                start = time.perf_counter()
                found = knn.predict_batch(texts, subjects, top_k=5, evidence=3, **options)
                stop = time.perf_counter()
                hits = [bool(p.bert_knn) and p.bert_knn[0].token.lower() == a for p, a in zip(found, answers)]
                cell.update(
                    per_s=round(len(texts) / (stop - start), 1),
                    p_at_1=round(sum(hits) / len(hits), 3),
                    gpu_utilisation=sampler.mean(start, stop),
                )
            match.clear()
            single = []
            for text, subject in list(zip(texts, subjects))[: args.single]:
                if cold:
                    match.clear()
                start = time.perf_counter()
                knn.predict(text, subject, top_k=5, evidence=3, **options)
                single.append(time.perf_counter() - start)
            cell["p50_ms"] = round(1000 * statistics.median(single), 2)
            cell["p90_ms"] = round(1000 * (statistics.quantiles(single, n=10)[-1] if len(single) > 1 else single[0]), 2)
            out.setdefault(mode, {})[name] = cell
            save(args.json, figures)  # what a run stopped by its time limit measured is kept
            print(
                f"| {mode} | {name} | {cell.get('per_s', '')} | {cell['p50_ms']} | {cell['p90_ms']} | "
                f"{cell.get('p_at_1', '')} | {cell.get('gpu_utilisation', '')} |",
                flush=True,
            )


def save(path: Path | None, figures: dict) -> None:
    if path is not None:
        path.write_text(json.dumps(figures) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DATA / "wiki" / "lama_evidence_docs.jsonl")
    parser.add_argument("--docs", type=int, default=10000, help="the corpus's first N documents (0: all)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--backend", default="auto", help="as `bertknn build --backend` takes it")
    parser.add_argument("--store", type=Path, default=None, help="where to build (deleted first) [a scratch folder]")
    parser.add_argument("--single", type=int, default=100, help="questions asked one at a time per run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="12 documents, 4 several-facts ones, 4 alone")
    args = parser.parse_args()
    if args.smoke:
        args.docs, args.single = SMOKE_DOCS, SMOKE_SINGLE
    import torch
    import transformers

    from bertknn.model.runtime import Runtime

    device = Runtime.of(args.backend, 0, args.device, args.dtype).torch_device
    on_gpu = device.type == "cuda"
    figures = {
        "device": torch.cuda.get_device_name(device) if on_gpu else f"CPU, {os.cpu_count()} cores",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    sampler = Sampler((device.index or 0) if on_gpu else None)
    work = Path(tempfile.mkdtemp(prefix="bertknn_e2e_"))
    try:
        knn = build(args, work, sampler, figures)
        save(args.json, figures)
        questions(args, knn, sampler, figures)
    finally:
        sampler.close()
        shutil.rmtree(work, ignore_errors=True)
        save(args.json, figures)
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
