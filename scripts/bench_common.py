"""Shared pieces of the benchmark suites: options, repeated timing, and machine facts."""

from __future__ import annotations

import platform
import resource
import statistics
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Callable


@dataclass
class BenchOptions:
    envs: list[int] | None  # env counts to sweep; None = the suite's default
    quick: bool  # finish fast (CI); fewer reps and smaller sizes
    reps: int  # timed repetitions after the warm-up


def timed_repeats(fn: Callable[[], object], reps: int, warmup: int = 1) -> dict:
    """Runs fn warmup times untimed, then reps times timed. fn must block until its work is done."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps}


def peak_host_memory_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_versions(names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "not installed"
    return out
