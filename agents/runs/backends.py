"""Runs a list of jobs (agents/runs/jobs.py) with a backend, and says which failed; the results stay in the run
folders, where the caller reads them back whichever backend made them.

- `local`: in this process, one after another (the jobs' order);
- `processes`: up to N jobs at once, each `python -m agents.runs.jobs RUN_DIR` in a process of its own, its output in
  RUN_DIR/job.log; where GPUs are visible each process is given one (CUDA_VISIBLE_DEVICES), in turn;
- `ray`: a Ray Tune experiment, one trial per job, on a local Ray instance or a cluster (agents/runs/ray_backend.py);
- `slurm`: a submitit job array on SLURM, requeued on preemption (agents/runs/slurm_backend.py).
Ray and submitit are in the optional `sweep` extra (`pip install -e .[sweep]`); check_backend says so in one line.
add_backend_arguments gives a command the flags that choose the backend (--backend, --jobs, --ray-address, --slurm-*),
backend_options reads them back checked: walkforward.py, search.py and experiment.py take the same.

A job whose folder another live process holds is tried again after the others (every LOCKED_WAIT_S while only such
jobs are left); a job waits for the jobs it needs (a warm start's previous fold). A job that fails is named with
where its log is and the others go on; one whose needed job failed is not started. Ctrl-C: each running process is
asked to stop once (it saves a checkpoint), and the same command resumes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agents.runs import jobs as job_runs
from agents.runs.jobs import EXIT_LOCKED, LOG_FILE, Job

BACKENDS = ("local", "processes", "ray", "slurm")
NEEDS = {"ray": ("ray.tune", "Ray"), "slurm": ("submitit", "submitit")}  # backend -> (its module, its name)
SLURM_EXECUTORS = ("slurm", "local")  # submitit's: the cluster, or processes of this machine
LOCKED_WAIT_S = 30.0  # a job whose folder another process holds is looked at again this often
POLL_S = 0.2  # how often the processes backend looks at its processes


@dataclass
class Failure:
    run_dir: Path
    why: str


class BackendMissing(ValueError):
    """A backend's package is not installed, or its scheduler not reachable: one line that says what to install."""


def check_backend(backend: str, slurm_executor: str = "slurm") -> None:
    """Raises BackendMissing when `backend` cannot run here: its package (the `sweep` extra) is missing, or, for
    slurm on the cluster, sbatch is not on the PATH."""
    if backend not in NEEDS:
        return
    module, name = NEEDS[backend]
    try:
        importlib.import_module(module)
    except ImportError:
        raise BackendMissing(f"--backend {backend} needs {name}: pip install -e .[sweep]") from None
    if backend == "slurm" and slurm_executor == "slurm" and shutil.which("sbatch") is None:
        raise BackendMissing("--backend slurm: sbatch not found; run it where SLURM's commands are (a login node), "
                             "or try the path on this machine with --slurm-executor local")


@dataclass(frozen=True)
class SlurmOptions:
    """What each SLURM array task asks for (agents/runs/slurm_backend.py)."""

    partition: str | None = None
    time_min: int = 240  # the task's time limit; a run out of time is requeued and resumes from its checkpoint
    gpus_per_job: int = 0
    executor: str = "slurm"  # SLURM_EXECUTORS


