"""Sequences of writes, not single steps: a stateful test (Hypothesis' RuleBasedStateMachine) over `bertknn add`,
`add --replace` and `remove`, each run as its own process and killed (kill -9) at a drawn durable step or not, rerun
with the same or a changed input, followed by any other command, with a reader opened before a commit and asked
after it, and damage to an index file followed by `bertknn repair`.

After every step the store is compared with a plain model: which documents are live with which text (their digest),
which an interrupted add left staged (a later add publishes them: promise 20; a remove of their id drops them).
Every live document has keys (the store is not lazy); `bertknn verify`'s checks find nothing; the reader's answers
come from live documents' current sentences. A killed command leaves the state before it or after it, never a mix.

Default: a few sequences of a few steps, derandomized (the same ones every run). `--long`: BERTKNN_SEQUENCES
sequences (default 1000) of up to 12 steps, drawn at random. The sequences that found a store gone lazy after a
corrected rerun, a removed document brought back, and a reader crashing across a commit are kept as explicit
tests below.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from bertknn import BertKNN
from bertknn.index import faiss_files, retrieval
from bertknn.ingest.corpus import digest
from bertknn.store import verify as checks
from bertknn.store.schema import REPLACING_PREFIX
from bertknn.text import parse_document

from ..conftest import write_corpus
from .conftest import TORCH, Setup

IDS = [f"s{i}" for i in range(6)]
NAMES = ["Ilsa Varnhold", "Marek Quenmire", "Tove Ostrava", "Quentin Belcourt", "Odile Tamsin", "Yara Rydberg"]
CITIES = ["oslo", "paris", "lisbon", "rome"]  # the text variants of a document: where its person was born
KILL_STEPS = 45  # kills are drawn at durable steps 1..KILL_STEPS (an add of a few documents takes about 30)
STEPS = {"short": 5, "long": 12}
RUN = {"runs": 0, "steps": 0, "kills": 0, "seconds": 0.0}  # the long run's figures


def document(i: int, variant: int) -> dict:
    """Document s`i` with text variant `variant`."""
    name = NAMES[i]
    text = f"{name} was born in {CITIES[variant].title()}. {name} builds boats near the harbour."
    return {"id": IDS[i], "title": name, "text": text}


def text_digest(doc: dict) -> str:
    """The digest the store keeps of a document's title and text; its text is remembered by it (`TEXTS`)."""
    made = digest(parse_document(doc, doc["id"]))
    TEXTS[made] = doc["text"]
    return made


TEXTS: dict[str, str] = {}  # digest -> text of every document the sequences wrote


@pytest.fixture(scope="module")
def base(cli, tiny_model_dir, tmp_path_factory) -> Path:
    """A store of documents s0..s3 (variant 0) with a FAISS index, built by the CLI."""
    root = tmp_path_factory.mktemp("sequences")
    corpus = write_corpus(root / "base.jsonl", [document(i, 0) for i in range(4)])
    store = root / "base"
    Setup._ok(cli.run(["build", corpus, "--out", store, "--model", tiny_model_dir, *TORCH]))
    Setup._ok(cli.run(["index", store, "--factory", "Flat", "--threads", "1"]))
    return store


