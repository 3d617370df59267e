"""LAMA data module: git blob hashes, verification of a local copy, and download + unzip from a real local server."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from bertknn.evaluation import lama_data
from bertknn.evaluation.lama_data import (
    LAMA_URL,
    LamaDataError,
    VerifyResult,
    download,
    expected_hashes,
    git_blob_sha1,
    report_lines,
    verify,
)

SHARED_DATA = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
LAMA_DATA = SHARED_DATA / "lama" / "data"
# Small files of the shared copy that are byte-identical to LAMA's data.zip.
REAL_FILES = ["data/Google_RE/place_of_death_test.jsonl", "data/Squad/test.jsonl", "data/relations.jsonl"]


def git_hash_object(path: Path) -> str:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return subprocess.run(["git", "hash-object", str(path)], check=True, capture_output=True, text=True).stdout.strip()


# --- hashes -----------------------------------------------------------------------------------------------------


def test_git_blob_sha1_known_value(tmp_path):
    path = tmp_path / "hello.txt"
    path.write_bytes(b"hello\n")
    assert git_blob_sha1(path) == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert git_blob_sha1(str(path)) == "ce013625030ba8dba906f756967f9e9ca394464a"


@pytest.mark.parametrize("content", [b"", b"\x00\xffbinary\r\n" * 3, bytes(range(256)) * 4])
def test_git_blob_sha1_matches_git_hash_object(tmp_path, monkeypatch, content):
    monkeypatch.setattr(lama_data, "_BLOCK", 7)  # many blocks, the last one partial
    path = tmp_path / "file.bin"
    path.write_bytes(content)
    assert git_blob_sha1(path) == git_hash_object(path)


def test_expected_hashes_are_the_shipped_list():
    hashes = expected_hashes()
    assert len(hashes) == 47
    assert hashes["data/Squad/test.jsonl"] == "fcde22deaf533447297bd4cfb5025705a32fc92c"
    assert {"data/TREx/P19.jsonl", "data/ConceptNet/test.jsonl", "data/relations.jsonl"} <= set(hashes)
    assert all(name.startswith("data/") for name in hashes)
    assert all(len(sha1) == 40 and int(sha1, 16) >= 0 for sha1 in hashes.values())


# --- verify -----------------------------------------------------------------------------------------------------


@pytest.fixture()
def real_copy(tmp_path) -> Path:
    """A root in LAMA's layout holding a copy of three small real files."""
    if not LAMA_DATA.is_dir():
        pytest.skip(f"LAMA data not found at {LAMA_DATA} (set BERTKNN_DATA to the shared data directory)")
    root = tmp_path / "lama"
    for name in REAL_FILES:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(LAMA_DATA.parent / name, target)
    return root


def test_verify_real_files_ok_and_the_rest_missing(real_copy):
    result = verify(real_copy)
    assert result.ok == sorted(REAL_FILES)
    assert result.modified == []
    assert result.missing == sorted(set(expected_hashes()) - set(REAL_FILES))
    assert result.total == 47 and not result.passed


def test_verify_accepts_the_inner_data_dir(real_copy):
    assert verify(real_copy / "data") == verify(real_copy)


def test_verify_detects_one_changed_byte(real_copy):
    path = real_copy / "data/Squad/test.jsonl"
    content = bytearray(path.read_bytes())
    content[100] ^= 0x01
    path.write_bytes(bytes(content))
    result = verify(real_copy)
    assert result.modified == ["data/Squad/test.jsonl"]
    assert result.ok == sorted(set(REAL_FILES) - {"data/Squad/test.jsonl"})


def test_verify_rejects_a_missing_root(tmp_path):
    with pytest.raises(LamaDataError, match="not a directory"):
        verify(tmp_path / "nowhere")


def test_report_lines():
    result = VerifyResult(ok=["data/a.jsonl", "data/b.jsonl"], modified=["data/c.jsonl"], missing=["data/d.jsonl"])
    lines = report_lines(result)
    assert lines[0] == "2 of 4 files of LAMA's data.zip match, 1 modified, 1 missing"
    assert lines[1:] == ["modified: data/c.jsonl", "missing:  data/d.jsonl"]
    assert report_lines(VerifyResult(ok=["data/a.jsonl"]))[-1] == "all files are LAMA's own"


