"""The `ray` and `slurm` backends of agents/runs/backends.py (Ray and submitit: the optional `sweep` extra): without
the extra, the backend list and a one-line refusal; with it, the jobs in waves by what they need, a SLURM job array
through submitit's local executor that names a failed job, and (slow) the same report as `--backend local` from a
walk-forward run by Ray, killed (SIGKILL of the driver) and restarted, and by submitit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents.runs import backends, jobs
from tests.test_walkforward import TINY, walkforward, walkforward_figures, walkforward_plan

REPO = Path(__file__).resolve().parents[1]


def test_the_backends_are_local_processes_ray_and_slurm():
    from experiments.walkforward import parser

    assert backends.BACKENDS == ("local", "processes", "ray", "slurm")
    backend = next(a for a in parser()._actions if a.dest == "backend")
    assert tuple(backend.choices) == backends.BACKENDS and backend.default == "local"


def test_walkforward_search_and_experiment_take_the_same_backend_flags():
    """One definition (backends.add_backend_arguments): the same flags, defaults, choices and help in each command."""
    from experiments import fusion, search, walkforward

    def flags(ap):
        return {a.dest: (a.option_strings, a.default, a.choices, a.help) for a in ap._actions
                if a.dest in ("backend", "jobs", "ray_address") or a.dest.startswith("slurm_")}

    wf = flags(walkforward.parser())
    assert len(wf) == 7 and flags(search.parser()) == wf and flags(fusion.parser()) == wf


@pytest.mark.parametrize("backend, module, name", [("ray", "ray.tune", "Ray"), ("slurm", "submitit", "submitit")])
def test_a_backend_whose_package_is_missing_is_refused_in_one_line_before_anything_is_planned(
        tmp_path, capsys, monkeypatch, backend, module, name):
    monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError, as where the extra is not installed
    assert walkforward(tmp_path / "wf", "--backend", backend) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: --backend {backend} needs {name}: pip install -e .[sweep]"]
    assert not (tmp_path / "wf").exists()
    with pytest.raises(backends.BackendMissing, match="pip install -e .\\[sweep\\]"):
        backends.run_jobs([], backend, progress=False)


def test_slurm_without_sbatch_and_a_stray_ray_address_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", type(sys)("submitit"))  # installed or not: the check is sbatch's
    monkeypatch.setattr(backends.shutil, "which", lambda name: None)
    assert walkforward(tmp_path / "wf", "--backend", "slurm") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --backend slurm: sbatch not found; run it where SLURM's commands are (a login node), or try the path "
        "on this machine with --slurm-executor local"]
    assert walkforward(tmp_path / "wf", "--ray-address", "auto") == 2
    assert capsys.readouterr().err.splitlines() == ["error: --ray-address: give --backend ray"]
    assert not (tmp_path / "wf").exists()


def test_ray_and_slurm_run_jobs_in_waves_after_the_jobs_they_need(tmp_path):
    from experiments.walkforward import plan_jobs

    warm = plan_jobs(walkforward_plan(tmp_path / "wf", "--seeds", "0-1", "--folds", "3", "--warm-start"))
    assert [[j.label for j in wave] for wave in backends.waves(warm)] == [
        [f"fold {f} rl_only seed {s}" for s in (0, 1)] for f in (0, 1, 2)]
    # a need outside the plan (a folder already there) counts as met
    assert [len(w) for w in backends.waves(warm[2:])] == [2, 2]
    fresh = plan_jobs(walkforward_plan(tmp_path / "wf", "--seeds", "0-1"))
    assert backends.waves(fresh) == [fresh]


SCORER = '''
"""A scorer for tests: records which process scored a run; fails where a file says so."""
import os

SCORE_FILE = "fake_eval.json"


def score_run(run_dir):
    if (run_dir / "fail").exists():
        raise RuntimeError(f"boom in {run_dir.name}")
    return {"pid": os.getpid()}


def scored_as_asked(scores):
    return True
'''


def test_the_slurm_backend_submits_a_job_array_through_submitit_and_names_a_failed_job(tmp_path, monkeypatch):
    """submitit's local executor: the same array submission as on SLURM, each task a process of this machine that
    calls the job entry point; a failed task is named with its log, a job that needs it is not submitted."""
    pytest.importorskip("submitit")
    from agents.runs.jobs import Job
    from agents.runs.slurm_backend import RunFolder
    from experiments.walkforward import plan_jobs
    from tests.test_jobs import _trained

    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fake_slurm_scorer.py").write_text(textwrap.dedent(SCORER))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(modules))
    planned = [Job(j.run_dir, j.config, "fake_slurm_scorer", label=j.label)
               for j in plan_jobs(walkforward_plan(tmp_path / "wf", "--seeds", "0-1"))]
    for job in planned:  # trained already: the tasks only score
        _trained(job.run_dir, job.config, job.config.num_updates)
    broken, ok, after = planned[0], planned[1], planned[2]
    after = Job(after.run_dir, after.config, after.scorer, needs=(broken.run_dir,), label=after.label)
    (broken.run_dir / "fail").touch()
    t0 = time.perf_counter()
    outcome = backends.run_jobs([broken, ok, after], "slurm", 2, progress=False, state_dir=tmp_path / "slurm",
                                slurm=backends.SlurmOptions(time_min=5, executor="local"))
    print(f"slurm (submitit local) backend, 2 tasks scoring: {time.perf_counter() - t0:.1f} s")
    assert outcome.ran == [ok]
    assert [f.run_dir for f in outcome.failed] == [broken.run_dir, after.run_dir]
    why = outcome.failed[0].why
    assert why.startswith("failed (task ") and "RuntimeError: boom in rl_only-s0); its log: " in why
    log = Path(why.split("its log: ")[1])
    assert log.is_relative_to(tmp_path / "slurm") and "RuntimeError: boom in rl_only-s0" in log.read_text()
    assert outcome.failed[1].why == f"not run: it needs {broken.run_dir}, which failed"
    scored = json.loads((ok.run_dir / "fake_eval.json").read_text())
    assert scored["pid"] != os.getpid() and not (after.run_dir / "fake_eval.json").exists()
    # requeued on preemption or timeout: the same call again
    call = RunFolder(str(tmp_path))
    again = call.checkpoint(str(ok.run_dir))
    assert again.function is call and again.args == (str(ok.run_dir),)


# ------------------------------------------------------------------------------------------------------------ slow
def table_lines(folder: Path) -> list[str]:
    return (folder / "table.md").read_text().splitlines()[1:-1]  # less the command and the time


@pytest.mark.slow
def test_a_walk_forward_run_by_ray_gives_the_same_report_as_local(tmp_path):
    """2 folds × 2 seeds with --backend local and with --backend ray --jobs 2 (a local Ray instance)."""
    pytest.importorskip("ray.tune")
    out, took = {}, {}
    for backend, extra in (("local", []), ("ray", ["--jobs", "2"])):
        out[backend] = tmp_path / backend
        t0 = time.perf_counter()
        assert walkforward(out[backend], "--seeds", "0-1", "--backend", backend, *extra) == 0
        took[backend] = time.perf_counter() - t0
    print(f"walk-forward 2 folds x 2 seeds: local {took['local']:.0f} s, ray --jobs 2 {took['ray']:.0f} s")
    assert walkforward_figures(out["local"]) == walkforward_figures(out["ray"])
    assert table_lines(out["local"]) == table_lines(out["ray"])
    assert len(list((out["ray"] / "ray").glob("jobs-*-wave0/experiment_state-*.json"))) == 1


def cli(out: Path, *extra: str) -> list[str]:
    """The walk-forward's command line as tests.test_walkforward.walkforward gives it, 2 seeds."""
    return [sys.executable, str(REPO / "scripts" / "walkforward.py"), "--config", "configs/quick.yaml", "--seeds",
            "0-1", "--folds", "2", "--test-sessions", "3", "--val-sessions", "3", "--total-steps", "256", "--out",
            str(out), "--no-progress", *(f"--set={o}" for o in TINY), *extra]


