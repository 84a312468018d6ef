"""The GPUs the advisor may use, and JAX's share of their memory. Imports neither JAX nor torch: entry scripts
call `leave_gpu_memory_to_advisor` before their other imports, because importing gymnax (hence jaxenv and
agents.config) creates arrays and so starts JAX's backend, which takes its GPU memory when it starts."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

# JAX's GPU memory settings a user may give (JAX's GPU memory docs); any of them set means the user has chosen.
XLA_GPU_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION",
                            "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")


@functools.cache
def visible_gpus() -> int:
    """GPUs the sidecars' torch may use, counted without importing torch in the trainer (slow to import, and heavy):
    CUDA_VISIBLE_DEVICES when set, else the GPUs `nvidia-smi -L` lists, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def visible_gpu_ids() -> list[str]:
    """The visible GPUs as CUDA_VISIBLE_DEVICES names them (its entries when set, else 0..N-1 of `nvidia-smi -L`'s):
    what a process given one of them is told to see."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]
    return [str(i) for i in range(visible_gpus())]


def leave_gpu_memory_to_advisor() -> bool:
    """Where GPUs are visible, JAX allocates GPU memory as it needs it instead of taking 75% of each GPU when it
    starts (its default), which would leave the advisor's PyTorch process beside it a quarter of the card: on an
    H100 that failed a Phi-3-mini scoring 1,024 prompts (benchmarks/phi3.py), and on a 24 GB card a Phi-3-mini in
    bf16 (7.6 GB) would not even load. Decided before the run's config is read, which cannot happen before
    JAX starts (see the module doc). True when it set XLA_PYTHON_CLIENT_PREALLOCATE=false; the user's own
    XLA_* memory settings are left as they are."""
    if not visible_gpus() or any(os.environ.get(v) for v in XLA_GPU_MEMORY_VARIABLES):
        return False
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return True
