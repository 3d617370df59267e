"""Files written whole (bertknn/atomic.py): every write of the package goes through it, and what it promises holds:
the old file or the new one, fsynced before its rename, the directory fsynced after, a full disk named."""

from __future__ import annotations

import ast
import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bertknn.store import atomic

from ..conftest import full_after

SRC = Path(atomic.__file__).parents[1]

# Calls that write a file: these methods on anything, these functions of these modules, `open` in a writing mode,
# `.replace(x)` with one argument (pathlib's rename, not str.replace) and memmaps opened for writing. Calls on the
# `atomic` module itself are what every writer should make.
METHODS = {"write_text", "write_bytes", "tofile", "open_memmap", "savefig", "save_file", "mkstemp", "rename"}
FUNCTIONS = {"np": {"save", "savez", "savetxt"}, "shutil": {"copy", "copy2", "copyfile", "copytree", "move"}}
FUNCTIONS |= {"os": {"replace", "rename", "write"}, "faiss": {"write_index"}, "onnx": {"export", "save"}}

# The writes allowed outside atomic.py, each with its reason: none of them writes a file of a datastore.
ALLOWED = {
    ("lock.py", "lock_holder", "open"): "write.lock is the writer lock (flock), not data; it holds a pid",
    ("lock.py", "acquire_lock", "open"): "write.lock, as above",
    ("run.py", "evaluate_facts", "open"): "the results log of `eval lama`, appended a line per fact and resumed",
    ("lama_data.py", "_fetch", "open"): "a download streamed into a temporary file that `download` renames",
    ("lama_data.py", "download", "mkstemp"): "the download's temporary file",
    ("lama_data.py", "download", "replace"): "the download renamed into place",
    ("train_head.py", "_export", "save_file"): "a trained head file (safetensors) written to a temporary name",
    ("train_head.py", "_export", "replace"): "the head file renamed into place",
    ("onnx_backend.py", "export", "export"): "an ONNX model cache file written to a temporary name",
    ("onnx_backend.py", "export", "replace"): "the ONNX cache file renamed into place",
    ("onnx_backend.py", "quantize", "replace"): "the int8 ONNX cache file renamed into place",
    ("report.py", "bar_chart", "savefig"): "a report's figure (reports/), not a datastore file",
    ("report.py", "reliability_chart", "savefig"): "a report's figure (reports/), not a datastore file",
    ("demo.py", "fresh_facts", "copytree"): "the demo copies its store into a temporary directory to add a fact",
    ("edits.py", "copy_datastore", "copytree"): "`eval edits` works on a copy in a temporary directory, the user's "
    "store left as it was; a copy a file changed under is deleted and made again",
    ("edits_report.py", "plot", "savefig"): "a report's figure (reports/), not a datastore file",
}


def _mode(call: ast.Call, position: int) -> str | None:
    """The mode argument of an open() call given as a literal, else None."""
    args = [*call.args[position : position + 1], *(k.value for k in call.keywords if k.arg == "mode")]
    return args[0].value if args and isinstance(args[0], ast.Constant) else None


def _write_sites(src: Path = SRC) -> set[tuple[str, str, str]]:
    """(module, enclosing function, call) of every call that writes a file under `src`, outside atomic.py."""
    found = set()
    for file in sorted(src.rglob("*.py")):
        if file.name == "atomic.py":
            continue
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(func):
                if isinstance(call, ast.Call) and _writes(call):
                    found.add((file.name, func.name, _name(call)))
    return found


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _writes(call: ast.Call) -> bool:
    """True for a call that writes a file (see METHODS and FUNCTIONS)."""
    name, func = _name(call), call.func
    owner = func.value if isinstance(func, ast.Attribute) else None
    module = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
    if module == "atomic":
        return False
    if name in FUNCTIONS.get(module, ()):
        streamed = name == "write_index" and any("CallbackIOWriter" in ast.unparse(a) for a in call.args)
        return not streamed  # FAISS writing into a callback (atomic.write_file's handle) writes no file itself
    if name == "open":
        mode = _mode(call, 1 if owner is None else 0) or "r"
        return any(c in mode for c in "wax+")
    if name == "memmap":
        return _mode(call, 2) not in ("r", "c")
    if name == "replace":
        return owner is not None and len(call.args) == 1 and not call.keywords
    return name in METHODS


def test_no_file_is_written_in_place_outside_atomic():
    sites = _write_sites()
    unexplained = sorted(sites - set(ALLOWED))
    assert not unexplained, (
        f"write a datastore's files with bertknn.store.atomic, or explain the write in ALLOWED: {unexplained}"
    )
    assert not set(ALLOWED) - sites, f"ALLOWED names writes that are gone: {sorted(set(ALLOWED) - sites)}"


def test_the_scan_sees_writes_in_place(tmp_path):
    module = tmp_path / "writer.py"
    module.write_text(
        "def f(p, a):\n    p.write_text('x')\n    open(p, 'ab')\n    p.open('r+b')\n    a.tofile(p)\n"
        "    p.replace(q)\n    'a'.replace('a', 'b')\n    open(p)\n",
        encoding="utf-8",
    )
    assert _write_sites(tmp_path) == {("writer.py", "f", n) for n in ("write_text", "open", "tofile", "replace")}