@pytest.mark.slow
def test_a_ray_walk_forward_killed_mid_way_keeps_its_finished_runs_and_completes_the_rest(tmp_path):
    """The driver SIGKILLed once a run has its scores; the same command resumes Ray's experiment (Tuner.restore),
    keeps the scored runs and runs the others."""
    pytest.importorskip("ray.tune")
    out = tmp_path / "wf"
    t0 = time.perf_counter()
    driver = subprocess.Popen(cli(out, "--backend", "ray", "--jobs", "2"), cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while not list(out.glob("runs/*/*/walkforward_eval.json")):
            assert driver.poll() is None, "the walk-forward ended before any run had its scores"
            assert time.perf_counter() - t0 < 600
            time.sleep(0.5)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    killed_at = time.perf_counter() - t0
    kept = {p: p.read_text() for p in out.glob("runs/*/*/walkforward_eval.json")}
    assert 1 <= len(kept) < 4 and not (out / "walkforward.json").exists()
    t1 = time.perf_counter()
    assert walkforward(out, "--seeds", "0-1", "--backend", "ray", "--jobs", "2") == 0
    print(f"ray walk-forward: killed after {killed_at:.0f} s with {len(kept)} run(s) scored; the same command "
          f"finished in {time.perf_counter() - t1:.0f} s")
    assert all(p.read_text() == text for p, text in kept.items())  # read back, not trained or scored again
    for path in kept:
        assert (path.parent / jobs.LOG_FILE).read_text().count(": scored\n") == 1
    assert len(list(out.glob("runs/*/*/walkforward_eval.json"))) == 4
    summary = json.loads((out / "walkforward.json").read_text())
    assert sorted(summary["runs"]) == ["fold0", "fold1"] and (out / "table.md").exists()
    assert len(list((out / "ray").glob("jobs-*-wave0/experiment_state-*.json"))) == 2  # restored, not started anew


@pytest.mark.slow
def test_a_walk_forward_run_as_a_slurm_job_array_gives_the_same_report_as_local(tmp_path):
    """1 fold × 2 seeds with --backend local and with --backend slurm through submitit's local executor (the cluster
    path itself, sbatch, is not tried here)."""
    pytest.importorskip("submitit")
    out, took = {}, {}
    for backend, extra in (("local", []), ("slurm", ["--slurm-executor", "local", "--slurm-time", "30"])):
        out[backend] = tmp_path / backend
        t0 = time.perf_counter()
        assert walkforward(out[backend], "--seeds", "0-1", "--folds", "1", "--backend", backend, *extra) == 0
        took[backend] = time.perf_counter() - t0
    print(f"walk-forward 1 fold x 2 seeds: local {took['local']:.0f} s, slurm (submitit local) {took['slurm']:.0f} s")
    assert walkforward_figures(out["local"]) == walkforward_figures(out["slurm"])
    assert table_lines(out["local"]) == table_lines(out["slurm"])
    assert list((out["slurm"] / "slurm").glob("*/*_log.err"))
