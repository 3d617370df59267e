"""`bertknn repair` through the Python API (`Writer.repair`) and typer's CliRunner: the settings a FAISS index is built
again with, the base TF-IDF segment and a sharded datastore, the refusal and its rebuild command, the lock. The damage
matrix through the command line, in processes, is tests/reliability/test_repair.py."""

from __future__ import annotations

import errno
import json
import sqlite3

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn import BertKNN, DatastoreError
from bertknn.cli import app
from bertknn.index import faiss_files, faiss_index, retrieval, tfidf_files
from bertknn.index.faiss_index import FaissIndex
from bertknn.ingest.ingester import Writer
from bertknn.ingest.repair import Unrepairable, rebuild_commands, repair
from bertknn.store import verify as checks
from bertknn.store.datastore import Datastore, read_committed
from bertknn.store.shards import ShardedDatastore
from bertknn.store.writers import open_writer
from tests.conftest import held_elsewhere, index_keys

from ..conftest import SMALL_DOCS
from ..sharded_store import make_sharded

FRESH = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
QUESTION = "Zorblat Quenmire was born in [MASK] ."
# Distances and probabilities of an index built again from the same keys: FAISS's float32 kernels (BLAS for Flat's
# distances) may sum in another order than the build did, so they are compared within float32 rounding, not bit for bit
RTOL = 1e-6


