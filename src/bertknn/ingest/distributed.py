"""A datastore built on a Ray cluster: shards of whole documents, each a normal bertknn datastore (`bertknn[ray]`).

The driver reads the corpus once, cuts it into shards of consecutive documents and writes each shard's documents as
a JSONL file beside the output (the output directory must be on storage every node sees). A Ray Data pipeline over
the shards then runs the CPU stage (`builder.register`: sentences and the shard's TF-IDF index, plain tasks) and the
key stage (`KeyStage`: an actor per worker that loads the model once and embeds its shards, on a GPU with
`num_gpus=1`, else with a share of the CPUs). Each shard is built by bertknn's own resumable builder, so a task that
Ray retries after its worker died goes on from what that worker committed: nothing is lost or duplicated. The top
manifest, `shards.json`, lists the shards in order with their document and entry offsets and is written last
(atomically); a rerun of the driver skips the shards that are complete and rebuilds only the others.
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from itertools import islice
from pathlib import Path

import numpy as np

from bertknn.ingest import builder
from bertknn.ingest.corpus import open_corpus
from bertknn.ingest.ingester import Writer
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.store import atomic
from bertknn.store.atomic import write_json
from bertknn.store.datastore import Datastore, DatastoreError, read_committed
from bertknn.store.shards import SHARDS_FILE, fixed_top, open_store, shard_name

SHARD_DOCS = 50_000  # documents per shard by default: ~100 shards for English Wikipedia's 5.07M articles
FORMAT = "bertknn-sharded"
CPU_STAGE_CPUS = 0.5  # Ray CPUs a CPU-stage task asks for
SHARED_CHECK = ".bertknn-shared-check"  # a file the driver writes in the output directory for every node to read


def plan(n_docs: int, shard_docs: int) -> list[tuple[int, int]]:
    """The (first, stop) documents of each shard."""
    if shard_docs < 1:
        raise ValueError(f"shard_docs must be >= 1, not {shard_docs}")
    return [(a, min(a + shard_docs, n_docs)) for a in range(0, n_docs, shard_docs)]


def _complete(path: Path, documents: int) -> bool:
    """True when the shard at `path` holds all its documents, embedded."""
    try:
        manifest = read_committed(path)
    except (OSError, DatastoreError):
        return False
    return manifest.get("status") == "complete" and manifest.get("documents") == documents


def _write_inputs(corpus, out: Path, shards: list[tuple[int, int]], todo: set[int]) -> None:
    """Each shard's documents as JSONL (`inputs/shard-i.jsonl`, written whole: `atomic.write_file`), for the shards
    in `todo` whose input is not there yet; the corpus is read once, streaming."""
    inputs = out / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    missing = {i for i in todo if not (inputs / f"{shard_name(i)}.jsonl").is_file()}
    docs = iter(corpus)
    for i, (first, stop) in enumerate(shards):
        if not missing:
            return
        chunk = islice(docs, stop - first)
        if i not in missing:
            deque(chunk, maxlen=0)  # skipped: its input is there
            continue
        atomic.write_file(inputs / f"{shard_name(i)}.jsonl", partial(_write_jsonl, chunk))
        missing.discard(i)


def _write_jsonl(docs: Iterable, handle) -> None:
    for doc in docs:
        handle.write((json.dumps({"id": doc.id, "title": doc.title, "text": list(doc.passages)}) + "\n").encode())


def _register(batch: dict, manifest: dict) -> dict:
    """The CPU stage (a Ray task): register each shard's documents and build its TF-IDF index."""
    for source, path in zip(batch["input"], batch["out"]):
        with Writer(builder.register(str(source), str(path), manifest)) as writer:
            writer.index_documents()
    return batch


class KeyStage:
    """The key stage (a Ray actor: the model is loaded once per worker): embed each shard's documents."""

    def __init__(self, model: str, layer: int, runtime: Runtime) -> None:
        runtime = runtime.here()
        runtime.apply()
        self.encoder = Encoder.load(model, layer, runtime)

    def __call__(self, batch: dict) -> dict:
        entries = []
        for path in batch["out"]:
            store = Datastore(str(path))
            writer = Writer(store, self.encoder)
            with writer.store_writer().commit() as held:
                written = held.store
                builder.embed(written, written.documents.pending(), self.encoder)
                builder.finish(written)
                entries.append(written.size)
            writer.close()
            store.close()
        return {**batch, "entries": np.array(entries, np.int64), "pid": np.full(len(entries), os.getpid())}


