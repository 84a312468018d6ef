#!/usr/bin/env bash
# The test command: the full default suite, then the `nojit` subset again with JAX_DISABLE_JIT=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m pytest -q "$@"
JAX_DISABLE_JIT=1 "$PYTHON" -m pytest -q -m "nojit and not slow" "$@"
