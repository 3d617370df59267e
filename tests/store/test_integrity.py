"""Checksums of a datastore's files, per block (src/bertknn/store/integrity.py): what is recorded, extended, forgotten,
saved and loaded, against blake2b-128 digests computed here with hashlib; the damage found when a byte is flipped or a
file truncated, named by file and block."""

from __future__ import annotations

import hashlib
import json

import pytest

from bertknn.store import integrity
from bertknn.store.integrity import ALGORITHM, CHECKSUMS, ChecksumError, Checksums, Damage

SMALL = 64  # bytes per block in these tests, so that a file of a few hundred bytes has several


@pytest.fixture()
def small_blocks(monkeypatch):
    monkeypatch.setattr(integrity, "BLOCK", SMALL)
    return SMALL


def digests(data: bytes, block: int) -> list[str]:
    """blake2b-128 of each `block` bytes of `data`, computed directly."""
    return [hashlib.blake2b(data[i : i + block], digest_size=16).hexdigest() for i in range(0, len(data), block)]


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


DATA = bytes(range(256)) + b"tail of the file"  # 272 bytes: 4 full blocks of 64 and one of 16


def test_record_hashes_each_block_with_blake2b_128(tmp_path, small_blocks):
    (tmp_path / "a.bin").write_bytes(DATA)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    assert sums.files == {"a.bin": {"length": 272, "blocks": digests(DATA, 64)}}
    assert len(sums.files["a.bin"]["blocks"]) == 5
    sums.record("a.bin", 100)  # only the first 100 bytes
    assert sums.files["a.bin"] == {"length": 100, "blocks": digests(DATA[:100], 64)}
    (tmp_path / "empty").write_bytes(b"")
    sums.record("empty")
    assert sums.files["empty"] == {"length": 0, "blocks": []}


def test_record_with_the_real_block_size_is_one_digest_of_a_small_file(tmp_path):
    assert integrity.BLOCK == 16 * 1024 * 1024 and ALGORITHM == "blake2b-128"
    (tmp_path / "a.bin").write_bytes(DATA)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    assert sums.files["a.bin"] == {"length": 272, "blocks": [hashlib.blake2b(DATA, digest_size=16).hexdigest()]}


def test_a_built_datastore_records_each_file_as_it_is_on_disk(built):
    sums = Checksums(built.store.path)
    assert {"keys.f16", "values.i32", "store.sqlite"} <= set(sums.files)
    assert sums.files["keys.f16"]["length"] == built.store.size * built.store.dim * 2
    assert sums.files["values.i32"]["length"] == built.store.size * 4
    for name, record in sums.files.items():
        data = (built.store.path / name).read_bytes()
        size = integrity.block_size(name)  # SQLite's blocks are smaller: its commits rewrite pages in place
        assert record == {"length": len(data), "blocks": digests(data, size)} | (
            {"block": size} if size != integrity.BLOCK else {}
        ), name
    assert sums.verify() == []


def test_extend_hashes_only_the_new_tail_and_equals_a_whole_record(tmp_path, small_blocks, monkeypatch):
    path = tmp_path / "keys"
    path.write_bytes(DATA[:150])  # blocks 0 and 1 full, block 2 holds 22 bytes
    sums = Checksums(tmp_path)
    sums.extend("keys", 150)  # nothing known yet: recorded whole
    assert sums.files["keys"] == {"length": 150, "blocks": digests(DATA[:150], 64)}
    path.write_bytes(DATA)
    real, hashed = integrity._digest, []

    def counting(file, block, length, size=None):
        hashed.append((block, length))
        return real(file, block, length, size)

    monkeypatch.setattr(integrity, "_digest", counting)
    sums.extend("keys", 272)
    # the partly filled block 2 checked as recorded, then blocks 2, 3, 4 hashed; blocks 0 and 1 never read
    assert sorted(hashed) == [(2, 150), (2, 272), (3, 272), (4, 272)]
    assert sums.files["keys"] == {"length": 272, "blocks": digests(DATA, 64)}
    hashed.clear()
    sums.extend("keys", 200)  # shorter than recorded: recorded again from the start
    assert sums.files["keys"] == {"length": 200, "blocks": digests(DATA[:200], 64)}
    assert sorted(hashed) == [(0, 200), (1, 200), (2, 200), (3, 200)]


def test_extend_refuses_to_record_damage_in_the_last_partly_filled_block(tmp_path, small_blocks):
    path = tmp_path / "keys"
    path.write_bytes(DATA[:150])
    sums = Checksums(tmp_path)
    sums.record("keys")
    path.write_bytes(DATA)
    _flip(path, 140)  # inside block 2, which held 22 recorded bytes
    with pytest.raises(ChecksumError, match=r"keys block 2 \(bytes 128-191\): checksum mismatch; `bertknn verify`"):
        sums.extend("keys", 272)
    assert sums.files["keys"] == {"length": 150, "blocks": digests(DATA[:150], 64)}  # unchanged
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "keys").write_bytes(DATA[:128])  # a whole number of blocks: nothing partly filled to check
    whole = Checksums(clean)
    whole.record("keys")
    (clean / "keys").write_bytes(DATA)
    whole.extend("keys", 272)
    assert whole.files["keys"]["blocks"] == digests(DATA, 64)


