"""The shape of the package: dependencies point one way; storage knows nothing of the model."""

from __future__ import annotations

import ast
from pathlib import Path

import bertknn

SRC = Path(bertknn.__file__).parent


def _is_module(name: str) -> bool:
    return (SRC.parent / f"{name.replace('.', '/')}.py").exists()


def _imports(module: str) -> set[str]:
    """The bertknn modules that `module` ("store.datastore") imports: `from bertknn.store import atomic` imports
    bertknn.store.atomic."""
    tree = ast.parse((SRC / f"{module.replace('.', '/')}.py").read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if _is_module(inner) else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.startswith("bertknn") and name != "bertknn"}


LAYERS = ["text", "model", "store", "index", "ingest", "query", "evaluation", "serving"]  # the order data flows


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_each_subpackage_imports_only_those_before_it():
    backwards = []
    for file in sorted(SRC.rglob("*.py")):
        module = ".".join(file.relative_to(SRC).with_suffix("").parts)
        own = _layer(f"bertknn.{module}")
        if own is None:
            continue
        backwards += [(module, name) for name in _imports(module) if (_layer(name) or 0) > own]
    assert backwards == []


def test_storage_imports_neither_the_model_nor_the_tokenizer():
    assert _imports("store.datastore") == {
        "bertknn.store.atomic",
        "bertknn.store.codec",
        "bertknn.store.documents",
        "bertknn.store.errors",
        "bertknn.store.evidence",
        "bertknn.store.identity",
        "bertknn.store.integrity",
        "bertknn.store.lexicon",
        "bertknn.store.manifest",
        "bertknn.store.protocol",  # `Shards`: a store is its own one shard
        "bertknn.store.records",
        "bertknn.store.schema",
        "bertknn.store.snapshot",
        "bertknn.store.wal",  # whether store.sqlite is as its last seal recorded it
    }  # a reader: neither the lock nor the writer
    for reads in ("store.documents", "store.lexicon"):  # the store's reads by concept (the store: for type hints)
        assert _imports(reads) <= {
            "bertknn.store.protocol",
            "bertknn.store.manifest",
            "bertknn.store.names",  # the names index's lookups
            "bertknn.store.records",
            "bertknn.store.schema",
        }
    assert _imports("store.names") == {"bertknn.text"}  # normalised names: string functions, no tokenizer
    assert not any(name.startswith(("bertknn.model", "bertknn.text")) for name in _imports("store.writer"))
    assert _imports("store.lock") == {"bertknn.store.manifest"}
    assert _imports("store.records") == _imports("store.schema") == set()
    assert _imports("store.manifest") == {"bertknn.text"}  # FORMER_SPLITTER: a name
    # the evidence texts: string functions, no tokenizer (the store: for type hints)
    assert _imports("store.evidence") == {"bertknn.text", "bertknn.store.protocol"}
    assert _imports("store.codec") == {"bertknn.store.atomic"}
    assert _imports("store.integrity") == {  # LOCK_FILE: not data; descriptors: store.sqlite read keeping its locks
        "bertknn.store.atomic",
        "bertknn.store.descriptors",
        "bertknn.store.lock",
    }
    assert _imports("store.atomic") == set()
    assert not any(name.startswith(("bertknn.model", "bertknn.text")) for name in _imports("store.shards"))


def _called(name: str) -> list[str]:
    """The package's modules ("store.writer") that call a function or method named `name` ("schema.writing": only
    that attribute of that module)."""
    owner, _, attr = name.rpartition(".")
    found = []
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            called = getattr(func, "attr", None) or getattr(func, "id", None)
            by = getattr(getattr(func, "value", None), "id", None)
            if called == attr and (not owner or by == owner):
                found.append(".".join(file.relative_to(SRC).with_suffix("").parts))
                break
    return found