@dataclass(frozen=True)
class BackendOptions:
    """What runs a command's jobs: --backend and the flags that go with it (add_backend_arguments), checked
    (backend_options); walkforward.py, search.py and experiment.py take the same."""

    backend: str = "local"  # BACKENDS
    workers: int | None = 1  # jobs at once (ray, slurm: None, as many as the cluster gives)
    ray_address: str | None = None  # --backend ray: the cluster (None: a local Ray instance)
    slurm: SlurmOptions | None = None  # --backend slurm: what each task asks for

    @property
    def processes(self) -> int | None:
        """Processes that run jobs at once, as a report counts them (None: as many as Ray or SLURM ran)."""
        return 1 if self.backend == "local" else self.workers

    def run(self, jobs: list[Job], progress: bool = True, desc: str = "runs",
            state_dir: Path | None = None) -> Outcome:
        """run_jobs with these options."""
        scheduler = ({"ray_address": self.ray_address} if self.backend == "ray" else
                     {"slurm": self.slurm} if self.backend == "slurm" else {})
        return run_jobs(jobs, self.backend, self.workers, progress=progress, desc=desc, state_dir=state_dir,
                        **scheduler)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """--backend, --jobs, --ray-address and --slurm-*: what runs a command's runs (read back by backend_options)."""
    parser.add_argument("--backend", default="local", choices=BACKENDS, help="what runs the runs "
                        "(agents/runs/backends.py): local, one after another in this process; processes, --jobs at "
                        "once, each in a process of its own with its log in its folder's job.log, one GPU each where "
                        "there are GPUs; ray, a Ray Tune trial per run (a local Ray instance, or --ray-address); "
                        "slurm, a SLURM job array (submitit). ray and slurm need the sweep extra: pip install -e "
                        ".[sweep] (default: %(default)s)")
    parser.add_argument("--jobs", type=int, metavar="N", help="runs at once: --backend processes (default: one per "
                        "visible GPU, else 1), ray and slurm (default: as many as the cluster gives)")
    parser.add_argument("--ray-address", metavar="ADDRESS", help="--backend ray: the cluster to join, auto (the one "
                        "`ray start` runs on this machine) or ray://HOST:10001 (default: a local Ray instance of this "
                        "machine)")
    parser.add_argument("--slurm-partition", metavar="NAME", help="--backend slurm: the partition (default: SLURM's)")
    parser.add_argument("--slurm-time", type=int, default=240, metavar="MINUTES", help="--backend slurm: each task's "
                        "time limit; a run out of time is requeued and resumes from its checkpoint "
                        "(default: %(default)s)")
    parser.add_argument("--slurm-gpus-per-job", type=int, default=0, metavar="N", help="--backend slurm: GPUs each "
                        "task asks for (default: %(default)s)")
    parser.add_argument("--slurm-executor", default="slurm", choices=SLURM_EXECUTORS, help="--backend slurm: "
                        "submitit's executor; local tries the same submission without a cluster, each task a process "
                        "of this machine (default: %(default)s)")


def backend_options(args: argparse.Namespace) -> BackendOptions:
    """The backend flags of a command line (add_backend_arguments), checked before anything is planned: a ValueError
    (BackendMissing: a package to install, or sbatch missing) in one line."""
    if args.jobs is not None and (args.backend == "local" or args.jobs < 1):
        raise ValueError(f"--jobs {args.jobs}: " + ("give --backend processes, ray or slurm (local runs one at a "
                                                    "time)" if args.backend == "local" else "must be at least 1"))
    if args.ray_address and args.backend != "ray":
        raise ValueError("--ray-address: give --backend ray")
    if args.slurm_time < 1 or args.slurm_gpus_per_job < 0:
        raise ValueError("--slurm-time must be at least 1 minute and --slurm-gpus-per-job at least 0")
    check_backend(args.backend, args.slurm_executor)
    workers = args.jobs or (default_workers() if args.backend == "processes" else
                            None if args.backend in ("ray", "slurm") else 1)
    return BackendOptions(args.backend, workers, args.ray_address if args.backend == "ray" else None,
                          SlurmOptions(args.slurm_partition, args.slurm_time, args.slurm_gpus_per_job,
                                       args.slurm_executor) if args.backend == "slurm" else None)


class JobsFailed(RuntimeError):
    """Some jobs failed: `errors` names each folder and where its log is, one line each."""

    def __init__(self, failures: list[Failure]):
        self.failures = failures
        self.errors = [f"{f.run_dir}: {f.why}" for f in failures]
        super().__init__("; ".join(self.errors))


@dataclass
class Outcome:
    ran: list[Job] = field(default_factory=list)  # the jobs this call trained or scored (not those read back)
    failed: list[Failure] = field(default_factory=list)

    def check(self) -> None:
        """Raises JobsFailed when a job failed."""
        if self.failed:
            raise JobsFailed(self.failed)


