#!/usr/bin/env bash
# Create (or reuse) .venv in the repository and install recompute with the app and test extras.
# Needs Python >= 3.11; set PYTHON=/path/to/python to choose the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "recompute needs Python >= 3.11 (got $("$PY" --version))" >&2; exit 1; }
  "$PY" -m venv .venv
fi
stamp=.venv/.recompute-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[app,test]"
  touch "$stamp"
fi
# numba caches its compiled kernels (cache=True) next to their sources; compile them now, not in the
# first plan (20-30 s), and again whenever a kernel's source changed since the last warm-up
warm=recompute/__pycache__/.numba-warm  # beside the cache it stands for: cleaning one cleans both
if [ ! -f "$warm" ] || [ -n "$(find recompute -name '*.py' -newer "$warm" -exec grep -l 'numba.njit' {} +)" ]; then
  .venv/bin/python scripts/warm_numba.py && mkdir -p recompute/__pycache__ && touch "$warm"
fi
