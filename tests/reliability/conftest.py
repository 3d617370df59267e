"""Reliability suite: the `bertknn` CLI run as separate processes (killed, damaged, concurrent), `--long` mode, and
the figures of a run.

Every command runs in its own process. Starting `bertknn` costs ~5 s of imports (torch, transformers) on this
machine, so by default the commands are forked from a "zygote": one process that imported bertknn's CLI (and loaded
the tests' model, for transformers' imports) once and forks a fresh child per command (the child's stdout and stderr
go to files, its exit status is the CLI's, and it can be killed with SIGKILL like any process). BERTKNN_SPAWN=exec
runs every command as a real `bertknn` executable instead; the service test always starts a real `bertknn serve`.

Figures (counts per test) are collected in one session object, written as JSON under the pytest temporary directory
and printed (visible with `pytest -s`); in long mode (`--long` or BERTKNN_LONG=1) they are also appended, as one JSON
line with the date, the exact command, the machine's cores and the wall time, to reports/reliability/runs.jsonl, which
the documentation site summarises (docs/hooks.py: results/reliability-runs.md).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from bertknn.store.datastore import read_committed

from ..conftest import write_corpus

ROOT = Path(__file__).resolve().parents[2]
RUNS_FILE = ROOT / "reports" / "reliability" / "runs.jsonl"  # one JSON line per long run
EXE = Path(sys.executable).with_name("bertknn")
TORCH = ["--backend", "torch", "--threads", "1"]

FIRST = ["Ilsa", "Marek", "Tove", "Quentin", "Aurelio", "Sunniva", "Bertil", "Odile", "Casimir", "Yara", "Leopold"]
LAST = ["Varnhold", "Quenmire", "Ostrava", "Belcourt", "Tamsin", "Rydberg", "Kovac", "Lindqvist", "Marchetti"]
CITIES = ["oslo", "paris", "london", "berlin", "rome", "madrid", "vienna", "lisbon", "dublin", "prague", "athens"]
CITIES += ["cairo", "moscow", "boston", "chicago", "tokyo", "sydney", "toronto", "warsaw", "budapest", "seoul"]
CITIES += ["lima", "delhi", "milan", "munich", "geneva", "zurich", "hamburg", "venice", "naples"]  # one token each
JOBS = ["cellist", "architect", "botanist", "sailor", "painter", "chemist", "baker", "poet", "surveyor", "historian"]
THINGS = ["boats", "maps", "violins", "clocks", "lanterns", "bridges", "gardens", "ships", "books", "kites"]
ADJ = ["old", "quiet", "busy", "narrow", "famous", "small", "green", "windy", "ancient", "bright"]


def long_mode(config: pytest.Config) -> bool:
    return bool(config.getoption("--long", default=False)) or os.environ.get("BERTKNN_LONG") == "1"


@pytest.fixture(scope="session")
def long(pytestconfig) -> bool:
    """True in long mode (`--long` or BERTKNN_LONG=1)."""
    return long_mode(pytestconfig)


@pytest.fixture()
def rng(request) -> random.Random:
    """A random generator per test; its seed is printed (BERTKNN_SEED=N replays a run)."""
    seed = int(os.environ.get("BERTKNN_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\n{request.node.nodeid}: BERTKNN_SEED={seed}")
    return random.Random(seed)


# --- corpora -----------------------------------------------------------------------------------------------------


def _sentence(rng: random.Random, name: str) -> str:
    city, year, job, thing, adj = (
        rng.choice(CITIES).title(),
        rng.randint(1800, 1999),
        rng.choice(JOBS),
        rng.choice(THINGS),
        rng.choice(ADJ),
    )
    return rng.choice(
        [
            f"{name} worked as a {job} in {city} for {rng.randint(2, 40)} years.",
            f"The {adj} harbour of {city} is known for its {thing}.",
            f"In {year} {name} moved to a {adj} street near the river in {city}.",
            f"Many people from {city} admired the {thing} that {name} made in {year}.",
            f"{name} wrote {rng.randint(2, 30)} letters about {adj} {thing} to a {job} in {city}.",
            f"Visitors say the {adj} market of {city} sells {thing} every Sunday.",
            f"A {job} from {city} once bought {rng.randint(2, 9)} {adj} {thing} from {name}.",
        ]
    )


def make_docs(n: int, sentences: int, seed: int, prefix: str) -> list[dict]:
    """`n` documents of varied sentences; document i's first sentence says where its person was born."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        title = f"{rng.choice(FIRST)} {rng.choice(LAST)} {prefix}{i}"
        born = f"{title} was born in {CITIES[(i + seed) % len(CITIES)].title()}."
        text = " ".join([born, *(_sentence(rng, title) for _ in range(sentences - 1))])
        docs.append({"id": f"{prefix}{i}", "title": title, "text": text})
    return docs


