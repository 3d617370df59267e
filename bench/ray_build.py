"""A build on a local Ray cluster against the single-process build, same corpus, same model, one run.

    python bench/ray_build.py [--docs 400] [--workers 1] [--shard-docs 100] [--model bertknn/minilm-l6-mlm] [--smoke]

Corpus: the first --docs documents of the evidence corpus ($BERTKNN_DATA/wiki/lama_evidence_docs.jsonl). First the
single-process build (`BertKNN.build`, this process, every core), then `distributed.build` on a local Ray cluster of
its own with every core (`ray.init(address="local")`), --workers key-stage actors and shards of --shard-docs
documents; each timed from start to a loadable datastore, model loads included (the single build loads the model
once, the Ray build once in its driver and once per actor). Both stores are checked for the same entries. Last line:
the Ray build's contexts/s over the single build's. --smoke: 6 documents in shards of 3, the single build on one
thread, a local Ray cluster of 2 CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from evidence import SMOKE, first_documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shard-docs", type=int, default=100)
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    if args.smoke:
        args.docs, args.shard_docs, args.workers, threads = 6, 3, 1, 1
    import ray

    from bertknn.ingest import distributed
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN
    from bertknn.store.shards import ShardedDatastore

    work = Path(tempfile.mkdtemp(prefix="ray_build_"))
    corpus = first_documents(args.docs, work / "corpus.jsonl")
    Runtime(threads=threads).apply()
    began = time.perf_counter()
    single = BertKNN.build(corpus, work / "single", args.model, runtime=Runtime(threads=threads))
    single_s = time.perf_counter() - began
    ray.init(address="local", num_cpus=2 if args.smoke else None, log_to_driver=False, include_dashboard=False)
    began = time.perf_counter()
    top = distributed.build(corpus, work / "sharded", args.model, workers=args.workers, shard_docs=args.shard_docs)
    ray_s = time.perf_counter() - began
    sharded = ShardedDatastore(work / "sharded")
    every = np.arange(single.store.size)
    same = sharded.size == single.store.size and np.array_equal(sharded.values[every], single.store.values[:])
    n = single.store.size
    print(f"# {args.docs} documents, {n:,} contexts, {os.cpu_count()} cores, model {args.model}")
    print(f"single process: {single_s:.1f} s, {n / single_s:,.1f} contexts/s")
    print(
        f"Ray, {args.workers} key-stage worker(s), {len(top['shards'])} shards: {ray_s:.1f} s, {n / ray_s:,.1f} "
        f"contexts/s; same entries: {same}"
    )
    print(json.dumps({"single_s": single_s, "ray_s": ray_s, "contexts": n, "shards": len(top["shards"])}))
    shutil.rmtree(work)
    print(f"ray / single contexts/s: {single_s / ray_s:.2f}")


if __name__ == "__main__":
    main()
