#!/usr/bin/env bash
# Create (or reuse) .venv in the repository and install recompute with its test extras.
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
  .venv/bin/python -m pip install --quiet -e ".[test]"
  touch "$stamp"
fi
