"""Memory and object-store use per node of a Ray build, on a simulated cluster of several nodes.

    python bench/ray_nodes.py [--docs 800] [--shard-docs 50,200] [--nodes 2] [--node-cpus 2]
                              [--model bertknn/minilm-l6-mlm] [--smoke]

A simulated cluster (`ray.cluster_utils.Cluster`: a head without CPUs and --nodes worker nodes of --node-cpus CPUs,
each its own raylet and object store, on this machine) builds the first --docs documents of the evidence corpus with
`distributed.build` (a key-stage worker per node), once per --shard-docs, each on a fresh cluster. A thread samples
every 0.25 s, per worker node, the proportional set size (PSS: shared pages split between the processes sharing
them) of its raylet and every process under it (the key-stage actor with its model, the CPU-stage tasks' workers), and
its object store's bytes in use (the raylet's node stats); and the driver's PSS (this process: it reads the corpus
and writes the shards' inputs). Printed per shard size: the peaks per node, the bytes created in the object stores
over the build per shard. The nodes share this machine's cores, so times are not speeds. Last line: the peak PSS and
object-store bytes of a node at the largest shard size. --smoke: 6 documents in shards of 3, nodes of 1 CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from evidence import SMOKE, first_documents

MIB = 2**20


def _pss(pid: int) -> int:
    """The PSS in bytes of process `pid` and every process under it (0 for one that ended meanwhile)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            continue
    return total


class Sampler(threading.Thread):
    """Peaks, every `every_s` until `stop`, of each worker node's PSS and object-store bytes, and the driver's PSS."""

    def __init__(self, nodes: list, every_s: float = 0.25) -> None:
        import psutil

        super().__init__(daemon=True)
        self.nodes, self.every_s, self.stop = nodes, every_s, threading.Event()
        self.pss, self.store = [0] * len(nodes), [0] * len(nodes)
        self.driver, self.this = 0, psutil.Process()

    def run(self) -> None:
        while not self.stop.is_set():
            for i, node in enumerate(self.nodes):
                self.pss[i] = max(self.pss[i], _pss(node.all_processes["raylet"][0].process.pid))
                self.store[i] = max(self.store[i], _store_stats(node).object_store_bytes_used)
            self.driver = max(self.driver, self.this.memory_full_info().pss)  # without the nodes it started
            time.sleep(self.every_s)


def _store_stats(node):
    """The object-store figures of a node's raylet (ray's own node stats call, as `ray memory` makes it)."""
    from ray._private.internal_api import node_stats

    return node_stats(node.node_ip_address, node.node_manager_port, include_memory_info=False).store_stats


def _one_build(corpus: Path, out: Path, model: str, shard_docs: int, nodes: int, node_cpus: int) -> dict:
    """Build on a fresh simulated cluster, sampled; the peaks and the object stores' bytes created per shard."""
    import ray
    from ray.cluster_utils import Cluster

    from bertknn.ingest import distributed

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=node_cpus) for _ in range(nodes)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    sampler = Sampler(workers)
    try:
        sampler.start()
        began = time.perf_counter()
        top = distributed.build(corpus, out, model, workers=nodes, shard_docs=shard_docs)
        took = time.perf_counter() - began
        sampler.stop.set()
        sampler.join()
        created = sum(_store_stats(node).cumulative_created_bytes for node in workers)
        objects = sum(_store_stats(node).cumulative_created_objects for node in workers)
    finally:
        sampler.stop.set()
        ray.shutdown()
        cluster.shutdown()
    shards = len(top["shards"])
    return {
        "shard_docs": shard_docs,
        "shards": shards,
        "contexts": top["entries"],
        "seconds": round(took, 1),
        "node_pss_mib": [round(b / MIB) for b in sampler.pss],
        "node_store_peak_bytes": sampler.store,
        "driver_pss_mib": round(sampler.driver / MIB),
        "store_created_bytes_per_shard": round(created / shards),
        "store_objects_per_shard": round(objects / shards, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=800)
    parser.add_argument("--shard-docs", default="50,200", help="shard sizes to build with, comma-separated")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--node-cpus", type=int, default=2)
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    sizes = [int(n) for n in args.shard_docs.split(",")]
    if args.smoke:
        args.docs, sizes, args.node_cpus = 6, [3], 1
    work = Path(tempfile.mkdtemp(prefix="ray_nodes_"))
    corpus = first_documents(args.docs, work / "corpus.jsonl")
    print(f"# {args.docs} documents, {args.nodes} worker nodes of {args.node_cpus} CPUs, {os.cpu_count()} cores")
    print(
        "| documents per shard | shards | contexts | peak PSS per node (MiB) | peak object store per node (bytes) | "
        "object-store bytes created per shard | driver PSS (MiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for size in sizes:
        row = _one_build(corpus, work / f"sharded-{size}", args.model, size, args.nodes, args.node_cpus)
        rows.append(row)
        print(
            f"| {size} | {row['shards']} | {row['contexts']:,} | {', '.join(map(str, row['node_pss_mib']))} | "
            f"{', '.join(f'{b:,}' for b in row['node_store_peak_bytes'])} | "
            f"{row['store_created_bytes_per_shard']:,} ({row['store_objects_per_shard']} objects) | "
            f"{row['driver_pss_mib']} |"
        )
    print(json.dumps(rows))
    shutil.rmtree(work)
    last = rows[-1]
    print(
        f"per node at {last['shard_docs']} documents per shard: peak PSS {max(last['node_pss_mib'])} MiB, "
        f"peak object store {max(last['node_store_peak_bytes']):,} bytes"
    )


if __name__ == "__main__":
    main()
