"""Every script under bench/ runs in its smoke form (`--smoke`: every size at the least that still runs each of its
steps), so that a bench that breaks fails here the day it breaks, not when someone next measures with it.

Each runs as it is run by hand, `python bench/NAME.py --smoke` from the repository root, in a process of its own, on
one thread and offline, with the LAMA data and the evidence corpus of $BERTKNN_DATA (conftest.SHARED_DATA) and the
test run's bertknn cache (conftest.private_cache: ONNX graphs exported once for all of them); the test checks its exit
status and a line of its output. The slowest (the Ray benches, load.py's two server processes) run the smallest
inputs of all: a few documents, a few questions, a second of load. They are marked `smoke`: the suite skips them and
CI runs them after it (`./run.sh test --smoke -m smoke`, .ci/run).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
HELPERS = {"evidence.py"}  # imported by the benches, not run
EVIDENCE = SHARED_DATA / "wiki" / "lama_evidence_docs.jsonl"
LAMA = SHARED_DATA / "lama" / "data"
COUNTERFACT = SHARED_DATA / "counterfact" / "counterfact-train.json"
NUMBER = r"[\d.,]+"

# id: (script, arguments beside --smoke, what it reads from $BERTKNN_DATA, lines (regular expressions) its output has)
CASES = {
    "accuracy": (
        "accuracy.py",
        [],
        "lama",
        [rf"^BERT-kNN P@1 on dev, bertknn default vs the paper's: subject {NUMBER} vs {NUMBER}; no subject "],
    ),
    "build_throughput": (
        "build_throughput.py",
        [],
        "wiki",
        [r"^exact keys: max \|bertknn - reference\| = ", rf"^build throughput ratio .* / reference: {NUMBER}x$"],
    ),
    "calibration": (
        "calibration.py",
        [],
        "lama",
        [
            r"^chosen: confidence_temperature \S+, lm_floor \S+$",
            r"^\| test \| subject \| chosen \| ",
            r"^\| dev \| no subject \| bertknn's \| ",
        ],
    ),
    "cpu_stages": ("cpu_stages.py", [], "wiki", [rf"^\| 2 \| {NUMBER} \| {NUMBER} \| {NUMBER} \|$"]),
    "counterfact_corpus": (
        "counterfact_corpus.py",
        [],
        "counterfact",
        [r"^wrote 53 documents$", r"^wrote 4 evidence documents$"],
    ),
    "edit_misses": (
        "edit_misses.py",
        [],
        "counterfact",
        [rf"^\| subjects \| bertknn \| {NUMBER} \| 980 of 1,000 \|"],
    ),
    "edit_rules": ("edit_rules.py", [], "counterfact", [rf"^\| newest, e\^20, margin 1 T \| {NUMBER} \| {NUMBER} \|$"]),
    "embed_ab": ("embed_ab.py", [], "wiki", [rf"\{{'exact': {NUMBER}, 'pack4': {NUMBER}\}}$"]),
    "faiss_scale": ("faiss_scale.py", [], None, [r"^\| IVF16,PQ8x4 \| 2 \| ", r"^(best re-ranked setting|no setting)"]),
    "gpu_build": (
        "gpu_build.py",
        [],
        "wiki",
        [r"^\| float32 \| 2,048 \| ", r'^\{"device": .*"questions": \{'],
    ),
    "head_quality": ("head_quality.py", [], "lama", [r'"lama_all_subjects": \{', r'"heldout_words": \{']),
    "int8_lama": ("int8_lama.py", [], "lama", [rf"^P@1 change with int8 questions: bert [+-]{NUMBER}, "]),
    "ir_scale": ("ir_scale.py", [], "wiki", [r"^  1,000 documents, .*, 1 merges$", r"^extrapolated to 5,070,000 "]),
    "key_codecs": ("key_codecs.py", [], "lama", [r"^\| float16 \| \d+ \| 1/1 \| ", r"^\| SQ8 \| \d+ \| 1/2 \| "]),
    "key_codecs --exact-search": (
        "key_codecs.py",
        ["--exact-search"],
        "lama",
        [rf"^\| SQ8 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER}x \|$"],
    ),
    "key_fidelity": ("key_fidelity.py", [], "wiki", [rf"^contexts/s ratio --pack 2 / exact: {NUMBER}x$"]),
    "load": (
        "load.py",
        [],
        None,
        [r"^batching on \(32\) .* errors 0 \(of \d+\)", r"^batching off .* errors 0 \(of \d+\)", r"^requests/s with "],
    ),
    "memory": ("memory.py", [], "wiki", [r"^\d+ contexts at 768 dimensions: ", rf"^peak RSS ratio x1/x1: {NUMBER}$"]),
    "prune": ("prune.py", [], "lama", [r"^\| 40 \| SQ8 \| \d+ \(", r"^\| 40 \| float16 \| \d+ \("]),
    "query_path": (
        "query_path.py",
        [],
        "lama",
        [
            r"^bertknn defaults vs the paper's settings: the same BERT-kNN top-1 on ",
            r"^bertknn onnx defaults: single question p50 ",
            rf"^query throughput ratio to the reference \(batched\): bertknn {NUMBER}x, ",
        ],
    ),
    "ray_build": ("ray_build.py", [], "wiki", [r"same entries: True$", rf"^ray / single contexts/s: {NUMBER}$"]),
    "ray_nodes": (
        "ray_nodes.py",
        [],
        "wiki",
        [
            r"^\| 3 \| 2 \| ",
            rf"^per node at 3 documents per shard: peak PSS {NUMBER} MiB, peak object store {NUMBER} bytes$",
        ],
    ),
    "ray_serve": (
        "ray_serve.py",
        [],
        "wiki",
        [r"^\| FAISS \(every shard\) \| .* \| True \|$", rf"^Ray Serve / local p50, IR path with subject: {NUMBER}$"],
    ),
    "sentences": (
        "sentences.py",
        [],
        "lama",
        [
            r"^\| sentence encoder, three views less the background ",
            r"^\| subject \| per word \| ",
            r"^\| no subject \| 0.015 \| ",
            r"^\| several \| subject \| 0.015 \| .* \| [\d.]+ / [\d.]+ \|$",
            r"^\| held-out \| subject \| 0.015, embedded at the question \| - \(-\) \| [\d.]+ \([\d.]+\) \| ",
            r"^\| word \| [\d.]+ \| [\d.]+ \| \d+% \|",
            r"^\| build \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$",
            r"^\| stream: defaults \(cache kept\) \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$",
            r"^\| defaults: sentence weights, the store's evidence vectors, cache emptied \| [\d.]+ \| ",
            r"^\| sentence weights, every evidence text embedded at the question, cache emptied \| [\d.]+ \| ",
            rf"^Bytes per context \({NUMBER} contexts\): {NUMBER} without evidence vectors, {NUMBER} with \(",
        ],
    ),
    "linking": (
        "linking.py",
        [],
        "lama",
        [
            r"^\| updated, update's words \| all \| no subject, linked \| \d+/\d+ \(\d+ old\) \| ",
            r"^\| no subject, linked \| [\d.]+ \| [\d.]+ \| [\d.]+ \| \d+ \| ",
            r"^\| synthetic \(spans and lookup\) \| 2,000 \| ",
            r"^a part naming two titles linked by TF-IDF instead of none: \d+ links change, \d+ of them ",
        ],
    ),
    "scale": (
        "scale.py",
        [],
        "wiki",
        [
            r"^\| add of 1 ms \| [\d.,]+ \| [\d.,]+ \| -?[\d.]+ \|$",
            r"^\| question p50 over FAISS, with subject ms \| ",
            r"^\| verify peak RSS GB \| ",
            r"^machine: ",
        ],
    ),
    "writes": ("writes.py", [], None, [r"^\| this tree \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$"]),
    "splitters": ("splitters.py", [], "wiki", [r"^\| pysbd \(older datastores\) \| ", r"^\| sentencex \| "]),
    "verify": ("verify.py", [], None, [r"^open-time sample \(\d+ \+ last\) +[\d.]+ s"]),
    "words": (
        "words.py",
        [],
        "wiki",
        [
            r"^\| whole words \+ names \| after add \| ",
            r"^\| whole words \| after add, no sentence weights \| ",
            r"^questions per cell: ",
        ],
    ),
}
RAY = {"ray_build", "ray_nodes", "ray_serve"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` on one thread, offline, with the data conftest found; PYTHONPATH as it is."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "BERTKNN_DATA": str(SHARED_DATA)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def test_every_bench_has_a_smoke_test():
    scripts = {path.name for path in BENCH.glob("*.py")} - HELPERS
    assert scripts == {script for script, *_ in CASES.values()}


@pytest.mark.smoke
@pytest.mark.parametrize("case", list(CASES))
def test_bench_runs_in_its_smoke_form(case):
    script, args, reads, lines = CASES[case]
    needed = {"wiki": [EVIDENCE], "lama": [EVIDENCE, LAMA], "counterfact": [COUNTERFACT]}.get(reads, [])
    if any(not path.exists() for path in needed):
        pytest.skip(f"{script} reads {', '.join(map(str, needed))} (set BERTKNN_DATA)")
    if case in RAY and importlib.util.find_spec("ray") is None:
        pytest.skip("needs Ray: pip install 'bertknn[ray]'")
    result = _run([str(BENCH / script), "--smoke", *args], ROOT)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    for line in lines:
        assert re.search(line, result.stdout, re.MULTILINE), f"no line {line!r} in:\n{result.stdout[-6000:]}"


def test_the_several_facts_generator_writes_the_committed_files(tmp_path):
    """bench/fresh_facts/make_several.py (a data generator, seeded) still writes the set that is committed."""
    result = _run([str(BENCH / "fresh_facts" / "make_several.py"), "--out", str(tmp_path)], ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "60 documents, 280 questions"
    for name in ("several_documents.jsonl", "several_questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (BENCH / "fresh_facts" / name).read_bytes()
