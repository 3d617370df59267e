"""Knowledge editing with BERT-kNN, measured as the editing field measures it (CounterFact: Meng et al. 2022; the
EasyEdit toolkit): an edit is a document added to the datastore, and what changes is asked, before and after.

`evaluate_edits` applies N edits in a row, in batches, on a copy of the datastore (the user's is never written,
unless `in_place`), and at checkpoints (1, 100, 1000, 10000 edits, as far as there are edits, and the last) asks
the questions of the edits made so far. Per checkpoint, settings row and mode (with and without subjects):
- efficacy: the prompt's top-1 answer is the new target; generalisation: the paraphrase's is; locality: the
  locality prompt's top-1 answer is the one it had before any edit. Top-1 rates in %.
- ROME's scores: P(new) > P(true) on the prompt (efficacy score) and the paraphrase (paraphrase score), P(true) >
  P(new) on the locality prompt (neighbourhood score), in %. A target's probability is its entry in the answer's
  distribution over words (the vocabulary, then the words of several tokens the neighbours hold, `words.Words`);
  a target of several tokens that is not among them has probability 0, and two zeros compare as a failure.
- seconds per edit (wall time of the adds / edits) and bytes per edit (growth of the datastore's folder / edits).
Then the undo check: every edit document removed, every question asked again, and the answers whose top-k words
differ from those before the edits counted (undo exact when 0).

Rows: BERT-kNN with the reader's settings (bertknn's defaults, or tuned), with the paper's, and the LM alone (the
predictions' `bert` ranking: edits cannot move it; shown so that a reader sees what the datastore adds).

Questions are asked in fixed chunks of ASK_CHUNK (the pipeline's batch), each chunk the same questions every time it
is asked (the locality questions of the records up to the chunk's end are asked at every checkpoint for that): the
LM's pass over a chunk is then the same, and an answer that no edit reaches is the same bit for bit before and after
(same process, same machine), but for the LM's scores of words of several tokens, which are computed in batches with
the other questions' words.

`Editor` is the same in the shape of EasyEdit's `BaseEditor.edit`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from bertknn.evaluation.edits_answers import ASK_CHUNK, SCORES, Answer, Reading, ask, edit_scores
from bertknn.evaluation.edits_data import KINDS, EditRecord, EditsError, Question, edit_document, questions_of
from bertknn.evaluation.edits_easyedit import easyedit_metrics, easyedit_requests, request_document, request_questions
from bertknn.ingest.ingester import Writer
from bertknn.query.settings import PAPER, Settings
from bertknn.store.datastore import DatastoreError
from bertknn.store.lock import lock_holder
from bertknn.store.shards import directories, open_store

LOG = logging.getLogger("bertknn.evaluation.edits")
CHECKPOINTS = (1, 100, 1000, 10000)  # edits made when the questions are asked (and the last number)
LOG_EVERY_S = 10.0
MODES = {"subjects": True, "no_subjects": False}  # asked with the edit's subject (IR's title shortcut) or without
LM = "lm"  # the row of the LM alone
__all__ = ["SCORES", "Answer", "EditRecord", "Editor", "ask", "edit_scores", "evaluate_edits"]


def directory_size(path: str | Path) -> int:
    """Bytes of every file under `path`."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _file_state(path: Path) -> dict[str, tuple[int, int]] | None:
    """(size, mtime) of every file under `path`; None when one vanished while they were read (a writer at work)."""
    state = {}
    try:
        for f in path.rglob("*"):
            if f.is_file():
                stat = f.stat()
                state[str(f.relative_to(path))] = (stat.st_size, stat.st_mtime_ns)
    except FileNotFoundError:
        return None
    return state


