#!/usr/bin/env bash
# One entry point that sets everything up on a fresh machine, then runs:
#   ./run.sh demo   - build the embedded demo corpus's datastore (cached) and answer its questions
#   ./run.sh test   - the test suite (offline; pytest-xdist, a worker per core, one thread each)
#   ./run.sh docs   - build the documentation site into site/ (mkdocs build --strict: a warning fails it)
#   ./run.sh <any bertknn arguments>, e.g. ./run.sh ask DIR "Dante was born in [MASK] ." --subject Dante
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.bertknn-installed
want=$(cat pyproject.toml | sha1sum | cut -c1-40)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # torch is pinned first: its CPU wheel lies on this kind of machine; a bare `torch` would pull a multi-GB CUDA build
  .venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
  echo "$want" > "$stamp"
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false
[ $# -gt 0 ] || set -- demo
case "$1" in
  test) shift; exec .venv/bin/python -m pytest "$@" ;;
  docs) shift; NO_MKDOCS_2_WARNING=1 exec .venv/bin/mkdocs build --strict "$@" ;;
  *) exec .venv/bin/bertknn "$@" ;;
esac
