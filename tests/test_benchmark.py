"""The benchmark harness itself: a tiny `--quick` run writes valid JSON in the shared format, a plot and a
Markdown report; a suite that cannot be imported is skipped with the reason; the reporting helpers."""

from __future__ import annotations

import json
import math
import os
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
    # a CPU report's GPU rows come from the GPU report measured earlier, never from this machine
    assert "## GPU" in markdown and benchmark.GPU_MARKDOWN in markdown

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


def test_gpu_rows_are_the_gpu_reports_figures_or_left_empty():
    assert benchmark.gpu_rows_markdown(None).count("| not measured |") == len(benchmark.GPU_FIGURES)
    gpu = "gpu: NVIDIA H100 80GB HBM3"
    rows = [
        {"suite": "env", "envs": 4096, "steps_per_s": 63.7e6, "baseline_steps_per_s": 275e6, "device": gpu},
        {"suite": "train", "case": "update", "envs": 4096, "steps_per_s": 6.6e6, "device": gpu},
        {"suite": "phi3", "case": "score", "quantize": "none", "micro_batch": 64, "prompts_per_s": 584.0},
        {"suite": "phi3", "case": "score", "quantize": "none", "micro_batch": 256, "prompts_per_s": 645.0},
    ]
    report = {"machine": {"jax_devices": ["cuda:0 (NVIDIA H100 80GB HBM3)"]}, "run": {"finished": "2026-11-24"},
              "results": rows}
    markdown = benchmark.gpu_rows_markdown(report)
    assert "63.7M (CartPole 275.0M)" in markdown and "6.6M at 4,096" in markdown
    assert "score bf16 645 prompts/s (micro-batch 256)" in markdown  # each quantization's fastest micro-batch
    assert markdown.count("| not measured |") == 2  # the mock hybrid and the learning round were not in it


def test_from_json_merges_reports_made_one_command_each_on_one_machine(tmp_path):
    def report(suite, command, finished, device="cuda:0 (NVIDIA H100 80GB HBM3)"):
        return {"machine": {"jax_devices": [device]}, "options": {}, "skipped": {}, "failed": {},
                "run": {"command": command, "wall_minutes": 1.5, "finished": finished, "load_avg_start": [1, 1, 1],
                        "load_avg_end": [2, 2, 2]},
                "results": [{"suite": suite, "envs": 8, "steps_per_s": 10.0}]}

    merged = benchmark.merged_report([report("env", "a", "2026-11-24 21:52 UTC"),
                                      report("train", "b", "2026-11-24 22:04 UTC")])
    assert merged["run"]["commands"] == ["a", "b"] and merged["run"]["wall_minutes"] == 3.0
    assert merged["run"]["finished"] == "2026-11-24 22:04 UTC"
    assert [r["suite"] for r in merged["results"]] == ["env", "train"]
    with pytest.raises(ValueError, match="different devices"):
        benchmark.merged_report([report("env", "a", "x"), report("env", "b", "y", device="cpu:0")])

    # through the command line: a report that is not JSON names its file, exit 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cmd = [sys.executable, str(SCRIPTS / "benchmark.py"), "--from-json", str(bad), "--json", str(tmp_path / "m.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and str(bad) in done.stderr and "Traceback" not in done.stderr


def phi3_quick_command(out: Path) -> list[str]:
    return [sys.executable, str(SCRIPTS / "benchmark.py"), "phi3", "--quick", "--reps", "1", "--json", str(out)]


@pytest.mark.slow  # 1-2 min on 2 cores: the whole suite in small
def test_phi3_quick_runs_a_tiny_phi3_through_scoring_a_learning_round_and_training(tmp_path):
    """The `phi3` suite's code paths on any machine: the tiny model answers every prompt, a LoRA round learns,
    and training with it as the advisor in its own process gets advice."""
    out = tmp_path / "phi3.json"
    cmd = phi3_quick_command(out)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    cases = {r["case"]: r for r in rows}
    assert cases.keys() == {"score", "learning", "hybrid"}
    assert cases["score"]["ok_fraction"] == 1.0 and cases["score"]["prompts_per_s"] > 0
    assert cases["learning"]["steps"] >= 1 and cases["learning"]["train_examples"] >= 16
    assert cases["hybrid"]["coverage"] > 0 and cases["hybrid"]["ratio"] > 0


def test_phi3_refuses_an_unknown_quantisation_in_one_line(tmp_path):
    bad_env = {**os.environ, "BENCH_PHI3_QUANTIZE": "int3"}
    bad = subprocess.run(phi3_quick_command(tmp_path / "phi3.json"), capture_output=True, text=True, timeout=120,
                         env=bad_env)
    assert bad.returncode == 2 and "error: BENCH_PHI3_QUANTIZE: unknown int3" in bad.stderr
    assert "Traceback" not in bad.stderr
