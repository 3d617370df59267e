"""Knowledge editing (`bertknn eval edits`, `evaluation/edits*.py`): CounterFact's two layouts and their errors, the
scores' arithmetic on scripted answers, twenty edits end to end on the tiny BERT, the undo check, the EasyEdit-shaped
`Editor` and the command, which leaves the datastore it is given as it was."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.console import console
from bertknn.evaluation.edits import Editor, default_rows, evaluate_edits
from bertknn.evaluation.edits_answers import SCORES, probability, target_tokens
from bertknn.evaluation.edits_data import EditRecord, EditsError, load_edits, questions_of, split_edits
from bertknn.evaluation.edits_report import write_edits_report
from bertknn.model.runtime import Runtime
from bertknn.query.prediction import Prediction, ranked
from bertknn.query.search import Neighbours
from bertknn.query.settings import DEFAULT, PAPER
from bertknn.query.words import Words
from bertknn.store.lock import BusyError
from bertknn.store.manifest import Manifest

FLAT = {
    "case_id": 2,
    "prompt": "Toko Yasuda, the",
    "target_new": "piano",
    "subject": "Toko Yasuda",
    "ground_truth": "guitar",
    "rephrase_prompt": "Toko Yasuda is incredible at",
    "locality_prompt": "John Lennon performs on the",
    "locality_ground_truth": "guitar",
}
ROME = {
    "case_id": 7,
    "pararel_idx": 2796,
    "requested_rewrite": {
        "prompt": "The mother tongue of {} is",
        "relation_id": "P103",
        "target_new": {"str": "English", "id": "Q1860"},
        "target_true": {"str": "French", "id": "Q150"},
        "subject": "Danielle Darrieux",
    },
    "paraphrase_prompts": ["Shayna does this and Yossel goes still. Danielle Darrieux is a native speaker of", "x"],
    "neighborhood_prompts": ["The mother tongue of Léon Blum is", "The native language of Montesquieu is"],
    "attribute_prompts": ["J.R.R. Tolkien is a native speaker of"],
    "generation_prompts": ["Danielle Darrieux's mother tongue is"],
}


# (a) the layouts


def test_both_layouts_are_read_from_a_json_list_or_json_lines(tmp_path):
    listed = tmp_path / "flat.json"
    listed.write_text(json.dumps([FLAT, {**FLAT, "case_id": 3, "prompt": "{}, the"}]), encoding="utf-8")
    flat = load_edits(listed)
    assert flat[0] == EditRecord(2, **{k: v for k, v in FLAT.items() if k != "case_id"})
    assert flat[1].prompt == "Toko Yasuda, the" and flat[1].relation is None  # a "{}" is filled with the subject
    lines = tmp_path / "rome.jsonl"
    lines.write_text(json.dumps(ROME) + "\n\n" + json.dumps({**ROME, "case_id": 8}) + "\n", encoding="utf-8")
    rome = load_edits(lines)
    assert rome[0] == EditRecord(
        case_id=7,
        prompt="The mother tongue of Danielle Darrieux is",
        subject="Danielle Darrieux",
        target_new="English",
        ground_truth="French",
        rephrase_prompt=ROME["paraphrase_prompts"][0],  # the first paraphrase and the first neighbourhood prompt
        locality_prompt="The mother tongue of Léon Blum is",
        locality_ground_truth="French",  # the neighbourhood keeps target_true
        relation="P103",
    )
    assert [r.case_id for r in split_edits(rome + flat, "dev")] == [8, 2]  # even case_ids
    assert [r.case_id for r in split_edits(rome + flat, "test")] == [7, 3]  # odd ones
    assert [r.case_id for r in split_edits(rome + flat, "all", n=3)] == [7, 8, 2]
    rewrite, rephrase, locality = questions_of(rome[0], with_subject=True)
    assert (
        rewrite.text == "The mother tongue of Danielle Darrieux is [MASK] ." and rewrite.subject == "Danielle Darrieux"
    )
    assert (rephrase.subject, rephrase.new, rephrase.true) == ("Danielle Darrieux", "English", "French")
    assert (locality.subject, locality.new, locality.true) == (None, "English", "French")  # never a subject
    assert questions_of(rome[0], with_subject=False)[0].subject is None


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([FLAT, {**FLAT, "case_id": 4, "target_new": None}], "record 2: field 'target_new' is missing"),
        ([{**FLAT, "locality_prompt": ""}], "record 1: field 'locality_prompt' is not a non-empty string"),
        ([{**FLAT, "case_id": "x2"}], "record 1: field 'case_id' is not a whole number >= 0 ('x2')"),
        ([FLAT, FLAT], "record 2: case_id 2 is given twice (first in "),
        ([{**FLAT, "prompt": "Toko Yasuda plays the [MASK]"}], "record 1: field 'prompt' holds [MASK]"),
        ([ROME, {**ROME, "case_id": 9, "paraphrase_prompts": []}], "record 2: field 'paraphrase_prompts' is not a"),
        ([{**ROME, "requested_rewrite": {**ROME["requested_rewrite"], "target_new": "English"}}],
         "record 1: field 'requested_rewrite.target_new' is missing or not an object with 'str'"),
        ([{**ROME, "requested_rewrite": {**ROME["requested_rewrite"], "subject": 3}}],
         "record 1: field 'requested_rewrite.subject' is not a non-empty string (3)"),
        ([["not", "an", "edit"]], "record 1: expected a JSON object (an edit), not list"),
        ([], "holds no edits"),
    ],
)  # fmt: skip
def test_a_bad_record_is_named_by_file_record_and_field(tmp_path, records, message):
    path = tmp_path / "edits.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    with pytest.raises(EditsError) as err:
        load_edits(path)
    assert str(err.value).startswith(f"{path}") and message in str(err.value)


def test_a_bad_json_line_is_named_by_its_line(tmp_path):
    path = tmp_path / "edits.jsonl"
    path.write_text(json.dumps(FLAT) + "\n{broken\n", encoding="utf-8")
    with pytest.raises(EditsError, match=r"edits\.jsonl, line 2: not valid JSON"):
        load_edits(path)
    path.write_text("\n".join(json.dumps({**FLAT, "case_id": i}) for i in (1, 2)) + "\n" + json.dumps({"x": 1}))
    with pytest.raises(EditsError, match=r"edits\.jsonl, record 3 \(line 3\): field 'prompt' is missing"):
        load_edits(path)
    with pytest.raises(ValueError, match="split must be one of dev, test, all"):
        split_edits([], "train")


# (b) the arithmetic, on scripted answers


def _record(i: int, new: str, true: str, loc_true: str, relation: str) -> EditRecord:
    name = f"Person{i}"
    return EditRecord(i, f"{name} is a", name, new, true, f"{name} works as a", f"Other{i} is a", loc_true, relation)


SCRIPTED = [  # the new target of record 2 has three tokens, that of record 3 four (never among the answer's words)
    _record(0, "piano", "guitar", "violin", "P1"),
    _record(1, "paris", "rome", "london", "P1"),
    _record(2, "glassblower", "baker", "teacher", "P2"),
    _record(3, "quellbrookian", "soccer", "tennis", "P2"),
]
AFTER = {  # BERT-kNN's answers once record i's edit is made: {word: probability}, best first
    ("rewrite", 0): {"piano": 0.6, "guitar": 0.2},  # right; P(new) > P(true)
    ("rewrite", 1): {"paris": 0.6, "rome": 0.2},  # right
    ("rewrite", 2): {"glassblower": 0.7, "baker": 0.1},  # right: a word of several tokens the neighbours hold
    ("rewrite", 3): {"tennis": 0.5},  # wrong; P(new) = P(true) = 0: a failure
    ("rephrase", 0): {"piano": 0.6, "guitar": 0.2},  # right
    ("rephrase", 1): {"berlin": 0.5, "paris": 0.3, "rome": 0.1},  # wrong, but P(new) > P(true)
    ("rephrase", 2): {"baker": 0.5, "glassblower": 0.2},  # wrong
    ("rephrase", 3): {"soccer": 0.5},  # wrong
    ("locality", 1): {"paris": 0.6, "london": 0.3},  # moved by the edit; P(true) < P(new)
    ("locality", 2): {"teacher": 0.4, "glassblower": 0.3},  # kept; P(true) > P(new)
}


class ScriptedReader:
    """A reader answering from a script: before its edit, record i's questions get the LM's answers (the true
    target first); after it, `AFTER`'s. Words of several tokens come as the neighbours' words, as in a datastore."""

    def __init__(self, tokenizer, path: Path, leak: bool = False) -> None:
        self.encoder = type("E", (), {"tokenizer": tokenizer, "vocab_size": len(tokenizer), "name": "scripted"})()
        self.store = type("S", (), {"path": path, "manifest": Manifest(layer=0, status="complete")})()
        self.settings, self.live, self.asked, self.leak, self.removed = DEFAULT, set(), [], leak, False
        self.lexicon: dict[int, tuple[tuple[int, ...], str]] = {}  # lexicon number -> (tokens, word)

    def add_documents(self, docs: list[dict], progress=None) -> int:
        self.live |= {d["id"] for d in docs}
        return len(docs)

    def remove_documents(self, ids: list[str]) -> tuple[list[str], list[str]]:
        self.live -= set(ids)
        self.removed = True
        return list(ids), []

    def words(self, found: Neighbours) -> Words:
        values = np.unique(found.values[found.values >= self.encoder.vocab_size])
        pieces = tuple(self.lexicon[int(v)][0] for v in values)
        return Words(self.encoder.vocab_size, values, pieces, tuple(self.lexicon[int(v)][1] for v in values))

    def _script(self, text: str) -> tuple[dict, dict]:
        """The LM's answer and BERT-kNN's to one question."""
        for record in SCRIPTED:
            for kind, question in zip(("rewrite", "rephrase", "locality"), questions_of(record, False)):
                if question.text == text:
                    lm = {question.true: 0.5, question.new: 0.1 if kind != "locality" else 0.2}
                    edited = f"edit-{record.case_id}" in self.live or (self.leak and self.removed and record.case_id)
                    return lm, AFTER.get((kind, record.case_id), lm) if edited else lm
        raise AssertionError(text)

    def _distribution(self, answer: dict) -> tuple[np.ndarray, Words]:
        vocab, tok = self.encoder.vocab_size, self.encoder.tokenizer
        longer = [(word, p) for word, p in answer.items() if len(target_tokens(tok, word)) > 1]
        for word, _ in longer:
            self.lexicon.setdefault(vocab + 10 * len(word), (target_tokens(tok, word), word))
        values = np.array(sorted(vocab + 10 * len(word) for word, _ in longer), np.int64)
        words = self.words(Neighbours([], np.arange(len(values)), np.zeros(len(values)), values, np.zeros(0)))
        p = np.zeros(words.size)
        for word, prob in answer.items():
            tokens = target_tokens(tok, word)
            p[tokens[0] if len(tokens) == 1 else vocab + words.pieces.index(tokens)] = prob
        return p, words

    def predict_batch(self, texts, subjects, top_k, evidence, settings):
        assert evidence == 0 and settings in (DEFAULT, PAPER)
        tok, vocab, out = self.encoder.tokenizer, self.encoder.vocab_size, []
        for text, subject in zip(texts, subjects):
            self.asked.append((text, subject))
            lm, knn = self._script(text)
            p_bert, (p, words) = self._distribution(lm)[0][:vocab], self._distribution(knn)
            found = Neighbours([], np.arange(len(words.values)), np.zeros(len(words.values)), words.values, np.zeros(0))
            rankings = {"bert": ranked(p_bert, tok, top_k), "knn": [], "bert_knn": ranked(p, tok, top_k, words)}
            out.append(
                Prediction(text, subject, [], **rankings, evidence={}, p_bert=p_bert, p_knn=None, p=p, neighbours=found)
            )
        return out


def test_the_scores_are_counted_exactly_on_scripted_answers(tokenizer, tmp_path):
    reader = ScriptedReader(tokenizer, tmp_path)
    result = evaluate_edits(reader, SCRIPTED, batch=3, modes=("subjects",), in_place=True)
    assert [p["edits"] for p in result["checkpoints"]] == [0, 1, 4]
    before, one, four = (p["scores"]["subjects"] for p in result["checkpoints"])
    everything = dict.fromkeys(SCORES, 100.0)
    assert one["bertknn"]["all"] == {"edits": 1, **everything}  # the first edit: all right
    assert four["bertknn"]["all"] == {
        "edits": 4,
        "efficacy": 75.0,  # 3 of 4 top-1 words are the new target
        "generalisation": 25.0,
        "locality": 75.0,  # record 1's locality answer moved
        "efficacy_score": 75.0,  # record 3: 0 > 0 fails
        "paraphrase_score": 50.0,
        "neighbourhood_score": 75.0,
    }
    assert four["paper"] == four["bertknn"]  # the script answers every settings row alike
    p1 = {"generalisation": 50.0, "locality": 50.0, "neighbourhood_score": 50.0}
    assert four["bertknn"]["relations"]["P1"] == {"edits": 2, **everything, **p1}
    lm = {"edits": 4, "efficacy": 0.0, "generalisation": 0.0, "locality": 100.0, "efficacy_score": 0.0}
    assert four["lm"]["all"] == lm | {"paraphrase_score": 0.0, "neighbourhood_score": 100.0}
    assert before["bertknn"]["all"] == before["lm"]["all"] == four["lm"]["all"]  # nothing edited yet: the LM's
    assert result["checkpoints"][1]["bytes_per_edit"] == 0 and result["checkpoints"][2]["seconds_per_edit"] >= 0
    assert result["undo"]["rows"] == {
        row: {"asked": 12, "changed": 0, "exact": True} for row in ("bertknn", "paper", "lm")
    }
    with_subjects = {(t, s) for t, s in reader.asked if s is not None}
    assert with_subjects == {(q.text, q.subject) for r in SCRIPTED for q in questions_of(r, True)[:2]}
    assert result["records"][2]["answers"]["subjects"]["bertknn"]["rewrite"] == ["baker", "glassblower"]


def test_the_undo_check_counts_answers_that_did_not_come_back(tokenizer, tmp_path):
    reader = ScriptedReader(tokenizer, tmp_path, leak=True)  # records 1 to 3 keep their edited answers
    result = evaluate_edits(reader, SCRIPTED, modes=("subjects", "no_subjects"), in_place=True)
    rows = result["undo"]["rows"]
    # 2 modes, the locality questions once: the rewrites of 1 to 3 and the paraphrases of 1 and 3 changed in each mode
    # (that of 2 has the same top words), the locality answer of 1 (that of 2 has the same top words)
    assert rows["bertknn"] == {"asked": 4 * 5, "changed": (3 + 2) * 2 + 1, "exact": False}
    assert rows["lm"] == {"asked": 20, "changed": 0, "exact": True}


def test_a_targets_probability_is_read_among_the_answer_words(tokenizer):
    words = Words(5, np.array([7, 9]), ((1, 2), (3, 4, 0)), ("ab", "cde"))
    p = np.array([0.1, 0.2, 0.0, 0.0, 0.0, 0.3, 0.4])
    assert probability(p, (1,), 5, words) == 0.2 and probability(p, (3, 4, 0), 5, words) == 0.4
    assert probability(p, (1, 3), 5, words) == 0.0 and probability(p, (), 5, words) == 0.0
    assert probability(p[:5], (3, 4, 0), 5) == 0.0  # the LM alone: its vocabulary only
    assert target_tokens(tokenizer, " Glassblower ") == (3221, 16558, 25114) and target_tokens(tokenizer, "") == ()


# (c) and (d): twenty edits on the tiny BERT, and undo

SUBJECTS = [
    "Zarkel Vombrit", "Quandry Pelth", "Orvik Stannel", "Melkar Dunstry", "Yostin Farrow", "Brenna Kolvish",
    "Tazmir Ollendt", "Wexley Ardun", "Grissom Taltry", "Pimbrel Vost", "Jorvath Kensit", "Lunderby Crail",
    "Estrom Halvig", "Nadrel Voskin", "Ulbrand Sorrit", "Harnok Pelsin", "Cordwel Ivash", "Sembrin Yaltor",
    "Darrow Kilveth", "Fennick Ostrau",
]  # fmt: skip
TARGETS = [
    "piano", "guitar", "violin", "doctor", "lawyer", "teacher", "farmer", "painter", "singer", "river",
    "mountain", "castle", "garden", "bridge", "island", "forest", "harbor", "temple", "market", "library",
]  # fmt: skip
PROMPTS = ("{}, the", "{} is a", "{} was a")  # stopwords besides the subject: IR finds the edit by its subject alone


def twenty_edits() -> list[dict]:
    """Twenty flat edits of invented subjects: each prompt's words but the subject's are stopwords, and each
    locality prompt is about an invented name no document holds (answered by the LM alone, before and after)."""
    return [
        {
            "case_id": i,
            "prompt": PROMPTS[i % 3].format(subject),
            "subject": subject,
            "target_new": TARGETS[i],
            "ground_truth": TARGETS[(i + 7) % 20],
            "rephrase_prompt": f"{subject} is known as a",
            "locality_prompt": f"Quorveth Lindal{'o' * i}m is a",
            "locality_ground_truth": TARGETS[(i + 3) % 20],
        }
        for i, subject in enumerate(SUBJECTS)
    ]


@pytest.fixture()
def edits_file(tmp_path) -> Path:
    path = tmp_path / "edits.json"
    path.write_text(json.dumps(twenty_edits()), encoding="utf-8")
    return path


def test_twenty_edits_end_to_end_on_the_tiny_bert(built, edits_file):
    knn_only = PAPER.replace(lam=1.0)  # p = p_kNN: the edit's own context, at distance ~0, is the nearest
    rows = default_rows(built) | {"knn": knn_only}
    result = evaluate_edits(built, load_edits(edits_file), batch=5, rows=rows)
    assert built.store.documents.count_live() == 5  # the run worked on a copy
    points = {p["edits"]: p for p in result["checkpoints"]}
    assert sorted(points) == [0, 1, 20]
    for mode in ("subjects", "no_subjects"):  # without subjects, TF-IDF finds the edit by the subject's words
        for n in (1, 20):
            scores = points[n]["scores"][mode]["knn"]["all"]
            assert scores["edits"] == n and scores["efficacy"] == scores["efficacy_score"] == 100.0, (mode, n)
        final = points[20]["scores"][mode]
        for row in ("bertknn", "paper", "knn", "lm"):
            # the locality prompts retrieve nothing: the LM answers them, asked in the same chunk every time, so their
            # answers are the same bits before and after the edits
            assert final[row]["all"]["locality"] == 100.0, (mode, row)
            assert final[row]["all"]["neighbourhood_score"] == final["lm"]["all"]["neighbourhood_score"]
        assert final["lm"]["all"] == points[0]["scores"][mode]["lm"]["all"]  # edits cannot move the LM
        assert "relations" not in final["lm"]  # the flat layout names no relation
    assert points[20]["bytes_per_edit"] > 0 and points[20]["seconds_per_edit"] > 0
    # (d) every edit removed: each answer's top-10 words are those before the edits, bit for bit, by construction:
    # the same questions through the same chunks in one process, and the removed documents searched by no path
    assert result["undo"]["rows"] == {row: {"asked": 100, "changed": 0, "exact": True} for row in [*rows, "lm"]}
    assert result["setting"]["rows"]["knn"]["lam"] == 1.0 and result["setting"]["edits"] == 20


def test_the_easyedit_editor_edits_in_place_and_undoes(built, edits_file):
    records = load_edits(edits_file)[:3]
    editor = Editor(built, settings=PAPER.replace(lam=1.0))
    metrics, edited, weights = editor.edit(
        prompts=["{}, the", *(r.prompt for r in records[1:])],
        target_new=[r.target_new for r in records],
        subject=[r.subject for r in records],
        ground_truth=[r.ground_truth for r in records],
        rephrase_prompts=[r.rephrase_prompt for r in records],
        locality_inputs={"neighborhood": {"prompt": [r.locality_prompt for r in records],
                                          "ground_truth": [r.locality_ground_truth for r in records]}},
        case_ids=[r.case_id for r in records],
    )  # fmt: skip
    assert edited is editor and weights == {} and editor.made == ["edit-0", "edit-1", "edit-2"]
    assert built.store.documents.count_live() == 8
    first = metrics[0]
    assert set(first) == {"case_id", "requested_rewrite", "time", "pre", "post", "document", "answers"}
    assert first["requested_rewrite"] == {
        "prompt": "Zarkel Vombrit, the",
        "target_new": "piano",
        "ground_truth": records[0].ground_truth,
        "portability": {},
        "locality": {"neighborhood": {"prompt": records[0].locality_prompt, "ground_truth": "doctor"}},
        "subject": "Zarkel Vombrit",
        "rephrase_prompt": "Zarkel Vombrit is known as a",
    }
    assert set(first["pre"]) == {"rewrite_acc", "rephrase_acc", "portability"}
    for m in metrics:
        assert m["post"]["rewrite_acc"] == [1.0] and m["post"]["locality"] == {"neighborhood_acc": [1.0]}
        assert len(m["post"]["rephrase_acc"]) == 1 and m["post"]["portability"] == {}
    question = "Zarkel Vombrit, the [MASK] ."
    assert built.predict(question, subject="Zarkel Vombrit", settings=editor.settings).bert_knn[0].token == "piano"
    assert editor.undo() == ["edit-0", "edit-1", "edit-2"] and editor.made == [] and editor.restore() == []
    assert built.store.documents.count_live() == 5
    alone, _, _ = editor.edit("Brenna Kolvish is a", "teacher", subject="Brenna Kolvish", sequential_edit=False)
    assert alone[0]["post"]["rewrite_acc"] == [1.0] and set(alone[0]["pre"]) == {"rewrite_acc", "portability"}
    assert editor.made == [] and built.store.documents.count_live() == 5  # each edit removed after it is measured
    with pytest.raises(EditsError, match="target_new must be 2 non-empty string"):
        editor.edit(["a {}", "b {}"], ["x"])


HOLD = (  # another process holding a datastore's writer lock (its own open file) until its stdin closes
    "import sys; from pathlib import Path; from bertknn.store.lock import acquire_lock; "
    "lock = acquire_lock(Path(sys.argv[1]), 0); print('held', flush=True); sys.stdin.read()"
)


@contextlib.contextmanager
def lock_held_elsewhere(store: Path) -> Iterator[None]:
    """`store`'s write.lock held by a second process, through the store's own `acquire_lock`, within the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_an_undo_that_failed_keeps_its_edits_for_the_next(built):
    editor = Editor(built, settings=PAPER.replace(lam=1.0))
    question = "Zarkel Vombrit, the [MASK] ."

    def top() -> str:
        return built.predict(question, subject="Zarkel Vombrit", settings=editor.settings).bert_knn[0].token

    before = top()
    editor.edit("{}, the", "piano", subject="Zarkel Vombrit", case_ids=[0])
    assert before != "piano" and top() == "piano"
    built.writer.close()  # this process's writer lets the lock go: another process takes it
    with lock_held_elsewhere(built.store.path):
        with pytest.raises(BusyError, match="is being written by pid"):
            editor.undo()
        assert editor.made == ["edit-0"] and top() == "piano"  # not removed, so still recorded
    assert editor.undo() == ["edit-0"] and editor.made == [] and editor.undo() == []
    assert top() == before and built.store.documents.count_live() == 5


