"""Writes: an add of one document, an add of 100 and a remove of one on a copy of the demo datastore, by this tree's
code and a baseline revision's, side by side.

    python bench/writes.py [--baseline REV] [--rounds 3] [--repeats 10] [--threads 2] [--profile] [--smoke]

Each round runs one worker process per tree, alternating (this tree's, then the baseline's: a git worktree of REV in
a temporary folder, its src/ first on the path). A worker copies the demo corpus's cached datastore (`bertknn demo`
builds it; made here when missing), loads it with the default model in ONNX Runtime at --threads (`BertKNN.load`, the
writer side included), adds one document to warm up, then times --repeats adds of one new document each
(`add_documents`: the model's keys and evidence vectors, TF-IDF, the commit, the checksums), one add of 100 new
documents, and --repeats removes of one (`remove_documents`). The documents are invented, each a title and two
sentences of the demo corpus's length. Prints each tree's medians over all rounds (ms; an add of 100 also per
document) and this tree's over the baseline's. --profile: the functions that take most of an add of one document,
per tree (cProfile, cumulative). --smoke: one round, two repeats, a batch of 5, one thread, no baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITIES = ["Tallinn", "Bergen", "Zurich", "Madrid", "Oslo", "Porto", "Lyon", "Gdansk", "Turku", "Ghent"]
CRAFTS = ["clocks", "boats", "violins", "bridges", "maps", "lamps", "bells", "looms"]


def document(n: int) -> dict:
    """An invented document of the demo corpus's length, its id, title and facts made from `n`."""
    name = f"Orla Vesk{n:05d}"
    city, craft = CITIES[n % len(CITIES)], CRAFTS[n % len(CRAFTS)]
    text = f"{name} was born in {city} in {1900 + n % 100}. She repairs old {craft} in a shop by the harbour."
    return {"id": f"bench-{n}", "title": name, "text": text}


def worker(args: argparse.Namespace) -> None:
    """One tree's measurements (its bertknn is the one on the path), written as JSON to --worker."""
    from bertknn.model.runtime import Runtime
    from bertknn.query.pipeline import BertKNN

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(args.demo, store)
        knn = BertKNN.load(store, runtime=Runtime.of("onnx", args.threads))  # sets both libraries' threads
        knn.add_documents([document(0)])  # warm: the model's first pass, the writer's first open
        one, hundred, removes, n = [], None, [], 1
        for _ in range(args.repeats):
            began = time.perf_counter()
            knn.add_documents([document(n)])
            one.append(time.perf_counter() - began)
            n += 1
        batch = [document(i) for i in range(n, n + args.batch)]
        began = time.perf_counter()
        knn.add_documents(batch)
        hundred = time.perf_counter() - began
        for i in range(1, args.repeats + 1):
            began = time.perf_counter()
            knn.remove_documents([f"bench-{i}"])
            removes.append(time.perf_counter() - began)
        profile = _profiled(knn, n + args.batch) if args.profile else ""
        knn.store.close()
    out = {"add_one": one, "add_batch": hundred, "batch": args.batch, "remove_one": removes, "profile": profile}
    Path(args.worker).write_text(json.dumps(out), encoding="utf-8")


def _profiled(knn, n: int) -> str:
    """The functions that take most of one more add of one document (cProfile, cumulative)."""
    profile = cProfile.Profile()
    profile.enable()
    knn.add_documents([document(n)])
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
    stats.print_stats(r"bertknn/(store|index|ingest|build|model)/", 18)
    return text.getvalue()


def _demo(copy: Path) -> Path:
    """The demo datastore (built by this tree when missing), copied to `copy` in SQLite's rollback mode, as the
    workers of every tree start from it: a tree before WAL mode does not know the log's files."""
    from bertknn.demo import build_demo

    built = build_demo(runtime="onnx")
    shutil.copytree(built.store.path, copy, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    built.close()
    with contextlib.closing(sqlite3.connect(copy / "store.sqlite")) as db:
        db.execute("PRAGMA journal_mode = DELETE")  # this tree's writer turns WAL mode on again
    return copy


def _tree(rev: str, work: Path) -> Path:
    """A worktree of `rev` under `work`: its src/ is what the baseline's worker imports."""
    path = work / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev], check=True,
                   capture_output=True)  # fmt: skip
    return path


def _run(src: Path, args: argparse.Namespace, out: Path) -> dict:
    """One worker with `src` first on the path; its measurements."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, __file__, "--worker", str(out), "--threads", str(args.threads), "--repeats",
               str(args.repeats), "--batch", str(args.batch), "--demo", str(args.demo),
               *(["--profile"] if args.profile else [])]  # fmt: skip
    subprocess.run(command, env=env, check=True, cwd=str(src.parent))
    return json.loads(out.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=None, help="a git revision to compare with (default: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--demo", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.repeats, args.batch, args.threads, args.baseline = 1, 2, 5, 1, None
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        args.demo = _demo(work / "demo")
        trees = {"this tree": ROOT / "src"}
        if args.baseline:
            trees[f"baseline {args.baseline}"] = _tree(args.baseline, work) / "src"
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        try:
            for r in range(args.rounds):
                for name, src in trees.items():
                    runs[name].append(_run(src, args, work / f"{r}-{len(runs[name])}-{name[:4]}.json"))
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "baseline")],
                               check=False, capture_output=True)  # fmt: skip
    _report(runs, args)


def _report(runs: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """Each tree's medians (ms) and this tree's over the baseline's."""
    medians = {}
    for name, done in runs.items():
        one = statistics.median(t for d in done for t in d["add_one"]) * 1e3
        batch = statistics.median(d["add_batch"] for d in done) * 1e3
        remove = statistics.median(t for d in done for t in d["remove_one"]) * 1e3
        medians[name] = (one, batch, batch / args.batch, remove)
    print(f"\n## Writes on a copy of the demo datastore ({args.rounds} rounds, {args.repeats} repeats, "
          f"{args.threads} threads; ms, medians)\n")  # fmt: skip
    print(f"| tree | add of 1 | add of {args.batch} | per document | remove of 1 |\n|---|---|---|---|---|")
    for name, (one, batch, per, remove) in medians.items():
        print(f"| {name} | {one:.1f} | {batch:.0f} | {per:.2f} | {remove:.1f} |")
    if len(medians) == 2:
        (a, b) = medians.values()
        print("| this tree / baseline | " + " | ".join(f"{x / y:.2f}" for x, y in zip(a, b)) + " |")
    for name, done in runs.items():
        if done[-1]["profile"]:
            print(f"\n### {name}: an add of one document, by function (cProfile, cumulative)\n")
            print(done[-1]["profile"])


if __name__ == "__main__":
    main()