# --- download ---------------------------------------------------------------------------------------------------


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture()
def server(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving files of a temporary directory; yields (directory, base url)."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


ZIP_FILES = {
    "data/relations.jsonl": b'{"relation": "P19", "template": "[X] was born in [Y] ."}\n',
    "data/TREx/P19.jsonl": b'{"sub_label": "Alan Turing", "obj_label": "London"}\n' * 50,
    "data/Squad/test.jsonl": '{"masked_sentences": ["caf\u00e9 [MASK]"]}\n'.encode(),
}


def make_zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)


@pytest.fixture()
def zip_hashes(tmp_path, monkeypatch) -> dict[str, str]:
    """Make `expected_hashes` return the git blob hashes of ZIP_FILES."""
    hashes = {}
    for name, content in ZIP_FILES.items():
        path = tmp_path / "hashing"
        path.write_bytes(content)
        hashes[name] = git_hash_object(path)
    monkeypatch.setattr(lama_data, "expected_hashes", lambda: dict(hashes))
    return hashes


def test_download_unzips_and_verifies(server, tmp_path, zip_hashes):
    served, url = server
    make_zip(served / "data.zip", ZIP_FILES)
    dest = tmp_path / "dest"
    assert download(dest, url=f"{url}/data.zip", timeout=5) == dest
    for name, content in ZIP_FILES.items():
        assert (dest / name).read_bytes() == content
    assert (dest / "data.zip").read_bytes() == (served / "data.zip").read_bytes()
    assert not list(dest.glob("*.part"))
    assert verify(dest).ok == sorted(zip_hashes)


def test_download_with_wrong_content_fails_verification(server, tmp_path, zip_hashes):
    served, url = server
    make_zip(served / "data.zip", {**ZIP_FILES, "data/TREx/P19.jsonl": b"changed\n"})
    with pytest.raises(LamaDataError, match=r"do not match[\s\S]*modified: data/TREx/P19\.jsonl"):
        download(tmp_path / "dest", url=f"{url}/data.zip", timeout=5, show_progress=False)


@pytest.mark.parametrize("evil", ["../evil.txt", "data/../../evil.txt", "{tmp}/evil.txt"])
def test_download_refuses_members_escaping_dest(server, tmp_path, zip_hashes, evil):
    served, url = server
    member = evil.format(tmp=tmp_path.as_posix())  # the absolute case points into tmp_path too
    make_zip(served / "data.zip", {"data/relations.jsonl": b"{}\n", member: b"owned\n"})
    dest = tmp_path / "dest"
    before = set(tmp_path.rglob("*"))
    with pytest.raises(LamaDataError, match="refusing to unzip"):
        download(dest, url=f"{url}/data.zip", timeout=5, show_progress=False)
    created = set(tmp_path.rglob("*")) - before
    assert created == {dest, dest / "data.zip"}  # nothing unzipped, nothing outside dest


def test_download_http_error_and_not_a_zip(server, tmp_path, zip_hashes):
    served, url = server
    with pytest.raises(LamaDataError, match="404"):
        download(tmp_path / "a", url=f"{url}/absent.zip", timeout=5, show_progress=False)
    (served / "page.html").write_text("<html>not a zip</html>")
    with pytest.raises(LamaDataError, match="not a zip archive"):
        download(tmp_path / "b", url=f"{url}/page.html", timeout=5, show_progress=False)


def test_download_unreachable_explains_manual_download(tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dest = tmp_path / "dest"
    with pytest.raises(LamaDataError) as caught:
        download(dest, url=f"http://127.0.0.1:{port}/data.zip", timeout=5, show_progress=False)
    message = str(caught.value)
    assert "failed" in message and "by hand" in message
    assert LAMA_URL in message and str(dest) in message and "--verify-only" in message
    assert list(dest.iterdir()) == []  # the temporary file is removed
