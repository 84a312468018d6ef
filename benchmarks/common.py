"""Shared pieces of the benchmark suites: options, repeated timing, memory and machine facts."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable


class BenchInputError(ValueError):
    """A suite's input (a flag or BENCH_* variable) is wrong: the runner prints it in one line and exits 2."""


@dataclass
class BenchOptions:
    envs: list[int] | None  # env counts to sweep; None = the suite's default
    quick: bool  # finish fast (CI); fewer reps and smaller sizes
    reps: int  # timed repetitions after the warm-up


def timed_repeats(fn: Callable[[], object], reps: int, warmup: int = 1, budget_s: float | None = None) -> dict:
    """Runs fn `warmup` times untimed, then `reps` times timed. fn must block until its work is done.
    `cores_used` is this process's CPU time over the timed wall time: how many cores the work kept busy.

    With `budget_s`, slow cases get fewer reps: as many as fit in the budget at the warm-up's pace, never fewer
    than 3 (or `reps` if smaller), or 2 for a case whose one call outlasts the whole budget, so a sweep's largest
    sizes do not take most of its time."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    if budget_s is not None and warmup:
        per_call = (time.perf_counter() - t0) / warmup
        least = 2 if per_call > budget_s else 3
        reps = max(min(least, reps), min(reps, int(budget_s / max(per_call, 1e-9))))
    times = []
    cpu0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps,
            "cores_used": (time.process_time() - cpu0) / sum(times)}  # fmt: skip


def rates(work: float, timing: dict, unit: str = "steps") -> dict:
    """Work per second at the median time, with the range over the timed repetitions."""
    return {
        f"{unit}_per_s": work / timing["median_s"],
        f"{unit}_per_s_min": work / timing["max_s"],
        f"{unit}_per_s_max": work / timing["min_s"],
    }


def reset_peak_memory() -> None:
    """Starts a new peak for `peak_host_memory_mb` (Linux: writing 5 to clear_refs resets the RSS high-water
    mark), so each case of a sweep reports its own peak rather than the largest so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # elsewhere the peak stays the process's, which the sweep's ascending sizes make the same figure


def peak_host_memory_mb() -> float:
    """Peak resident set size of this process since the last `reset_peak_memory` (or since it started)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages: other jobs on the machine show up here and in the figures."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_caches() -> dict[str, str]:
    """Cache sizes per level as the kernel reports them, e.g. {"L2": "512K", "L3": "32768K"}."""
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            if kind != "Instruction":
                caches[f"L{level}"] = (index / "size").read_text().strip()
        except OSError:
            continue
    return caches


def host_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def available_memory_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return host_memory_gb()


def jax_device_name() -> str:
    """The device JAX computes on: the GPU's name, or the CPU model."""
    import jax

    device = jax.devices()[0]
    return cpu_model() if device.platform == "cpu" else f"{device.platform}: {device.device_kind}"


def on_gpu(row: dict) -> bool:
    """Whether a result row was measured on a GPU (its `device` from jax_device_name)."""
    return str(row.get("device", "")).startswith("gpu:")


def package_versions(names: list[str]) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "not installed"
    return out


# ------------------------------------------------------------------------------------------------ Markdown
def fmt(value) -> str:
    """A figure as a table shows it: thousands separators, three significant digits below 100."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def fmt_range(row: dict, key: str) -> str:
    """`median [min–max]` for a rate with `<key>_min` and `<key>_max` beside it."""
    if key not in row:
        return "—"
    if f"{key}_min" not in row:
        return fmt(row[key])
    return f"{fmt(row[key])} [{fmt(row[key + '_min'])}–{fmt(row[key + '_max'])}]"


def table(rows: list[dict], columns: list[tuple[str, Callable[[dict], object]]]) -> str:
    """A Markdown table: one row per result, one column per (header, cell function)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(cell(row)) for _, cell in columns) + " |")
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """Every scalar field of the rows, for suites without tables of their own."""
    keys = list(dict.fromkeys(k for r in rows for k, v in r.items() if not isinstance(v, (dict, list))))
    return table(rows, [(k, lambda r, k=k: r.get(k, "")) for k in keys])


def scaling_note(rows: list[dict], key: str = "steps_per_s", what: str = "steps/s", gain: float = 0.15) -> str:
    """Where a sweep stops growing: the smallest env count past which no larger one is more than `gain` faster."""
    rows = sorted((r for r in rows if key in r), key=lambda r: r["envs"])
    if len(rows) < 2:
        return ""
    first, last = rows[0], rows[-1]
    knee = next(r for r in rows if all(s[key] <= r[key] * (1 + gain) for s in rows if s["envs"] > r["envs"]))
    text = f"{what} goes from {fmt(first[key])} at {first['envs']:,} envs to {fmt(last[key])} at {last['envs']:,} ({last[key] / first[key]:.2g}×)"
    if knee is last:
        return text + f"; still growing by more than {gain:.0%} at the largest size."
    best = max(rows, key=lambda r: r[key])
    return (text + f"; past {knee['envs']:,} envs no size is more than {gain:.0%} faster (best: {fmt(best[key])} "
            f"at {best['envs']:,}): throughput stops growing there.")