def test_the_writer_lock_is_taken_only_by_the_writer():
    """One writer per store (store/writer.py), opened once: it alone takes the lock and opens the writer's
    connection (besides a new store's creation, in a directory nobody reads yet); no reader becomes a writer."""
    assert _called("acquire_lock") == ["store.writer"]
    assert _called("schema.writing") == ["store.creation", "store.writer"]
    assert set(_called("writing")) <= set(_called("schema.writing"))  # no reader's `writing()` left
    assert _called("open_datastore_writer") == ["ingest.repair", "store.verify", "store.writers"]


SHARDING = {"ShardedDatastore", "ShardedWriter", "ShardedDocuments", "ShardedLexicon", "is_sharded", "shard_paths"}


def _names_used(file: Path) -> set[str]:
    """The names a file uses (as a name, an attribute or an import)."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names}
    return found


def test_no_caller_outside_store_asks_whether_a_store_is_sharded():
    """A sharded store has the reader's and the writer's interfaces of a plain one (`protocol.Shards`: every store is
    its shards); outside store/ nothing names the sharded classes or asks whether a directory is sharded."""
    asking = {
        ".".join(file.relative_to(SRC).with_suffix("").parts): sorted(_names_used(file) & SHARDING)
        for file in sorted(SRC.rglob("*.py"))
        if file.relative_to(SRC).parts[0] != "store" and _names_used(file) & SHARDING
    }
    assert asking == {}


def test_a_store_and_a_sharded_store_are_read_through_the_same_shards():
    """Both have `shards`, `doc_starts`, `entry_starts`, `split_documents` and `merge_nearest`: a plain store is
    its own one shard."""
    from bertknn.store.datastore import Datastore
    from bertknn.store.protocol import Shards
    from bertknn.store.shards import ShardedDatastore

    assert issubclass(Datastore, Shards) and issubclass(ShardedDatastore, Shards)
    assert {"shards", "doc_starts", "entry_starts"} <= set(dir(Datastore))


def _modules() -> dict[str, set[str]]:
    """Each module of the package ("store.datastore"; a package by its name) and the package's modules it imports,
    those imported for type hints only and inside functions included."""
    files = {".".join(f.relative_to(SRC).with_suffix("").parts): f for f in SRC.rglob("*.py")}
    names = {m.removesuffix(".__init__"): m for m in files}
    return {name: {i.removeprefix("bertknn.") for i in _imports(m)} & set(names) for name, m in names.items()}


def test_no_module_imports_itself_through_others():
    """No import circle: a module reached again from what it imports, with type hints' and functions' imports."""
    graph, circles = _modules(), []
    for start in sorted(graph):
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                circles.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo += graph[name]
    assert circles == []


def test_the_builder_sits_between_model_and_store():
    assert {"bertknn.store.datastore", "bertknn.model.encoder", "bertknn.text"} <= _imports("ingest.builder")
    assert not any("query" in name or "cli" in name for name in _imports("ingest.builder"))


def test_the_corpus_readers_know_nothing_of_the_model():
    assert _imports("ingest.corpus") == {"bertknn.store.datastore", "bertknn.store.records", "bertknn.text"}


def test_no_function_of_the_package_is_over_sixty_lines():
    long = []
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long.append(f"{file.relative_to(SRC)}:{node.lineno} {node.name}")
    assert long == []


LONG_FILES: set[str] = set()  # files allowed over 500 lines: none
LARGE_CLASSES: set[str] = set()  # classes allowed over 30 methods: none


def test_no_file_of_the_package_is_over_500_lines():
    long = [
        f"{file.relative_to(SRC)}: {n} lines"
        for file in sorted(SRC.rglob("*.py"))
        if (n := len(file.read_text(encoding="utf-8").splitlines())) > 500
    ]
    assert sorted(long) == sorted(f"{name}: {len((SRC / name).read_text().splitlines())} lines" for name in LONG_FILES)


def test_no_class_of_the_package_has_over_30_methods():
    large = set()
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > 30:
                    large.add(node.name)
    assert large == LARGE_CLASSES


def test_each_file_name_names_one_concept_across_the_package():
    """No two modules share a file name (a newcomer finds each concept in the file named after it)."""
    names = [file.name for file in SRC.rglob("*.py") if file.name != "__init__.py"]
    assert sorted({name for name in names if names.count(name) > 1}) == []