def start_ray(address: str | None) -> None:
    """Ray started in this process unless it is: on the cluster at `address` ("auto": the one `ray start` started
    on this machine), or, for None, on a local cluster of its own. Ray's own default for None would join the cluster
    last recorded in /tmp/ray/ray_current_cluster, a stale one included, which is not what "no address" says."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "local", log_to_driver=False)


def on_gpu(runtime: Runtime) -> bool:
    """True when `runtime`'s model runs on the cluster's GPUs (an actor then asks Ray for one): a CUDA device, or
    "auto" on a cluster that has GPUs; a CUDA device on a cluster without any is refused (its actors would wait for
    one for ever). Ray is started by the caller."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if runtime.device.startswith("cuda") and not gpus:
        raise ValueError(f"--device {runtime.device}: the Ray cluster has no GPU; use --device cpu or auto")
    return runtime.device.startswith("cuda") or (runtime.device == "auto" and gpus > 0)


def _sees(path: str, token: str) -> tuple[str, bool]:
    """On a node: its address, and whether it reads `token` in the file at `path` the driver just wrote."""
    import ray

    try:
        seen = Path(path).read_text(encoding="utf-8") == token
    except OSError:
        seen = False
    return ray.util.get_node_ip_address(), seen


def check_shared(out: Path) -> None:
    """Refuse, before anything is built, an output directory that a node of the cluster cannot read: the driver
    writes a fresh token into `out` and a task pinned to each node with CPUs or GPUs reads it back (a build would
    otherwise fail half-way, when the first task on that node opens its shard's input)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n["Alive"] and (n["Resources"].get("CPU") or n["Resources"].get("GPU"))]
    token, check = uuid.uuid4().hex, out / SHARED_CHECK
    atomic.write_text(check, token)
    try:
        probe = ray.remote(num_cpus=0, max_retries=0)(_sees)
        pinned = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in nodes]
        seen = ray.get([probe.options(scheduling_strategy=where).remote(str(check), token) for where in pinned])
    finally:
        check.unlink(missing_ok=True)
    blind = sorted({address for address, ok in seen if not ok})
    if blind:
        raise ValueError(
            f"the Ray workers on {', '.join(blind)} cannot read the output directory {out}: it must be on storage "
            "every node sees (NFS or the like) at the same path"
        )


def build(
    corpus: str | Path,
    out: str | Path,
    model: str,
    layer: int | None = None,
    workers: int = 1,
    shard_docs: int = SHARD_DOCS,
    address: str | None = None,
    runtime: Runtime | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Build (or finish building) a sharded datastore at `out` on Ray; return its manifest (shards.json's fields
    with the counts its shards hold: the sharded store's `manifest`).

    `workers` key-stage actors, each with one GPU when `runtime` runs on CUDA, else `runtime.threads` CPUs (0: an
    equal share of the cluster's). `address`: a running cluster's ("auto" finds one); None starts a local one
    (or uses the Ray this process already started).
    """
    if importlib.util.find_spec("ray") is None:
        raise ValueError("building on Ray needs Ray: pip install 'bertknn[ray]'")

    # absolute: a worker's working directory is its node's, not the driver's
    out, report = Path(out).absolute(), progress or (lambda phase, done, total: None)
    runtime = runtime or Runtime()
    source = open_corpus(corpus)
    n_docs = builder.check_corpus(source, report)
    # for the manifest (model, weights hash, layer, width), on this machine's CPU: the keys are made on the workers'
    encoder = Encoder.load(model, layer, Runtime())
    manifest = builder.manifest(encoder, source.info(n_docs), 1, False)
    manifest |= {"key_dtype": runtime.dtype, "shard_docs": shard_docs}
    top = out / SHARDS_FILE
    if top.is_file():
        known = json.loads(top.read_text(encoding="utf-8"))
        if known.get("corpus", {}).get("sha256") != manifest["corpus"]["sha256"]:
            raise DatastoreError(f"{out} holds a sharded datastore of another corpus; choose another --out directory")
        return _opened(out)
    shards = plan(n_docs, shard_docs)
    dirs = [out / "shards" / shard_name(i) for i in range(len(shards))]
    _check_existing(out, manifest, shard_docs)
    todo = [i for i, (a, b) in enumerate(shards) if not _complete(dirs[i], b - a)]
    report("sharding", len(shards) - len(todo), len(shards))
    if todo:
        _start(out, address, runtime)
    _write_inputs(source, out, shards, set(todo))
    if todo:
        before = len(shards) - len(todo)
        stage = {"model": model, "layer": encoder.layer, "runtime": runtime}
        _run_stages(
            out,
            [(i, dirs[i]) for i in todo],
            manifest,
            stage,
            workers,
            lambda d: report("shards", before + d, len(shards)),
        )
    write_json(top, _top_manifest(manifest, dirs))
    return _opened(out)