def born_docs(uids: list[int], prefix: str = "Name") -> list[dict]:
    """Documents like {"title": "Name 17", "text": "Name 17 was born in Oslo."} (a one-token city per uid)."""
    return [
        {
            "id": f"{prefix.lower()}-{u}",
            "title": f"{prefix} {u}",
            "text": f"{prefix} {u} was born in {city(u).title()}.",
        }
        for u in uids
    ]


def city(uid: int) -> str:
    return CITIES[uid % len(CITIES)]


# --- running the CLI in other processes ------------------------------------------------------------------------------


@dataclass
class Result:
    """A finished command: exit status (negative: killed by that signal), output and wall time."""

    args: list[str]
    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool = False

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL

    @property
    def text(self) -> str:
        return self.out + self.err

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.text

    def traceback_summary(self) -> str:
        """The innermost frame and the exception of a traceback (plain or rich), on one line."""
        frames = re.findall(r'(\S+\.py)(?::|", line )(\d+),? in (\S+)', self.text)
        last = [line.strip() for line in self.text.splitlines() if line.strip() and line.strip()[0] not in "│╭╰─"]
        where = f"{Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]}: " if frames else ""
        return f"traceback at {where}{last[-1] if last else ''}"

    def error_lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if re.match(r"\s*(error|damaged):", line)]

    def describe(self) -> str:
        if self.traceback:
            return f"`bertknn {' '.join(self.args[:2])}` rc={self.rc}: {self.traceback_summary()}"
        last = (self.error_lines() or self.text.strip().splitlines() or [""])[-1]
        return f"`bertknn {' '.join(self.args[:2])}` rc={self.rc}: {last.strip()[:300]}"


class Proc:
    """A running command."""

    def __init__(self, spawner: Spawner, args: list[str], pid: int, out: Path, err: Path, popen=None) -> None:
        self.spawner, self.args, self.pid, self.out, self.err, self.popen = spawner, args, pid, out, err, popen
        self.began = time.monotonic()
        self._result: Result | None = None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has exited (a zombie until reaped: the pid is not reused)
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float = 300) -> Result:
        if self._result is None:
            rc, timed_out = self.spawner.reap(self, timeout)
            seconds = time.monotonic() - self.began
            out = self.out.read_text(encoding="utf-8", errors="replace")
            err = self.err.read_text(encoding="utf-8", errors="replace")
            self._result = Result(self.args, rc, out, err, seconds, timed_out)
            self.out.unlink(missing_ok=True)
            self.err.unlink(missing_ok=True)
        return self._result


