"""The command line through typer's runner: build, ask, demo, and the errors a user sees."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bertknn import cli
from bertknn.cli import app
from bertknn.datastore import Datastore
from bertknn.pipeline import set_threads

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Render as on a 200-column terminal so that lines are not wrapped; the suite's one thread back afterwards
    (a command without --threads sets all cores for the process)."""
    monkeypatch.setattr(cli.console, "width", 200)
    yield
    set_threads(1)


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
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path / "cache"))
    args = ["demo", "--model", str(tiny_model_dir), "--threads", "1"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Ilsa Varnhold was born in [MASK] ." in first.output and "questions answered right" in first.output
    fresh = [line.split(": BERT-kNN ")[1].split()[0] for line in first.output.splitlines() if ": BERT-kNN " in line]
    assert fresh[1] == "tallinn" and fresh[0] != "tallinn" and fresh[2] != "tallinn"  # before add, after, after remove
    (cached,) = (tmp_path / "cache").glob("demo-*")  # the fresh-facts step ran on a copy
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 2  # the default backend exported its graphs
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
    assert "(the paper's)" in report
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
    assert Datastore(tmp_path / "p").pack == 3
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "keys computed with pack=3" in result.output
    assert runner.invoke(app, [*base, "--pack", "0"]).exit_code == 2  # not a valid pack


def test_build_with_int8_keys_records_it_and_refuses_float32_on_resume(tmp_path, small_corpus, tiny_model_dir):
    base = ["build", str(small_corpus), "--out", str(tmp_path / "q"), "--model", str(tiny_model_dir), "--threads", "1"]
    result = runner.invoke(app, [*base, "--int8-keys"])
    assert result.exit_code == 0, result.output
    assert Datastore(tmp_path / "q").int8
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "holds int8 keys" in result.output
