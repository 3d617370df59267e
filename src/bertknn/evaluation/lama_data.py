"""LAMA probe data: download LAMA's official data.zip and verify a local copy file by file.

The evaluation reads LAMA's facts (TREx, Google-RE, ConceptNet, SQuAD) from a directory in the layout of the zip,
`<root>/data/TREx/P19.jsonl` and so on. Results are only comparable with published numbers when those files are
LAMA's own, so the package ships the git blob SHA-1 of every file of data.zip (`data/lama_blob_sha1.txt`, one
`<sha1>  <path in zip>  <note>` per line) and `verify` hashes a local copy against it: a file is `ok`, `modified`
or `missing`. Git blob hashes (SHA-1 of `b"blob <size>\\0" + content`) are used so that a copy can be checked by hand
with `git hash-object FILE`.

`download` fetches data.zip with urllib into a temporary file, renames it into place, unzips it (refusing members
whose paths would land outside the destination) and verifies the result. When the network is unreachable it raises
`LamaDataError` explaining how to download and unzip the archive by hand.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

LAMA_URL = "https://dl.fbaipublicfiles.com/LAMA/data.zip"
HASH_LIST = "lama_blob_sha1.txt"
ZIP_NAME = "data.zip"
_BLOCK = 1 << 20


class LamaDataError(RuntimeError):
    """LAMA's data could not be downloaded, unpacked or found."""


@dataclass
class VerifyResult:
    """Outcome of `verify`: paths inside data.zip (e.g. `data/TREx/P19.jsonl`), sorted, by status."""

    ok: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Number of files checked."""
        return len(self.ok) + len(self.modified) + len(self.missing)

    @property
    def passed(self) -> bool:
        """True when every listed file is present and unmodified."""
        return not self.modified and not self.missing


def git_blob_sha1(path: str | os.PathLike[str]) -> str:
    """The git blob hash of a file (what `git hash-object` prints), read in blocks."""
    path = Path(path)
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def expected_hashes() -> dict[str, str]:
    """Path inside data.zip -> git blob SHA-1, from the list shipped with the package."""
    text = (files("bertknn") / "data" / HASH_LIST).read_text(encoding="utf-8")
    hashes: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or len(fields[0]) != 40:
            raise LamaDataError(f"{HASH_LIST} line {number} is not `<sha1>  <path>`: {line!r}")
        hashes[fields[1]] = fields[0].lower()
    return hashes


def _local_path(root: Path, name: str) -> Path:
    """Where the zip member `name` (`data/...`) lives under `root` (either layout)."""
    if (root / "data").is_dir():
        return root / name
    parts = PurePosixPath(name).parts
    return root.joinpath(*parts[1:]) if parts and parts[0] == "data" else root / name


def verify(root: str | os.PathLike[str]) -> VerifyResult:
    """Hash every file listed for data.zip under `root` (which contains `data/`, or is that `data` dir)."""
    root = Path(root)
    if not root.is_dir():
        raise LamaDataError(f"{root} is not a directory")
    result = VerifyResult()
    for name, sha1 in sorted(expected_hashes().items()):
        path = _local_path(root, name)
        if not path.is_file():
            result.missing.append(name)
        elif git_blob_sha1(path) == sha1:
            result.ok.append(name)
        else:
            result.modified.append(name)
    return result


def report_lines(result: VerifyResult) -> list[str]:
    """Human-readable lines for a `VerifyResult`: the counts, then each modified and each missing file."""
    lines = [
        f"{len(result.ok)} of {result.total} files of LAMA's data.zip match, "
        f"{len(result.modified)} modified, {len(result.missing)} missing"
    ]
    lines += [f"modified: {name}" for name in result.modified]
    lines += [f"missing:  {name}" for name in result.missing]
    if result.passed:
        lines.append("all files are LAMA's own")
    return lines


def _manual_hint(dest: Path) -> str:
    return (
        f"You can download data.zip by hand from {LAMA_URL}, unzip it into {dest} "
        f"(so that {dest / 'data' / 'TREx' / 'P19.jsonl'} exists), "
        f"then run `bertknn data lama --dest {dest} --verify-only`."
    )


def _fetch(url: str, target: Path, timeout: float, console: Console | None, show_progress: bool) -> None:
    """Stream `url` into the open-for-writing file `target`, with a progress bar (bytes, rate, ETA)."""
    columns = (
        TextColumn("[bold]LAMA data.zip"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with urllib.request.urlopen(url, timeout=timeout) as response, target.open("wb") as out:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        written = 0
        with Progress(*columns, console=console, disable=not show_progress) as progress:
            task = progress.add_task("download", total=total)
            while block := response.read(_BLOCK):
                out.write(block)
                written += len(block)
                progress.advance(task, len(block))
        if total is not None and written != total:
            raise http.client.IncompleteRead(b"", total - written)


def _check_members(archive: zipfile.ZipFile, dest: Path) -> None:
    """Refuse the archive if any member's path is absolute or would land outside `dest`."""
    base = dest.resolve()
    for info in archive.infolist():
        name = info.filename.replace("\\", "/")
        pure = PurePosixPath(name)
        target = (base / pure).resolve()
        drive = re.match(r"[A-Za-z]:", name) is not None
        if pure.is_absolute() or drive or ".." in pure.parts or not target.is_relative_to(base):
            raise LamaDataError(f"refusing to unzip: member {info.filename!r} would be written outside {dest}")


def download(
    dest: str | os.PathLike[str],
    url: str = LAMA_URL,
    timeout: float = 60,
    *,
    console: Console | None = None,
    show_progress: bool = True,
) -> Path:
    """Download data.zip from `url`, unzip it into `dest`, verify it and return `dest`.

    The archive is written to a temporary file in `dest` and renamed to `dest/data.zip` once complete. Raises
    `LamaDataError` when the download fails, the archive is not a zip or has unsafe member paths, or the unpacked
    files do not match the shipped hash list.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    handle, part_name = tempfile.mkstemp(prefix=f"{ZIP_NAME}.", suffix=".part", dir=dest)
    os.close(handle)
    part = Path(part_name)
    archive_path = dest / ZIP_NAME
    try:
        try:
            _fetch(url, part, timeout, console, show_progress)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            plain_url_error = isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError)
            reason = err.reason if plain_url_error else err
            raise LamaDataError(f"Downloading LAMA's data from {url} failed: {reason}.\n{_manual_hint(dest)}") from err
        os.replace(part, archive_path)
    finally:
        part.unlink(missing_ok=True)

    try:
        with zipfile.ZipFile(archive_path) as archive:
            _check_members(archive, dest)
            archive.extractall(dest)
    except zipfile.BadZipFile as err:
        raise LamaDataError(f"{archive_path} (from {url}) is not a zip archive: {err}.\n{_manual_hint(dest)}") from err

    result = verify(dest)
    if not result.passed:
        details = "\n".join(report_lines(result))
        raise LamaDataError(f"the files unzipped from {url} into {dest} do not match LAMA's data.zip:\n{details}")
    return dest
