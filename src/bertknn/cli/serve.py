"""Commands that show bertknn at work: serve (the HTTP API and page), demo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from bertknn.cli.main import BackendOption, DeviceOption, DtypeOption, ThreadsOption, _build, command
from bertknn.console import console, phase_progress
from bertknn.model.default_model import DEFAULT_MODEL
from bertknn.model.runtime import CLI_BACKEND, Runtime
from bertknn.serving.schemas import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from bertknn.query.pipeline import BertKNN

ServedArg = Annotated[
    str, typer.Argument(help="datastore directory, or `demo` for the demo corpus's (built and cached on first use)")
]
HostOption = Annotated[str, typer.Option(help="interface to bind (loopback: this machine only)")]
PortOption = Annotated[int, typer.Option(help="TCP port")]
WritableOption = Annotated[bool, typer.Option(help="allow POST /documents and DELETE /documents/{id}")]
TokenOption = Annotated[
    str | None,
    typer.Option(
        envvar="BERTKNN_TOKEN",
        show_default=False,
        help="token that writes need (Authorization: Bearer TOKEN); required for --writable off loopback. "
        "Prefer the environment variable: a command line is visible to other users",
    ),
]
AllowedHostOption = Annotated[
    list[str] | None,
    typer.Option(
        show_default=False,
        help="Host header value to answer, repeatable (default: the loopback names; binding another address "
        "adds it and this machine's names and addresses)",
    ),
]
EngineOption = Annotated[
    str,
    typer.Option(
        help="local (this process searches every shard) or ray (on Ray Serve: a deployment per shard, searched "
        "where it is held; pip install 'bertknn[ray]')"
    ),
]
AddressOption = Annotated[str | None, typer.Option(help="ray: the cluster's address [default: a local one]")]
ReplicasOption = Annotated[int, typer.Option(min=1, help="ray: replicas of each shard's deployment")]
RequestTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="seconds a question may take; then it gets 503 with Retry-After (ray: also how long the shards are waited "
        "for, as when a node is lost)",
    ),
]


@command(example="bertknn demo")
def demo(
    model: Annotated[str, typer.Option(help="HF masked LM")] = DEFAULT_MODEL,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Build the embedded demo corpus's datastore (cached) and answer its questions."""
    from bertknn.demo import DEMO_CORPUS, demo_path, intro, narration
    from bertknn.model.encoder import Encoder

    encoder = Encoder.load(model, runtime=backend)
    out = demo_path(encoder)
    console.print(intro(model, out))
    reader = _build(DEMO_CORPUS, out, encoder, None)
    for part in narration(reader):
        console.print(part)


@command(example="bertknn serve my_store --port 8000   (then open http://127.0.0.1:8000)")
def serve(
    datastore: ServedArg,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    writable: WritableOption = False,
    token: TokenOption = None,
    allowed_host: AllowedHostOption = None,
    engine: EngineOption = "local",
    address: AddressOption = None,
    replicas: ReplicasOption = 1,
    request_timeout: RequestTimeoutOption = REQUEST_TIMEOUT_S,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web page: ask a question, see the three answers and evidence."""
    import uvicorn

    from bertknn.serving.service import create_app

    token = token or None
    hosts = _bind(datastore, host, writable, token, allowed_host, engine)
    mode = ("writable, with token" if token else "writable") if writable else "read-only"
    options = {"writable": writable, "token": token, "allowed_hosts": hosts, "request_timeout_s": request_timeout}
    if engine == "ray":
        _serve_on_ray(datastore, host, port, backend, address, replicas, mode, options)
        return
    reader = _reader(datastore, backend)
    console.print(
        f"datastore {reader.store.path} ({reader.store.n_documents:,} documents, {reader.store.size:,} contexts, "
        f"{mode}), model {reader.encoder.name}\nserving on [bold]http://{escape(host)}:{port}/[/] for the Host "
        f"names {escape(', '.join(hosts))} (--allowed-host sets others; Ctrl+C stops)"
    )
    uvicorn.run(create_app(reader, **options), host=host, port=port, log_level="warning")


def _bind(
    datastore: str, host: str, writable: bool, token: str | None, allowed_host: list[str] | None, engine: str
) -> list[str]:
    """The Host names to answer, once the options are checked (a writable network bind needs a token; --engine is
    local or ray); warns when `host` is reachable from the network."""
    from bertknn.serving.security import allowed_hosts_for, is_loopback

    network = not is_loopback(host)
    if writable and network and not token:
        raise ValueError(f"--writable on {host} needs a token: pass --token or set BERTKNN_TOKEN")
    hosts = allowed_host or allowed_hosts_for(host)
    if engine not in ("local", "ray"):
        raise ValueError(f"--engine is local or ray (each shard served by Ray Serve), not {engine!r}")
    if network:
        console.print(
            f"[bold yellow]warning:[/] bound to {escape(host)}: the service is reachable from the network, by anyone "
            "who can connect to this machine"
        )
    return hosts


def _serve_on_ray(
    datastore: str, host: str, port: int, runtime: Runtime, address: str | None, replicas: int, mode: str, options: dict
) -> None:
    """Serve a sharded datastore on Ray Serve, a deployment per shard (`serving.ray_serve`), until Ctrl+C."""
    from bertknn.serving import ray_serve

    console.print(
        f"sharded datastore {escape(datastore)} ({mode}) on Ray Serve, a deployment per shard ({replicas} "
        f"replica(s) each)\nserving on [bold]http://{escape(host)}:{port}/[/] once the deployments are up "
        "(Ctrl+C stops)"
    )
    ray_serve.run(datastore, host, port, runtime, address, replicas, **options)


def _reader(datastore: str, runtime: Runtime) -> BertKNN:
    """The datastore's reader (`demo`: the demo corpus's, built on first use), its model warmed up: the first request
    should not pay for loading (or exporting) the model."""
    from bertknn.demo import build_demo
    from bertknn.query.pipeline import BertKNN

    if datastore == "demo":
        with phase_progress() as report:
            reader = build_demo(runtime=runtime, progress=report)
    else:
        reader = BertKNN.load(datastore, runtime=runtime)
    reader.encoder.query(["[MASK] ."])
    return reader