def gpu_slots(workers: int) -> list[str | None]:
    """The GPU each of `workers` processes is given (visible GPUs in turn), or None each without GPUs."""
    from agents.devices.gpus import visible_gpu_ids

    ids = visible_gpu_ids()
    return [ids[i % len(ids)] if ids else None for i in range(workers)]


def default_workers() -> int:
    """Processes at once when --jobs is not given: one per visible GPU, else 1."""
    from agents.devices.gpus import visible_gpu_ids

    return max(len(visible_gpu_ids()), 1)


def run_jobs(jobs: list[Job], backend: str = "local", workers: int | None = 1, progress: bool = True,
             desc: str = "runs", *, ray_address: str | None = None, slurm: SlurmOptions | None = None,
             state_dir: Path | None = None) -> Outcome:
    """Runs every job not already finished with `backend` (BACKENDS), a tqdm bar over the jobs; returns what it ran
    and what failed (Outcome.check raises). `workers`: jobs at once (ray, slurm: None, as many as the cluster
    gives); `ray_address`: the Ray cluster (None: a local instance); `slurm`: what each SLURM task asks for;
    `state_dir`: where Ray or submitit keep their own state (default: beside the run folders)."""
    from tqdm import tqdm

    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend}: choose from {', '.join(BACKENDS)}")
    if workers is None and backend in ("local", "processes"):
        workers = 1
    if workers is not None and workers < 1:
        raise ValueError(f"--jobs {workers}: must be at least 1")
    check_backend(backend, (slurm or SlurmOptions()).executor)
    if state_dir is None and jobs:
        state_dir = Path(os.path.commonpath([j.run_dir.resolve() for j in jobs])).parent / backend
    with tqdm(total=len(jobs), desc=desc, unit="run", disable=not progress, file=sys.stderr) as bar:
        if backend == "local":
            return _run_local(jobs, bar)
        if backend == "processes":
            return _run_processes(jobs, workers, bar)
        outcome = Outcome()
        if backend == "ray":
            from agents.runs import ray_backend

            ray_backend.run(jobs, workers, bar, ray_address, state_dir, outcome, Failure)
        else:
            from agents.runs import slurm_backend

            slurm_backend.run(jobs, workers, bar, slurm or SlurmOptions(), state_dir, outcome, Failure)
        return outcome


def waves(jobs: list[Job]) -> list[list[Job]]:
    """The jobs in waves: a job's wave comes after those of the planned jobs it needs (unplanned needs count as met)."""
    planned = {j.run_dir: j for j in jobs}
    depth: dict[Path, int] = {}

    def wave(job: Job) -> int:
        if job.run_dir not in depth:
            depth[job.run_dir] = 1 + max((wave(planned[n]) for n in job.needs if n in planned), default=-1)
        return depth[job.run_dir]

    out: list[list[Job]] = []
    for job in jobs:
        k = wave(job)
        out += [[] for _ in range(k + 1 - len(out))]
        out[k].append(job)
    return out



def wave_todo(wave: list[Job], outcome: Outcome, bar) -> list[Job]:
    """The jobs of a wave a scheduler still has to run: a job whose needed job failed is failed in `outcome` ("not
    run"), a finished one is read back; each of those moves the bar."""
    failed = {f.run_dir for f in outcome.failed}
    todo = []
    for job in wave:
        need = next((n for n in job.needs if n in failed), None)
        if need is not None:
            outcome.failed.append(Failure(job.run_dir, f"not run: it needs {need}, which failed"))
            bar.update()
        elif job.finished():
            bar.update()
        else:
            todo.append(job)
    return todo

