"""Damage every kind of file of a datastore and run the commands on it: each must answer correctly or fail with a
one-line error naming the damaged file (or the datastore directory), never with a traceback and never with a
silently wrong answer; `verify` must find (exit 1, naming the file) every damage of a checksummed file.

The datastore has a FAISS index (`index --factory Flat`) and one `add` (so a tfidf_add_ segment exists); a second one,
pruned and with SQ8 keys, has the files of compressed keys and counts (keys.codes, keys.codec, counts.i32). Every case
damages a fresh copy. Default: one kind of damage per file, and only `ask` (plus `ask --retrieval faiss` for the
FAISS files) and `verify`; `--long`: every kind on every file, and `add`, `remove` and `index` too (each on its own
copy, followed by the `ask` that shows its effect).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from ..conftest import write_corpus
from .conftest import TORCH, Result, born_docs, long_mode, make_docs

BASE_DOCS = 30
SEGMENT = f"tfidf_add_{BASE_DOCS:09d}"  # the IR segment of the documents of the one `add`
TFIDF = ["tfidf_hashes.npy", "tfidf_indptr.npy", "tfidf_docs.npy", "tfidf_logtf.npy", "tfidf_ndocs.txt"]
FILES = [
    "keys.f16",
    "values.i32",
    "store.sqlite",
    *TFIDF,
    *(f"{SEGMENT}/{name}" for name in TFIDF),
    "faiss.index",
    "faiss.json",
    "manifest.json",
    "checksums.json",
]
NOT_CHECKSUMMED = {"manifest.json", "checksums.json"}  # every other file of a datastore is covered by checksums.json
KINDS = ["flip", "zero4k", "trunc_half", "trunc0", "delete", "append"]
MANIFEST_KINDS = [
    *(f"drop:{f}" for f in ("format", "version", "model", "model_hash", "layer", "dim", "status")),
    "layer:other",
    "dim:string",
]
DEFAULT_CASES = [
    ("keys.f16", "flip"),
    ("keys.f16", "append"),
    ("values.i32", "zero4k"),
    ("store.sqlite", "trunc_half"),
    ("tfidf_hashes.npy", "trunc0"),
    ("tfidf_indptr.npy", "delete"),
    ("tfidf_docs.npy", "flip"),
    ("tfidf_logtf.npy", "zero4k"),
    ("tfidf_ndocs.txt", "flip"),
    (f"{SEGMENT}/tfidf_docs.npy", "trunc_half"),
    ("faiss.index", "flip"),
    ("faiss.json", "delete"),
    ("manifest.json", "drop:layer"),
    ("manifest.json", "dim:string"),
    ("checksums.json", "trunc_half"),
]
COMPRESSED_FILES = ["keys.codes", "keys.codec", "counts.i32"]  # a pruned store with SQ8 keys (`Store(compressed=True)`)
COMPRESSED_CASES = [
    ("keys.codes", "flip"),
    ("keys.codes", "append"),
    ("keys.codec", "trunc_half"),
    ("counts.i32", "zero4k"),
]
READERS = ["ask", "ask-faiss", "verify"]
WRITERS = ["add", "remove", "index"]
RESULTS: list[dict] = []


def cases(long: bool) -> list[tuple[str, str]]:
    if not long:
        return DEFAULT_CASES
    return [(f, k) for f in FILES for k in KINDS] + [("manifest.json", k) for k in MANIFEST_KINDS]


def pytest_generate_tests(metafunc):
    long = long_mode(metafunc.config)
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", cases(long), ids=lambda c: f"{c[0]}:{c[1]}")
    if "compressed_case" in metafunc.fixturenames:
        chosen = [(f, k) for f in COMPRESSED_FILES for k in KINDS] if long else COMPRESSED_CASES
        metafunc.parametrize("compressed_case", chosen, ids=lambda c: f"{c[0]}:{c[1]}")


def harmless(file: str, kind: str) -> bool:
    """Garbage past the committed length of an append-only file: what a killed writer leaves, not damage."""
    return kind == "append" and file in ("keys.f16", "values.i32", "keys.codes", "counts.i32")


class Store:
    """The undamaged datastore and what each command answers on it."""

    def __init__(self, root: Path, cli, model: Path, compressed: bool = False) -> None:
        """`compressed`: the store is a pruning of the built one (`prune --radius inf`) with SQ8 keys."""
        self.cli, self.path = cli, root / "store"
        docs = make_docs(BASE_DOCS, 20, seed=3, prefix="doc")
        corpus = write_corpus(root / "corpus.jsonl", docs)
        built = root / "built" if compressed else self.path
        self._ok(cli.run(["build", corpus, "--out", built, "--model", model, *TORCH]))
        if compressed:
            self._ok(cli.run(["prune", built, self.path, "--radius", "inf"]))
            self._ok(cli.run(["convert-keys", self.path, "--key-codec", "SQ8"]))
        self._ok(cli.run(["index", self.path, "--factory", "Flat", "--threads", "1"]))
        self._ok(cli.run(["add", self.path, write_corpus(root / "fresh.jsonl", born_docs([1, 2, 3], "Fresh")), *TORCH]))
        assert (self.path / SEGMENT).is_dir(), sorted(p.name for p in self.path.iterdir())
        self.extra = write_corpus(root / "extra.jsonl", born_docs([7, 8], "Extra"))
        title = docs[5]["title"]
        self.ask = [f"{title} was born in [MASK] .", "--subject", title, *TORCH]
        self.ask_extra = ["Extra 7 was born in [MASK] .", "--subject", "Extra 7", *TORCH]
        self.reference: dict[str, Result] = {}
        for command in (*READERS, *WRITERS):
            copy = root / f"clean-{command}"
            shutil.copytree(self.path, copy)
            result, after = self.run(command, copy)
            self.reference[command] = self._ok(after or result)

    @staticmethod
    def _ok(result: Result) -> Result:
        assert result.rc == 0 and not result.traceback, result.describe() + "\n" + result.text[-3000:]
        return result

    def run(self, command: str, store: Path) -> tuple[Result, Result | None]:
        """Run a command on a store; for a writer that exits 0, also the `ask` that shows its effect."""
        args = {
            "ask": ["ask", store, *self.ask],
            "ask-faiss": ["ask", store, *self.ask, "--retrieval", "faiss"],
            "verify": ["verify", store],
            "add": ["add", store, self.extra, *TORCH],
            "remove": ["remove", store, "--doc", "doc5"],
            "index": ["index", store, "--factory", "Flat", "--threads", "1"],
        }[command]
        result = self.cli.run(args)
        if command not in WRITERS or result.rc != 0:
            return result, None
        question = {"add": self.ask_extra, "remove": self.ask, "index": [*self.ask, "--retrieval", "faiss"]}[command]
        return result, self.cli.run(["ask", store, *question])


@pytest.fixture(scope="module")
def store(tmp_path_factory, cli, tiny_model_dir) -> Store:
    return Store(tmp_path_factory.mktemp("damage"), cli, tiny_model_dir)


@pytest.fixture(scope="module")
def compressed_store(tmp_path_factory, cli, tiny_model_dir) -> Store:
    return Store(tmp_path_factory.mktemp("damage-compressed"), cli, tiny_model_dir, compressed=True)


@pytest.fixture(scope="module", autouse=True)
def record(figures, store, long):
    yield
    if not RESULTS:
        return
    columns = READERS + (WRITERS if long else [])
    lines = [
        "| file | damage | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for r in RESULTS:
        lines.append(f"| {r['file']} | {r['kind']} | " + " | ".join(r["outcomes"].get(c, "") for c in columns) + " |")
    made = [r for r in RESULTS if r["made"]]
    checksummed = [r for r in made if r["file"] not in NOT_CHECKSUMMED and not harmless(r["file"], r["kind"])]
    outcomes = Counter(o for r in made for o in r["outcomes"].values())
    summary = {
        "damage_made": len(made),
        "no_op_damage_skipped": len(RESULTS) - len(made),
        "checksummed_file_damage": len(checksummed),
        "found_by_verify": sum(r["outcomes"].get("verify") == "found" for r in checksummed),
        "any_damage_reported_by_verify": sum(r["outcomes"].get("verify") == "found" for r in made),
        "runs": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "violations": sum(len(r["violations"]) for r in RESULTS),
    }
    legend = (
        "Outcomes: ok = exit 0 with the undamaged store's answer; err = non-zero exit, the error names the damaged "
        "file; err(dir) = names the datastore directory only; found = verify exit 1 naming the file; sound = verify "
        "exit 0; MISSED = verify exit 0 on damage it must find; WRONG = exit 0 with another answer than the "
        "undamaged store's; UNNAMED = error naming neither file nor directory; TB = traceback; ok/err after a writer: "
        "the writer exited 0 and the `ask` after it answered correctly / reported the damage."
    )
    text = "\n".join(
        [
            f"Summary: {json.dumps(summary)}",
            "",
            legend,
            "",
            *lines,
            "",
            "Violations:",
            *([f"- {r['file']} {r['kind']}: {v}" for r in RESULTS for v in r["violations"]] or ["- none"]),
        ]
    )
    figures.add("damaged files (test_damage.py)", {"summary": summary, "cases": RESULTS}, text)


def damage(path: Path, kind: str, rng: random.Random) -> str | None:
    """Damage one file in place; a description, or None when the damage would change nothing."""
    if kind == "delete":
        path.unlink()
        return "deleted"
    data = bytearray(path.read_bytes())
    if kind == "flip":
        if not data:
            return None
        offset = rng.randrange(len(data))
        data[offset] ^= 0xFF
        path.write_bytes(data)
        return f"byte {offset} of {len(data)} flipped"
    if kind == "zero4k":
        n = min(4096, len(data))
        for _ in range(100):
            offset = rng.randrange(len(data) - n + 1)
            if any(data[offset : offset + n]):
                data[offset : offset + n] = bytes(n)
                path.write_bytes(data)
                return f"{n} bytes zeroed at {offset} of {len(data)}"
        return None
    if kind in ("trunc_half", "trunc0"):
        size = len(data) // 2 if kind == "trunc_half" else 0
        if size == len(data):
            return None
        with path.open("r+b") as handle:
            handle.truncate(size)
        return f"truncated from {len(data)} to {size} bytes"
    if kind == "append":
        garbage = bytes(rng.getrandbits(8) for _ in range(4099))
        with path.open("ab") as handle:
            handle.write(garbage)
        return f"{len(garbage)} random bytes appended to {len(data)}"
    manifest = json.loads(data)
    if kind.startswith("drop:"):
        manifest.pop(kind[5:])
    elif kind == "layer:other":
        manifest["layer"] = manifest["layer"] - 1
    elif kind == "dim:string":
        manifest["dim"] = str(manifest["dim"])
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return kind


def names(text: str, store: Path, file: str, directory_too: bool) -> bool:
    """Whether an error line names the damaged file (its path, or its name within the store), or the store."""
    if str(store / file) in text or re.search(r"(?<![\w/.])" + re.escape(file), text):
        return True
    return directory_too and str(store) in text


def judge(
    store: Path, file: str, kind: str, command: str, result: Result, after: Result | None, ref: Result, ask_ok: bool
) -> tuple[str, str | None]:
    """(outcome, violation or None) of one command on one damaged store."""
    if result.traceback or (after is not None and after.traceback):
        shown = result if result.traceback else after
        return "TB", f"{command}: {shown.traceback_summary()}"
    if command == "verify":
        if result.rc == 0:
            if harmless(file, kind) or (file in NOT_CHECKSUMMED and ask_ok):
                return "sound", None
            return "MISSED", f"verify exits 0 on this damage: {result.text.strip().splitlines()[-1:]}"
        lines = result.error_lines()
        if result.rc == 1 and any(names(line, store, file, file in NOT_CHECKSUMMED) for line in lines):
            return "found", None
        return "UNNAMED", f"verify exits {result.rc} without naming {file}: {lines[:3] or result.text[-300:]!r}"
    if result.rc == 0:
        shown = after or result
        if shown.rc == 0:
            if shown.out == ref.out:
                return "ok", None
            return "WRONG", f"{command} exits 0 with an answer other than the undamaged store's ({shown.describe()})"
        result = shown  # the writer exited 0; the question after it reports the damage (or not)
    lines = result.error_lines()
    specific = command == "ask-faiss" and file == "faiss.index"  # the FAISS path must name faiss.index itself
    if any(names(line, store, file, directory_too=False) for line in lines):
        return "err", None
    if any(names(line, store, file, directory_too=True) for line in lines):
        if specific:
            return "err(dir)", f"ask --retrieval faiss must name faiss.index: {lines[:1]!r}"
        return "err(dir)", None
    return "UNNAMED", f"{command} exits {result.rc}; its error names neither {file} nor the datastore: {lines[:2]!r}"


def test_damaged_file_is_reported_never_answered_wrong(store, case, long, rng, tmp_path):
    _damage_and_run(store, case, long, rng, tmp_path)


def test_damaged_file_of_a_pruned_compressed_store_is_reported_never_answered_wrong(
    compressed_store, compressed_case, long, rng, tmp_path
):
    _damage_and_run(compressed_store, compressed_case, long, rng, tmp_path)


def _damage_and_run(store: Store, case: tuple[str, str], long: bool, rng, tmp_path: Path) -> None:
    """Damage a copy of `store` as `case` says, run the commands on it and judge each (`judge`)."""
    file, kind = case
    commands = ["ask", "verify"] + (["ask-faiss"] if long or file.startswith("faiss") else [])
    commands += WRITERS if long else []
    template = tmp_path / "store"
    shutil.copytree(store.path, template)
    made = damage(template / file, kind, rng)
    row = {"file": file, "kind": kind, "made": made, "outcomes": {}, "violations": []}
    RESULTS.append(row)
    if made is None:
        pytest.skip(f"{kind} would not change {file}")
    ask_ok = True
    for command in sorted(commands, key=lambda c: (c in WRITERS, c == "verify")):  # ask first, writers last
        target = template
        if command in WRITERS:
            target = tmp_path / f"copy-{command}"
            shutil.copytree(template, target)
        result, after = store.run(command, target)
        outcome, violation = judge(target, file, kind, command, result, after, store.reference[command], ask_ok)
        if command == "ask":
            ask_ok = outcome == "ok"
        if file.startswith("faiss") and command == "ask" and outcome != "ok":
            violation = f"IR ask must answer despite damaged FAISS files, got {outcome}: {result.describe()}"
        row["outcomes"][command] = outcome
        if violation:
            row["violations"].append(violation)
    print(f"{file} {kind} ({made}): {row['outcomes']}")
    assert row["violations"] == []