def _trace(monkeypatch) -> list[tuple[str, str]]:
    """Record fsyncs (of the path the descriptor names) and renames, in order."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1]
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("rename", f"{a} -> {b}")), real_replace(a, b))[1])
    return calls


def test_a_file_is_fsynced_before_its_rename_and_its_directory_after(tmp_path, monkeypatch):
    (tmp_path / "f.json").write_text("old")
    calls = _trace(monkeypatch)
    atomic.write_json(tmp_path / "f.json", {"a": 1})
    assert calls == [
        ("fsync", str(tmp_path / "f.json.tmp")),
        ("rename", f"{tmp_path / 'f.json.tmp'} -> {tmp_path / 'f.json'}"),
        ("fsync", str(tmp_path)),
    ]
    assert (tmp_path / "f.json").read_text() == '{\n  "a": 1\n}' and not (tmp_path / "f.json.tmp").exists()


def test_a_folder_is_published_with_every_file_fsynced_first(tmp_path, monkeypatch):
    folder = atomic.new_folder(tmp_path / "seg")
    (folder / "a.npy").write_bytes(b"1")
    (folder / "sub").mkdir()
    (folder / "sub" / "b").write_bytes(b"2")
    calls = _trace(monkeypatch)
    atomic.publish(folder, tmp_path / "seg")
    synced = [path for what, path in calls[:-2] if what == "fsync"]
    assert set(synced) == {str(folder / "a.npy"), str(folder / "sub" / "b"), str(folder / "sub"), str(folder)}
    assert synced.index(str(folder / "sub" / "b")) < synced.index(str(folder / "sub")) < synced.index(str(folder))
    assert calls[-2:] == [("rename", f"{folder} -> {tmp_path / 'seg'}"), ("fsync", str(tmp_path))]


def test_a_full_disk_names_the_file_and_the_bytes_needed_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "faiss.index"
    target.write_bytes(b"the good index")
    full_after(monkeypatch, 1000, lambda path: path.suffix == ".tmp")
    with pytest.raises(atomic.DiskFullError) as caught:
        atomic.write_file(target, lambda h: [h.write(b"x" * 600) for _ in range(5)])
    assert str(caught.value).startswith(f"no space left for {target}: the write needs 3,000 bytes, ")
    assert "Nothing was damaged" in str(caught.value) and caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"the good index" and list(tmp_path.iterdir()) == [target]


def test_an_append_that_does_not_fit_is_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "keys.f16"
    atomic.append(path, 0, b"a" * 10)
    atomic.append(path, 10, b"b" * 10)
    atomic.append(path, 15, b"c" * 5)  # bytes past the committed length (15) are dropped first
    assert path.read_bytes() == b"a" * 10 + b"b" * 5 + b"c" * 5
    full_after(monkeypatch, 3)
    with pytest.raises(atomic.DiskFullError, match=r"keys.f16: the write needs 8 bytes"):
        atomic.append(path, 20, b"d" * 8)
    assert path.read_bytes() == b"a" * 10 + b"b" * 5 + b"c" * 5


def test_arrays_append_whole_rows_and_an_empty_one_writes_nothing(tmp_path):
    path = tmp_path / "keys.f16"
    rows = np.arange(6, dtype=np.float16).reshape(2, 3)
    atomic.append(path, 0, np.ascontiguousarray(rows).data)
    atomic.append(path, rows.nbytes, np.zeros((0, 3), np.float16).data)  # a document without targets
    assert np.fromfile(path, np.float16).reshape(-1, 3).tolist() == rows.tolist()


def test_a_new_npy_is_a_loadable_array(tmp_path):
    array = atomic.new_npy(tmp_path / "x.npy", np.int64, 5)
    array[:] = np.arange(5)
    array.flush()
    del array
    assert np.load(tmp_path / "x.npy").tolist() == [0, 1, 2, 3, 4]


@pytest.fixture()
def small_fs(tmp_path):
    """A 64 KiB tmpfs (skipped where the machine forbids mounting one)."""
    point = tmp_path / "fs"
    point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)], capture_output=True)
    if made.returncode:
        pytest.skip(f"this machine forbids mounting a tmpfs: {made.stderr!r}")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


def test_on_a_real_full_disk_an_append_is_named_and_cut_back(small_fs):
    path = small_fs / "keys.f16"
    atomic.append(path, 0, b"a" * 1000)
    with pytest.raises(atomic.DiskFullError, match=r"keys\.f16: the write needs 65,000 bytes, "):
        atomic.append(path, 1000, b"b" * 65_000)  # a little more than is free: a buffered write kept the rest
    assert path.read_bytes() == b"a" * 1000


def test_on_a_real_full_disk_a_file_is_named_with_what_it_needed_and_the_old_one_kept(small_fs):
    path = small_fs / "faiss.index"
    atomic.write_bytes(path, b"good")
    with pytest.raises(atomic.DiskFullError, match=r"faiss\.index: the write needs 100,000 bytes, "):
        atomic.write_file(path, lambda handle: [handle.write(b"x" * 1000) for _ in range(100)])
    assert path.read_bytes() == b"good" and [p.name for p in small_fs.iterdir()] == ["faiss.index"]
