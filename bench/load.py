"""Load on the HTTP service: N concurrent clients against /predict on loopback, micro-batching on vs off.

    python bench/load.py [--clients 16] [--seconds 20] [--threads 0] [--max-batch 32] [--window-ms 0] [--datastore DIR]
                         [--backend onnx] [--smoke]

The server (`bertknn.serving.service.create_app`) runs in its own process over the demo corpus's datastore with the
offline default model (built and cached as by `bertknn demo`), or over --datastore, with the model in --backend
(onnx, as `bertknn serve` does by default, torch or onnx-int8). Each client posts the demo questions
(with their subjects) one after another for --seconds, after a warm-up; the figures are requests/s, p50/p99
latency, the error count (non-200 answers and failed requests) and requests per model call. The server runs once
with micro-batching (--max-batch waiting requests share one predict_batch call) and once without (max_batch=1:
one request per model call); the last line is the ratio of their requests/s. --smoke: 2 clients for 1 second, the
server on one thread.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import socket
import time

import httpx
import numpy as np
from evidence import SMOKE

from bertknn.demo import demo_questions
from bertknn.model.runtime import BACKENDS

WARM_UP = 8


def serve(port: int, max_batch: int, window_ms: float, threads: int, datastore: str | None, backend: str) -> None:
    """Server process: load the datastore and serve it on 127.0.0.1:port."""
    import uvicorn

    from bertknn.demo import build_demo
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN
    from bertknn.serving.service import create_app

    Runtime.of(backend, threads).apply()
    knn = BertKNN.load(datastore, runtime=backend) if datastore else build_demo(runtime=backend)
    app = create_app(knn, max_batch=max_batch, batch_window_ms=window_ms)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, process: mp.Process, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.is_alive():
            raise RuntimeError(f"the server process exited with status {process.exitcode}")
        try:
            if httpx.get(url + "health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} did not answer /health within {timeout:.0f} s")


async def load(url: str, clients: int, seconds: float, questions: list[dict]) -> dict:
    """Run `clients` concurrent request loops for `seconds`; latencies and errors of the requests they finished."""
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        for q in questions[:WARM_UP]:
            (await client.post("/predict", json=q)).raise_for_status()

        async def worker(offset: int, end: float) -> None:
            for q in itertools.islice(itertools.cycle(questions), offset, None):
                if time.monotonic() >= end:
                    return
                began = time.monotonic()
                try:
                    response = await client.post("/predict", json=q)
                    if response.status_code != 200:
                        errors.append(f"{response.status_code}: {response.text[:200]}")
                except httpx.HTTPError as err:
                    errors.append(f"{type(err).__name__}: {err}")
                latencies.append(time.monotonic() - began)

        calls_before = (await client.get("/health")).json()["model_calls"]
        began = time.monotonic()
        await asyncio.gather(*(worker(i, began + seconds) for i in range(clients)))
        elapsed = time.monotonic() - began
        calls = (await client.get("/health")).json()["model_calls"] - calls_before
    ms = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies),
        "rps": (len(latencies) - len(errors)) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "per_call": len(latencies) / max(calls, 1),
    }


def run(label: str, max_batch: int, args: argparse.Namespace, questions: list[dict]) -> dict:
    port = free_port()
    process = mp.get_context("spawn").Process(
        target=serve, args=(port, max_batch, args.window_ms, args.threads, args.datastore, args.backend), daemon=True
    )
    process.start()
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_ready(url, process)
        result = asyncio.run(load(url, args.clients, args.seconds, questions))
    finally:
        process.terminate()
        process.join(30)
    print(
        f"{label:<17} {args.clients} clients, {args.seconds:.0f} s: {result['rps']:6.1f} requests/s, "
        f"p50 {result['p50_ms']:7.1f} ms, p99 {result['p99_ms']:7.1f} ms, errors {result['errors']} "
        f"(of {result['requests']}), {result['per_call']:.1f} requests per model call",
        flush=True,
    )
    if result["first_error"]:
        print(f"  first error: {result['first_error']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each run sends requests")
    parser.add_argument("--threads", type=int, default=0, help="server's CPU threads [default: all cores]")
    parser.add_argument("--max-batch", type=int, default=32, help="requests per model call with batching on")
    parser.add_argument("--window-ms", type=float, default=0.0, help="how long the worker waits for more requests")
    parser.add_argument("--backend", default="onnx", choices=BACKENDS, help="the model runtime")
    parser.add_argument("--datastore", help="datastore directory [default: the demo corpus's, with the default model]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.seconds, args.threads = 2, 1.0, 1
    questions = [{"text": q["question"], "subject": q["subject"], "top_k": 10, "evidence": 3} for q in demo_questions()]
    if args.datastore:
        questions = [{"text": q["text"], "top_k": 10, "evidence": 3} for q in questions]
    print(f"server: {args.datastore or 'demo datastore, offline default model'}; {len(questions)} questions cycled")
    on = run(f"batching on ({args.max_batch})", args.max_batch, args, questions)
    off = run("batching off", 1, args, questions)
    print(f"requests/s with micro-batching vs without: {on['rps'] / max(off['rps'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