ZYGOTE = r"""
import json, os, sys, time
import faiss
from bertknn.cli import main as cli
import bertknn.store.datastore, bertknn.store.writer, bertknn.index.faiss_index
import bertknn.query.pipeline, bertknn.index.retrieval

def steps(req):
    # Count the durable steps of writes (each fsync and rename): list their paths in req["trace"], and kill this
    # process with SIGKILL just before step req["crash_at"] (1-based).
    at, trace = req.get("crash_at"), req.get("trace")
    if at is None and trace is None:
        return
    import signal
    count = [0]
    real_fsync, real_replace = os.fsync, os.replace

    def step(label):
        count[0] += 1
        if trace:
            with open(trace, "a") as out:
                out.write(label + "\n")
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)

    def fsync(fd):
        step("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def replace(src, dst, **kwargs):
        step("rename " + os.fspath(dst))
        return real_replace(src, dst, **kwargs)

    os.fsync, os.replace = fsync, replace

def child(req):
    steps(req)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "out"), (2, "err")):
        os.dup2(os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.argv = ["bertknn", *req["args"]]
    code = 1
    try:
        cli.app(prog_name="bertknn")
        code = 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
    except BaseException as err:
        sys.excepthook(type(err), err, err.__traceback__)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

while True:
    line = sys.stdin.readline()
    if not line:
        break
    req = json.loads(line)
    if req["op"] == "run":
        pid = os.fork()
        if pid == 0:
            child(req)
        reply = {"pid": pid}
    elif req["op"] == "ping":
        reply = {"pong": os.getpid()}
    elif req["op"] == "warm":  # load a model once: its imports (transformers' lazy modules) are then in every child
        from bertknn.model.encoder import Encoder
        Encoder.load(req["model"])
        reply = {"warm": True}
    else:
        pid, deadline, timed_out = req["pid"], time.monotonic() + req["timeout"], False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                _, status = os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(0.005)
        reply = {"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


def cli_env() -> dict[str, str]:
    """The environment of every command: offline, one thread, and wide lines (an error is one line)."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        COLUMNS="1000",
        PYTHONFAULTHANDLER="1",
    )
    env.pop("BERTKNN_TOKEN", None)
    return env


class Spawner:
    """Runs `bertknn ARGS` in a new process: forked from the zygote, or a real executable (`exec=True`)."""

    def __init__(self, exec_: bool, workdir: Path) -> None:
        self.exec, self.workdir = exec_, workdir
        self.lock = threading.Lock()
        self.zygote = None
        self.count = 0
        if not exec_:
            self.zygote = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=cli_env(),
                text=True,
                bufsize=1,
            )
            self._ask({"op": "ping"})  # wait for its imports: the first command's timing must not include them

    def warm(self, model: Path) -> None:
        """Load `model` once in the zygote, so that every command forked from it finds its imports done (~4 s of
        transformers' lazy imports less per command on the 2-core machine: an `add` of one document 4.8 s -> 1.0 s).
        Nothing runs a thread then: the commands' environment sets one thread (`cli_env`)."""
        if self.zygote is not None:
            self._ask({"op": "warm", "model": str(model)})

    def _ask(self, request: dict) -> dict:
        assert self.zygote is not None
        with self.lock:
            self.zygote.stdin.write(json.dumps(request) + "\n")
            self.zygote.stdin.flush()
            line = self.zygote.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote process died (exit status {self.zygote.poll()})")
        return json.loads(line)

    def start(self, args: list, exec_: bool | None = None, **hooks: object) -> Proc:
        """`hooks`: crash_at=N (killed just before the Nth fsync or rename) and trace=FILE (those steps listed
        there), in a child of the zygote only."""
        args = [str(a) for a in args]
        self.count += 1
        fd, out = tempfile.mkstemp(prefix="out-", dir=self.workdir)
        os.close(fd)
        err = Path(out).with_name(Path(out).name.replace("out-", "err-"))
        err.touch()  # a child killed before it opens its files has still written (nothing) to both
        out = Path(out)
        if self.exec if exec_ is None else exec_:
            assert not hooks, "crash_at and trace need the zygote (not BERTKNN_SPAWN=exec)"
            with out.open("wb") as o, err.open("wb") as e:
                popen = subprocess.Popen([str(EXE), *args], stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=cli_env())
            return Proc(self, args, popen.pid, out, err, popen)
        reply = self._ask({"op": "run", "args": args, "out": str(out), "err": str(err), **hooks})
        return Proc(self, args, reply["pid"], out, err)

    def reap(self, proc: Proc, timeout: float) -> tuple[int, bool]:
        if proc.popen is not None:
            try:
                return proc.popen.wait(timeout), False
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.popen.wait(), True
        reply = self._ask({"op": "wait", "pid": proc.pid, "timeout": timeout})
        return reply["rc"], reply["timed_out"]

    def run(self, args: list, timeout: float = 300, exec_: bool | None = None, **hooks: object) -> Result:
        return self.start(args, exec_, **hooks).wait(timeout)

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.stdin.close()
            self.zygote.wait(30)