def copy_datastore(source: str | Path, target: str | Path, tries: int = 3) -> Path:
    """Copy a datastore's folder while no writer runs: refused while one holds its lock, and copied again when any
    file changed during the copy (DatastoreError after `tries`)."""
    source, target = Path(source), Path(target)
    for _ in range(tries):
        holder = lock_holder(source)
        if holder:
            raise DatastoreError(f"{source} is being written by {holder}; rerun when it has finished")
        before = _file_state(source)
        try:
            shutil.copytree(source, target, symlinks=True)
        except (shutil.Error, FileNotFoundError):  # a file went while it was copied
            before = None
        if before is not None and _file_state(source) == before:
            outside = [p for p in directories(target) if p != target and target.resolve() not in p.resolve().parents]
            if outside:
                raise DatastoreError(f"{source} lists shards outside its folder ({outside[0]}): use in_place")
            return target
        shutil.rmtree(target, ignore_errors=True)
    raise DatastoreError(f"{source} kept changing while it was copied: rerun when no writer is at work")


@contextlib.contextmanager
def working_copy(reader, in_place: bool = False, workdir: str | Path | None = None) -> Iterator:
    """A reader like `reader` (model, settings) over a copy of its datastore in a temporary folder (under `workdir`;
    default: the system's), deleted afterwards; `reader` itself when `in_place`."""
    if in_place:
        yield reader
        return
    source = Path(reader.store.path)
    with tempfile.TemporaryDirectory(prefix="bertknn-edits-", dir=workdir) as tmp:
        store = open_store(copy_datastore(source, Path(tmp) / source.name))
        copy = type(reader)(reader.encoder, store, settings=reader.settings, writer=Writer(store, reader.encoder))
        try:
            yield copy
        finally:
            copy.close()


def checkpoints(n: int) -> list[int]:
    """The numbers of edits at which questions are asked: CHECKPOINTS up to `n`, and `n`."""
    return sorted({c for c in CHECKPOINTS if c <= n} | {n})


def default_rows(reader) -> dict[str, Settings]:
    """The settings rows: the reader's ("bertknn": bertknn's defaults, or tuned) and the paper's."""
    return {"bertknn": reader.settings, "paper": PAPER}


