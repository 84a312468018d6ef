"""The benchmark harness itself: a tiny `--quick` run writes valid JSON in the shared format, a plot and a
Markdown report; a suite that cannot be imported is skipped with the reason; the reporting helpers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cli as benchmark
from benchmarks.common import scaling_note, timed_repeats

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_quick_run_writes_valid_json_plot_and_markdown(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(SCRIPTS / "benchmark.py"), "env", "bridge", "--quick", "--envs", "8", "--reps", "1",
           "--json", str(out), "--plot", str(tmp_path / "bench.png"), "--markdown", str(tmp_path / "BENCH.md")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    report = json.loads(out.read_text())
    assert {"machine", "run", "options", "results", "skipped"} <= report.keys()
    assert report["machine"]["cpu"] and report["machine"]["packages"]["jax"] != "not installed"
    assert len(report["run"]["load_avg_start"]) == 3 and report["options"]["quick"] is True
    suites = {r["suite"] for r in report["results"]}
    assert suites == {"env", "bridge"}
    for r in report["results"]:
        rate = r.get("steps_per_s", r.get("prompts_per_s"))
        assert rate is not None and math.isfinite(rate) and rate > 0, r
    env_row = next(r for r in report["results"] if r["suite"] == "env")
    assert env_row["envs"] == 8 and env_row["steps_per_s_min"] <= env_row["steps_per_s"] <= env_row["steps_per_s_max"]
    assert env_row["compile_s"] > 0 and env_row["peak_host_mb"] > 0

    assert (tmp_path / "bench.png").stat().st_size > 0
    markdown = (tmp_path / "BENCH.md").read_text()
    assert "## env" in markdown and "## bridge" in markdown and "| envs |" in markdown
    assert "### env" in done.stdout  # the tables go to stdout too
    assert "## GPU" in markdown and "| not measured |" in markdown  # a CPU report leaves the GPU rows empty

    # the report re-rendered from its JSON, measuring nothing, is the same report
    again = tmp_path / "AGAIN.md"
    cmd = [sys.executable, str(SCRIPTS / "benchmark.py"), "--from-json", str(out), "--markdown", str(again),
           "--plot", str(tmp_path / "bench.png")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert again.read_text() == markdown


def test_suite_that_cannot_be_imported_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setitem(benchmark.SUITES, "sb3", "no_such_bench_module")
    module, why_not = benchmark.import_suite("sb3")
    assert module is None and "no_such_bench_module" in why_not
    monkeypatch.setitem(benchmark.INSTALL_HINTS, "no_such_bench_module", "pip install it")
    assert "pip install it" in benchmark.import_suite("sb3")[1]


def test_scaling_note_finds_where_throughput_stops_growing():
    rows = [{"envs": n, "steps_per_s": s} for n, s in [(256, 1.0), (1024, 2.0), (4096, 4.0), (16384, 4.2)]]
    assert "past 4,096 envs" in scaling_note(rows)
    assert "still growing" in scaling_note(rows[:3])


def test_timed_repeats_budget_cuts_reps_but_keeps_three_or_two_for_calls_longer_than_the_budget():
    calls = []

    def five_ms():
        calls.append(1)
        time.sleep(0.005)

    timing = timed_repeats(five_ms, reps=50, budget_s=0.012)
    assert timing["reps"] == 3 and len(calls) == 4  # one warm-up, three timed
    assert timing["min_s"] <= timing["median_s"] <= timing["max_s"]
    assert timed_repeats(five_ms, reps=50, budget_s=0.002)["reps"] == 2  # one call outlasts the whole budget


@pytest.mark.parametrize("reps", [1, 2])
def test_timed_repeats_never_adds_reps(reps):
    assert timed_repeats(lambda: None, reps=reps, budget_s=0.0)["reps"] == reps


def test_train_memory_projection_is_a_line_through_the_measured_sizes():
    from benchmarks.train import projected_peak_mb

    measured = [{"steps_per_update": 1000, "peak_host_mb": 600.0}, {"steps_per_update": 3000, "peak_host_mb": 1000.0}]
    assert projected_peak_mb(measured, 5000) == pytest.approx(1400.0)
    assert projected_peak_mb(measured[:1], 5000) is None  # one size gives no slope