def _flip(path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _files(path) -> dict[str, bytes]:
    """Every file of a datastore directory and its bytes, but the writer lock (whose holder a writer records)."""
    return {
        str(f.relative_to(path)): f.read_bytes()
        for f in sorted(path.rglob("*"))
        if f.is_file() and f.name != "write.lock"
    }


def _search(store: Datastore, query: np.ndarray) -> tuple[list[int], np.ndarray]:
    ids, dist = FaissIndex.load(store).search(query, 8)
    return ids.tolist(), dist


@pytest.fixture()
def indexed(built):
    """The small corpus with an IVF index of non-default settings and one added document (a tfidf_add_ segment)."""
    index_keys(built.store, "IVF2,Flat", train_size=40, nprobe=2, seed=7)
    built.add_documents([FRESH])
    built.writer.close()  # the lock goes: the commands below are other processes' writers
    return built.store.path


def test_a_lost_faiss_json_is_written_again_from_the_copy_sqlite_keeps(indexed):
    settings = (indexed / "faiss.json").read_bytes()
    index = (indexed / "faiss.index").read_bytes()
    (indexed / "faiss.json").unlink()
    assert any("faiss.json: missing" in p for p in checks.verify(indexed).problems)
    done = Writer(Datastore(indexed, check=False)).repair()
    assert done.rebuilt == ["FAISS settings (faiss.json): written again from the copy in store.sqlite"]
    assert (indexed / "faiss.json").read_bytes() == settings and (indexed / "faiss.index").read_bytes() == index
    assert checks.verify(indexed).problems == []


def test_a_damaged_faiss_index_is_built_again_with_its_settings_and_its_trained_quantizer(indexed, built):
    store = Datastore(indexed)
    query = np.asarray(store.keys[3], np.float32)
    expected = _search(store, query)
    trained = (indexed / "faiss_trained.index").read_bytes()
    settings = json.loads((indexed / "faiss.json").read_text())
    _flip(indexed / "faiss.index", 40)
    _flip(indexed / "faiss.json", 2)  # its settings then come from SQLite's copy
    done = Writer(Datastore(indexed, check=False)).repair()
    assert len(done.rebuilt) == 1 and "FAISS index (faiss.index, faiss.json): built again over" in done.rebuilt[0]
    assert "IVF2,Flat with nprobe 2, its settings from the copy of faiss.json in store.sqlite" in done.rebuilt[0]
    assert json.loads((indexed / "faiss.json").read_text()) == settings
    assert (indexed / "faiss_trained.index").read_bytes() == trained  # sound: kept, not trained again
    assert checks.verify(indexed).problems == []
    ids, dist = _search(Datastore(indexed), query)
    assert ids == expected[0]
    np.testing.assert_allclose(dist, expected[1], rtol=RTOL)
    assert Writer(Datastore(indexed)).repair().rebuilt == []  # idempotent


def test_a_cleanup_that_fails_after_the_commit_says_the_repair_is_committed_and_what_is_left(indexed, monkeypatch):
    """Deleting what a repair replaced comes after its commit: a failure there (a permission, say) says that the
    rebuilt index is committed and names the files left to delete by hand."""
    _flip(indexed / "faiss.index", 40)

    def refused(store: Datastore, name: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(store.path / name))

    monkeypatch.setattr(faiss_files, "delete", refused)
    with pytest.raises(DatastoreError) as err:
        repair(indexed)
    with Datastore(indexed) as store:
        left = sorted(set(faiss_files.on_disk(indexed)) - {part.name for part in store.parts(faiss_files.KIND)})
        assert left and FaissIndex.load(store).ntotal == store.size  # the rebuilt index, committed
    assert str(err.value).startswith(f"{indexed}: the repair is committed (readers use the rebuilt index), but ")
    assert str(err.value).endswith(f"delete by hand: {', '.join(str(indexed / name) for name in left)}")
    assert checks.verify(indexed).problems == []


def test_without_settings_or_their_copy_the_index_is_built_with_the_defaults_and_says_so(indexed):
    with sqlite3.connect(indexed / "store.sqlite") as db:  # an index built before SQLite kept a copy of its settings
        db.execute("DELETE FROM meta WHERE key = ?", (faiss_files.SETTINGS_COPY,))
    with open_writer(indexed, check_tails=False) as writer, writer.commit():
        pass  # the edit above is not damage: the commit's end records store.sqlite's checksums anew
    (indexed / "faiss.json").unlink()
    (line,) = Writer(Datastore(indexed, check=False)).repair().rebuilt
    assert "Flat with nprobe 16, its settings from the defaults of `bertknn index`" in line
    assert json.loads((indexed / "faiss.json").read_text())["factory"] == "Flat"
    assert checks.verify(indexed).problems == []


def test_the_base_segment_is_indexed_again_into_a_folder_and_scores_as_before(indexed, built):
    store = Datastore(indexed)
    listed = store.parts(tfidf_files.KIND)
    before = {
        part.first: [np.load(tfidf_files.segment_path(indexed, part.name) / f) for f in tfidf_files.FILES]
        for part in listed
    }
    ranked = retrieval.TfidfIndex.load(store).ranked("cello Vienna born Tallinn boats", 5)
    (indexed / "tfidf_ndocs.txt").write_text("x")
    with pytest.raises(DatastoreError, match=r"tfidf_ndocs\.txt .*`bertknn repair .*` rebuilds"):
        BertKNN.load(indexed, str(built.encoder.name)).predict(QUESTION, top_k=1)
    result = CliRunner().invoke(app, ["repair", str(indexed)])
    assert result.exit_code == 0, result.output
    output = result.output.replace("\n", "")
    assert "TF-IDF segment tfidf_*.npy and tfidf_ndocs.txt (documents 0..5): indexed again" in output, output
    assert not (indexed / "tfidf_ndocs.txt").exists()  # the base now lives in a folder of its own
    store = Datastore(indexed)
    for part in store.parts(tfidf_files.KIND):
        arrays = [np.load(tfidf_files.segment_path(indexed, part.name) / f) for f in tfidf_files.FILES]
        for got, want in zip(arrays, before[part.first]):
            np.testing.assert_array_equal(got, want)  # integers and float32 log1p of counts: the same bytes
    got = retrieval.TfidfIndex.load(store).ranked("cello Vienna born Tallinn boats", 5)
    assert got[0] == ranked[0]
    np.testing.assert_allclose(got[1], ranked[1], rtol=RTOL)
    assert checks.verify(indexed).problems == []
    again = CliRunner().invoke(app, ["repair", str(indexed)])
    assert again.exit_code == 0 and "sound, nothing needs repair" in again.output.replace("\n", "")


def test_damage_to_what_the_store_keeps_is_refused_with_the_build_that_makes_it_again(indexed):
    _flip(indexed / "values.i32", 4)
    _flip(indexed / "faiss.index", 40)  # an index damaged too is left as it is: nothing is written
    before = _files(indexed)
    with pytest.raises(Unrepairable, match=r"cannot be repaired: what it keeps is damaged \(values\.i32\)") as err:
        Writer(Datastore(indexed, check=False)).repair()
    assert any("values.i32 block 0" in problem for problem in err.value.problems)
    message = str(err.value)
    manifest = read_committed(indexed)
    assert (
        f"bertknn build {manifest['corpus']['path']} --out {indexed} --model {manifest['model']} --layer 3" in message
    )
    assert f"bertknn index {indexed} --factory IVF2,Flat --train-size 40 --nprobe 2" in message
    assert "1 documents were added or removed after the build" in message
    assert _files(indexed) == before
    result = CliRunner().invoke(app, ["repair", str(indexed)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "damaged:" in result.output and "error:" in result.output and "values.i32" in result.output
    assert _files(indexed) == before


def test_a_lost_manifest_is_refused_with_the_settings_sqlite_keeps(indexed):
    corpus = read_committed(indexed)["corpus"]["path"]
    (indexed / "manifest.json").write_text("{broken")
    message = rebuild_commands(indexed)
    assert "--model MODEL --layer 3" in message and "MODEL: the model whose weights have sha256" in message
    assert f"bertknn build {corpus} " in message  # the corpus, from the commit record SQLite keeps
    result = CliRunner().invoke(app, ["repair", str(indexed)])
    assert result.exit_code == 2 and "manifest.json" in result.output and "bertknn build" in result.output


def test_repair_waits_for_another_writer(indexed):
    with held_elsewhere(indexed):  # another process's writer
        result = CliRunner().invoke(app, ["repair", str(indexed), "--wait", "0.2"])
    assert result.exit_code == 2 and "one writer at a time" in result.output.replace("\n", " ")


def test_a_sharded_datastore_is_repaired_shard_by_shard_with_its_one_quantizer(tmp_path, encoder):
    path = make_sharded(tmp_path / "sharded", encoder, [SMALL_DOCS[:3], SMALL_DOCS[3:]])
    sharded = ShardedDatastore(path)
    index_keys(sharded, "IVF2,Flat", train_size=40, nprobe=2)
    query = np.asarray(sharded.keys[[5]], np.float32)[0]
    expected = faiss_index.load(sharded).search(query, 6)
    first, second = sharded.shards[0].path, sharded.shards[1].path
    trained = (first / "faiss_trained.index").read_bytes()
    (second / "faiss_trained.index").write_bytes(b"")  # its quantizer is the one the other shard holds too
    _flip(second / "faiss.index", 60)
    _flip(first / "tfidf_docs.npy", 130)
    assert all(checks.verify(s.path).problems for s in sharded.shards)
    done = repair(path)  # (a Writer cannot open it: opening a store checks it)
    assert len(done.rebuilt) == 2 and "TF-IDF segment" in done.rebuilt[0] and "FAISS index" in done.rebuilt[1]
    assert (second / "faiss_trained.index").read_bytes() == trained
    assert [checks.verify(s.path).problems for s in sharded.shards] == [[], []]
    got = faiss_index.load(ShardedDatastore(path)).search(query, 6)
    assert got[0].tolist() == expected[0].tolist()
    np.testing.assert_allclose(got[1], expected[1], rtol=RTOL)
    assert faiss.read_index(str(second / "faiss.index")).ntotal == sharded.shards[1].size
    for shard in (first, second):  # no shard holds the quantizer now: it is trained again on all of them, as built
        (shard / "faiss_trained.index").write_bytes(b"")
    done = repair(path)
    assert [line.split(":")[0] for line in done.rebuilt] == ["shards/shard-00000", "shards/shard-00001"]
    assert (first / "faiss_trained.index").read_bytes() == (second / "faiss_trained.index").read_bytes() == trained
    got = faiss_index.load(ShardedDatastore(path)).search(query, 6)
    assert got[0].tolist() == expected[0].tolist()
    np.testing.assert_allclose(got[1], expected[1], rtol=RTOL)


def test_a_segment_indexed_again_in_pieces_equals_the_one_its_writers_made(indexed):
    store = Datastore(indexed)
    listed = store.parts(tfidf_files.KIND)
    before = {
        part.first: [np.load(tfidf_files.segment_path(indexed, part.name) / f) for f in tfidf_files.FILES]
        for part in listed
    }
    _flip(indexed / "tfidf_hashes.npy", 100)
    done = repair(indexed, segment_docs=2)  # documents 0..5 hashed 2 at a time, then merged as `compact` merges
    assert len(done.rebuilt) == 1 and "(documents 0..5)" in done.rebuilt[0]
    assert not list(indexed.glob("*.tmp"))  # the pieces are gone
    for part in Datastore(indexed).parts(tfidf_files.KIND):
        for name, want in zip(tfidf_files.FILES, before[part.first]):
            np.testing.assert_array_equal(np.load(tfidf_files.segment_path(indexed, part.name) / name), want)
    assert checks.verify(indexed).problems == []