def test_an_edit_made_alone_stays_recorded_until_its_removal_commits(built, monkeypatch):
    editor = Editor(built, settings=PAPER.replace(lam=1.0))
    remove = built.remove_documents

    def busy(ids: list[str], wait: float | None = None) -> None:
        raise BusyError(f"{built.store.path} is being written by pid 1 (test)")

    monkeypatch.setattr(built, "remove_documents", busy)
    with pytest.raises(BusyError):
        editor.edit("{} is a", "teacher", subject="Brenna Kolvish", sequential_edit=False)
    assert editor.made == ["edit-0"] and built.store.documents.count_live() == 6
    monkeypatch.setattr(built, "remove_documents", remove)
    assert editor.undo() == ["edit-0"] and built.store.documents.count_live() == 5


def test_the_editor_refuses_a_lone_surrogate_naming_the_field(built):
    editor = Editor(built)
    with pytest.raises(EditsError, match=r"^target_new is not valid Unicode \(unpaired surrogate at position 2\)"):
        editor.edit("Brenna Kolvish is a", "te\ud800", subject="Brenna Kolvish")
    with pytest.raises(EditsError, match=r"^subject\[1\] is not valid Unicode"):
        editor.edit(["{} is a", "{} was a"], ["teacher", "doctor"], subject=["Brenna Kolvish", "\udc80"])
    with pytest.raises(EditsError, match=r"^locality_inputs\['n'\]\['ground_truth'\]\[0\] is not valid Unicode"):
        editor.edit("{} is a", "teacher", locality_inputs={"n": {"prompt": "X is a", "ground_truth": ["\ud800"]}})
    assert editor.made == [] and built.store.documents.count_live() == 5  # refused before anything was added


