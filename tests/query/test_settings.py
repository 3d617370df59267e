"""The one settings record: the paper's values, replace(), checks and their messages, and that every caller uses it."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertknn import BertKNN, DatastoreError
from bertknn.cli.options import QuerySettings
from bertknn.evaluation.results import results_name
from bertknn.query.settings import (
    DEFAULT,
    DOC_TEMPERATURE,
    HPARAMS,
    LAM,
    MIXTURE,
    MIXTURES,
    PAPER,
    RETRIEVALS,
    SENTENCE_TEMPERATURE,
    TUNED,
    Settings,
)
from bertknn.serving.service import create_app

ROOT = Path(__file__).resolve().parents[2]
QUESTION, SUBJECT = "Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold"


def test_the_defaults_are_the_papers_but_the_vote_and_the_mixture():
    bertknns = {"doc_temperature": DOC_TEMPERATURE, "mixture": MIXTURE, "lam": LAM}  # each kept on the dev split
    bertknns |= {"confidence_temperature": 1.25, "lm_floor": 0.4}  # fitted on the dev split (bench/calibration.py)
    bertknns |= {"entity_filter": True}  # evidence about another entity never answers (reports/edits)
    bertknns |= {"sentence_temperature": SENTENCE_TEMPERATURE}  # read from the datastore's evidence vectors
    bertknns |= {"link": True}  # a question without a subject is given the one its text names
    assert SENTENCE_TEMPERATURE == 0.015  # kept on the dev halves (bench/README.md, "One document, several facts")
    assert Settings() == DEFAULT == PAPER.replace(**bertknns)
    assert (DOC_TEMPERATURE, MIXTURE, LAM) == (0.2, "log-linear", 0.5) and MIXTURES == ("linear", "log-linear")
    assert PAPER.as_dict() == {
        "n_docs": 3,
        "k": 128,
        "temperature": 6.0,
        "lam": 0.3,
        "retrieval": "ir",
        "doc_temperature": 0.0,  # off: the paper's vote
        "lam_by": "constant",
        "mixture": "linear",
        "lm_words": 5,  # beyond the paper, which has no answers of several tokens
        "word_bonus": 15.0,  # used by the log-linear mixture only (bench/README.md, "Words of several tokens ...")
        "sentence_temperature": 0.0,  # off: every sentence alike
        "confidence_temperature": 1.0,  # the probabilities as combined
        "lm_floor": 0.0,
        "conflicts": "newest",  # used only where several documents carry the subject's title; the paper had one each
        "entity_filter": False,  # the paper's TF-IDF keeps documents that do not name the question's entity
        "link": False,  # the paper's questions without a subject search by TF-IDF
    }
    assert (*HPARAMS, "mixture") == TUNED and PAPER.tuned == {**PAPER.hparams, "mixture": "linear"}
    assert HPARAMS == ("n_docs", "k", "temperature", "lam") and RETRIEVALS == ("ir", "faiss", "ir+faiss")
    assert PAPER.hparams == {name: PAPER.as_dict()[name] for name in HPARAMS}
    with pytest.raises(dataclasses.FrozenInstanceError):
        PAPER.k = 64  # type: ignore[misc]


def test_replace_round_trip():
    changed = PAPER.replace(k=64, lam=0.5, retrieval="faiss")
    assert (changed.k, changed.lam, changed.retrieval, changed.n_docs) == (64, 0.5, "faiss", PAPER.n_docs)
    assert Settings(**changed.as_dict()) == changed == PAPER.replace(**changed.as_dict())
    assert changed.replace(**PAPER.as_dict()) == PAPER
    assert PAPER.replace() is PAPER and PAPER.replace(k=None, lam=None) is PAPER  # None: keep, nothing re-checked
    assert hash(changed) == hash(PAPER.replace(k=64, lam=0.5, retrieval="faiss"))  # the service groups by settings


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"k": 0, "lam": 2.0}, "k must be a whole number >= 1, not 0; lam must be a number in [0, 1], not 2.0"),
        (
            {"temperature": float("nan"), "lam": "0.5"},
            "temperature must be a number > 0, not nan; lam must be a number in [0, 1], not '0.5'",
        ),
        ({"k": 2.5}, "k must be a whole number >= 1, not 2.5"),
        ({"n_docs": 0}, "n_docs must be a whole number >= 1, not 0"),
        ({"n_docs": True}, "n_docs must be a whole number >= 1, not True"),
        ({"temperature": 0}, "temperature must be a number > 0, not 0"),
        ({"temperature": -1}, "temperature must be a number > 0, not -1"),
        ({"lam": -0.1}, "lam must be a number in [0, 1], not -0.1"),
        ({"retrieval": "web"}, "retrieval must be one of ir, faiss, ir+faiss, not 'web'"),
        (
            {"lam": 5, "retrieval": "web"},
            "lam must be a number in [0, 1], not 5; retrieval must be one of ir, faiss, ir+faiss",
        ),
        ({"k": float("inf"), "retrieval": 3}, "k must be a whole number >= 1, not inf; retrieval must be one of"),
        ({"doc_temperature": -1}, "doc_temperature must be a number >= 0 (0: the paper's vote), not -1"),
        ({"doc_temperature": float("nan"), "lam_by": "max"}, "doc_temperature must be a number >= 0 (0: the paper's"),
        ({"lam_by": "max"}, "lam_by must be one of constant, entropy, not 'max'"),
        ({"mixture": "max", "k": 0}, "k must be a whole number >= 1, not 0; mixture must be one of linear, log-"),
        ({"lm_words": -1}, "lm_words must be a whole number >= 0 (0: every word of several tokens), not -1"),
        (
            {"lm_words": 2.5, "word_bonus": 0},
            "lm_words must be a whole number >= 0 (0: every word of several tokens), "
            "not 2.5; word_bonus must be a number > 0 (1: none), not 0",
        ),
        ({"word_bonus": float("inf")}, "word_bonus must be a number > 0 (1: none), not inf"),
    ],
)
def test_bad_values_are_named_together(overrides, message):
    with pytest.raises(ValueError) as caught:
        PAPER.replace(**overrides)
    assert str(caught.value).startswith(message)
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings(**{**PAPER.as_dict(), **overrides})


def test_edge_values_are_valid():
    assert PAPER.replace(lam=0.0).lam == 0.0 and PAPER.replace(lam=1).lam == 1
    assert PAPER.replace(k=4.0, n_docs=1).k == 4.0  # a whole float passes, as before
    for retrieval in RETRIEVALS:
        assert PAPER.replace(retrieval=retrieval).retrieval == retrieval


def test_unknown_names_are_a_type_error():
    with pytest.raises(
        TypeError,
        match=r"unknown hyperparameter\(s\) \['alpha', 'lambda_'\]; known: \['confidence_temperature', 'conflicts', '",
    ):
        PAPER.replace(lambda_=0.5, alpha=1)
    tuned = {"k": 64, "temperature": 34.51, "mixture": "log-linear"}
    assert Settings.from_tuned(tuned) == DEFAULT.replace(k=64, temperature=34.51)
    # a record without a mixture was tuned before there was a choice: for the linear one
    assert Settings.from_tuned({"lam": 0.6}) == DEFAULT.replace(lam=0.6, mixture="linear")
    assert Settings.from_tuned({}) == DEFAULT
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['retrieval'\]"):
        Settings.from_tuned({"retrieval": "faiss"})  # a datastore stores tuned numbers only
    with pytest.raises(TypeError, match="unknown hyperparameter"):
        Settings.from_tuned([3, 128])
    with pytest.raises(ValueError, match=r"lam must be a number in \[0, 1\]"):
        Settings.from_tuned({"lam": 3})


def test_the_library_keeps_its_keyword_interface(built):
    assert built.settings == DEFAULT and built.hparams == PAPER.hparams | {"lam": LAM}
    chosen = PAPER.replace(n_docs=1, k=4, temperature=2.0, lam=0.5)
    by_keywords = built.predict(QUESTION, SUBJECT, **chosen.as_dict())
    by_settings = built.predict_batch([QUESTION], [SUBJECT], settings=chosen)[0]
    np.testing.assert_array_equal(by_keywords.p, by_settings.p)
    other = BertKNN(built.encoder, built.store, settings=chosen, k=8)
    assert other.settings == chosen.replace(k=8) and other.hparams["k"] == 8
    assert BertKNN(built.encoder, built.store, k=4).settings == DEFAULT.replace(k=4)
    with pytest.raises(ValueError, match="retrieval must be one of ir, faiss, ir\\+faiss, not 'web'"):
        built.predict(QUESTION, retrieval="web")


def test_tuned_values_stored_with_the_datastore_replace_the_papers(built):
    with built.writer.commit() as store:
        store.writer.set_manifest(tuned={"hparams": {"n_docs": 1, "k": 64, "temperature": 34.51, "lam": 0.6}})
    tuned = BertKNN(built.encoder, built.store)  # stored before tune searched the mixture: tuned for the linear one
    assert tuned.settings == DEFAULT.replace(n_docs=1, k=64, temperature=34.51, lam=0.6, mixture="linear")
    assert BertKNN(built.encoder, built.store, lam=0.3).settings.lam == 0.3  # arguments replace the tuned values
    tag = f"n1-k64-T34.51-l0.6-dt{DOC_TEMPERATURE}-st0.015-ct1.25-f0.4-named-linked"
    assert results_name(tuned, "full") == f"results-L{built.store.manifest.layer}-{tag}-full.jsonl"
    with built.writer.commit() as store:
        store.writer.set_manifest(tuned={"hparams": {"lam": 7}})
    with pytest.raises(
        DatastoreError, match=r"holds bad tuned hyperparameters \(lam must be a number in \[0, 1\], not 7\)"
    ):
        BertKNN(built.encoder, built.store)


@pytest.mark.parametrize(
    "options",
    [
        {"lam": 5.0},
        {"n_docs": 2, "temperature": -1.0},
        {"lam": 1.5, "temperature": 0.0},
        {"retrieval": "web"},
        {"lam": 2.0, "retrieval": "everywhere"},
    ],
)
def test_the_service_and_the_library_give_the_same_message(built, options):
    """Floats as the service reads them (JSON 5 is 5.0 for a float option); its own bounds (k, n_docs) come first."""
    with pytest.raises(ValueError) as caught:
        built.predict(QUESTION, SUBJECT, **options)
    with TestClient(create_app(built), base_url="http://localhost") as client:
        response = client.post("/predict", json={"text": QUESTION, "subject": SUBJECT, "options": options})
    assert response.status_code == 422 and response.json()["detail"] == str(caught.value)


def test_the_service_passes_one_settings_down(built, monkeypatch):
    seen = []
    real = built.predict_batch

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(built, "predict_batch", spy)
    with TestClient(create_app(built), base_url="http://localhost") as client:
        options = {"k": 4, "lam": 0.5, "retrieval": "ir"}
        response = client.post("/predict", json={"text": QUESTION, "subject": SUBJECT, "options": options})
        assert response.status_code == 200, response.text
        health = client.get("/health").json()
        assert health["hparams"] == DEFAULT.hparams and health["settings"] == DEFAULT.as_dict()
        assert health["settings"]["mixture"] == "log-linear" and health["settings"]["doc_temperature"] == 0.2
        schema = client.get("/openapi.json").json()["components"]["schemas"]["Options"]["properties"]["retrieval"]
    assert seen == [{"settings": DEFAULT.replace(**options)}]
    assert list(RETRIEVALS) in (schema.get("enum"), *(s.get("enum") for s in schema.get("anyOf", [])))


def test_result_file_names_are_unchanged():
    assert PAPER.file_tag() == "n3-k128-T6.0-l0.3"
    names = sorted(p.name for p in ROOT.glob("reports/*/results-*.jsonl"))
    assert names, "no committed result files found"
    pattern = re.compile(
        r"results-L(\d+)-n(\d+)-k(\d+)-T([\d.]+)-l([\d.]+)(?:-dt([\d.]+))?(-loglin)?(?:-st([\d.]+))?(?:-ct([\d.]+))?"
        r"(?:-f([\d.]+))?-(full|common)(-nosubject)?\.jsonl"
    )
    for name in names:
        layer, n_docs, k, temperature, lam, dt, loglin, st, ct, lf, vocab, nosubject = pattern.fullmatch(name).groups()
        numbers = {"n_docs": int(n_docs), "k": int(k), "temperature": float(temperature), "lam": float(lam)}
        mixture = "log-linear" if loglin else "linear"
        settings = PAPER.replace(
            **numbers,
            doc_temperature=float(dt or 0),
            mixture=mixture,
            sentence_temperature=float(st or 0),
            confidence_temperature=float(ct or 1),
            lm_floor=float(lf or 0),
        )
        assert f"results-L{layer}-{settings.file_tag()}-{vocab}{nosubject or ''}.jsonl" == name
    assert f"results-L5-{PAPER.file_tag()}-full.jsonl" in names


def test_results_name_uses_the_settings(built):
    assert results_name(built, "common") == f"results-L{built.store.manifest.layer}-{DEFAULT.file_tag()}-common.jsonl"
    # other results, another file: calibrated probabilities rank the gold answer differently
    assert DEFAULT.file_tag() == f"n3-k128-T6.0-l{LAM}-dt{DOC_TEMPERATURE}-loglin-st0.015-ct1.25-f0.4-named-linked"


NUMBER = r"(?<![\w.]){}(?![\w.])"
PAPER_VALUES = {
    "n_docs": r"3",
    "k": r"128",
    "temperature": r"6(?:\.0*)?",
    "lam": r"0?\.30*",
}
TUPLE = re.compile(r"3\s*[,/]\s*128\s*[,/]\s*6(?:\.0*)?\s*[,/]\s*0?\.3\b")
NAMED = re.compile(
    "|".join(rf"\b{name}\b['\"]?\s*(?::\s*\w+\s*)?[:=]\s*{value}(?![\w.])" for name, value in PAPER_VALUES.items())
)


def _sources():
    for folder in ("src", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "settings.py":
                yield path


def test_the_papers_values_are_written_only_in_settings():
    """No copy of the defaults in src/ or bench/: not as a tuple, not as name = value, not two of them on one line."""
    found = []
    values = [re.compile(NUMBER.format(v)) for v in (r"128", r"6\.0", r"0\.3")]
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            if TUPLE.search(line) or NAMED.search(line) or sum(bool(v.search(line)) for v in values) >= 2:
                found.append(where)
    assert not found, "the paper's values outside settings.py:\n" + "\n".join(found)
    settings = (ROOT / "src" / "bertknn" / "query" / "settings.py").read_text(encoding="utf-8")
    assert all(re.search(rf"\b{name}: \w+ = ", settings) for name in HPARAMS)


def test_the_scan_finds_copies():
    """The scan above would have caught the copies this settings record replaced."""
    lines = [
        'DEFAULTS = {"n_docs": 3, "k": 128, "temperature": 6.0, "lam": 0.3}',
        'PAPER = {"n_docs": 3, "k": 128, "temperature": 6.0, "lam": 0.3}',
        "if (r['n_docs'], r['k'], r['temperature'], r['lam']) == (3, 128, 6.0, 0.3):",
        "the paper's 3/128/6/0.3",
        "p = interpolate(p_bert, knn_distribution(values, dist[0], 6.0, len(p_bert)), 0.3)",
        "    k: int = 128",
        "lam=0.3",
    ]
    values = [re.compile(NUMBER.format(v)) for v in (r"128", r"6\.0", r"0\.3")]
    for line in lines:
        assert TUPLE.search(line) or NAMED.search(line) or sum(bool(v.search(line)) for v in values) >= 2, line
    assert not NAMED.search("KEY_WINDOW = 128") and not NAMED.search("max_length: int = 128")


def test_every_setting_is_an_option_of_the_cli_and_the_service_with_its_bounds():
    """The CLI's options and the service's request schema are made from Settings' declarations: each field is in
    both, with the bounds or choices Settings states (and the service's own caps, no looser)."""
    from typer.main import get_command

    from bertknn.cli import app
    from bertknn.query.settings import SPECS
    from bertknn.serving.schemas import LIMITS, Options

    cli = get_command(app)
    commands = {"ask": cli.commands["ask"], "eval lama": cli.commands["eval"].commands["lama"]}
    schema = Options.model_json_schema()["properties"]
    bounds = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    assert set(schema) == {field.name for field, _ in SPECS}
    for field, spec in SPECS:
        for name, command in commands.items():
            option = next((p for p in command.params if p.name == field.name), None)
            assert option is not None, f"{name} has no option for {field.name}"
            allowed = " or ".join(spec.choices) if spec.choices else spec.range()
            assert f"[{allowed}]" in option.help if allowed else field.type == "bool", (name, field.name)
        stated = next(s for s in schema[field.name]["anyOf"] if s["type"] != "null")
        expected = {key: getattr(spec, name) for name, key in bounds.items() if getattr(spec, name) is not None}
        if field.name in LIMITS:
            assert stated.pop("maximum") == LIMITS[field.name] and spec.le is None
        assert {k: v for k, v in stated.items() if k in bounds.values()} == expected, field.name
        assert stated.get("enum", []) == list(spec.choices), field.name
    assert Settings.__dataclass_fields__["lam"].metadata["spec"].flag == "--lambda"
    assert next(p for p in commands["ask"].params if p.name == "lam").opts == ["--lambda"]


def test_the_cli_gives_the_settings_its_options_make(tmp_path):
    """What a command is called with: the options given, over the paper's with --paper; --no-sentence-weights."""
    from bertknn.cli import options

    signature = options.exposed(inspect.signature(_command, eval_str=True))
    assert [p.name for p in signature.parameters.values()][:2] == ["datastore", "n_docs"]
    given = signature.bind(tmp_path, k=4, paper=True, no_sentence_weights=True).arguments
    given = {name: given.get(name, p.default) for name, p in signature.parameters.items()}
    made = options.gathered(given)
    assert made["datastore"] == tmp_path and made["top_k"] == 10
    paper = {name: value for name, value in PAPER.replace(k=4).as_dict().items() if name != "retrieval"}
    assert made["settings"] == paper | {"sentence_temperature": 0.0}  # the retrieval stays the datastore's
    assert options.gathered({**given, "paper": False, "no_sentence_weights": False})["settings"] == {"k": 4}


def _command(datastore: Path, settings: QuerySettings = None, top_k: int = 10) -> None:  # a command's shape
    """A command that takes the query settings."""
