"""Commands that show bertknn at work: serve (the HTTP API and page), demo."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from bertknn.cli import BackendOption, DeviceOption, DtypeOption, ThreadsOption, _build, command
from bertknn.console import console, phase_progress
from bertknn.default_model import DEFAULT_MODEL
from bertknn.encoder import Encoder
from bertknn.pipeline import BertKNN
from bertknn.runtime import CLI_BACKEND


@command()
def demo(
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Build the embedded demo corpus's datastore (cached) and answer its questions."""
    from bertknn.demo import DEMO_CORPUS, demo_path, intro, narration

    encoder = Encoder.load(model, runtime=backend)
    out = demo_path(encoder)
    console.print(intro(model, out))
    knn = _build(DEMO_CORPUS, out, encoder, None)
    for part in narration(knn):
        console.print(part)


@command()
def serve(
    datastore: Annotated[
        str, typer.Argument(help="datastore directory, or `demo` for the demo corpus's (built and cached on first use)")
    ],
    host: Annotated[str, typer.Option(help="interface to bind (loopback: this machine only)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    writable: Annotated[bool, typer.Option(help="allow POST /documents and DELETE /documents/{id}")] = False,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="BERTKNN_TOKEN",
            show_default=False,
            help="token that writes need (Authorization: Bearer TOKEN); required for --writable off loopback. "
            "Prefer the environment variable: a command line is visible to other users",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            show_default=False,
            help="Host header value to answer, repeatable (default: the loopback names; binding another address "
            "adds it and this machine's names and addresses)",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="sharded datastores: local (this process searches every shard) or ray (on Ray Serve: a deployment "
            "per shard, searched where it is held; pip install 'bertknn[ray]')"
        ),
    ] = "local",
    address: Annotated[str | None, typer.Option(help="ray: the cluster's address [default: a local one]")] = None,
    replicas: Annotated[int, typer.Option(min=1, help="ray: replicas of each shard's deployment")] = 1,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web page: ask a question, see the three answers and evidence."""
    import uvicorn

    from bertknn.demo import build_demo
    from bertknn.service import allowed_hosts_for, create_app, is_loopback
    from bertknn.shards import is_sharded

    token = token or None
    network = not is_loopback(host)
    if writable and network and not token:
        raise ValueError(f"--writable on {host} needs a token: pass --token or set BERTKNN_TOKEN")
    hosts = allowed_host or allowed_hosts_for(host)
    if engine not in ("local", "ray") or (engine == "ray" and not is_sharded(datastore)):
        raise ValueError("--engine is local, or ray for a sharded datastore (its shards served by Ray Serve)")
    if network:
        console.print(
            f"[bold yellow]warning:[/] bound to {escape(host)}: the service is reachable from the network, by anyone "
            "who can connect to this machine"
        )
    mode = ("writable, with token" if token else "writable") if writable else "read-only"
    if engine == "ray":
        from bertknn import ray_serve

        console.print(
            f"sharded datastore {escape(datastore)} ({mode}) on Ray Serve, a deployment per shard ({replicas} "
            f"replica(s) each)\nserving on [bold]http://{escape(host)}:{port}/[/] once the deployments are up "
            "(Ctrl+C stops)"
        )
        options = {"writable": writable, "token": token, "allowed_hosts": hosts}
        ray_serve.run(datastore, host, port, backend, address, replicas, **options)
        return
    if datastore == "demo":
        with phase_progress() as report:
            knn = build_demo(runtime=backend, progress=report)
    else:
        knn = BertKNN.load(datastore, runtime=backend)
    knn.encoder.query(["[MASK] ."])  # the first request should not pay for loading (or exporting) the model
    console.print(
        f"datastore {knn.store.path} ({knn.store.n_documents:,} documents, {knn.store.size:,} contexts, {mode}), "
        f"model {knn.encoder.name}\nserving on [bold]http://{escape(host)}:{port}/[/] for the Host names "
        f"{escape(', '.join(hosts))} (--allowed-host sets others; Ctrl+C stops)"
    )
    uvicorn.run(
        create_app(knn, writable=writable, token=token, allowed_hosts=hosts), host=host, port=port, log_level="warning"
    )
