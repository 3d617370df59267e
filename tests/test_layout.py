"""The shape of the package: dependencies point one way; storage knows nothing of the model."""

from __future__ import annotations

import ast
from pathlib import Path

import bertknn

SRC = Path(bertknn.__file__).parent


def _imports(module: str) -> set[str]:
    tree = ast.parse((SRC / f"{module}.py").read_text(encoding="utf-8"))
    found = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "bertknn"
    }
    found |= {  # `from bertknn import atomic` imports the module bertknn.atomic
        f"bertknn.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "bertknn"
        for alias in node.names
    }
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return {name for name in found if name.startswith("bertknn")}


def test_storage_imports_neither_the_model_nor_the_tokenizer():
    assert _imports("datastore") == {"bertknn.atomic", "bertknn.integrity"}
    assert _imports("integrity") == {"bertknn.atomic"}
    assert _imports("atomic") == set()


def test_the_builder_sits_between_model_and_store():
    assert {"bertknn.datastore", "bertknn.encoder", "bertknn.text"} <= _imports("builder")
    assert not any("pipeline" in name or "cli" in name for name in _imports("builder"))


def test_the_corpus_readers_know_nothing_of_the_model():
    assert _imports("corpus") == {"bertknn.datastore", "bertknn.text"}
