"""The `ray` backend of agents/runs/backends.py: the jobs as a Ray Tune experiment, one trial per job (its config: the
run folder), on a local Ray instance or a cluster (`address`: "auto", "ray://HOST:PORT"). Imported only when the
backend is asked for: Ray is in the optional `sweep` extra.

Ray only schedules. A trial runs `python -m agents.runs.jobs RUN_DIR` in a process of its own (its output appended
to RUN_DIR/job.log, in the driver's working folder, with the GPU Ray gave the trial), so JAX never starts inside a
Ray worker and the run is the same as under any other backend; the results stay in the run folder. A failed trial is
tried again up to RETRIES times (Tune's FailureConfig). Jobs that need other jobs (a warm start's previous fold) run
in later waves, one Tune experiment per wave, kept under `state_dir` (the walk-forward's OUT/ray/). The driver
killed, the same command finds each wave's experiment there and resumes it with Tuner.restore (errored trials are
started again); and whatever Tune remembers, a job whose folder holds its scores is read back, not run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from agents.runs import jobs as job_runs
from agents.runs.backends import wave_todo, waves
from agents.runs.jobs import EXIT_LOCKED, LOG_FILE, Job

RETRIES = 2  # a failed trial is started again this many times before it counts as failed
LOCKED_WAIT_S = 30.0  # a trial whose folder another live process holds looks again this often


def run_trial(config: dict) -> None:
    """Tune's function trainable: runs one job (config["run_dir"]) in a process of its own, waiting while another
    live process holds its folder; raises (Tune retries) when the job fails."""
    from ray import tune

    run_dir = Path(config["run_dir"])
    os.chdir(config["cwd"])  # the driver's: a config's relative paths (its data) mean what they meant there
    try:
        if job_runs.read_job(run_dir).finished():  # a killed driver's trial that ended before Tune saved its state
            tune.report({"exit": 0})
            return
    except Exception:  # noqa: BLE001 - the job's own process says what is wrong, in its log
        pass
    command = [sys.executable, "-m", "agents.runs.jobs", str(run_dir)]
    while True:
        with open(run_dir / LOG_FILE, "a") as log:
            gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(command)} (Ray trial"
                      f"{f', CUDA_VISIBLE_DEVICES={gpus}' if gpus else ''})\n")
            log.flush()
            code = subprocess.call(command, cwd=config["cwd"], stdout=log, stderr=subprocess.STDOUT)
        if code != EXIT_LOCKED:
            break
        time.sleep(LOCKED_WAIT_S)  # another process (a killed driver's trial, say) is still training it
    if code != 0:
        raise RuntimeError(f"{run_dir}: failed (exit {code}); its log: {run_dir / LOG_FILE}")
    tune.report({"exit": code})


def experiment_name(jobs: list[Job], wave: int) -> str:
    """A wave's experiment, named by every planned job: the same plan finds it again, another plan starts its own."""
    digest = hashlib.sha256("\n".join(str(j.run_dir.resolve()) for j in jobs).encode()).hexdigest()[:12]
    return f"jobs-{digest}-wave{wave}"


def _watch(jobs: list[Job], bar, stop: threading.Event, seen: set[Path]) -> None:
    """Moves the progress bar as the jobs' folders get their scores (`seen`: those counted)."""
    while not stop.wait(2.0):
        for job in jobs:
            if job.run_dir not in seen and job.finished():
                seen.add(job.run_dir)
                bar.update()


def run(jobs: list[Job], workers: int | None, bar, address: str | None, state_dir: Path, outcome, failure) -> None:
    """Runs the jobs not yet finished with Ray Tune (module doc), appending to `outcome` (backends.Outcome) what ran
    and `failure(run_dir, why)` for each job that failed."""
    started_ray = False
    try:
        for k, wave in enumerate(waves(jobs)):
            todo = wave_todo(wave, outcome, bar)
            if not todo:
                continue
            if not started_ray:
                started_ray = _start_ray(address)
            errors = _fit(wave, todo, workers, bar, state_dir / experiment_name(jobs, k))
            for job in todo:
                if job.finished():
                    outcome.ran.append(job)
                else:
                    why = errors.get(job.run_dir) or ("Ray reports its trial done but the folder holds no current "
                                                      f"scores; remove {state_dir} to schedule it again")
                    outcome.failed.append(failure(job.run_dir, why))
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def _start_ray(address: str | None) -> bool:
    """Connects to the cluster at `address` or starts a local instance; True when this call did either."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:  # a local instance of this machine's CPUs (and GPUs), gone with this process
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    # the jobs' output is in their folders' job.log; a trial's error in Tune's folder under state_dir
    return True


def _fit(wave: list[Job], todo: list[Job], workers: int | None, bar, path: Path) -> dict[Path, str]:
    """Runs one wave's experiment (restored when `path` holds it); returns why each errored trial failed."""
    import ray
    from ray import tune

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    trainable = tune.with_resources(run_trial, {"cpu": 1, "gpu": gpus})
    for job in todo:
        job_runs.write_job(job)  # as planned now: the trial's process reads the job from its folder
    if tune.Tuner.can_restore(str(path)):  # a killed driver's experiment: its finished trials stay finished
        print(f"ray: resuming the experiment in {path}", file=sys.stderr, flush=True)
        tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, restart_errored=True)
    else:
        cwd = os.getcwd()
        space = {"run_dir": tune.grid_search([str(j.run_dir.resolve()) for j in wave]), "cwd": cwd}
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(max_concurrent_trials=workers, trial_dirname_creator=_trial_folder),
            run_config=tune.RunConfig(name=path.name, storage_path=str(path.parent.resolve()), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=RETRIES)))
    stop, seen = threading.Event(), set()
    watcher = threading.Thread(target=_watch, args=(todo, bar, stop, seen), daemon=True)
    watcher.start()
    try:
        results = tuner.fit()
    finally:
        stop.set()
        watcher.join()
    bar.update(len(todo) - len(seen))  # the jobs that ended since the watcher last looked, and the failed ones
    errors = {}
    for result in results:
        if result.error is not None:
            run_dir = Path(result.config["run_dir"])
            errors[run_dir] = (f"failed in Ray after {RETRIES + 1} tries ({type(result.error).__name__}); its log: "
                               f"{run_dir / LOG_FILE}")
    # the folders of the plan as given (results name them resolved)
    by_resolved = {j.run_dir.resolve(): j.run_dir for j in todo}
    return {by_resolved.get(p, p): why for p, why in errors.items()}


def _trial_folder(trial) -> str:
    return f"trial-{trial.trial_id}"
