"""MkDocs hooks: the pages that describe the code are made from it at build time, so that they cannot go stale.

- reference/cli.md: every command's `--help`, as `bertknn` prints it, in the order `bertknn --help` lists them.
- reference/service.md: the HTTP API's endpoints from its OpenAPI schema (docs/reference/openapi.json, which
  tests/serving/test_service.py compares with the running service's).
- results/reliability-runs.md: the long reliability runs recorded as data in reports/reliability/runs.jsonl.

A page asks for generated text with a marker line, e.g. `<!-- generated: cli -->`.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPENAPI = ROOT / "docs" / "reference" / "openapi.json"
RUNS = ROOT / "reports" / "reliability" / "runs.jsonl"
WIDTH = 110  # the help's line width on the page


def _commands(group: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The words that call each command under `group` (`("eval", "lama")`), in the order the help lists them."""
    found: list[tuple[str, ...]] = []
    context = group.context_class(group)
    for name in group.list_commands(context):
        sub = group.get_command(context, name)
        found += _commands(sub, (*path, name)) if hasattr(sub, "list_commands") else [(*path, name)]
    return found


def cli_reference() -> str:
    """`bertknn --help`, then each command's help, run through typer's test runner."""
    import typer
    from typer.testing import CliRunner

    from bertknn.cli import app

    runner = CliRunner()
    parts = []
    for path in [(), *_commands(typer.main.get_command(app))]:
        shown = runner.invoke(app, [*path, "--help"], terminal_width=WIDTH, prog_name="bertknn")
        if shown.exit_code != 0:
            raise RuntimeError(f"bertknn {' '.join(path)} --help failed: {shown.output}")
        title = " ".join(("bertknn", *path))
        parts.append(f"## `{title}`\n\n```text\n{shown.output.rstrip()}\n```\n")
    return "\n".join(parts)


def _schema_name(schema: dict) -> str:
    """A schema's name as a reader knows it: the model's name, or the type (of the items)."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_name(part) for part in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    return schema.get("type", "any")


def _fields(name: str, schemas: dict) -> str:
    """A table of a model's fields: name, type, required, description."""
    model = schemas[name]
    required = set(model.get("required", ()))
    rows = [
        f"| `{field}` | {_schema_name(spec)} | {'yes' if field in required else ''} | "
        f"{spec.get('description', '').replace('|', '&#124;')} |"
        for field, spec in model.get("properties", {}).items()
    ]
    head = f"**{name}**" + (f": {model['description']}" if model.get("description") else "")
    return "\n".join([head, "", "| field | type | required | what |", "| --- | --- | --- | --- |", *rows, ""])


def service_reference() -> str:
    """The endpoints, then each model they name, from the OpenAPI schema."""
    api = json.loads(OPENAPI.read_text(encoding="utf-8"))
    schemas = api.get("components", {}).get("schemas", {})
    rows, named = [], []
    for route, methods in api["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            answer = operation.get("responses", {}).get("200", operation.get("responses", {}).get("201", {}))
            returned = answer.get("content", {}).get("application/json", {}).get("schema")
            codes = ", ".join(code for code in operation.get("responses", {}) if code not in ("200", "201"))
            what = (operation.get("description") or operation.get("summary", "")).split("\n\n")[0]
            rows.append(
                f"| `{method.upper()} {route}` | {what.replace('|', '&#124;')} | "
                f"{_schema_name(body) if body else ''} | {_schema_name(returned) if returned else ''} | {codes} |"
            )
            named += [s["$ref"].rsplit("/", 1)[-1] for s in (body, returned) if s and "$ref" in s]
    table = ["| endpoint | what | request | answer | other codes |", "| --- | --- | --- | --- | --- |", *rows]
    models = [name for name in schemas if name in named] + [name for name in schemas if name not in named]
    parts = [f"OpenAPI {api['openapi']}, `{api['info']['title']}` {api['info']['version']}.", "", *table, ""]
    parts += ["## Models", ""] + [_fields(name, schemas) for name in models]
    return "\n".join(parts)


def reliability_runs() -> str:
    """A table of the long runs, newest first, then each run's figures in a folded block."""
    runs = [json.loads(line) for line in RUNS.read_text(encoding="utf-8").splitlines() if line.strip()]
    runs.reverse()
    table = ["| run | cores | wall (min) | what ran |", "| --- | --- | --- | --- |"]
    table += [
        f"| {run['date']} | {run['cores']} | {run['wall_min']} | {', '.join(run['markdown']) or '-'} |" for run in runs
    ]
    details = []
    for run in runs:
        body = "\n\n".join(f"**{section}**\n\n{text}" for section, text in run["markdown"].items())
        indented = "\n".join(
            f"    {line}" if line else "" for line in f"Command: `{run['command']}`\n\n{body}".split("\n")
        )
        details.append(f'??? note "Long run of {run["date"]}"\n\n{indented}\n')
    return "\n".join([*table, "", *details])


GENERATED = {"cli": cli_reference, "service": service_reference, "reliability-runs": reliability_runs}


def on_page_markdown(markdown: str, page: object, config: object, files: object) -> str:
    """Replace each `<!-- generated: NAME -->` line with what GENERATED[NAME] makes."""
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("<!-- generated: ") and line.endswith(" -->"):
            lines[i] = GENERATED[line[len("<!-- generated: ") : -len(" -->")]]()
    return "\n".join(lines)
