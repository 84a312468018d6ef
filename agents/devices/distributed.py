"""Joining JAX's distributed runtime (several hosts; docs/scale.md). It must happen before anything initialises a
JAX backend, and importing gymnax (hence jaxenv, agents.config) does, so entry points call `join_from_argv` before
their other imports; this module imports nothing of the project for that reason.

    python scripts/train.py ... --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
"""

from __future__ import annotations

import argparse
import os
import sys

import jax


def join(coordinator: str | None, num_processes: int | None, process_id: int | None, auto: bool = False) -> None:
    """Explicitly (all three given), or with what JAX detects from the cluster (`auto`, or a SLURM job of several
    tasks); nothing to do for one process. Bad flags exit 2 with one line naming them."""
    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        _fail("--coordinator, --num-processes and --process-id go together (or none, to auto-detect)")
    if all(given):
        if not 0 <= process_id < num_processes:
            _fail(f"--process-id: must be in [0, {num_processes}), got {process_id}")
        jax.distributed.initialize(coordinator, num_processes, process_id)
    elif auto or int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        jax.distributed.initialize()  # SLURM / Open MPI: the coordinator, count and id come from the environment


def join_from_argv(argv: list[str] | None = None) -> None:
    """`join` with the --coordinator / --num-processes / --process-id / --distributed flags found in argv (the
    command's own parser, agents.devices.parallel.add_device_flags, documents and checks them)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int)
    ap.add_argument("--process-id", type=int)
    ap.add_argument("--distributed")
    args, _ = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    join(args.coordinator, args.num_processes, args.process_id, args.distributed == "auto")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
