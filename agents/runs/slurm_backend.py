"""The `slurm` backend of agents/runs/backends.py: the jobs as a submitit job array on SLURM, one array task per job,
each calling the job entry point (agents.runs.jobs.main) on its run folder in the task's own Python process. Imported
only when the backend is asked for: submitit is in the optional `sweep` extra.

A task preempted or out of time is requeued by submitit (RunFolder.checkpoint: the same call again), and the job
resumes from its run's latest orbax checkpoint. Jobs that need other jobs (a warm start's previous fold) are submitted
in later arrays, each after the one before has ended. submitit keeps its pickles and the tasks' logs under
`state_dir` (the walk-forward's OUT/slurm/). The results stay in the run folders.

`executor` "local" runs the same submission on this machine (submitit's local executor, each task a process): the way
this project tests the path; the cluster path itself (sbatch) is untested here.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import submitit

from agents.runs.backends import wave_todo, waves
from agents.runs.jobs import EXIT_LOCKED, Job

LOCKED_WAIT_S = 30.0  # a task whose folder another live process holds looks again this often
MAX_TIMEOUTS = 20  # requeues after running out of time before a task counts as failed (preemptions are not counted)


class RunFolder:
    """The callable each array task runs: the job of one run folder, in the submitting process's working folder.
    submitit calls checkpoint() on preemption or timeout and requeues what it returns: this call again (the run
    resumes from its orbax checkpoint)."""

    def __init__(self, cwd: str):
        self.cwd = cwd

    def __call__(self, run_dir: str) -> str:
        from agents.runs import jobs

        os.chdir(self.cwd)
        while (code := jobs.main([run_dir])) == EXIT_LOCKED:  # another live process is still training it
            time.sleep(LOCKED_WAIT_S)
        if code != 0:
            raise RuntimeError(f"{run_dir}: the job exited {code}")
        return run_dir

    def checkpoint(self, run_dir: str) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, run_dir)


def executor_for(state_dir: Path, options, workers: int | None) -> submitit.AutoExecutor:
    """A submitit executor for `options` (backends.SlurmOptions): partition, time, GPUs per task, tasks at once."""
    executor = submitit.AutoExecutor(folder=state_dir / "%j", cluster=options.executor,
                                     slurm_max_num_timeout=MAX_TIMEOUTS)
    params = {"name": "walkforward-job", "timeout_min": options.time_min, "gpus_per_node": options.gpus_per_job}
    if options.partition:
        params["slurm_partition"] = options.partition
    if workers:
        params["slurm_array_parallelism"] = workers
    executor.update_parameters(**params)
    return executor


def run(jobs: list[Job], workers: int | None, bar, options, state_dir: Path, outcome, failure) -> None:
    """Submits the jobs not yet finished (module doc), appending to `outcome` (backends.Outcome) what ran and
    `failure(run_dir, why)` for each job that failed."""
    from agents.runs import jobs as job_runs

    executor = executor_for(state_dir, options, workers)
    call = RunFolder(os.getcwd())
    for wave in waves(jobs):
        todo = wave_todo(wave, outcome, bar)
        if not todo:
            continue
        for job in todo:
            job_runs.write_job(job)  # as planned now: the task reads the job from its folder
        tasks = executor.map_array(call, [str(j.run_dir) for j in todo])
        by_id = {task.job_id: job for task, job in zip(tasks, todo)}
        for task in submitit.helpers.as_completed(tasks):
            job = by_id[task.job_id]
            try:
                task.result()
            except Exception as e:  # noqa: BLE001 - one task's failure is reported, the others go on
                outcome.failed.append(failure(job.run_dir, f"failed (task {task.job_id}: {_raised(e)}); its log: "
                                                           f"{task.paths.stderr}"))
            else:
                outcome.ran.append(job)
            bar.set_postfix_str(job.name)
            bar.update()


def _raised(error: Exception) -> str:
    """What a task raised, in one line: the last `SomeError: message` line of the trace submitit hands back."""
    raised = [line for line in str(error).splitlines() if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line)]
    return raised[-1] if raised else type(error).__name__