@pytest.fixture(scope="session")
def cli(tmp_path_factory, tiny_model_dir) -> Spawner:
    """`cli.run([...])` / `cli.start([...])`: bertknn commands in new processes (see the module docstring)."""
    spawner = Spawner(os.environ.get("BERTKNN_SPAWN") == "exec", tmp_path_factory.mktemp("cli-output"))
    spawner.warm(tiny_model_dir)
    yield spawner
    spawner.close()


# --- looking at a datastore without opening it for writing -----------------------------------------------------------


def connect_ro(store: Path) -> sqlite3.Connection:
    """A connection for looking only. Not SQLite's read-only mode: after a kill -9 mid-transaction the first reader
    must roll the hot journal back (as bertknn's own connection does), and a read-only connection cannot."""
    return sqlite3.connect(store / "store.sqlite", timeout=30)


def tables(store: Path) -> dict:
    """documents (id, title, state, start, end), sentences and entries, in index order; the evidence vectors and
    their references, in id order; the names index (written in the transaction of its documents), by name."""
    with connect_ro(store) as db:
        held = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'evidence'").fetchone()
        named = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'names'").fetchone()
        return {
            "names": db.execute("SELECT * FROM names ORDER BY name, title").fetchall() if named else [],
            "documents": db.execute("SELECT idx, id, title, state, start, end FROM documents ORDER BY idx").fetchall(),
            "sentences": db.execute("SELECT * FROM sentences ORDER BY idx").fetchall(),
            "entries": db.execute("SELECT * FROM entries ORDER BY idx").fetchall(),
            "evidence": db.execute("SELECT * FROM evidence ORDER BY id").fetchall() if held else [],
        }


def committed(store: Path) -> int:
    with connect_ro(store) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'entries'").fetchone()
    return int(row[0]) if row else 0


def dim(store: Path) -> int:
    return int(json.loads((store / "manifest.json").read_text())["dim"])


def keys_values(store: Path) -> tuple[np.ndarray, bytes]:
    """The committed keys (a float16 memmap, or the codes of compressed keys) and the committed bytes of values.i32."""
    n, d = committed(store), dim(store)
    if read_committed(store).key_codec != "float16":
        import faiss

        size = faiss.read_index(str(store / "keys.codec")).sa_code_size()
        keys = np.fromfile(store / "keys.codes", np.uint8)[: n * size].reshape(n, size)
        return keys, (store / "values.i32").read_bytes()[: 4 * n] if n else b""
    keys = np.memmap(store / "keys.f16", np.float16, "r", shape=(n, d)) if n else np.zeros((0, d), np.float16)
    values = (store / "values.i32").read_bytes()[: 4 * n] if n else b""
    return keys, values


def counts(store: Path) -> bytes:
    """The committed bytes of a pruned store's counts.i32 (b"" where there is none)."""
    n = committed(store)
    return (store / "counts.i32").read_bytes()[: 4 * n] if (store / "counts.i32").exists() else b""


