"""Runs as jobs (agents/runs/jobs.py, agents/runs/backends.py): a walk-forward's job list, a job file that describes its
run, a finished job left alone and a stopped one resumed, several jobs at once in processes of their own with a failed
one named, and (slow) the same report from the same folders whichever backend made them."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from agents.runs import jobs
from agents.runs.backends import run_jobs
from tests.test_walkforward import walkforward, walkforward_figures, walkforward_plan


def test_a_walk_forwards_jobs_are_its_run_folders_fold_major_and_describe_themselves(tmp_path):
    from experiments.walkforward import plan_jobs

    out = tmp_path / "wf"
    plan = walkforward_plan(out, "--seeds", "0-1")
    planned = plan_jobs(plan)
    assert [j.run_dir.relative_to(out).as_posix() for j in planned] == [
        "runs/fold0/rl_only-s0", "runs/fold0/rl_only-s1", "runs/fold1/rl_only-s0", "runs/fold1/rl_only-s1"]
    assert all(not j.needs for j in planned) and planned[2].label == "fold 1 rl_only seed 0"
    assert planned[2].config == plan.run_config(plan.folds[1], "rl_only", 0)
    assert not out.exists()  # planning writes nothing
    # the job file: its folder alone says what to train and how to score it
    path = jobs.write_job(planned[2])
    assert path == planned[2].run_dir / jobs.JOB_FILE and not (planned[2].run_dir / "config.yaml").exists()
    assert jobs.read_job(planned[2].run_dir) == planned[2]
    with pytest.raises(ValueError, match="was not planned as a job"):
        jobs.read_job(planned[0].run_dir)
    # a warm start: each fold's run needs the previous fold's, same arm and seed
    warm = plan_jobs(walkforward_plan(out, "--seeds", "0-1", "--warm-start"))
    assert [j.needs for j in warm[2:]] == [(warm[0].run_dir,), (warm[1].run_dir,)]
    assert warm[2].config.transfer.init_from == str(warm[0].run_dir)


def _trained(run_dir: Path, cfg, update: int) -> None:
    """A run folder as training leaves it after `update` updates (no real checkpoint: train is replaced)."""
    from agents.config import save_config

    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"update": u}) + "\n" for u in range(1, update + 1)))


def test_a_finished_job_is_left_alone_a_stopped_one_resumed_a_trained_one_only_scored(tmp_path, monkeypatch):
    import agents.training.loop as loop
    import experiments.walkforward as wf

    plan = walkforward_plan(tmp_path / "wf", "--seeds", "0-1")
    finished, stopped, new, trained = wf.plan_jobs(plan)
    updates = finished.config.num_updates
    for job in (finished, new):  # as walkforward.py plans them: each folder with its job file
        jobs.write_job(job)
    (finished.run_dir / wf.SCORE_FILE).write_text(json.dumps({"version": wf.SCORE_VERSION, "test": "kept"}))
    _trained(stopped.run_dir, stopped.config, updates - 1)  # killed before its last update
    _trained(trained.run_dir, trained.config, updates)
    (trained.run_dir / wf.SCORE_FILE).write_text(json.dumps({"version": wf.SCORE_VERSION - 1}))  # an older scoring
    calls, scored = [], []

    def train(cfg, run_dir, resume=False):
        calls.append((Path(run_dir).name, Path(run_dir).parent.name, cfg is None, resume))
        return type("Result", (), {"interrupted": False})()

    monkeypatch.setattr(loop, "train", train)
    monkeypatch.setattr(wf, "score_run", lambda run_dir: scored.append(run_dir) or {"version": wf.SCORE_VERSION})
    outcome = run_jobs([finished, stopped, new, trained], progress=False)
    assert outcome.failed == [] and outcome.ran == [stopped, new, trained]
    # resumed from its folder's config and checkpoint (not started again); the new one from its planned config
    assert calls == [("rl_only-s1", "fold0", True, True), ("rl_only-s0", "fold1", False, False)]
    assert scored == [stopped.run_dir, new.run_dir, trained.run_dir]
    assert json.loads((finished.run_dir / wf.SCORE_FILE).read_text())["test"] == "kept"
    assert {"train_s", "score_s"} <= set(json.loads((new.run_dir / wf.SCORE_FILE).read_text()))
    # the second time every job is finished: nothing runs
    assert run_jobs([finished, stopped, new, trained], progress=False).ran == [] and len(calls) == 2


SCORER = '''
"""A scorer for tests: records which process scored a run, and with which GPU; fails where a file says so."""
import os

SCORE_FILE = "fake_eval.json"


def score_run(run_dir, fail_on="fail"):
    if (run_dir / fail_on).exists():
        raise RuntimeError(f"boom in {run_dir.name}")
    return {"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}


def scored_as_asked(scores, fail_on="fail"):
    return True
'''


def test_the_processes_backend_runs_jobs_in_processes_of_their_own_one_gpu_each_and_names_a_failed_one(
        tmp_path, monkeypatch):
    """--backend processes: each job is `python -m agents.runs.jobs RUN_DIR`, given a GPU in turn; a failed job is
    named with its log, a job that needs it is not started, the others finish."""
    from experiments.walkforward import plan_jobs

    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fake_job_scorer.py").write_text(textwrap.dedent(SCORER))
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), str(repo), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.syspath_prepend(str(modules))
    plan = walkforward_plan(tmp_path / "wf", "--seeds", "0-1")
    planned = [jobs.Job(j.run_dir, j.config, "fake_job_scorer", {"fail_on": "fail"}, label=j.label)
               for j in plan_jobs(plan)]
    for job in planned:  # trained already: the processes only score
        _trained(job.run_dir, job.config, job.config.num_updates)
    broken, ok0, ok1, after = planned[0], planned[1], planned[2], planned[3]
    (broken.run_dir / "fail").touch()
    after = jobs.Job(after.run_dir, after.config, after.scorer, after.options, (broken.run_dir,), after.label)
    outcome = run_jobs([broken, ok0, ok1, after], "processes", 2, progress=False)
    assert outcome.ran == [ok0, ok1]
    assert [(f.run_dir, f.why) for f in outcome.failed] == [
        (broken.run_dir, f"failed (exit 1); its log: {broken.run_dir / jobs.LOG_FILE}"),
        (after.run_dir, f"not run: it needs {broken.run_dir}, which failed")]
    assert "RuntimeError: boom in rl_only-s0" in (broken.run_dir / jobs.LOG_FILE).read_text()
    scores = [json.loads((j.run_dir / "fake_eval.json").read_text()) for j in (ok0, ok1)]
    assert all(s["pid"] != os.getpid() for s in scores) and {s["gpu"] for s in scores} <= {"3", "5"}
    assert not (after.run_dir / "fake_eval.json").exists() and not (after.run_dir / jobs.LOG_FILE).exists()
    with pytest.raises(Exception, match="rl_only-s0: failed"):
        outcome.check()
    # the job entry point on its own, in this process: an already scored run is left alone
    assert jobs.main([str(ok0.run_dir)]) == 0 and json.loads((ok0.run_dir / "fake_eval.json").read_text()) == scores[0]
    assert jobs.main([str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow
def test_every_backend_gives_the_same_report_from_the_same_folders(tmp_path):
    """A tiny walk-forward (2 folds × 2 seeds) with --backend local and with --backend processes --jobs 2: the same
    figures, read from run folders the two backends trained."""
    out = {}
    for backend, extra in (("local", []), ("processes", ["--jobs", "2"])):
        out[backend] = tmp_path / backend
        assert walkforward(out[backend], "--seeds", "0-1", "--backend", backend, *extra) == 0

    assert walkforward_figures(out["local"]) == walkforward_figures(out["processes"])
    tables = {b: (out[b] / "table.md").read_text().splitlines()[1:-1] for b in out}  # less the command and the time
    assert tables["local"] == tables["processes"]
    logs = sorted(p.relative_to(out["processes"]).as_posix() for p in out["processes"].rglob(jobs.LOG_FILE))
    assert logs == [f"runs/fold{f}/rl_only-s{s}/{jobs.LOG_FILE}" for f in (0, 1) for s in (0, 1)]


def test_jobs_refuses_a_bad_jobs_count_in_one_line(tmp_path, capsys):
    assert walkforward(tmp_path / "wf", "--jobs", "2") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --jobs 2: give --backend processes, ray or slurm (local runs one at a time)"]
    assert walkforward(tmp_path / "wf", "--backend", "processes", "--jobs", "0") == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "wf").exists()
