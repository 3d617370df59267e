"""Question latency of a sharded datastore served on Ray Serve against the same store served by one process, one run.

    python bench/ray_serve.py [--docs 400] [--shard-docs 100] [--questions 200] [--replicas 1] [--smoke]

Corpus: the first --docs documents of the evidence corpus ($BERTKNN_DATA/wiki/lama_evidence_docs.jsonl), built on
a local Ray cluster of its own (every core) into shards of --shard-docs documents, with a FAISS index per shard.
Questions: "<title> is located in [MASK] ." for --questions titles drawn with a fixed seed, asked with the subject
(the IR path's title shortcut: one document, one shard), without it (TF-IDF's top 3 documents, up to 3 shards) and
through FAISS (every shard). Each is sent over HTTP (POST /predict), one at a time, to `bertknn serve`'s app served by
uvicorn in this process (`--engine local`) and to the Ray Serve application (`--engine ray`); both answer alike
(checked). Printed: p50 / p90 milliseconds per path and engine; last line: the Ray Serve p50 over the local p50 for
the IR path with subject. --smoke: 6 documents in shards of 3, 3 questions, a local Ray cluster of 2 CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from evidence import SMOKE, first_documents


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ask(port: int, question: str, subject: str | None, retrieval: str) -> dict:
    body = {"text": question, "subject": subject, "options": {"retrieval": retrieval}, "evidence": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def timed(port: int, questions: list[tuple[str, str | None]], retrieval: str) -> tuple[list[float], list]:
    """Milliseconds per question (after 5 unmeasured ones) and the kNN's top answers."""
    for question, subject in questions[:5]:
        ask(port, question, subject, retrieval)
    times, answers = [], []
    for question, subject in questions:
        began = time.perf_counter()
        answer = ask(port, question, subject, retrieval)
        times.append((time.perf_counter() - began) * 1000)
        answers.append([t["token"] for t in answer["knn"][:3]])
    return times, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--shard-docs", type=int, default=100)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.docs, args.shard_docs, args.questions = 6, 3, 3
    import ray
    import uvicorn
    from ray import serve

    from bertknn.ingest import distributed
    from bertknn.ingest.ingester import Writer
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN
    from bertknn.serving import ray_serve
    from bertknn.serving.service import create_app
    from bertknn.store.shards import ShardedDatastore

    work = Path(tempfile.mkdtemp(prefix="ray_serve_"))
    corpus = first_documents(args.docs, work / "corpus.jsonl")
    ray.init(address="local", num_cpus=2 if args.smoke else None, log_to_driver=False, include_dashboard=False)
    distributed.build(corpus, work / "sharded", args.model, shard_docs=args.shard_docs)
    with Writer(ShardedDatastore(work / "sharded")) as writer:
        writer.index_keys("Flat")
    runtime = Runtime(threads=1)
    runtime.apply()
    knn = BertKNN.load(work / "sharded", runtime=runtime)
    titles = knn.store.documents.titles(list(range(knn.store.n_documents)))
    picked = np.random.default_rng(0).choice(len(titles), min(args.questions, len(titles)), replace=False)
    questions = [(f"{titles[i]} is located in [MASK] .", titles[i]) for i in picked]
    paths = {
        "IR, subject (1 shard)": (questions, "ir"),
        "IR, no subject (<= 3 shards)": ([(q, None) for q, _ in questions], "ir"),
        "FAISS (every shard)": ([(q, None) for q, _ in questions], "faiss"),
    }
    local_port, remote_port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(knn), port=local_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    ray_serve.run(str(work / "sharded"), "127.0.0.1", remote_port, runtime, replicas=args.replicas, blocking=False)
    n_shards = len(knn.store.shards)
    print(f"# {args.docs} documents, {knn.store.size:,} contexts, {n_shards} shards, {os.cpu_count()} cores, local Ray")
    print("| path | local p50 / p90 ms | Ray Serve p50 / p90 ms | same answers |")
    print("| --- | --- | --- | --- |")
    ratio = None
    for name, (asked, retrieval) in paths.items():
        local, local_answers = timed(local_port, asked, retrieval)
        remote, remote_answers = timed(remote_port, asked, retrieval)
        a, b = np.percentile(local, [50, 90]), np.percentile(remote, [50, 90])
        print(f"| {name} | {a[0]:.1f} / {a[1]:.1f} | {b[0]:.1f} / {b[1]:.1f} | {local_answers == remote_answers} |")
        ratio = ratio or b[0] / a[0]
    server.should_exit = True
    serve.shutdown()
    shutil.rmtree(work)
    print(f"Ray Serve / local p50, IR path with subject: {ratio:.2f}")


if __name__ == "__main__":
    main()