def entry_multiset(store: Path) -> Counter:
    """Each committed entry as (document id, sentence, span, value): what `lost` and `duplicated` count."""
    n = committed(store)
    values = np.frombuffer((store / "values.i32").read_bytes()[: 4 * n], np.int32) if n else np.zeros(0, np.int32)
    with connect_ro(store) as db:
        rows = db.execute(
            "SELECT e.idx, coalesce(d.removed_id, d.id), s.text, e.start, e.end FROM entries e "
            "JOIN sentences s ON s.idx = e.sentence JOIN documents d ON d.idx = s.doc WHERE e.idx < ?",
            (n,),
        ).fetchall()
    return Counter((doc, text, a, b, int(values[idx])) for idx, doc, text, a, b in rows)


def faiss_vectors(store: Path) -> np.ndarray | None:
    """Every vector of the FAISS index (faiss.index and the added parts, as `FaissIndex.load` reads them)."""
    from bertknn.index.faiss_index import FaissIndex
    from bertknn.store.datastore import Datastore

    if not (store / "faiss.json").is_file():
        return None
    with Datastore(store) as opened:
        parts = [p.index for p in FaissIndex.load(opened).parts]
    return np.concatenate([p.reconstruct_n(0, p.ntotal) if p.ntotal else np.zeros((0, p.d), np.float32) for p in parts])


# --- figures -------------------------------------------------------------------------------------------------------


@dataclass
class Figures:
    """Counts recorded by the tests, by section; written at the end of the session."""

    long: bool
    sections: dict[str, dict] = field(default_factory=dict)
    markdown: dict[str, str] = field(default_factory=dict)

    def add(self, section: str, figures: dict, markdown: str = "") -> None:
        self.sections[section] = figures
        if markdown:
            self.markdown[section] = markdown


def _command(config: pytest.Config) -> str:
    env = "BERTKNN_LONG=1 " if os.environ.get("BERTKNN_LONG") == "1" else ""
    env += "BERTKNN_SPAWN=exec " if os.environ.get("BERTKNN_SPAWN") == "exec" else ""
    env += f"BERTKNN_SEQUENCES={os.environ['BERTKNN_SEQUENCES']} " if "BERTKNN_SEQUENCES" in os.environ else ""
    args = " ".join(shlex.quote(a) for a in config.invocation_params.args)
    return f"cd {ROOT} && {env}HF_HUB_OFFLINE=1 {os.path.relpath(sys.executable, ROOT)} -m pytest {args}"


@pytest.fixture(scope="session")
def figures(pytestconfig, tmp_path_factory) -> Figures:
    """Where tests put their counts (JSON in the pytest temporary directory; reports/reliability/runs.jsonl in long
    mode)."""
    began = time.time()
    collected = Figures(long_mode(pytestconfig))
    yield collected
    if not collected.sections:
        return
    out = tmp_path_factory.getbasetemp() / "reliability.json"
    out.write_text(json.dumps(collected.sections, indent=1, default=str), encoding="utf-8")
    print(f"\nreliability figures ({out}):\n{json.dumps(collected.sections, indent=1, default=str)}")
    if collected.long:
        run = {
            "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "command": _command(pytestconfig),
            "cores": os.cpu_count(),
            "wall_min": round((time.time() - began) / 60, 1),
            "figures": collected.sections,
            "markdown": collected.markdown,
        }
        RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
        with RUNS_FILE.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(run, ensure_ascii=False, default=str) + "\n")


# --- the commands' start states and uninterrupted references (test_kill.py, test_disk_full.py) ---------------------

REMOVED = ("doc3", "doc7")  # `remove --doc doc3 --doc doc7`: both or neither
REPLACED = ("doc4", "doc8")  # `add --replace` of these two with new text: both old or both new, one live copy each
PRUNE_RADIUS = "inf"  # every document's entries of one word merged into its first: the most a pruning rewrites


