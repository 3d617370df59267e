"""Edits files that Python's JSON reader or the tokenizer cannot take (issue #62): nesting deeper than the parser
recurses, a lone surrogate in a field, a case_id of more digits than Python converts. Each is an EditsError naming
the file, the record and the problem, and `bertknn eval edits` prints it as one line and exits with 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.console import console
from bertknn.evaluation.edits_data import EditsError, load_edits

from ..conftest import SMALL_DOCS, write_corpus
from .test_edits import FLAT, ROME

LONG = "9" * 5001  # over Python's 4,300 digits for an int from a string
SURROGATE_TARGET = {**ROME, "requested_rewrite": {**ROME["requested_rewrite"], "target_new": {"str": "\ud800"}}}
BAD = {  # name: (the file's text, what the message says after the file's name)
    "nested list": (
        "[" * 100_000 + "]" * 100_000,
        ": JSON nested too deeply to read (arrays or objects within each other)",
    ),
    "nested line": (
        json.dumps(FLAT) + "\n" + '{"case_id": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
        ", record 2 (line 2): JSON nested too deeply to read (arrays or objects within each other)",
    ),
    "surrogate in target_new.str": (
        json.dumps([SURROGATE_TARGET]),  # written as the JSON escape "\ud800"
        ", record 1: field 'requested_rewrite.target_new.str': not valid Unicode (unpaired surrogate at position 0)",
    ),
    "surrogate in a flat field": (
        json.dumps([FLAT, {**FLAT, "case_id": 3, "ground_truth": "gui\udc80tar"}]),
        ", record 2: field 'ground_truth': not valid Unicode (unpaired surrogate at position 3)",
    ),
    "long case_id": (
        json.dumps([FLAT]).replace('"case_id": 2', f'"case_id": {LONG}'),
        ", record 1: field 'case_id' has 5,001 digits, over Python's limit of 4,300",
    ),
    "long case_id string": (
        json.dumps({**FLAT, "case_id": LONG}) + "\n",
        ", record 1 (line 1): field 'case_id' has 5,001 digits, over Python's limit of 4,300",
    ),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, encoder) -> Path:
    """A datastore of the small corpus, so that a file the command took would be edited for real (on a copy)."""
    from bertknn.query.pipeline import BertKNN

    path = tmp_path_factory.mktemp("edits-input")
    return BertKNN.build(write_corpus(path / "corpus.jsonl", SMALL_DOCS), path / "store", encoder).store.path


def _bad_file(tmp_path: Path, name: str) -> tuple[Path, str]:
    """The file of BAD[name] (JSON Lines unless its text is a list) and the message it must get."""
    text, message = BAD[name]
    path = tmp_path / ("edits.json" if text.startswith("[") else "edits.jsonl")
    path.write_text(text, encoding="utf-8")
    return path, f"{path}{message}"


@pytest.mark.parametrize("name", BAD)
def test_load_edits_names_the_file_record_and_problem(tmp_path, name):
    path, message = _bad_file(tmp_path, name)
    with pytest.raises(EditsError) as err:
        load_edits(path)
    assert str(err.value) == message


@pytest.mark.parametrize("name", BAD)
def test_eval_edits_prints_one_line_and_exits_2(store, tmp_path, monkeypatch, name):
    monkeypatch.setattr(console, "width", 10_000)  # one line however long the temporary path
    path, message = _bad_file(tmp_path, name)
    args = ["eval", "edits", str(store), str(path), "--backend", "torch", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # not an exception's traceback
    assert result.output.strip() == f"error: {message}"