# (e) the command


def _files(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest() for f in path.rglob("*") if f.is_file()
    }


def test_the_command_writes_the_report_and_leaves_the_datastore_as_it_was(built, tmp_path, monkeypatch):
    monkeypatch.setattr(console, "width", 200)  # lines as on a wide terminal: not wrapped
    rome = [
        {
            "case_id": i,
            "requested_rewrite": {"prompt": "{}, the", "subject": s, "relation_id": f"P{1 + i % 2}",
                                  "target_new": {"str": TARGETS[i]}, "target_true": {"str": TARGETS[i + 5]}},
            "paraphrase_prompts": [f"{s} is known as a"],
            "neighborhood_prompts": [f"Quorveth Lindal{'o' * i}m, the"],
        }
        for i, s in enumerate(SUBJECTS[:8])
    ]  # fmt: skip
    path = tmp_path / "rome.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rome), encoding="utf-8")
    store = built.store.path
    before = _files(store)
    out = tmp_path / "report"
    args = ["eval", "edits", str(store), str(path), "--n", "3", "--batch", "2", "--split", "test", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--backend", "torch", "--threads", "1", "--no-subjects"])
    Runtime(threads=1).apply()  # the suite's one thread back
    assert result.exit_code == 0, result.output
    assert _files(store) == before  # edited on a copy
    assert f"report: {out / 'edits.md'}" in result.output and "undo exact" in result.output
    report = (out / "edits.md").read_text(encoding="utf-8")
    assert "## Scores without subjects (%)" in report and "## Scores with subjects" not in report
    assert "## Per relation, after 3 edits (%)" in report and "| P2 | without subjects |" in report
    assert "- split: test" in report and "## Undo" in report and "![scores" in report
    saved = json.loads((out / "edits.json").read_text(encoding="utf-8"))
    assert [p["edits"] for p in saved["checkpoints"]] == [0, 1, 3]
    assert [r["case_id"] for r in saved["records"]] == [1, 3, 5]  # the test half: odd case_ids
    assert (out / "edits.png").read_bytes().startswith(b"\x89PNG")
    bad = CliRunner().invoke(app, ["eval", "edits", str(store), str(path), "--split", "train", "--threads", "1"])
    assert bad.exit_code == 2 and "split must be one of dev, test, all" in bad.output


def test_write_edits_report_from_a_scripted_run(tokenizer, tmp_path):
    result = evaluate_edits(ScriptedReader(tokenizer, tmp_path), SCRIPTED, in_place=True)
    md = write_edits_report(tmp_path / "r", result)
    text = md.read_text(encoding="utf-8")
    assert "| 4 | BERT-kNN, bertknn's settings | 75.0 | 25.0 | 75.0 | 75.0 | 50.0 | 75.0 |" in text
    assert (
        "| 0 (before) | BERT alone (the LM) |" in text and "| P1 | with subjects | BERT-kNN, the paper's | 2 |" in text
    )
    assert json.loads((tmp_path / "r" / "edits.json").read_text())["undo"]["rows"]["lm"]["exact"] is True