class Setup:
    """The corpora, the base stores and the uninterrupted reference of each command."""

    def __init__(self, root: Path, cli, model: Path) -> None:
        self.root, self.cli, self.model = root, cli, model
        # 60 documents of ~45 sentences: ~200k characters, so the build commits ~8 chunks of ~4096 words
        self.docs = make_docs(60, 45, seed=1, prefix="doc")
        self.corpus = write_corpus(root / "corpus.jsonl", self.docs)
        self.more_docs = make_docs(30, 40, seed=2, prefix="new")
        self.more = write_corpus(root / "more.jsonl", self.more_docs)
        moved = [
            dict(d, text=d["text"].replace(" was born in ", " was born in Newport, not in ", 1)) for d in self.docs
        ]
        self.replacing = write_corpus(root / "replacing.jsonl", [d for d in moved if d["id"] in REPLACED])
        self.refs: dict[str, Path] = {}
        self.durations: dict[str, float] = {}
        self.answers: dict[tuple, Result] = {}
        self.base = root / "base"  # built, no FAISS index (what `index` starts from)
        self.base_faiss = root / "base-faiss"  # with a Flat FAISS index (what `add` and `remove` start from)
        self._reference("build", None, self.base)
        shutil.copytree(self.base, self.base_faiss)
        self._ok(cli.run(["index", self.base_faiss, "--factory", "Flat", "--threads", "1"]))
        starts = (("add", self.base_faiss), ("remove", self.base_faiss), ("index", self.base))
        for command, start in (
            *starts,
            ("replace", self.base_faiss),
            ("convert-keys", self.base_faiss),
            ("prune", None),
        ):
            self._reference(command, start, root / f"ref-{command}")

    @staticmethod
    def _ok(result: Result) -> Result:
        assert result.rc == 0 and not result.traceback, result.describe() + "\n" + result.text[-3000:]
        return result

    def args(self, command: str, store: Path) -> list:
        return {
            "build": ["build", self.corpus, "--out", store, "--model", self.model, *TORCH],
            "add": ["add", store, self.more, *TORCH],
            "replace": ["add", store, self.replacing, "--replace", *TORCH],
            "remove": ["remove", store, *(a for d in REMOVED for a in ("--doc", d))],
            "index": ["index", store, "--factory", "Flat", "--threads", "1"],
            "convert-keys": ["convert-keys", store, "--key-codec", "SQ8"],
            "prune": ["prune", self.base_faiss, store, "--radius", PRUNE_RADIUS],  # a copy: the source stays
        }[command]

    def start_state(self, command: str, store: Path) -> None:
        """Put the store a trial of `command` starts from at `store` (nothing for a build)."""
        if command in ("add", "replace", "remove", "convert-keys"):
            shutil.copytree(self.base_faiss, store)
        elif command == "index":
            shutil.copytree(self.base, store)

    def _reference(self, command: str, start: Path | None, store: Path) -> None:
        if start is not None:
            shutil.copytree(start, store)
        began = time.monotonic()
        self._ok(self.cli.run(self.args(command, store)))
        self.durations[command] = time.monotonic() - began
        self.refs[command] = store

    def reference_answer(self, command: str, question: list[str]) -> Result:
        key = (command, *question)
        if key not in self.answers:
            self.answers[key] = self._ok(self.cli.run(["ask", self.refs[command], *question]))
        return self.answers[key]

    def questions(self, command: str) -> list[list[str]]:
        """The `bertknn ask` questions whose answers a trial must reproduce."""
        doc = self.more_docs[4] if command == "add" else self.docs[{"remove": 3, "replace": 4}.get(command, 5)]
        ask = [f"{doc['title']} was born in [MASK] .", "--subject", doc["title"], *TORCH]
        faiss = [[*ask, "--retrieval", "faiss"]] if command not in ("build", "prune") else []  # no FAISS copied
        return [ask, *faiss]


@pytest.fixture(scope="session")
def setup(tmp_path_factory, cli, tiny_model_dir) -> Setup:
    return Setup(tmp_path_factory.mktemp("kill"), cli, tiny_model_dir)
