"""Hostile input: broken Unicode in corpora and questions, out-of-range options, terminal escapes in output."""

from __future__ import annotations

import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from bertknn.cli import app
from bertknn.console import render
from bertknn.model.encoder import QuestionError
from bertknn.query.prediction import Neighbour, Prediction, TokenScore
from bertknn.text import CONTROL, CorpusError, Document, iso_date, iter_corpus, parse_document, question_error

FUZZ = settings(
    max_examples=int(os.environ.get("BERTKNN_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            r'{"id": "x", "title": "T", "text": "bad \ud800 here"}',
            "'text' is not valid Unicode (unpaired surrogate at position 4)",
        ),
        (
            r'{"id": "x\udc00", "title": "T", "text": "ok"}',
            "'id' is not valid Unicode (unpaired surrogate at position 1)",
        ),
        (r'{"id": "x", "title": "\ud83d", "text": "ok"}', "'title' is not valid Unicode"),
        (r'{"id": "x", "title": "T", "sentences": ["ok", "\udfff"]}', "'sentences' item 2 is not valid Unicode"),
        (r'{"id": "a\u001b[31m", "title": "T", "text": "ok"}', "'id' 'a\\x1b[31m' holds the control character U+001B"),
        (r'{"id": "a\u0085", "title": "T", "text": "ok"}', "'id' 'a\\x85' holds the control character U+0085"),
        (r'{"id": "a\u007f", "title": "T", "text": "ok"}', "'id' 'a\\x7f' holds the control character U+007F"),
    ],
)
def test_corpus_strings_that_are_not_valid_unicode_or_ids_with_controls_are_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "title": "T", "text": "fine"}\n' + line + "\n", encoding="ascii")
    with pytest.raises(CorpusError) as err:
        list(iter_corpus(path))
    assert str(err.value) == f"{path}:2: {message}" or str(err.value).startswith(f"{path}:2: {message} (")


def test_ids_may_hold_tabs_and_paired_surrogate_escapes_are_fine():
    doc = parse_document(json.loads(r'{"id": "a\tb", "title": "\ud83d\ude00", "text": "x"}'), "w")
    assert doc.id == "a\tb" and doc.title == "😀"


OUT_OF_RANGE_DATES = ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"]  # years 10000 and 0 in UTC


@pytest.mark.parametrize("date", OUT_OF_RANGE_DATES)
def test_a_date_outside_years_1_to_9999_in_utc_is_a_corpus_error(date):
    why = f"{date!r} converted to UTC falls outside the years 1 to 9999"
    with pytest.raises(ValueError) as err:
        iso_date(date)
    assert str(err.value) == why
    with pytest.raises(CorpusError) as err:
        parse_document({"id": "a", "title": "A", "text": "x", "date": date}, "here")
    assert str(err.value) == f"here: 'date' {why}"


@pytest.mark.parametrize("command", ["build", "add"])
def test_cli_names_the_file_and_line_of_a_date_out_of_range(tmp_path, tiny_model_dir, command):
    corpus = tmp_path / "c.jsonl"
    dated = {"id": "b", "title": "B", "text": "ok", "date": OUT_OF_RANGE_DATES[0]}
    corpus.write_text('{"id": "a", "title": "A", "text": "ok"}\n' + json.dumps(dated) + "\n", encoding="utf-8")
    store, model = tmp_path / "store", ["--model", str(tiny_model_dir)]
    args = (
        ["build", str(corpus), "--out", str(store), *model] if command == "build" else ["add", str(store), str(corpus)]
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    said = "".join(result.output.split())  # one message, wrapped to the terminal's width wherever it breaks
    assert said.startswith("error:") and "Traceback" not in said
    expected = f"c.jsonl:2: 'date' '{OUT_OF_RANGE_DATES[0]}' converted to UTC falls outside the years 1 to 9999"
    assert said.endswith("".join(expected.split()))


def test_invalid_utf8_names_file_line_byte_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "title": "A", "text": "ok"}\n{"id": "b", "title": "B", "text": "caf\xe9"}\n')
    column = b'{"id": "b", "title": "B", "text": "caf\xe9"}'.index(b"\xe9") + 1
    with pytest.raises(CorpusError, match=rf"^{path}:2: not valid UTF-8 \(byte 0xe9 at column {column}\)$"):
        list(iter_corpus(path))


def test_question_error_names_an_unpaired_surrogate_and_keeps_the_mask_checks():
    assert question_error("Dante was born in [MASK] .") is None
    assert question_error("ab\ud800 [MASK]") == "the question is not valid Unicode (unpaired surrogate at position 2)"
    assert "has no [MASK]" in question_error("Dante was born in Florence.")
    assert "has 2 [MASK] tokens" in question_error("[MASK] [MASK]")


def test_questions_and_subjects_with_surrogates_are_question_errors(built):
    with pytest.raises(QuestionError, match=r"question 1 .*not valid Unicode \(unpaired surrogate at position 6\)"):
        built.predict("Dante \ud800 was born in [MASK] .")
    with pytest.raises(QuestionError, match=r"subject 1 .*the subject is not valid Unicode"):
        built.predict("Dante was born in [MASK] .", subject="Dan\udfffte")
    with pytest.raises(QuestionError, match="not valid Unicode"):
        built.encoder.question_ids("\udc80 [MASK]")