def test_forget_drops_records_and_ignores_unknown_names(tmp_path, small_blocks):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode() * 100)
    sums = Checksums(tmp_path)
    for name in ("a", "b", "c"):
        sums.record(name)
    sums.forget(["a", "c", "never-recorded"])
    assert sums.files == {"b": {"length": 100, "blocks": digests(b"b" * 100, 64)}}
    sums.forget(iter(["b"]))
    assert sums.files == {}


def test_save_and_load_round_trip(tmp_path, small_blocks):
    (tmp_path / "a.bin").write_bytes(DATA)
    (tmp_path / "b.sqlite").write_bytes(DATA)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    sums.record("b.sqlite")
    sums.meta["sqlite_changes"] = 7
    sums.save()
    on_disk = json.loads((tmp_path / CHECKSUMS).read_text(encoding="utf-8"))
    paged = integrity.PAGED_BLOCK  # SQLite's blocks, kept apart so an older reader does not read them as 16 MiB ones
    assert on_disk == {
        "algorithm": "blake2b-128",
        "block": 64,
        "meta": {"sqlite_changes": 7},
        "files": {"a.bin": {"length": 272, "blocks": digests(DATA, 64)}},
        "paged": {"b.sqlite": {"length": 272, "block": paged, "blocks": digests(DATA, paged)}},
    }
    loaded = Checksums(tmp_path)
    assert (loaded.files, loaded.meta) == (sums.files, sums.meta)
    assert Checksums(tmp_path / "nowhere").files == {}  # no checksums.json: nothing recorded


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "Expecting property name"),
        ('{"algorithm": "md5", "block": 64, "files": {}}', "made with md5 blocks of 64 bytes"),
        ('{"algorithm": "blake2b-128", "block": 128, "files": {}}', "made with blake2b-128 blocks of 128 bytes"),
        ('{"algorithm": "blake2b-128", "block": 64}', "'files'"),
        ("[1, 2]", "'list' object has no attribute 'get'"),
    ],
)
def test_an_unreadable_checksums_file_is_a_checksum_error(tmp_path, small_blocks, content, problem):
    (tmp_path / CHECKSUMS).write_text(content, encoding="utf-8")
    with pytest.raises(ChecksumError) as err:
        Checksums(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / CHECKSUMS} is damaged (")
    assert problem in str(err.value) and str(err.value).endswith("); `bertknn verify --record` rewrites it")
    assert isinstance(err.value, ValueError)


def test_damage_names_its_file_and_block_with_the_block_s_bytes(small_blocks):
    assert str(Damage("keys.f16", 3, "checksum mismatch")) == "keys.f16 block 3 (bytes 192-255): checksum mismatch"
    assert str(Damage("keys.f16", None, "missing")) == "keys.f16: missing"


@pytest.mark.parametrize("offset", [0, 63, 64, 200, 271])
def test_a_flipped_byte_is_found_in_its_block(tmp_path, small_blocks, offset):
    (tmp_path / "a.bin").write_bytes(DATA)
    (tmp_path / "b.bin").write_bytes(DATA)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    sums.record("b.bin")
    assert sums.verify() == []
    _flip(tmp_path / "a.bin", offset)
    block = offset // 64
    assert sums.verify() == [Damage("a.bin", block, "checksum mismatch")]
    start = block * 64
    assert str(sums.verify()[0]) == f"a.bin block {block} (bytes {start}-{start + 63}): checksum mismatch"
    assert sums.verify(["b.bin"]) == []  # only the files named


def test_a_truncated_longer_or_missing_file_is_damage_to_the_whole_file(tmp_path, small_blocks):
    for name in ("short", "long", "gone", "log"):
        (tmp_path / name).write_bytes(DATA)
    sums = Checksums(tmp_path)
    for name in ("short", "long", "gone", "log"):
        sums.record(name)
    sums.save()
    (tmp_path / "short").write_bytes(DATA[:100])
    (tmp_path / "long").write_bytes(DATA + b"x")
    (tmp_path / "log").write_bytes(DATA + b"appended, not yet committed")
    (tmp_path / "gone").unlink()
    assert sums.verify(growing=["log"]) == [
        Damage("gone", None, "missing"),
        Damage("long", None, "273 bytes, 272 recorded"),
        Damage("short", None, "100 bytes, 272 recorded"),
    ]
    assert [str(d) for d in sums.verify(["log"])] == ["log: 299 bytes, 272 recorded"]  # not said to be growing
    _flip(tmp_path / "log", 280)  # in the uncommitted tail: not checked
    assert sums.verify(["log"], growing=["log"]) == []
    _flip(tmp_path / "log", 10)
    assert sums.verify(["log"], growing=["log"]) == [Damage("log", 0, "checksum mismatch")]


def test_a_missing_file_whose_record_a_writer_dropped_is_not_damage(tmp_path, small_blocks):
    for name in ("kept", "merged"):
        (tmp_path / name).write_bytes(DATA)
    reader = Checksums(tmp_path)
    reader.record("kept")
    reader.record("merged")
    reader.save()
    writer = Checksums(tmp_path)  # another process's writer: drops the record, then deletes the file
    writer.forget(["merged"])
    writer.save()
    (tmp_path / "merged").unlink()
    assert reader.verify() == []
    (tmp_path / "kept").unlink()  # deleted with its record still on disk: damage
    assert reader.verify() == [Damage("kept", None, "missing")]


def test_verify_only_looks_again_at_the_damage_given(tmp_path, small_blocks):
    (tmp_path / "a.bin").write_bytes(DATA)
    (tmp_path / "b.bin").write_bytes(DATA)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    sums.record("b.bin")
    _flip(tmp_path / "a.bin", 70)
    _flip(tmp_path / "a.bin", 260)
    _flip(tmp_path / "b.bin", 5)
    found = sums.verify()
    assert found == [
        Damage("a.bin", 1, "checksum mismatch"),
        Damage("a.bin", 4, "checksum mismatch"),
        Damage("b.bin", 0, "checksum mismatch"),
    ]
    assert sums.verify(only=found[1:2]) == found[1:2]
    _flip(tmp_path / "a.bin", 260)  # repaired
    assert sums.verify(only=found) == [found[0], found[2]]
    assert sums.verify(["b.bin"], only=found) == [found[2]]


def test_verify_reports_progress_and_samples_blocks_plus_each_file_s_last(tmp_path, small_blocks):
    data = bytes(range(256)) * 3  # 768 bytes: 12 blocks
    (tmp_path / "a.bin").write_bytes(data)
    sums = Checksums(tmp_path)
    sums.record("a.bin")
    calls = []
    assert sums.verify(progress=lambda done, total: calls.append((done, total))) == []
    assert calls == [(12, 12)]
    for block in range(12):  # every block damaged: the blocks checked are the blocks reported
        _flip(tmp_path / "a.bin", block * 64 + 1)
    sampled = sums.verify(sample=4, seed=3)
    blocks = [d.block for d in sampled]
    assert blocks == sorted(set(blocks)) and len(blocks) in (4, 5) and blocks[-1] == 11
    assert sums.verify(sample=4, seed=3) == sampled  # the same seed: the same blocks
    assert [d.block for d in sums.verify(sample=12)] == list(range(12))  # as many as there are: all


def test_a_file_a_writer_deleted_after_dropping_its_checksums_is_not_damage_to_a_reader(built, monkeypatch):
    """A reader that read checksums.json before a merge deleted index parts (their records dropped first) sees no
    damage, whether the file is gone before its size is read or while its blocks are hashed; a file deleted without
    its record dropped is still damage."""
    from bertknn.store import integrity

    built.add_documents([{"id": "x1", "title": "X 1", "text": "Town 1 lies in Norway."}])
    segment = next(p for p in built.store.path.glob("tfidf_add_*") if p.is_dir())
    names = [str(f.relative_to(built.store.path)) for f in sorted(segment.iterdir())]
    before = integrity.Checksums(built.store.path)  # what a reader read before the merge
    assert set(names) <= set(before.files)
    real, calls = integrity._digest, []

    def vanishing(path, block, length, size=None):  # the first file hashed disappears just then (a writer's merge)
        if not calls:
            calls.append(path)
            sums = integrity.Checksums(built.store.path)  # what the merging writer's `rewriting` does first
            sums.forget([str(path.relative_to(built.store.path))])
            sums.save()
            path.unlink()
        return real(path, block, length, size)

    monkeypatch.setattr(integrity, "_digest", vanishing)
    assert before.verify(names) == []
    monkeypatch.setattr(integrity, "_digest", real)
    sums = integrity.Checksums(built.store.path)  # a writer's `rewriting`: the record dropped first
    sums.forget([names[1]])
    sums.save()
    (built.store.path / names[1]).unlink()
    assert before.verify(names[1:2]) == []  # gone before its size was read
    (built.store.path / names[2]).unlink()  # deleted without its record dropped: damage
    assert [(d.file, d.problem) for d in before.verify(names[2:3])] == [(names[2], "missing")]
