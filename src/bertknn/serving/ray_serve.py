"""`bertknn serve DIR --engine ray`: the service of a sharded datastore on Ray Serve (`bertknn[ray]`).

One deployment per shard (`ShardServer`, with `replicas` replicas) holds the shard's keys and FAISS index on the
machine Serve places it and searches them there; the ingress deployment (`Ingress`) is bertknn's own FastAPI app
(`service.create_app`) with the model. An IR-path question needs only the keys of its retrieved documents, so it goes
to the shards that own them; a FAISS question fans out to every shard. The shards' nearest are merged by distance
(`Store.merge_nearest`), so the answers equal those of one process searching every shard.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bertknn.index.exact import candidates, nearest
from bertknn.index.faiss_index import FaissIndex
from bertknn.model.runtime import Runtime
from bertknn.query.search import ShardUnavailable
from bertknn.serving.schemas import REQUEST_TIMEOUT_S
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.protocol import Store
from bertknn.store.shards import open_store, shard_name

APP_NAME = "bertknn"
SHARD_CPUS = 0.5  # Ray CPUs a shard replica asks for (searching is light next to the ingress's model)
MIN_SHARD_CPUS = 0.01
NONE_FOUND = (np.zeros(0, np.int64), np.zeros(0, np.float32))


def shard_deployment(i: int) -> str:
    """The Serve deployment name of shard i (its folder's name)."""
    return shard_name(i)


class ShardServer:
    """A Serve deployment of one shard: exact kNN over its documents' keys (the IR path) and its FAISS index, searched
    on the machine that holds them. Each request first takes in what was committed to the shard (an add, a new
    index); a replica answers one request at a time (its datastore connection and index are not shared)."""

    def __init__(self, path: str) -> None:
        self.store, self.index, self.lock = Datastore(path), None, threading.Lock()
        self._seen: tuple | None = None  # (store version, FAISS files) when the index was opened

    def _fresh(self) -> None:
        self.store.reopen_if_changed()
        seen = (self.store.version, FaissIndex.disk_state(self.store))
        if seen != self._seen:
            self.index, self._seen = FaissIndex.load(self.store), seen

    def nearest(self, docs: np.ndarray, state: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k entries of the shard's documents `docs` (its own numbers) nearest to `state`, nearest first."""
        with self.lock:
            self._fresh()
            return nearest(self.store.keys, candidates(self.store.documents.ranges(docs.tolist())), state, k)

    def search(self, query: np.ndarray, k: int, hidden: np.ndarray, rerank: int) -> tuple[np.ndarray, np.ndarray]:
        """`FaissIndex.search` over the shard (its own entry numbers)."""
        with self.lock:
            self._fresh()
            if self.index is None:
                raise DatastoreError(f"shard {self.store.path} has no FAISS index: run `bertknn index` on the store")
            return self.index.search(query, k, hidden, rerank)

    def size(self) -> int | None:
        """The keys in the shard's FAISS index, None without one."""
        with self.lock:
            self._fresh()
            return None if self.index is None else self.index.ntotal


class ServedShards:
    """The shard deployments as the ingress sees them (Serve handles in shard order), searched by `BertKNN` once it
    is given them (`serve_shards_on`): the `search.RemoteShards` of a sharded datastore. A search whose shards have
    not all answered within `wait_s` (a node lost, its replicas not yet back) raises `ShardUnavailable`."""

    def __init__(self, store: Store, handles: list, wait_s: float = REQUEST_TIMEOUT_S) -> None:
        self.store, self.handles, self.wait_s = store, handles, wait_s
        self.asked = [0] * len(handles)  # IR-path requests sent to each shard
        self.ntotal = 0  # keys in the shards' FAISS indexes

    def nearest(self, docs: list[int], state: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k entries of `docs` (global numbers) nearest to `state`: only the shards owning them are asked, at
        once."""
        calls = {}
        for s, local in enumerate(self.store.split_documents(np.asarray(docs, np.int64))):
            if len(local):
                calls[s] = self.handles[s].nearest.remote(local, state, k)
                self.asked[s] += 1
        found = self._answers(calls)
        return self.store.merge_nearest([found.get(s, NONE_FOUND) for s in range(len(self.handles))], k)

    def search(
        self, query: np.ndarray, k: int, hidden: np.ndarray | None = None, rerank: int = 8
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest entries over every shard's FAISS index (global numbers), as `ShardedFaiss.search`."""
        local = self.store.split_documents(hidden)
        calls = {s: handle.search.remote(query, k, h, rerank) for s, (handle, h) in enumerate(zip(self.handles, local))}
        return self.store.merge_nearest(list(self._answers(calls).values()), k)

    def _answers(self, calls: dict[int, Any]) -> dict[int, Any]:
        """The calls' results by shard ({shard: Serve call}), all within `wait_s` together; else the calls are
        cancelled and ShardUnavailable names the first shard that did not answer."""
        from ray.exceptions import RayError

        deadline, answers = time.monotonic() + self.wait_s, {}
        for shard, call in calls.items():
            try:
                answers[shard] = call.result(timeout_s=max(deadline - time.monotonic(), 0.0))
            except (TimeoutError, RayError) as err:
                for other in calls.values():
                    other.cancel()
                reason = f"gave no answer within {self.wait_s:g} s" if isinstance(err, TimeoutError) else "failed"
                raise ShardUnavailable(
                    f"shard {shard} of the datastore {reason} (its node may be lost while Ray Serve restarts its "
                    "replica): try again in a few seconds"
                ) from err
        return answers

    def faiss(self, store: Store) -> ServedShards | None:
        """The FAISS path (`BertKNN`'s loader), or None when a shard has no index."""
        sizes = [call.result() for call in [handle.size.remote() for handle in self.handles]]
        if any(size is None for size in sizes):
            return None
        self.ntotal = sum(sizes)
        return self


class Ingress:
    """The ingress deployment: the model and bertknn's FastAPI app, searching through the shard deployments, which
    are waited for as long as the app waits for an answer (`request_timeout_s`)."""

    def __init__(self, datastore: str, shards: list, runtime: Runtime, app_options: dict) -> None:
        wait_s = float(app_options.get("request_timeout_s", REQUEST_TIMEOUT_S))
        # in a thread: Serve runs this in its event loop, where a handle's result cannot be waited for
        with ThreadPoolExecutor(1) as thread:
            self.reader = thread.submit(self._load, datastore, shards, runtime.here(), wait_s).result()
        self.app_options = app_options

    @staticmethod
    def _load(datastore: str, shards: list, runtime: Runtime, wait_s: float):
        from bertknn.query.pipeline import BertKNN

        runtime.apply()
        reader = BertKNN.load(datastore, runtime=runtime)
        reader.serve_shards_on(ServedShards(reader.store, shards, wait_s))
        reader.encoder.query(["[MASK] ."])  # the first request should not pay for loading the model
        return reader

    def __serve_build_asgi_app__(self):
        from bertknn.serving.service import create_app

        return create_app(self.reader, **self.app_options)


def application(
    datastore: str,
    runtime: Runtime,
    replicas: int = 1,
    shard_cpus: float = SHARD_CPUS,
    ingress_cpus: float = 1.0,
    ingress_gpus: float = 0.0,
    **app_options: object,
):
    """The Serve application of the sharded datastore at `datastore`: a deployment per shard with `replicas`
    replicas of `shard_cpus` CPUs each, and the ingress (`ingress_gpus`: 1 to run the model on a GPU);
    `app_options` go to `service.create_app`."""
    from ray import serve

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, not {replicas}")
    store = open_store(datastore)
    shard = serve.deployment(ShardServer, num_replicas=replicas, ray_actor_options={"num_cpus": shard_cpus})
    shards = [shard.options(name=shard_deployment(i)).bind(str(s.path)) for i, s in enumerate(store.shards)]
    ingress = serve.deployment(
        serve.ingress()(Ingress), ray_actor_options={"num_cpus": ingress_cpus, "num_gpus": ingress_gpus}
    )
    return ingress.bind(str(datastore), shards, runtime, app_options)


def run(
    datastore: str,
    host: str,
    port: int,
    runtime: Runtime,
    address: str | None = None,
    replicas: int = 1,
    blocking: bool = True,
    **app_options: object,
):
    """Serve the sharded datastore at `datastore` on Ray Serve at http://host:port/ (Ray started here when it is not:
    `distributed.start_ray(address)`); block until Ctrl+C unless `blocking` is False (then return the ingress's
    handle; `serve.shutdown()` stops it). The ingress gets `runtime.threads` CPUs (0: one) and a GPU when `runtime`
    runs on one; each shard replica half a CPU, or an equal share of what is left when the cluster has less."""
    import ray
    from ray import serve

    from bertknn.ingest.distributed import on_gpu, start_ray

    start_ray(address)
    ingress_cpus = float(runtime.threads or 1)
    replicas_total = len(open_store(datastore).shards) * replicas
    shard_cpus = min(SHARD_CPUS, (ray.cluster_resources().get("CPU", 0) - ingress_cpus) / replicas_total)
    if shard_cpus < MIN_SHARD_CPUS:
        raise ValueError(
            f"the Ray cluster has too few CPUs for the ingress ({ingress_cpus:g}) and {replicas_total} shard replicas: "
            "use fewer --replicas or --threads, or a larger cluster"
        )
    serve.start(http_options={"host": host, "port": port})
    app = application(
        str(datastore),
        runtime,
        replicas,
        round(shard_cpus, 4),
        ingress_cpus=ingress_cpus,
        ingress_gpus=1.0 if on_gpu(runtime) else 0.0,
        **app_options,
    )
    return serve.run(app, blocking=blocking, name=APP_NAME, route_prefix="/")