def test_questions_longer_than_the_model_are_cut_to_its_positions(built):
    assert built.predict("[MASK] is a city " + "and a town " * 80).bert  # 330 tokens, a 128-position model
    with pytest.raises(QuestionError, match="too long"):
        built.predict("a town " * 200 + "is in [MASK] .")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "top_k must be an integer from 1 to the vocabulary size 30522 (got 0)"),
        ({"top_k": -1}, "top_k must be an integer from 1"),
        ({"top_k": 1_000_000}, "(got 1000000)"),
        ({"top_k": 2.5}, "(got 2.5)"),
        ({"top_k": True}, "(got True)"),
        ({"evidence": -1}, "evidence must be an integer >= 0 (got -1)"),
    ],
)
def test_out_of_range_top_k_and_evidence_are_refused(built, options, message):
    with pytest.raises(ValueError) as err:
        built.predict("Dante was born in [MASK] .", **options)
    assert message in str(err.value)


def test_top_k_one_and_no_evidence_answer(built):
    p = built.predict("Dante was born in [MASK] .", subject="Dante Alighieri", top_k=1, evidence=0)
    assert len(p.bert) == 1 and all(not n for n in p.evidence.values())


@pytest.mark.parametrize("value", ["-1", "0", "1001"])
def test_cli_top_k_out_of_range_is_a_usage_error(tmp_path, value):
    result = CliRunner().invoke(app, ["ask", str(tmp_path), "x [MASK]", "--top-k", value])
    assert result.exit_code == 2 and "Invalid value for '--top-k'" in result.output
    assert "Traceback" not in result.output


def test_render_escapes_control_characters_of_questions_and_corpus_text():
    bad = "\x1b[31mred\x07\x9b\x7f"
    tokens = [TokenScore(f"tok{bad}", 0.5, 7)]
    sentence = f"A sentence {bad} with tok{bad} ."
    span = (sentence.index("tok"), sentence.index("tok") + len(f"tok{bad}"))
    neighbour = Neighbour(f"tok{bad}", 1.0, 1.0, "d1", f"Title {bad}", sentence, span)
    prediction = Prediction(
        question=f"{bad} [MASK] [bold]x[/bold]",
        subject=None,
        documents=[f"Doc {bad}"],
        bert=tokens,
        knn=tokens,
        bert_knn=tokens,
        evidence={f"tok{bad}": [neighbour]},
        p_bert=None,
        p_knn=None,
        p=None,
    )
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=300).print(render(prediction, top_k=1))
    text = out.getvalue()
    assert not CONTROL.search(text.replace("\n", ""))
    assert r"\x1b[31mred\x07\x9b\x7f [MASK] [bold]x[/bold]" in text  # shown as written, markup included
    assert r"Title \x1b[31mred\x07\x9b\x7f:" in text and r"Doc \x1b[31mred\x07\x9b\x7f" in text
    assert r"A sentence \x1b[31mred\x07\x9b\x7f with tok\x1b[31mred\x07\x9b\x7f ." in text


# Property tests: whatever the input, bertknn answers or raises its own errors.

CHARS = st.characters() | st.characters(categories=["Cs"]) | st.characters(max_codepoint=0x9F)  # surrogates, controls
TEXT = st.text(CHARS, max_size=30)
QUESTION = st.one_of(
    st.lists(st.one_of(st.just("[MASK]"), TEXT), max_size=8).map("".join),
    st.tuples(TEXT, TEXT).map(lambda t: f"{t[0]} [MASK] {t[1]}"),
    st.tuples(st.integers(0, 400), st.integers(0, 400), TEXT).map(
        lambda t: "a " * t[0] + "[MASK]" + " b" * t[1] + t[2]
    ),
    st.text(CHARS, min_size=1000, max_size=3000),
)


def _is_bertknn_error(err: Exception) -> bool:
    return isinstance(err, ValueError) and type(err).__module__.startswith("bertknn.")


@FUZZ
@given(question=QUESTION, subject=st.none() | TEXT)
def test_any_question_answers_or_raises_a_bertknn_error(built, question, subject):
    try:
        prediction = built.predict(question, subject=subject, top_k=3)
    except Exception as err:  # the property: only bertknn's own errors
        assert _is_bertknn_error(err), repr(err)
    else:
        assert prediction.question == question and 1 <= len(prediction.bert) <= 3


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
DOCUMENT = st.fixed_dictionaries(
    {},
    optional={"id": JSON | TEXT, "title": JSON | TEXT, "text": JSON | TEXT, "sentences": st.lists(TEXT) | JSON},
)


def _is_document(doc: object) -> bool:
    """A Document whose id and text are there and whose strings all encode to UTF-8."""
    for s in (doc.id, doc.title, *doc.passages):
        s.encode("utf-8")
    return isinstance(doc, Document) and bool(doc.id and doc.passages)


@FUZZ
@given(obj=DOCUMENT | JSON)
def test_any_json_value_is_a_document_or_a_corpus_error(obj):
    try:
        doc = parse_document(obj, "somewhere")
    except CorpusError as err:
        assert str(err).startswith("somewhere: ")
    else:
        assert _is_document(doc)


LINE = st.one_of(
    st.binary(max_size=60),
    st.tuples(DOCUMENT | JSON, st.booleans()).map(
        lambda t: json.dumps(t[0], ensure_ascii=t[1]).encode("utf-8", "surrogatepass")
    ),
)


@FUZZ
@given(lines=st.lists(LINE, max_size=5))
def test_any_corpus_file_gives_documents_or_a_corpus_error(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "corpus.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
    try:
        docs = list(iter_corpus(path))
    except CorpusError as err:
        assert str(err).startswith(str(path))
    else:
        assert docs and all(_is_document(d) for d in docs)