class _Queue:
    """The jobs left, in order, with what each needs: ready, waiting for a needed job, or blocked by a failed one."""

    def __init__(self, jobs: list[Job], outcome: Outcome):
        self.left = deque(jobs)
        self.planned = {j.run_dir for j in jobs}
        self.done: set[Path] = set()
        self.outcome = outcome
        self.locked_at: dict[Path, float] = {}

    def failed_need(self, job: Job) -> Path | None:
        failed = {f.run_dir for f in self.outcome.failed}
        return next((n for n in job.needs if n in failed), None)

    def waits(self, job: Job) -> bool:
        """Needs a planned job not done yet, or was found locked less than LOCKED_WAIT_S ago."""
        if any(n in self.planned and n not in self.done for n in job.needs):
            return True
        return time.monotonic() - self.locked_at.get(job.run_dir, -LOCKED_WAIT_S) < LOCKED_WAIT_S

    def next_ready(self, bar) -> Job | None:
        """The first job that can start now (jobs found finished, or blocked by a failed need, are settled on the
        way); None when none can."""
        for _ in range(len(self.left)):
            job = self.left.popleft()
            need = self.failed_need(job)
            if need is not None:
                self.outcome.failed.append(Failure(job.run_dir, f"not run: it needs {need}, which failed"))
                bar.update()
            elif self.waits(job):
                self.left.append(job)
            elif job.finished():
                self.done.add(job.run_dir)
                bar.update()
            else:
                return job
        return None

    def finish(self, job: Job, made: bool, bar) -> None:
        self.done.add(job.run_dir)
        if made:
            self.outcome.ran.append(job)
        bar.update()

    def locked(self, job: Job) -> None:
        self.locked_at[job.run_dir] = time.monotonic()
        self.left.append(job)


def _run_local(jobs: list[Job], bar) -> Outcome:
    from agents.runs.lock import RunLocked

    outcome = Outcome()
    queue = _Queue(jobs, outcome)
    while queue.left:
        job = queue.next_ready(bar)
        if job is None:  # only jobs another process holds (or that wait for one) are left
            time.sleep(1.0)
            continue
        bar.set_postfix_str(job.name)
        try:
            _, made = job_runs.run_job(job)
        except RunLocked:
            queue.locked(job)
            continue
        except Exception as e:  # noqa: BLE001 - one run's failure is reported, the others go on
            traceback.print_exc(file=sys.stderr)
            outcome.failed.append(Failure(job.run_dir, f"failed ({type(e).__name__}: {e}); its traceback is above"))
            bar.update()
            continue
        queue.finish(job, made, bar)
    return outcome


def job_command(job: Job) -> list[str]:
    """The command that runs `job` in a process of its own."""
    return [sys.executable, "-m", "agents.runs.jobs", str(job.run_dir)]


def _run_processes(jobs: list[Job], workers: int, bar) -> Outcome:
    outcome = Outcome()
    queue = _Queue(jobs, outcome)
    slots = gpu_slots(workers)
    free = list(range(workers))
    running: dict[int, tuple[subprocess.Popen, Job, object]] = {}  # slot -> (process, job, its log file)
    try:
        while queue.left or running:
            while free and queue.left:
                job = queue.next_ready(bar)
                if job is None:
                    break
                slot = free.pop(0)
                env = dict(os.environ)
                if slots[slot] is not None:
                    env["CUDA_VISIBLE_DEVICES"] = slots[slot]
                job_runs.write_job(job)  # as planned now: the process reads the job from its folder
                log = open(job.run_dir / LOG_FILE, "a")
                log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(job_command(job))}"
                          f"{f' (CUDA_VISIBLE_DEVICES={slots[slot]})' if slots[slot] is not None else ''}\n")
                log.flush()
                # a session of its own: Ctrl-C reaches this process only, which asks each job to stop once
                process = subprocess.Popen(job_command(job), stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True)
                running[slot] = (process, job, log)
                bar.set_postfix_str(job.name)
            ended = [slot for slot, (p, _, _) in running.items() if p.poll() is not None]
            for slot in ended:
                process, job, log = running.pop(slot)
                log.close()
                free.append(slot)
                if process.returncode == 0:
                    queue.finish(job, True, bar)
                elif process.returncode == EXIT_LOCKED:
                    queue.locked(job)
                else:
                    outcome.failed.append(Failure(job.run_dir, f"failed (exit {process.returncode}); its log: "
                                                               f"{job.run_dir / LOG_FILE}"))
                    bar.update()
            if not ended:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        for process, _, _ in running.values():
            process.send_signal(signal.SIGINT)  # once: the run saves a checkpoint and stops
        for process, _, log in running.values():
            process.wait()
            log.close()
        raise
    return outcome
