"""Devices and processes a run uses (docs/scale.md): the env mesh over each process's local devices, which
process writes, barriers, host copies of sharded arrays, and the start-up banner naming the backend.

One process (the usual case) shards its envs over `devices` of its local devices. With several processes (joined
by agents.devices.distributed: `--coordinator`, or what JAX detects under SLURM / Open MPI), each steps its share of the
envs on its own devices and the mesh spans all of them; process 0 alone writes the run folder, the others meet
it at barriers.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import numpy as np

from agents.config import ConfigError
from agents.devices.gpus import visible_gpus
from agents.rl.sharding import env_mesh


def local_device_count(devices: str) -> int:
    """The local devices `devices` (all, or a count) asks for; more than this process has is a ConfigError naming
    the flag."""
    have = jax.local_device_count()
    if devices == "all":
        return have
    want = int(devices)
    if want > have:
        raise ConfigError(f"devices (--devices): {want} asked, this process has {have} "
                          f"{jax.default_backend()} device(s)")
    return want


def make_mesh(num_envs: int, devices: str):
    """The env mesh: `devices` local devices of every process, process by process, so each process's envs are a
    contiguous block on its own devices. num_envs must divide by the mesh's size (ConfigError naming both)."""
    per_process = local_device_count(devices)
    used = [d for p in range(jax.process_count()) for d in jax.local_devices(process_index=p)[:per_process]]
    if num_envs % len(used):
        where = f"{jax.process_count()} processes × {per_process}" if jax.process_count() > 1 else f"{per_process}"
        raise ConfigError(f"num_envs (--envs): {num_envs} envs do not split evenly over {where} devices; use a "
                          f"multiple of {len(used)} or another --devices")
    return env_mesh(used)


def is_writer() -> bool:
    """Process 0 writes the run folder (config, metrics, TensorBoard, checkpoints, lock); the others only read it."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """All processes meet here (after process 0 wrote something the others then read); no-op for one process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def to_host(tree: Any) -> Any:
    """Numpy copies of (possibly sharded) arrays, whole on every process: a collective when several processes."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)


def gather_processes(tree: Any) -> Any:
    """Every process's numpy `tree`, stacked along a new leading axis [processes, ...] on every process (a
    collective: all processes call it at the same point)."""
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=False)


def broadcast_from_writer(value: float) -> float:
    """Process 0's `value` on every process (a collective); the value itself with one process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return float(multihost_utils.broadcast_one_to_all(np.float64(value)))


def from_host(tree: Any, shardings: Any) -> Any:
    """Global arrays laid out as `shardings` from whole numpy arrays held by every process (each process places
    only its own shards)."""
    def place(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(place, tree, shardings)


def advisor_device(llm: str) -> str | None:
    """The torch device the run's advisor sidecars use (they pick cuda when torch sees a GPU), or None without one."""
    if llm == "none":
        return None
    if llm == "mock":
        return "none (the mock advisor runs no model)"
    gpus = visible_gpus()
    return f"cuda ({gpus} GPU(s), worker i on GPU i)" if gpus else "cpu"


def backend_banner(mesh=None, llm: str | None = None) -> str:
    """`jax backend: cpu, devices: 2 x cpu` (with the mesh's size and the process when several), the advisor's
    torch device where the run's advisor `llm` uses one, and a warning when a GPU is visible but JAX runs on CPU."""
    local = jax.local_devices()
    kinds = sorted({d.device_kind for d in local})
    text = f"jax {jax.__version__} backend: {jax.default_backend()}, devices: {len(local)} x {', '.join(kinds)}"
    if mesh is not None:
        text += f"; envs sharded over {mesh.size}"
    if jax.process_count() > 1:
        text += f" (process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices in all)"
    if jax.default_backend() == "gpu" and os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false":
        text += "; JAX allocates GPU memory as it needs it (XLA_PYTHON_CLIENT_PREALLOCATE=false)"
    torch_device = advisor_device(llm) if llm is not None else None
    if torch_device is not None:
        text += f"\nadvisor (sidecar) torch device: {torch_device}"
    gpus = visible_gpus()
    if gpus and jax.default_backend() == "cpu":
        text += (f"\nWARNING: {gpus} NVIDIA GPU(s) visible to the system but JAX runs on CPU: install JAX's "
                 "CUDA plugin (./setup.sh does where nvidia-smi works; see docs/scale.md)")
    return text


def print_banner(mesh=None, llm: str | None = None) -> None:
    if is_writer():
        print(backend_banner(mesh, llm), file=sys.stderr)


def add_device_flags(ap, processes: bool = False) -> None:
    """`--devices` (train.py, evaluate.py, benchmark.py) and, for training, the distributed runtime's flags."""
    ap.add_argument("--devices", help="local devices to shard the envs over: all (default) or a number; num_envs must "
                    "divide by the devices in use (devices)")
    if not processes:
        return
    ap.add_argument("--coordinator", metavar="HOST:PORT", help="several processes: process 0's address, which "
                    "every process gives (with --num-processes and --process-id); see docs/scale.md")
    ap.add_argument("--num-processes", type=int, metavar="N", help="several processes: how many in all")
    ap.add_argument("--process-id", type=int, metavar="I", help="several processes: this one's index, 0 to N-1 "
                    "(0 writes the run folder)")
    ap.add_argument("--distributed", choices=["auto"], help="auto: join the processes JAX detects from SLURM or "
                    "Open MPI (done by itself under SLURM with more than one task)")