def _start(out: Path, address: str | None, runtime: Runtime) -> None:
    """Ray started (unless it is), then what the cluster lacks refused before anything is written: a device, or an
    output directory that a node cannot read."""
    start_ray(address)
    on_gpu(runtime)
    out.mkdir(parents=True, exist_ok=True)
    check_shared(out)


def _run_stages(
    out: Path, todo: list[tuple[int, Path]], manifest: dict, stage: dict, workers: int, done: Callable[[int], None]
) -> None:
    """The Ray Data pipeline over the shards in `todo` ((number, directory)): the CPU stage (`_register`) in tasks,
    then the key stage (`KeyStage`, built from `stage`) in `workers` actors; `done(n)` after each shard."""
    import ray

    runtime = stage["runtime"]
    gpu = on_gpu(runtime)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    nodes = sum(1 for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0)
    # the CPU stage's tasks get half a CPU each, and the actors leave that much free on every node with CPUs: on a
    # cluster of several nodes, actors holding all but one half CPU of the cluster would starve the tasks for ever
    share = float(runtime.threads or max(0.5, (cpus - CPU_STAGE_CPUS * max(nodes, 1)) / max(workers, 1)))
    items = [{"shard": i, "input": str(out / "inputs" / f"{shard_name(i)}.jsonl"), "out": str(d)} for i, d in todo]
    pipeline = (
        ray.data.from_items(items, override_num_blocks=len(items))
        .map_batches(_register, batch_size=1, fn_kwargs={"manifest": manifest}, num_cpus=CPU_STAGE_CPUS)
        .map_batches(
            KeyStage,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=workers),
            fn_constructor_kwargs=stage,
            num_gpus=1 if gpu else 0,
            num_cpus=0 if gpu else share,
        )
    )
    for n, _ in enumerate(pipeline.iter_rows(), 1):
        done(n)


def _check_existing(out: Path, manifest: dict, shard_docs: int) -> None:
    """Refuse to go on with shards begun for another corpus, model or shard size (a rerun must be the same build)."""
    for path in sorted((out / "shards").glob("shard-*")):
        try:  # the fields compared are fixed when a shard is created: manifest.json as it was written
            known = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not begun: it is built anew
        same = all(known.get(k) == manifest[k] for k in ("model_hash", "layer", "key_dtype"))
        if not same or (known.get("corpus") or {}).get("sha256") != manifest["corpus"]["sha256"]:
            raise DatastoreError(
                f"{out} holds shards of another corpus or model ({path.name}); choose another --out directory"
            )
        if known.get("shard_docs", shard_docs) != shard_docs:
            raise DatastoreError(f"{out} holds shards of {known['shard_docs']} documents: rerun with that --shard-docs")


def _top_manifest(manifest: dict, dirs: list[Path]) -> dict:
    """shards.json: the shards in order, each complete, and the fields fixed when they were made (`fixed_top`)."""
    for path in dirs:
        if read_committed(path).get("status") != "complete":
            raise DatastoreError(f"shard {path} is not complete; rerun the build")
    keep = ("model", "model_hash", "layer", "dim", "pack", "int8", "key_dtype", "splitter", "corpus", "shard_docs")
    fields = {"format": FORMAT, **{k: manifest[k] for k in keep}}
    return fixed_top(fields, [str(path.relative_to(path.parents[1])) for path in dirs])


def _opened(out: Path) -> dict:
    """The manifest of the sharded datastore at `out`, with the counts its shards hold."""
    with open_store(out) as store:
        return dict(store.manifest)
