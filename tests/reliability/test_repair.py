"""`bertknn repair` on the damage matrix of test_damage.py, every command a process of its own: each damaged index file
(FAISS and TF-IDF, the base segment and an added one) is made again by the command, after which `verify` passes, a
second repair finds nothing to do and the answers equal the undamaged store's; damage to what the store keeps is
refused (exit 2, the file named, the `bertknn build` that makes the store again given, nothing written); a sound store
needs no repair; a repair killed (kill -9) before any of its fsyncs and renames and run again finishes the job.

The store is test_damage.py's: 30 documents built with the tiny random BERT, a FAISS index (`index --factory Flat`)
and one `add` (so a tfidf_add_ segment exists). Default: each index file emptied or one byte of it flipped (in
turn), and kills before 12 of the repair's durable steps; `--long`: every kind of damage of test_damage.py, and a kill
before every step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest

from ..conftest import write_corpus
from .conftest import TORCH, Result, born_docs, connect_ro, long_mode, make_docs
from .test_damage import BASE_DOCS, KINDS, SEGMENT, TFIDF, damage

INDEX_FILES = ["faiss.index", "faiss.json", "faiss_trained.index", *TFIDF, *(f"{SEGMENT}/{name}" for name in TFIDF)]
KEPT_CASES = [
    ("keys.f16", "flip"),
    ("keys.f16", "trunc_half"),
    ("values.i32", "zero4k"),
    ("store.sqlite", "trunc_half"),
    ("manifest.json", "drop:layer"),
]
# Probabilities and distances of answers from an index built again from the same keys and documents: FAISS's float32
# kernels and the BLAS behind them may accumulate in another order than the first build did, so they are compared
# within float32 rounding (tokens, ids, documents and entries exactly)
RTOL = 1e-6  # the same keys and documents indexed again: float32 rounding only
STEPS_SHORT = 12  # durable steps of a repair a kill is tried before, in the default run (--long: all)


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        if long_mode(metafunc.config):  # every kind of damage to every file
            cases = [(f, k) for f in INDEX_FILES for k in KINDS]
        else:  # every file once, emptied or a bit flipped in turn
            cases = [(f, ("trunc0", "flip")[i % 2]) for i, f in enumerate(INDEX_FILES)]
        metafunc.parametrize("case", cases, ids=lambda c: f"{c[0]}:{c[1]}")


class Store:
    """The undamaged datastore, its files and the answers it gives (through IR and through FAISS)."""

    def __init__(self, root: Path, cli, model: Path) -> None:
        self.cli, self.path = cli, root / "store"
        docs = make_docs(BASE_DOCS, 20, seed=3, prefix="doc")
        self.corpus = write_corpus(root / "corpus.jsonl", docs)
        ok(cli.run(["build", self.corpus, "--out", self.path, "--model", model, *TORCH]))
        ok(cli.run(["index", self.path, "--factory", "Flat", "--threads", "1"]))
        ok(cli.run(["add", self.path, write_corpus(root / "fresh.jsonl", born_docs([1, 2, 3], "Fresh")), *TORCH]))
        assert (self.path / SEGMENT).is_dir()
        title = docs[5]["title"]
        self.questions = {  # IR without a subject: TF-IDF ranks every segment's documents (idf sums over them all)
            "ir": ["Fresh 2 was born in [MASK] .", *TORCH, "--json"],
            "faiss": [f"{title} was born in [MASK] .", "--subject", title, "--retrieval", "faiss", *TORCH, "--json"],
        }
        self.answers = self.ask(self.path)
        self.index = index_contents(self.path)

    def ask(self, store: Path) -> dict[str, dict]:
        return {name: json.loads(ok(self.cli.run(["ask", store, *args])).out) for name, args in self.questions.items()}


def ok(result: Result) -> Result:
    assert result.rc == 0 and not result.traceback, result.describe() + "\n" + result.text[-3000:]
    return result


def files(path: Path) -> dict[str, bytes]:
    """Every file of a datastore directory and its bytes, but the writer lock (whose holder a writer records)."""
    found = sorted(  # not SQLite's log and shared memory, there while a connection is open
        f for f in path.rglob("*") if f.is_file() and f.name != "write.lock" and not f.name.endswith(("-wal", "-shm"))
    )
    return {str(f.relative_to(path)): f.read_bytes() for f in found}


def index_contents(path: Path) -> dict:
    """What the committed index parts hold, whatever their names: each TF-IDF segment's arrays by its documents, and
    the vectors of the FAISS parts in entry order (a FAISS index built again is one part where an add made two)."""
    with connect_ro(path) as db:
        parts = db.execute("SELECT kind, name, first, stop FROM parts ORDER BY kind, first").fetchall()
    held: dict = {"faiss": b""}
    for kind, name, first, stop in parts:
        if kind == "tfidf":
            folder = path if name == "." else path / name
            held[(first, stop)] = [np.load(folder / f).tobytes() for f in TFIDF[:4]]
        else:
            index = faiss.read_index(str(path / name))
            held["faiss"] += index.reconstruct_n(0, index.ntotal).tobytes()
    return held


def assert_same_answers(got: dict[str, dict], want: dict[str, dict]) -> None:
    for name in want:
        a, b = got[name], want[name]
        assert a["documents"] == b["documents"], name
        for method in ("bert", "knn", "bert_knn"):
            assert [(t["token"], t["id"]) for t in a[method]] == [(t["token"], t["id"]) for t in b[method]], method
            np.testing.assert_allclose(
                [t["probability"] for t in a[method]], [t["probability"] for t in b[method]], RTOL
            )
        assert a["evidence"].keys() == b["evidence"].keys()
        for word, found in b["evidence"].items():
            same = [(n["doc_id"], n["sentence"], n["span"]) for n in a["evidence"][word]]
            assert same == [(n["doc_id"], n["sentence"], n["span"]) for n in found], word
            distances = ([n["distance"] for n in a["evidence"][word]], [n["distance"] for n in found])
            np.testing.assert_allclose(*distances, rtol=RTOL)


@pytest.fixture(scope="module")
def store(tmp_path_factory, cli, tiny_model_dir) -> Store:
    return Store(tmp_path_factory.mktemp("repair"), cli, tiny_model_dir)


def test_a_damaged_index_file_is_rebuilt_by_repair(store, case, cli, rng, tmp_path):
    file, kind = case
    path = shutil.copytree(store.path, tmp_path / "store")
    made = damage(path / file, kind, rng)
    if made is None:
        pytest.skip(f"{kind} would not change {file}")
    found = cli.run(["verify", path])
    assert found.rc == 1 and any(file in line for line in found.error_lines()), found.describe()
    repaired = ok(cli.run(["repair", path]))
    what = "FAISS" if file.startswith("faiss") else "TF-IDF segment"
    assert any(line.startswith("rebuilt:") and what in line for line in repaired.out.splitlines()), repaired.out
    ok(cli.run(["verify", path]))
    again = ok(cli.run(["repair", path]))
    assert "nothing needs repair" in again.out and "rebuilt:" not in again.out
    assert index_contents(path) == store.index  # the same segments and FAISS vectors, under the same or new names
    assert_same_answers(store.ask(path), store.answers)


@pytest.mark.parametrize("kept", KEPT_CASES, ids=lambda c: f"{c[0]}:{c[1]}")
def test_damage_to_what_the_store_keeps_is_refused_and_nothing_is_written(store, kept, cli, rng, tmp_path):
    file, kind = kept
    path = shutil.copytree(store.path, tmp_path / "store")
    assert damage(path / file, kind, rng) is not None
    damage(path / "faiss.index", "flip", rng)  # an index damaged too is left as it is
    before = files(path)
    refused = cli.run(["repair", path])
    assert refused.rc == 2 and not refused.traceback, refused.describe()
    (error,) = [line for line in refused.error_lines() if line.startswith("error:")]
    assert "cannot be repaired" in error and file in error and "nothing was written" in error, error
    assert f"bertknn build {store.corpus} --out {path} --model" in error and "--layer 3" in error, error
    assert f"bertknn index {path} --factory Flat" in error, error
    assert files(path) == before


def test_a_sound_store_needs_no_repair_and_repair_changes_nothing(store, cli, tmp_path):
    path = shutil.copytree(store.path, tmp_path / "store")
    before = files(path)
    result = ok(cli.run(["repair", path]))
    assert f"{path}: sound, nothing needs repair" in result.out, result.out
    assert files(path) == before


def test_a_repair_killed_before_any_durable_step_and_rerun_finishes_the_job(store, cli, long, rng, tmp_path):
    template = shutil.copytree(store.path, tmp_path / "damaged")
    for file, kind in (("faiss.index", "flip"), ("tfidf_ndocs.txt", "trunc0"), (f"{SEGMENT}/tfidf_docs.npy", "flip")):
        assert damage(template / file, kind, rng) is not None
    trace = tmp_path / "trace.txt"
    ok(cli.run(["repair", shutil.copytree(template, tmp_path / "traced")], trace=str(trace)))
    steps = len(trace.read_text().splitlines())
    picked = (
        range(1, steps + 1)
        if long
        else sorted({round(1 + i * (steps - 1) / (STEPS_SHORT - 1)) for i in range(STEPS_SHORT)})
    )
    print(f"repair: {steps} durable steps; killed before {len(picked)} of them")
    for step in picked:
        path = shutil.copytree(template, tmp_path / f"killed-{step}")
        killed = cli.run(["repair", path], crash_at=step)
        assert killed.killed, (step, killed.describe())
        ok(cli.run(["repair", path]))
        checked = ok(cli.run(["verify", path]))
        assert "note:" not in checked.out, (step, checked.out)
        assert not list(path.rglob("*.tmp")), step
        assert index_contents(path) == store.index, step
    assert_same_answers(store.ask(path), store.answers)


@pytest.mark.parametrize("file", ["faiss.index", "faiss_trained.index", "tfidf_hashes.npy"])
def test_an_index_file_replaced_by_a_directory_is_rebuilt_and_the_directory_removed(store, file, cli, tmp_path):
    """A directory where an index file was (something in it) is damage of that file: the repair rebuilds the file,
    deletes the directory and exits 0 (it said "Is a directory", exit 2, after committing the rebuilt index)."""
    path = shutil.copytree(store.path, tmp_path / "store")
    (path / file).unlink()
    (path / file).mkdir()
    (path / file / "stray.txt").write_text("not an index")
    found = cli.run(["verify", path])
    assert found.rc == 1 and any(file in line for line in found.error_lines()), found.describe()
    repaired = ok(cli.run(["repair", path]))
    what = "FAISS" if file.startswith("faiss") else "TF-IDF segment"
    assert any(line.startswith("rebuilt:") and what in line for line in repaired.out.splitlines()), repaired.out
    assert not (path / file).is_dir()
    ok(cli.run(["verify", path]))
    assert "nothing needs repair" in ok(cli.run(["repair", path])).out
    assert index_contents(path) == store.index
    assert_same_answers(store.ask(path), store.answers)