class _EditRun:
    """One `evaluate_edits` run over a working reader: asking, editing, scoring, undoing."""

    def __init__(self, reader, records: list[EditRecord], rows: dict, modes: tuple, top_k: int, lm: bool, progress):
        self.reader, self.records, self.rows, self.modes, self.top_k, self.lm = reader, records, rows, modes, top_k, lm
        self.report = progress or (lambda phase, done, total: None)
        self.reading = Reading(reader)
        n = len(records)
        self.total = sum(self._questions(count) for count in [n, *checkpoints(n), n])
        self.asked, self.logged = 0, time.monotonic()
        self.relations = sorted({r.relation for r in records if r.relation is not None})

    def _aligned(self, count: int) -> int:
        """The locality questions asked with `count` edits: up to the end of the last chunk they fall in."""
        return min(len(self.records), -(-count // ASK_CHUNK) * ASK_CHUNK)

    def _questions(self, count: int) -> int:
        return len(self.rows) * (self._aligned(count) + 2 * len(self.modes) * count)

    def _tick(self, n: int) -> None:
        self.asked += n
        self.report("questions", self.asked, self.total)
        if time.monotonic() - self.logged >= LOG_EVERY_S:
            self.logged = time.monotonic()
            LOG.info("questions: %s of %s asked", f"{self.asked:,}", f"{self.total:,}")

    def _ask(self, questions: list[Question], settings: Settings) -> dict[str, list[Answer]]:
        return ask(self.reader, questions, settings, self.top_k, self._tick, self.reading)

    def ask_all(self, count: int) -> dict:
        """answers[mode][row][kind] of the first `count` records, each row asked once per mode (the LM's row from
        the first row's predictions; the locality questions, which have no subject, once for both modes)."""
        locality = [questions_of(r, False)[2] for r in self.records[: self._aligned(count)]]
        out: dict[str, dict] = {mode: {} for mode in self.modes}
        lm: dict[str, dict] = {}
        for i, (row, settings) in enumerate(self.rows.items()):
            near = self._ask(locality, settings)
            for mode in self.modes:
                asked = [questions_of(r, MODES[mode]) for r in self.records[:count]]
                got = {kind: self._ask([q[j] for q in asked], settings) for j, kind in enumerate(KINDS[:2])}
                got["locality"] = near
                out[mode][row] = {kind: answers["bert_knn"][:count] for kind, answers in got.items()}
                if i == 0 and self.lm:
                    lm[mode] = {kind: answers["bert"][:count] for kind, answers in got.items()}
        for mode, kinds in lm.items():
            out[mode][LM] = kinds  # the last row
        return out

    def apply(self, start: int, stop: int, batch: int) -> float:
        """Add the edit documents of records start..stop, `batch` per add; the seconds the adds took."""
        spent, logged = 0.0, time.monotonic()
        for first in range(start, stop, batch):
            docs = [edit_document(r) for r in self.records[first : min(first + batch, stop)]]
            began = time.perf_counter()
            self.reader.add_documents(docs, progress=lambda done: None)  # logged here, not per add
            spent += time.perf_counter() - began
            self.report("edits", first + len(docs), len(self.records))
            if time.monotonic() - logged >= LOG_EVERY_S:
                logged = time.monotonic()
                LOG.info("edits: %s of %s made", f"{first + len(docs):,}", f"{len(self.records):,}")
        return spent

    def scores(self, answers: dict, before: dict, count: int) -> dict:
        """scores[mode][row]: {"all": edit_scores, "relations": {relation: edit_scores}} of the first `count`."""
        out: dict[str, dict] = {}
        for mode, by_row in answers.items():
            out[mode] = {}
            for row, kinds in by_row.items():
                now = [kinds[kind][:count] for kind in KINDS]
                past = before[mode][row]["locality"][:count]
                entry: dict = {"all": edit_scores(*now, past)}
                if self.relations:
                    entry["relations"] = {rel: self._relation(rel, now, past) for rel in self.relations}
                out[mode][row] = entry
        return out

    def _relation(self, relation: str, now: list[list[Answer]], past: list[Answer]) -> dict:
        """`edit_scores` of the records of one relation."""
        mine = [r.relation == relation for r in self.records]
        return edit_scores(*([a for a, m in zip(k, mine) if m] for k in now), [a for a, m in zip(past, mine) if m])

    def checkpoint(self, count: int, answers: dict, before: dict, seconds: float, grown: int) -> dict:
        """A checkpoint's record (logged): its scores, seconds and bytes per edit."""
        point = {
            "edits": count,
            "seconds_per_edit": seconds / count if count else None,
            "bytes_per_edit": grown / count if count else None,
            "scores": self.scores(answers, before, count or len(self.records)),
        }
        for mode, by_row in point["scores"].items():
            shown = "; ".join(
                f"{row} " + ", ".join(f"{name} {s['all'][name]:.1f}" for name in SCORES[:3])
                for row, s in by_row.items()
            )
            LOG.info("%s edits, %s: %s", f"{count:,}", mode.replace("_", " "), shown)
        return point

    def undo(self, before: dict) -> dict:
        """Remove every edit document, ask everything again, and count the answers whose top-k words moved."""
        began = time.perf_counter()
        self.reader.remove_documents([edit_document(r)["id"] for r in self.records])
        seconds = time.perf_counter() - began
        after = self.ask_all(len(self.records))
        rows: dict[str, dict] = {}
        for mode in self.modes:
            for row, kinds in before[mode].items():
                counted = rows.setdefault(row, {"asked": 0, "changed": 0})
                for kind in KINDS if mode == self.modes[0] else KINDS[:2]:  # locality: one set for both modes
                    pairs = list(zip(kinds[kind], after[mode][row][kind]))
                    counted["asked"] += len(pairs)
                    counted["changed"] += sum(a.top != b.top for a, b in pairs)
        for counted in rows.values():
            counted["exact"] = counted["changed"] == 0
        LOG.info("undo: %s", ", ".join(f"{row} {c['changed']} of {c['asked']} changed" for row, c in rows.items()))
        return {"seconds": seconds, "rows": rows}


def _per_record(records: list[EditRecord], before: dict, after: dict) -> list[dict]:
    """Each record with its questions' top-1 answers before and after the edits: {mode: {row: {kind: [b, a]}}}."""
    return [
        {
            "case_id": r.case_id,
            "relation": r.relation,
            "subject": r.subject,
            "prompt": r.prompt,
            "target_new": r.target_new,
            "ground_truth": r.ground_truth,
            "answers": {
                mode: {
                    row: {kind: [kinds[kind][i].word, after[mode][row][kind][i].word] for kind in KINDS}
                    for row, kinds in by_row.items()
                }
                for mode, by_row in before.items()
            },
        }
        for i, r in enumerate(records)
    ]


def evaluate_edits(
    reader,
    records: Sequence[EditRecord],
    batch: int = 100,
    modes: Sequence[str] = tuple(MODES),
    rows: Mapping[str, Settings] | None = None,
    lm: bool = True,
    top_k: int = 10,
    in_place: bool = False,
    workdir: str | Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Edit a BertKNN's datastore with `records` (in order, `batch` per add) and measure it (see the module's text):
    returns {"setting", "checkpoints", "undo", "records"}, what `edits_report.write_edits_report` writes.

    `modes`: "subjects" and/or "no_subjects"; `rows`: settings rows by name (default `default_rows`), and with `lm`
    the LM alone; `top_k`: the words the undo check compares. Works on a copy of the datastore (`working_copy`)
    unless `in_place` (the edit documents are then left removed, hidden on disk); in a lazy datastore the documents
    questions retrieve are embedded then, in the copy, and count in the bytes per edit. `progress(phase, done, total)`:
    "questions" and "edits"; INFO lines on "bertknn.evaluation.edits" per checkpoint and every LOG_EVERY_S.
    """
    records, modes = list(records), tuple(modes)
    if not records:
        raise EditsError("no edits to evaluate")
    if batch < 1 or not modes or set(modes) - set(MODES):
        raise ValueError(f"batch must be >= 1 and modes some of {', '.join(MODES)} (got {batch}, {modes})")
    twice = sorted(case for case, n in Counter(r.case_id for r in records).items() if n > 1)
    if twice:
        raise EditsError(f"case_id(s) given twice: {twice[:5]}; each edit is the document edit-<case_id>")
    rows = dict(rows) if rows is not None else default_rows(reader)
    if not rows:
        raise ValueError("no settings rows to evaluate")
    began = time.time()
    with working_copy(reader, in_place, workdir) as work:
        run = _EditRun(work, records, rows, modes, top_k, lm, progress)
        LOG.info("%s edits: asking %s questions in all", f"{len(records):,}", f"{run.total:,}")
        before = after = run.ask_all(len(records))
        points, spent, done = [run.checkpoint(0, before, before, 0.0, 0)], 0.0, 0
        size = directory_size(work.store.path)
        for stop in checkpoints(len(records)):
            spent, done = spent + run.apply(done, stop, batch), stop
            after = run.ask_all(stop)
            points.append(run.checkpoint(stop, after, before, spent, directory_size(work.store.path) - size))
        undo = run.undo(before)
    asked = {"edits": len(records), "batch": batch, "modes": list(modes), "top_k": top_k, "in_place": in_place}
    setting = _setting(reader, rows, lm) | asked | {"began": began, "seconds": time.time() - began}
    return {"setting": setting, "checkpoints": points, "undo": undo, "records": _per_record(records, before, after)}


def _setting(reader, rows: dict[str, Settings], lm: bool) -> dict:
    """What a run's report says of the reader and its rows (each row's settings; None: the LM's own ranking)."""
    return {
        "datastore": str(reader.store.path),
        "model": reader.encoder.name,
        "layer": reader.store.manifest.layer,
        "lazy": bool(reader.store.manifest.lazy),
        "rows": {name: s.as_dict() for name, s in rows.items()} | ({LM: None} if lm else {}),
    }


class Editor:
    """EasyEdit's `BaseEditor.edit` for BERT-kNN: an edit is a document added to the reader's datastore (in place),
    so the "edited model" is this editor's reader and there are no weights to copy back; `undo()` removes what it
    added.

    `edit(prompts, target_new, subject=..., ground_truth=..., rephrase_prompts=..., locality_inputs={"neighborhood":
    {"prompt": [...], "ground_truth": [...]}})` returns `(metrics, self, {})`, metrics a list with EasyEdit's keys per
    edit: {"case_id", "requested_rewrite", "time", "pre": {"rewrite_acc": [..], "rephrase_acc": [..],
    "portability": {}}, "post": {"rewrite_acc": [..], "rephrase_acc": [..], "locality": {"neighborhood_acc": [..]},
    "portability": {}}}, plus bertknn's "document" (its id) and "answers" (the top-1 words, pre and post). An
    accuracy is 1.0 when the top-1 word is the target (locality: when it is the word it was before the edits), else
    0.0. With `sequential_edit` (the default here; EasyEdit's is False) the edits stay, all added in one batch; else,
    or with `keep_original_weight`, each is added, asked and removed again on its own, as EasyEdit restores the
    weights after each.
    """

    def __init__(self, reader, settings: Settings | None = None, top_k: int = 10) -> None:
        self.reader, self.settings, self.top_k = reader, settings, top_k
        self.made: list[str] = []  # the ids of the edit documents it added that are there now
        self._count = 0

    def edit(
        self,
        prompts: str | list[str],
        target_new: str | list[str],
        subject: str | list[str] | None = None,
        ground_truth: str | list[str] | None = None,
        rephrase_prompts: str | list[str] | None = None,
        locality_inputs: dict | None = None,
        sequential_edit: bool = True,
        keep_original_weight: bool = False,
        **kwargs: object,
    ) -> tuple[list[dict], Editor, dict]:
        """Make the edits and measure them (see the class's text); `case_ids=` (kwargs) names their documents
        "edit-<case_id>" (default: this editor's running count)."""
        requests = easyedit_requests(prompts, target_new, subject, ground_truth, rephrase_prompts, locality_inputs)
        ids = [f"edit-{c}" for c in (kwargs.get("case_ids") or range(self._count, self._count + len(requests)))]
        if len(ids) != len(requests):
            raise EditsError(f"{len(requests)} edits but {len(ids)} case_ids")
        self._count += len(requests)
        asked = [request_questions(r) for r in requests]
        docs = [request_document(r, doc_id) for r, doc_id in zip(requests, ids)]
        pre = self._ask([q for questions in asked for _, q in questions])
        if sequential_edit and not keep_original_weight:
            began = time.perf_counter()
            self.reader.add_documents(docs)
            self.made += ids
            times = [(time.perf_counter() - began) / len(docs)] * len(docs)
            post = self._ask([q for questions in asked for _, q in questions])
        else:
            times, post = [], []
            for doc, questions in zip(docs, asked):
                seconds, answers = self._alone(doc, [q for _, q in questions])
                times.append(seconds)
                post += answers
        return easyedit_metrics(requests, ids, asked, pre, post, times), self, {}

    def _alone(self, doc: dict, questions: list[Question]) -> tuple[float, list[Answer]]:
        """Add one edit document, ask its questions and remove it again: the seconds the add took and the answers.
        The document is in `made` from its add until its removal commits, so that `undo()` finds one left behind."""
        began = time.perf_counter()
        self.reader.add_documents([doc])
        seconds = time.perf_counter() - began
        self.made.append(doc["id"])
        answers = self._ask(questions)
        self.reader.remove_documents([doc["id"]])
        self.made.remove(doc["id"])
        return seconds, answers

    def _ask(self, questions: list[Question]) -> list[Answer]:
        return ask(self.reader, questions, self.settings, self.top_k)["bert_knn"] if questions else []

    def undo(self) -> list[str]:
        """Remove every edit document this editor added (and has not removed); their ids. They are forgotten only
        once their removal committed (one transaction): when it fails, e.g. BusyError while another process writes
        the datastore, the error propagates and they stay in `made`, for a later `undo()` to remove."""
        made = list(self.made)
        if made:
            self.reader.remove_documents(made)
            self.made = [doc_id for doc_id in self.made if doc_id not in made]
        return made

    restore = undo
