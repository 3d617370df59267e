"""`shards.Store`, what the query path and the service use of a datastore: `Datastore` and `ShardedDatastore` both
have every member, with the same parameters, and a type checker agrees."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bertknn.query.pipeline import BertKNN
from bertknn.store.datastore import DatastoreError
from bertknn.store.protocol import DocumentReads, Store
from bertknn.store.shards import ShardedDatastore
from bertknn.store.writers import open_writer

from ..conftest import SMALL_DOCS, write_corpus
from ..sharded_store import make_sharded

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = sorted(name for name in vars(Store) if not name.startswith("_"))
METHODS = {name for name in MEMBERS if inspect.isfunction(vars(Store)[name])}
READS = sorted(name for name in vars(DocumentReads) if not name.startswith("_"))  # all methods


@pytest.fixture(scope="module")
def stores(tmp_path_factory, encoder) -> dict:
    """A datastore of the small corpus, and the same documents in two shards."""
    path = tmp_path_factory.mktemp("stores")
    single = BertKNN.build(write_corpus(path / "corpus.jsonl", SMALL_DOCS), path / "single", encoder).store
    sharded = ShardedDatastore(make_sharded(path / "sharded", encoder, [SMALL_DOCS[:2], SMALL_DOCS[2:]]))
    return {"Datastore": single, "ShardedDatastore": sharded}


def _parameters(function) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_protocol_lists_what_the_service_needs():
    assert {"documents", "size", "n_documents", "keys", "writer", "manifest"} <= set(MEMBERS)
    assert {"reopen_if_changed", "paused", "close"} <= METHODS and not {"size", "documents"} & METHODS
    assert {"count_live", "states", "provenance", "ranges", "of"} <= set(READS)


@pytest.mark.parametrize("name", MEMBERS)
def test_both_datastores_have_every_member_of_the_protocol(stores, name):
    for kind, store in stores.items():
        if name == "writer":  # a reader never writes: its writer's own view answers it
            with pytest.raises(DatastoreError, match="is opened for reading and never writes"):
                _ = store.writer
            with open_writer(store) as writer:
                assert writer.store.writer is writer and type(writer.store) is type(store)
            continue
        assert hasattr(store, name), f"{kind} has no {name}"
        if name in METHODS:
            assert _parameters(getattr(store, name)) == _parameters(vars(Store)[name])[1:], f"{kind}.{name}"
        else:
            assert not inspect.ismethod(getattr(store, name)), f"{kind}.{name} is a method, the protocol's a value"


@pytest.mark.parametrize("name", READS)
def test_both_datastores_read_documents_alike(stores, name):
    for kind, store in stores.items():
        method = getattr(store.documents, name, None)
        assert inspect.ismethod(method), f"{kind}.documents has no {name}"
        assert _parameters(method) == _parameters(vars(DocumentReads)[name])[1:], f"{kind}.documents.{name}"


# every module of the service that uses a store (ray_serve.py is left out: it serves a ShardedDatastore's shards)
@pytest.mark.parametrize("module", ["serving/service.py", "serving/http_errors.py", "query/search.py"])
def test_the_service_and_the_search_use_only_the_protocol(module):
    text = (ROOT / "src" / "bertknn" / module).read_text(encoding="utf-8")
    used = set(re.findall(r"(?<!\w)(?<!bertknn\.)store\.(\w+)", text))  # `store.x`, `reader.store.x`, `self.store.x`
    assert used and used <= set(MEMBERS), sorted(used - set(MEMBERS))
    reads = set(re.findall(r"(?<!\w)(?<!bertknn\.)store\.documents\.(\w+)", text))
    assert reads <= set(READS), sorted(reads - set(READS))


CHECKED = textwrap.dedent(
    """\
    from bertknn.store.datastore import Datastore
    from bertknn.store.shards import ShardedDatastore
    from bertknn.store.protocol import DocumentReads, Store


    def stores(single: Datastore, sharded: ShardedDatastore) -> list[Store]:
        return [single, sharded]


    not_a_store: Store = 3
    """
)


def test_a_type_checker_holds_both_datastores_to_the_protocol(tmp_path):
    """mypy with the project's settings: no error but the one planted (which shows the protocol was read)."""
    pytest.importorskip("mypy")
    (tmp_path / "stores.py").write_text(CHECKED, encoding="utf-8")
    began = time.monotonic()
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", "cache"]
    run = subprocess.run([*command, "stores.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("stores.py:10: error: Incompatible types in assignment"), (
        run.stdout
    )
    assert time.monotonic() - began < 60
