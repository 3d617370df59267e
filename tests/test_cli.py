"""The command line through typer's runner: build, ask, demo, and the errors a user sees."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from bertknn import BertKNN
from bertknn.cli import app
from bertknn.cli import main as cli
from bertknn.model.runtime import Runtime
from bertknn.query.settings import DEFAULT, PAPER
from bertknn.store.datastore import Datastore, read_committed

from .conftest import write_corpus
from .tolerances import assert_ranking_close

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Render as on a 200-column terminal so that lines are not wrapped; the suite's one thread back afterwards
    (a command without --threads sets all cores for the process)."""
    monkeypatch.setattr(cli.console, "width", 200)
    yield
    Runtime(threads=1).apply()


@pytest.fixture()
def store_dir(tmp_path, small_corpus, tiny_model_dir):
    out = tmp_path / "store"
    result = runner.invoke(
        app, ["build", str(small_corpus), "--out", str(out), "--model", str(tiny_model_dir), "--threads", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "5 documents (5 embedded)" in result.output and "layer 3" in result.output
    return out


def test_ask_prints_three_lists_and_evidence(store_dir):
    result = runner.invoke(
        app,
        [
            "ask",
            str(store_dir),
            "Quellbrook is a town in [MASK] .",
            "--subject",
            "quellbrook",
            "--top-k",
            "3",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    for heading in ("BERT", "kNN", "BERT-kNN", "evidence", "documents: Quellbrook", "Quellbrook is a town in Norway."):
        assert heading in result.output


def test_ask_json_is_the_library_answer_with_the_fill_mask_format(store_dir):
    question = "Quellbrook is a town in [MASK] ."
    options = ["--subject", "quellbrook", "--top-k", "3", "--json", "--backend", "torch"]
    result = runner.invoke(app, ["ask", str(store_dir), question, *options])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    knn = BertKNN.load(store_dir)
    expected = knn.predict(question, subject="quellbrook", top_k=3)
    assert got["documents"] == ["Quellbrook"]  # the CLI maybe at another thread count: the model's tolerance
    ranked = [(t["token"], t["probability"]) for t in got["bert_knn"]]
    assert_ranking_close(ranked, [(t.token, t.probability) for t in expected.bert_knn])
    fill_mask = {a["token_str"]: a["sequence"] for a in expected.fill_mask(knn.encoder.tokenizer)}
    shown = {a["token_str"]: a["sequence"] for a in got["fill_mask"]["bert_knn"]}
    assert [t for t, _ in ranked] == list(shown) and all(shown[t] == fill_mask[t] for t in shown.keys() & fill_mask)
    assert got["fill_mask"]["bert_knn"][0]["sequence"].startswith("quellbrook is a town in ")


def test_ask_paper_and_mixture_choose_the_settings(store_dir):
    question, asked = "Quellbrook is a town in [MASK] .", ["--top-k", "5", "--json", "--backend", "torch"]
    knn = BertKNN.load(store_dir)

    def answer(*options: str, text: str = question) -> list[tuple]:
        result = runner.invoke(app, ["ask", str(store_dir), text, *asked, *options])
        assert result.exit_code == 0, result.output
        return [(t["token"], t["probability"]) for t in json.loads(result.output)["bert_knn"]]

    def library(settings, text: str = question) -> list[tuple]:
        (prediction,) = knn.predict_batch([text], top_k=5, settings=settings)
        return [(t.token, t.probability) for t in prediction.bert_knn]

    def differs(a: list[tuple], b: list[tuple]) -> bool:  # other tokens, or probabilities apart by far more than noise
        return [t for t, _ in a] != [t for t, _ in b] or not np.allclose(
            [p for _, p in a], [p for _, p in b], rtol=1e-2
        )

    # the CLI's answers against the library's: the same model, maybe at another thread count (the model's tolerance)
    assert_ranking_close(answer("--paper"), library(PAPER))
    assert differs(library(PAPER), library(DEFAULT))
    assert_ranking_close(answer(), library(DEFAULT))
    assert_ranking_close(answer("--paper", "--k", "4"), library(PAPER.replace(k=4)))  # options with --paper apply
    assert_ranking_close(answer("--mixture", "linear"), library(DEFAULT.replace(mixture="linear")))
    bad = runner.invoke(app, ["ask", str(store_dir), question, "--mixture", "cubic", "--threads", "1"])
    assert bad.exit_code == 2 and "mixture must be one of linear, log-linear, not 'cubic'" in bad.output
    plain = DEFAULT.replace(sentence_temperature=0)  # the weights off: the words' options decide the ranking alone
    assert_ranking_close(answer("--no-sentence-weights"), library(plain))
    words, text = plain.replace(lm_words=0, word_bonus=1000.0), "It is a small town in [MASK] ."  # no quellbrook
    scored = answer("--lm-words", "0", "--word-bonus", "1000", "--no-sentence-weights", text=text)
    assert_ranking_close(scored, library(words, text))
    assert differs(library(words, text), library(plain, text))
    bad = runner.invoke(app, ["ask", str(store_dir), question, "--word-bonus", "0", "--threads", "1"])
    assert bad.exit_code == 2 and "word_bonus must be a number > 0 (1: none), not 0.0" in bad.output
    unnamed, text = DEFAULT.replace(entity_filter=False), "Zorblat is a small town in [MASK] ."  # in no document
    assert_ranking_close(answer("--no-entity-filter", text=text), library(unnamed, text))
    assert_ranking_close(
        answer("--paper", "--entity-filter", text=text), library(PAPER.replace(entity_filter=True), text)
    )
    assert differs(library(unnamed, text), library(DEFAULT, text))  # the filter leaves no document: the LM answers


def test_ask_gives_the_same_answer_on_both_backends_and_refuses_an_unknown_one(store_dir):
    ask = ["ask", str(store_dir), "Quellbrook is a town in [MASK] .", "--subject", "quellbrook", "--threads", "1"]
    onnx = runner.invoke(app, ask)  # the default backend
    torch = runner.invoke(app, [*ask, "--backend", "torch"])
    assert onnx.exit_code == torch.exit_code == 0 and onnx.output == torch.output, (onnx.output, torch.output)
    bad = runner.invoke(app, [*ask, "--backend", "tensorrt"])
    assert bad.exit_code == 2 and "unknown backend 'tensorrt'" in bad.output


def test_ask_reports_a_question_without_mask(store_dir):
    result = runner.invoke(app, ["ask", str(store_dir), "Quellbrook is a town.", "--threads", "1"])
    assert result.exit_code == 2 and "has no [MASK]" in result.output


def test_ask_on_a_lazy_store_shows_the_embedding_s_progress_on_stderr(tmp_path, small_corpus, tiny_model_dir):
    out, model = str(tmp_path / "lazy"), ["--model", str(tiny_model_dir), "--threads", "1"]
    assert runner.invoke(app, ["build", str(small_corpus), "--out", out, "--lazy", *model]).exit_code == 0
    asked = runner.invoke(app, ["ask", out, "Ilsa Varnhold was born in [MASK] .", "--json", *model])
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.stdout)["documents"]  # stdout: the answer alone, off a terminal too
    n = re.search(rf"embedding (\d) documents of {re.escape(out)} before they are searched", asked.stderr)
    assert n, asked.stderr  # the documents IR picks for the question, then the line that says they are done
    assert re.search(
        rf"embedded {n[1]} of {n[1]} documents, [\d,]+ contexts \([\d,]+ contexts/s in [\d.]+ s\)", asked.stderr
    )


def test_build_reports_the_bad_line(tmp_path, tiny_model_dir):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "ok"}\n{"id": "b"}\n', encoding="utf-8")
    result = runner.invoke(app, ["build", str(corpus), "--out", str(tmp_path / "o"), "--model", str(tiny_model_dir)])
    assert result.exit_code == 2 and "c.jsonl:2" in result.output and "missing 'title'" in result.output
    assert not (tmp_path / "o").exists()


def test_ask_on_a_missing_datastore(tmp_path):
    result = runner.invoke(app, ["ask", str(tmp_path), "A [MASK] ."])
    assert result.exit_code == 2 and "not a datastore" in result.output


def test_demo_runs_and_caches(tmp_path, tiny_model_dir, monkeypatch):
    from bertknn.model.sentences import sentence_encoder

    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    sentence_encoder.cache_clear()  # loaded once per process: here, as in a new one, from this cache directory
    args = ["demo", "--model", str(tiny_model_dir), "--threads", "1"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Ilsa Varnhold was born in [MASK] ." in first.output and "questions answered right" in first.output
    fresh = [line.split(": BERT-kNN ")[1].split()[0] for line in first.output.splitlines() if ": BERT-kNN " in line]
    said = " ".join(first.output.split())  # lines wrapped at the terminal's width, joined
    assert "without sentence weights (--no-sentence-weights)" in said and "no sentence weights: BERT-kNN" in said
    # per question: before add, after add, after add without sentence weights, after remove
    assert fresh[1] == "tallinn" and fresh[0] != "tallinn" and fresh[3] != "tallinn"
    assert fresh[5] == "kuressaare" and "kuressaare" not in (fresh[4], fresh[7])  # a word of four wordpieces
    assert "before the update: answers" in said and "after the update: answers" in said  # an article's update
    assert "documents: Tovald Ekrund, Tovald Ekrund" in said  # after it, both versions are read
    (cached,) = (tmp_path / "cache").glob("demo-*")  # the fresh-facts step ran on a copy
    graphs = sorted(p.name.split("-")[2] for p in (tmp_path / "cache" / "onnx").glob("*.onnx"))
    assert graphs == ["key_states", "mask_outputs", "mean_states"]  # the default backend's, the sentence encoder's
    assert Datastore(cached).n_documents == 43
    mtime = (cached / "keys.f16").stat().st_mtime_ns
    assert runner.invoke(app, args).exit_code == 0
    assert (cached / "keys.f16").stat().st_mtime_ns == mtime  # the second run reuses the datastore


def test_eval_lama_and_tune_on_a_crafted_probe(tmp_path, small_corpus, tiny_model_dir, lama_dir, monkeypatch):
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    common = ["--corpus", str(small_corpus), "--model", str(tiny_model_dir), "--data", str(lama_dir), "--threads", "1"]
    result = runner.invoke(app, ["eval", "lama", *common, "--out", str(tmp_path / "rep"), "--layers", "2,3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("not found; ConceptNet skipped") == 1  # reported once, never a crash
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "## Layer ablation" in report and "| 2 |" in report and "layer: 3 of 4" in report
    assert "(bertknn's defaults; the paper's: n_docs=3, k=128, temperature=6.0, lam=0.3)" in report
    assert "## Calibration" in report and "![reliability](reliability.png)" in report
    assert (tmp_path / "rep" / "reliability.png").read_bytes().startswith(b"\x89PNG")
    paper = runner.invoke(app, ["eval", "lama", *common, "--out", str(tmp_path / "rep"), "--paper"])
    assert paper.exit_code == 0, paper.output
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "hyperparameters: n_docs=3, k=128, temperature=6.0, lam=0.3 (the paper's)" in report
    assert "mixture linear (the paper's)" in report and "## Runs side by side" in report
    assert f"| B | 3 | {PAPER.file_tag()} | the paper's | linear |" in report  # by name: L2, L3 paper, L3 default
    tuned = runner.invoke(
        app,
        [
            "tune",
            *common,
            "--out",
            str(tmp_path / "tune"),
            "--dev-per-relation",
            "1",
            "--exclude-sample-per-relation",
            "0",
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    assert "best: {'n_docs':" in tuned.output and (tmp_path / "tune" / "grid.md").is_file()
    again = runner.invoke(app, ["eval", "lama", *common, "--out", str(tmp_path / "rep2")])
    assert "(tuned, stored with the datastore)" in (tmp_path / "rep2" / "report.md").read_text(), again.output


def test_data_lama_verify_only_reports_modified_files(tmp_path):
    (tmp_path / "data").mkdir()
    result = runner.invoke(app, ["data", "lama", "--dest", str(tmp_path), "--verify-only"])
    assert result.exit_code == 1 and "missing" in result.output


def test_build_with_pack_records_it_and_refuses_another_on_resume(tmp_path, small_corpus, tiny_model_dir):
    base = ["build", str(small_corpus), "--out", str(tmp_path / "p"), "--model", str(tiny_model_dir), "--threads", "1"]
    result = runner.invoke(app, [*base, "--pack", "3"])
    assert result.exit_code == 0, result.output
    assert Datastore(tmp_path / "p").manifest.pack == 3
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "keys computed with pack=3" in result.output
    assert runner.invoke(app, [*base, "--pack", "0"]).exit_code == 2  # not a valid pack


def test_build_with_int8_keys_records_it_and_refuses_float32_on_resume(tmp_path, small_corpus, tiny_model_dir):
    base = ["build", str(small_corpus), "--out", str(tmp_path / "q"), "--model", str(tiny_model_dir), "--threads", "1"]
    result = runner.invoke(app, [*base, "--int8-keys"])
    assert result.exit_code == 0, result.output
    assert Datastore(tmp_path / "q").manifest.int8_keys
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "holds int8 keys" in result.output


def _failing_app(**handling) -> typer.Typer:
    """A one-command app whose command raises what --kind names, under the commands' error handler."""
    group = typer.Typer()
    raised = {"value": ValueError("bad \x1b[31m input"), "os": OSError("disk full"), "ctrl-c": KeyboardInterrupt()}

    @cli.command(group, **handling)
    def fails(out: str, kind: Annotated[str, typer.Option(help="what to raise")] = "value") -> None:
        """Fail as told."""
        raise raised.get(kind) or RuntimeError("a bug")

    return group


def test_the_error_handler_gives_one_line_and_an_exit_status():
    group = _failing_app(interrupted="what was saved is kept; rerun to resume {out}")
    value = runner.invoke(group, ["x", "--kind", "value"])
    assert value.exit_code == 2 and value.output == "error: bad \\x1b[31m input\n"  # the escape is shown, not run
    assert runner.invoke(group, ["x", "--kind", "os"]).output == "error: disk full\n"
    interrupted = runner.invoke(group, ["here", "--kind", "ctrl-c"])
    assert (
        interrupted.exit_code == 130
        and interrupted.output == "interrupted: what was saved is kept; rerun to resume here\n"
    )
    bug = runner.invoke(group, ["x", "--kind", "bug"])
    assert bug.exit_code == 1 and isinstance(bug.exception, RuntimeError)  # a bug keeps its traceback
    aborted = runner.invoke(_failing_app(), ["x", "--kind", "ctrl-c"])  # no message given: typer's own handling
    assert aborted.exit_code == 130 and "interrupted" not in aborted.output
    shown = runner.invoke(group, ["--help"]).output
    assert "Fail as told." in shown and "--kind" in shown and "what to raise" in shown  # typer sees the signature


def test_help_shows_its_defaults_and_brackets_as_written():
    asked = runner.invoke(app, ["ask", "--help"], terminal_width=200).output
    assert "documents retrieved [x>=1] [default: the datastore's tuned value, else 3]" in asked
    assert (
        "[linear or log-linear] [default: the datastore's tuned value, else log-linear; the paper's: linear]" in asked
    )
    assert "[default: all cores]" in asked
    assert "[default: 0]" not in asked  # --threads 0 means all cores: said once
    assert "MLM head, [MASK] embedding" in runner.invoke(app, ["--help"], terminal_width=200).output
    assert "Start with `bertknn demo`" in runner.invoke(app, ["--help"], terminal_width=200).output


def test_the_model_options_make_one_runtime_and_set_the_threads(monkeypatch):
    group, seen = typer.Typer(), []

    @cli.command(group)
    def threaded(
        threads: cli.ThreadsOption = 0, backend: str = "torch", device: str = "auto", dtype: str = "float32"
    ) -> None:
        """Record the runtime the command got and the threads PyTorch got."""
        seen.append((backend, torch.get_num_threads()))

    assert runner.invoke(group, ["--threads", "3"]).exit_code == 0
    assert runner.invoke(group, ["--threads", "3", "--backend", "onnx"]).exit_code == 0  # ONNX Runtime gets them
    assert runner.invoke(group, ["--backend", "auto", "--dtype", "bf16", "--device", "cpu"]).exit_code == 0
    assert seen == [
        (Runtime("torch", threads=3, device="auto"), 3),
        (Runtime("onnx", threads=3), 1),
        (Runtime("torch", dtype="bfloat16"), os.cpu_count()),
    ]
    bad = runner.invoke(group, ["--dtype", "fp16", "--device", "cpu"])
    assert bad.exit_code == 2 and "float16 runs on a GPU only: on CPU use --dtype bfloat16" in bad.output


def test_add_takes_documents_in_any_corpus_format(store_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"id": ["n1"], "url": ["u"], "title": ["Tamsin Orwhey"], "text": ["Tamsin Orwhey was born in Tallinn."]}
    pq.write_table(pa.table(rows), tmp_path / "more.parquet")
    result = runner.invoke(app, ["add", str(store_dir), str(tmp_path / "more.parquet"), "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "added 1 documents" in result.output
    answer = BertKNN.load(store_dir).predict("Tamsin Orwhey was born in [MASK] .", "Tamsin Orwhey")
    assert answer.documents == ["Tamsin Orwhey"]


def test_build_with_a_key_codec_stores_codes_and_refuses_a_lazy_one(tmp_path, small_corpus, tiny_model_dir):
    base = ["build", str(small_corpus), "--model", str(tiny_model_dir), "--threads", "1", "--key-codec", "SQ8"]
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    manifest = read_committed(tmp_path / "c")  # manifest.json with the fields committed since over it
    assert manifest["key_codec"] == "SQ8" and "key_codec_pending" not in manifest
    assert (tmp_path / "c" / "keys.codes").stat().st_size == manifest["entries"] * 32  # tiny BERT: 32 dimensions
    asked = runner.invoke(app, ["ask", str(tmp_path / "c"), "Quellbrook is a town in [MASK] .", "--threads", "1"])
    assert asked.exit_code == 0 and "kNN" in asked.output, asked.output
    lazy = runner.invoke(app, [*base, "--out", str(tmp_path / "l"), "--lazy"])
    assert lazy.exit_code == 2 and "a lazy datastore has no keys to train a codec on" in lazy.output
    assert not (tmp_path / "l").exists()
    bad = runner.invoke(app, ["convert-keys", str(tmp_path / "c"), "--key-codec", "PQ8"])
    assert bad.exit_code == 2 and "holds its keys as SQ8; only float16 keys convert" in bad.output


def _leaves(group: typer.core.TyperGroup, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """Every command under `group` with the words that call it (`eval lama`)."""
    found, context = [], group.context_class(group)
    for name in group.list_commands(context):
        sub = group.get_command(context, name)
        found += _leaves(sub, (*path, name)) if hasattr(sub, "list_commands") else [((*path, name), sub)]
    return found


def test_help_lists_the_commands_in_the_order_a_user_meets_them():
    shown = runner.invoke(app, ["--help"], terminal_width=200).output
    listed = [line.split()[0] for line in shown.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(cli.ORDER)
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output == f"bertknn {importlib.metadata.version('bertknn')}\n"


HEAVY = ("torch", "transformers", "faiss", "onnxruntime", "sklearn", "ray")  # seconds to import, each


@pytest.mark.parametrize("asked", [["--help"], ["--version"], ["ask", "--help"]])
def test_help_and_version_answer_without_importing_the_model_or_search_libraries(asked):
    """The installed `bertknn` command, its imports listed by Python (PYTHONPROFILEIMPORTTIME): none of HEAVY, which
    the commands import when they run."""
    command = [str(Path(sys.executable).parent / "bertknn"), *asked]
    done = subprocess.run(command, env=os.environ | {"PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True, text=True)
    assert done.returncode == 0 and ("Usage:" in done.stdout or done.stdout.startswith("bertknn ")), done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "bertknn.cli" in imported and not {name.split(".")[0] for name in imported} & set(HEAVY)


def test_every_command_help_ends_with_an_example_that_parses():
    leaves = dict(_leaves(typer.main.get_command(app)))
    assert set(leaves) >= {("demo",), ("eval", "lama"), ("data", "lama"), ("train-head",)}
    for path in leaves:
        shown = runner.invoke(app, [*path, "--help"], terminal_width=200).output.rstrip()
        assert "Example:" in shown and "Options:" not in shown.rsplit("Example:", 1)[-1], path
        lines = [line.strip() for line in shown.rsplit("Example:", 1)[-1].splitlines() if line.strip()]
        assert lines[0].startswith(" ".join(["bertknn", *path]) + " ") or lines[0] == "bertknn " + path[0], path
        for line in lines:
            words = shlex.split(line.split("   (")[0])  # a remark after three spaces is not part of the command
            called = next(p for p in leaves if words[1 : 1 + len(p)] == list(p))
            leaves[called].make_context(" ".join(called), words[1 + len(called) :])  # raises on an unknown option


def test_remove_shows_each_id_it_names_escaped_on_one_line(store_dir, tmp_path):
    """Ids are shown as `shown` shows untrusted text: a newline does not split the line, a bidi override does not
    reorder it (both escaped)."""
    ids = ["nl\nid", "rlo\u202eid"]
    docs = [{"id": i, "title": f"Orwhey {n}", "text": f"Orwhey {n} was born in Tallinn."} for n, i in enumerate(ids)]
    added = runner.invoke(
        app, ["add", str(store_dir), str(write_corpus(tmp_path / "ids.jsonl", docs)), "--threads", "1"]
    )
    assert added.exit_code == 0 and "added 2 documents" in added.output, added.output
    remove = ["remove", str(store_dir), "--doc", ids[0], "--doc", ids[1]]
    assert runner.invoke(app, remove).output.startswith("removed 2 document(s)")
    again = runner.invoke(app, remove)
    unknown = runner.invoke(app, ["remove", str(store_dir), "--doc", "no\n\u202eid"])
    assert again.exit_code == 0 and again.output.endswith("; already removed before: nl\\x0aid, rlo\\u202eid\n")
    assert unknown.exit_code == 2 and "no document with id 'no\\n\\u202eid'" in unknown.output, unknown.output
    for result in (again, unknown):
        assert result.output.count("\n") == 1 and "\u202e" not in result.output, result.output