def _observe(store: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(live id -> digest, staged id -> digest, live ids without keys) as store.sqlite holds them."""
    db = sqlite3.connect(store / "store.sqlite", timeout=30)  # read-write: rolls back a killed writer's journal
    try:
        rows = db.execute("SELECT id, state, digest, start FROM documents").fetchall()
    finally:
        db.close()
    live = {i: d for i, state, d, _ in rows if state == "live"}
    staged = {i.removeprefix(REPLACING_PREFIX): d for i, state, d, _ in rows if state == "adding"}
    return live, staged, sorted(i for i, state, _, start in rows if state == "live" and start is None)


def _is_ir(store: Path, file: Path) -> bool:
    """Whether a file of the store belongs to its TF-IDF index (a top segment's array or an added segment's)."""
    return str(file.relative_to(store)).startswith("tfidf")


def machine(cli, base: Path, workdir: Path):
    """The state machine class, over copies of `base` in `workdir`."""

    class Sequences(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.store = workdir / f"store-{time.monotonic_ns()}"
            shutil.copytree(base, self.store)
            self.live = {IDS[i]: text_digest(document(i, 0)) for i in range(4)}  # the model: id -> digest
            self.staged: dict[str, str] = {}  # what an interrupted add left staged (published by the next add)
            self.held = set(self.live)  # every id the store ever held (removing one again is not an error)
            self.killed: tuple | None = None  # the last command, when it was killed: (rule, arguments)
            self.reader: BertKNN | None = None
            self.seen: dict[str, str] = {}  # the live documents of the commit the reader holds
            RUN["runs"] += 1

        def teardown(self) -> None:
            if self.reader is not None:
                self.reader.store.close()
            shutil.rmtree(self.store, ignore_errors=True)

        def _run(self, args: list, kill_at: int | None):
            RUN["steps"] += 1
            hooks = {"crash_at": kill_at} if kill_at is not None else {}
            result = cli.run(args, **hooks)
            assert not result.traceback, result.describe() + result.text[-2000:]
            if result.killed:
                RUN["kills"] += 1
            return result

        def _settle(self, before: dict[str, str], after: dict[str, str], killed: bool, refused: bool) -> None:
            """The model after a command: `after` when it finished, the state before when it was refused; a killed
            one left `before` or `after` (whichever the store holds: nothing in between), and what it staged."""
            live, staged, _ = _observe(self.store)
            if killed:
                assert live in (before, after), (live, before, after)
            else:
                assert live == (before if refused else after), (live, before, after)
            self.live, self.staged = live, staged
            self.held |= set(live)

        @rule(
            which=st.sets(st.integers(0, len(IDS) - 1), min_size=1, max_size=3),
            variant=st.integers(0, len(CITIES) - 1),
            replace=st.booleans(),
            kill_at=st.none() | st.integers(1, KILL_STEPS),
        )
        def add(self, which: set[int], variant: int, replace: bool, kill_at: int | None) -> None:
            docs = [document(i, variant) for i in sorted(which)]
            self._add(docs, replace, kill_at)

        @precondition(lambda self: self.killed is not None and self.killed[0] == "add")
        @rule(changed=st.booleans(), kill_at=st.none() | st.integers(1, KILL_STEPS))
        def rerun_add(self, changed: bool, kill_at: int | None) -> None:
            """The killed add again: its own input, or the same ids with corrected text."""
            docs, replace = self.killed[1]
            if changed:
                docs = [{**d, "text": d["text"].replace(" was born in ", " was born near ")} for d in docs]
            self._add(docs, replace, kill_at)

        def _add(self, docs: list[dict], replace: bool, kill_at: int | None) -> None:
            corpus = write_corpus(self.store.with_suffix(".jsonl"), docs)
            new = {d["id"]: text_digest(d) for d in docs}
            refused = not replace and any(i in self.live and self.live[i] != dg for i, dg in new.items())
            staged = {i: dg for i, dg in self.staged.items() if i not in new}  # the rest of an interrupted add's
            after = {**self.live, **staged, **new}  # published with this add's own
            result = self._run(["add", self.store, corpus, *(["--replace"] if replace else []), *TORCH], kill_at)
            assert result.killed or result.rc == (2 if refused else 0), result.describe() + result.text[-2000:]
            self._settle(self.live, self.live if refused else after, result.killed, refused)
            if staged and not (result.killed or refused):  # the add says it published them
                assert "an interrupted add had staged" in result.text, result.text
            self.killed = ("add", (docs, replace)) if result.killed else None

        @rule(
            which=st.sets(st.integers(0, len(IDS) - 1), min_size=1, max_size=2),
            kill_at=st.none() | st.integers(1, 8),
        )
        def remove(self, which: set[int], kill_at: int | None) -> None:
            ids = [IDS[i] for i in sorted(which)]
            held = self.held | set(self.staged)
            refused = any(i not in held for i in ids)
            after = {i: dg for i, dg in self.live.items() if i not in ids}
            result = self._run(["remove", self.store, *(a for i in ids for a in ("--doc", i))], kill_at)
            assert result.killed or result.rc == (2 if refused else 0), result.describe() + result.text[-2000:]
            self._settle(self.live, self.live if refused else after, result.killed, refused)
            if not refused and not result.killed:
                assert not set(ids) & set(self.staged), "a removed id's staged text would come back"
            self.killed = None

        @rule()
        def open_reader(self) -> None:
            """A reader opened now and kept: the next questions are asked across later commits."""
            if self.reader is not None:
                self.reader.store.close()
            self.reader, self.seen = BertKNN.load(self.store, read_only=True, runtime="torch"), dict(self.live)

        @precondition(lambda self: self.reader is not None)
        @rule()
        def reopen_reader(self) -> None:
            """The reader moved to the latest commit (`refresh`, as a service does before each batch)."""
            self.reader.refresh()
            self.seen = dict(self.live)

        @precondition(lambda self: self.reader is not None)
        @rule(i=st.integers(0, len(IDS) - 1))
        def ask(self, i: int) -> None:
            """A question about s`i` to the reader opened before: answered from the documents of the commit it holds,
            whatever was committed since, never from a mix of two."""
            name = NAMES[i]
            p = self.reader.predict(f"{name} was born in [MASK] .", subject=name, top_k=3, evidence=10)
            for shown in p.evidence.values():
                for neighbour in shown:
                    assert neighbour.doc_id in self.seen, (neighbour, self.seen)
                    assert neighbour.sentence in TEXTS[self.seen[neighbour.doc_id]], (neighbour, self.seen)
            assert (name in p.documents) == (IDS[i] in self.seen), (p.documents, self.seen)

        @rule(kind=st.sampled_from(["truncate", "flip"]))
        def damage_and_repair(self, kind: str) -> None:
            """An index file damaged, then `bertknn repair`: verify passes again, the documents are as they were."""
            files = sorted(
                p for p in self.store.rglob("*") if p.is_file() and p.stat().st_size > 8 and _is_ir(self.store, p)
            )
            target = files[len(files) // 2]
            data = bytearray(target.read_bytes())
            if kind == "truncate":
                data = data[: len(data) // 2]
            else:
                data[len(data) // 2] ^= 0xFF
            target.write_bytes(bytes(data))
            result = self._run(["repair", self.store], None)
            assert result.rc == 0, result.describe() + result.text[-2000:]
            self._settle(self.live, self.live, killed=False, refused=False)
            if self.reader is not None:  # it may have read the damaged file: moved to the repair's commit
                self.reopen_reader()

        @invariant()
        def agrees_with_the_model(self) -> None:
            live, staged, without_keys = _observe(self.store)
            assert live == self.live and staged == self.staged
            assert without_keys == [], f"live documents without keys: {without_keys}"
            report = checks.verify(self.store, readers=(retrieval.problems, faiss_files.problems))
            assert report.problems == [], report.problems
            with sqlite3.connect(self.store / "store.sqlite") as db:
                record = db.execute("SELECT value FROM meta WHERE key = 'manifest'").fetchone()
            assert '"status": "complete"' in record[0]

    return Sequences


def test_sequences_of_writes_kills_readers_and_repairs_agree_with_the_model(cli, base, tmp_path, long, figures):
    began = time.monotonic()
    runs = int(os.environ.get("BERTKNN_SEQUENCES", "1000")) if long else 4
    options = settings(
        max_examples=runs,
        stateful_step_count=STEPS["long" if long else "short"],
        deadline=None,
        derandomize=not long,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    run_state_machine_as_test(machine(cli, base, tmp_path), settings=options)
    RUN["seconds"] = round(time.monotonic() - began, 1)
    row = f"| {RUN['runs']} | {RUN['steps']} | {RUN['kills']} | {RUN['seconds']} |"
    figures.add("sequences", dict(RUN), "| sequences | commands | killed | seconds |\n|---|---|---|---|\n" + row)


@pytest.fixture()
def sequences(cli, base, tmp_path):
    """One sequence, driven rule by rule (the explicit examples)."""
    made = machine(cli, base, tmp_path)()
    yield made
    made.teardown()


def _kill_after_staging(sequences, docs: list[dict], replace: bool) -> None:
    """An add killed after its documents were staged (and before they were published): the first kill step at which
    the store holds them staged, found by trying each step on a copy."""
    for step in range(1, KILL_STEPS + 1):
        probe = sequences.store.with_name(sequences.store.name + "-probe")
        shutil.copytree(sequences.store, probe)
        corpus = write_corpus(probe.with_suffix(".jsonl"), docs)
        args = ["add", probe, corpus, *(["--replace"] if replace else []), *TORCH]
        killed = sequences._run(args, step).killed
        staged = _observe(probe)[1]
        shutil.rmtree(probe)
        if killed and staged:
            sequences._add(docs, replace, step)
            assert sequences.killed is not None and sequences.staged
            return
    raise AssertionError("no kill step left the documents staged")


def test_a_killed_add_rerun_with_corrected_text_keeps_the_store_complete_and_later_adds_get_keys(sequences):
    _kill_after_staging(sequences, [document(4, 1), document(5, 1)], replace=False)
    sequences.rerun_add(changed=True, kill_at=None)  # the superseded staged texts must not count as pending
    sequences.agrees_with_the_model()
    sequences.add({3, 4}, variant=0, replace=True, kill_at=None)
    sequences.agrees_with_the_model()
    sequences.open_reader()
    sequences.ask(4)


def test_a_removed_document_does_not_come_back_with_a_later_add(sequences):
    _kill_after_staging(sequences, [document(1, 2)], replace=True)
    sequences.remove({1}, kill_at=None)
    sequences.agrees_with_the_model()
    sequences.add({5}, variant=0, replace=False, kill_at=None)
    sequences.agrees_with_the_model()
    assert "s1" not in sequences.live


def test_a_reader_opened_before_a_commit_answers_from_its_commit_until_it_is_reopened(sequences):
    sequences.open_reader()
    sequences.ask(2)
    sequences.add({2}, variant=3, replace=True, kill_at=None)  # another process replaces s2: a commit
    sequences.add({5}, variant=1, replace=False, kill_at=None)
    sequences.remove({0}, kill_at=None)
    assert sequences.seen != sequences.live
    for i in (2, 5, 0):  # the reader holds the commit it was opened on: s2's old text, no s5, s0 still there
        sequences.ask(i)
    sequences.reopen_reader()
    for i in (2, 5, 0):  # reopened, it reads the three commits
        sequences.ask(i)
