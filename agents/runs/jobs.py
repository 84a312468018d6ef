"""A job: one run folder of a walk-forward (or any set of runs), and everything needed to train and score it, written
into the folder when the runs are planned (RUN_DIR/job.yaml: the run's whole config and the module that scores it),
so that any process on any host that sees the folder can run it. Running a job is idempotent: a folder whose scores
are saved (and current) is left alone, a run stopped mid-way resumes from its latest checkpoint, a finished training
is only scored. agents/runs/backends.py runs a list of jobs, one after another or several processes at once.

    python -m agents.runs.jobs results/wf/runs/fold0/rl_only-s0     # trains (or resumes) and scores that one run

A scorer is a module with SCORE_FILE (the scores' file name in the run folder), score_run(run_dir, **options) -> the
scores, and scored_as_asked(scores, **options) -> whether saved scores stand (experiments.walkforward and
experiments.fusion are two).
Imports neither JAX nor the config at the top: the entry point first leaves GPU memory to the advisor.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.config import TrainConfig

JOB_FILE = "job.yaml"  # RUN_DIR/job.yaml: what the job trains and how it is scored
LOG_FILE = "job.log"  # RUN_DIR/job.log: a job run in a process of its own writes its output here
EXIT_LOCKED = 75  # the entry point's exit status when another live process holds the run folder (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Job:
    run_dir: Path
    config: TrainConfig  # the run's whole config: its config.yaml once it trains
    scorer: str  # the module that scores the finished run (experiments.walkforward)
    options: dict[str, Any] = field(default_factory=dict)  # the scorer's keyword arguments
    needs: tuple[Path, ...] = ()  # run folders whose jobs must be finished first (a warm start's previous fold)
    label: str = ""  # how the progress bar names it

    @property
    def name(self) -> str:
        return self.label or str(self.run_dir)

    def scoring(self) -> ModuleType:
        return importlib.import_module(self.scorer)

    def saved_scores(self) -> dict[str, Any] | None:
        """The run's saved scores when they stand (its scorer's file, as this job asks them), else None."""
        scoring = self.scoring()
        path = self.run_dir / scoring.SCORE_FILE
        if not path.exists():
            return None
        try:
            scores = json.loads(path.read_text())
        except ValueError:  # scores are written whole (a temporary file, renamed): not ours to read
            return None
        return scores if scoring.scored_as_asked(scores, **self.options) else None

    def finished(self) -> bool:
        return self.saved_scores() is not None


def write_job(job: Job) -> Path:
    """Writes the job's file into its run folder (made if missing), whole or not at all; returns its path."""
    import yaml

    from agents.config import to_dict

    job.run_dir.mkdir(parents=True, exist_ok=True)
    path = job.run_dir / JOB_FILE
    text = yaml.safe_dump({"scorer": job.scorer, "options": job.options, "needs": [str(p) for p in job.needs],
                           "label": job.label, "config": to_dict(job.config)}, sort_keys=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def read_job(run_dir: str | Path) -> Job:
    """The job a run folder's job file describes; a ValueError (ConfigError) names the folder and what is wrong."""
    import yaml

    from agents.config import TrainConfig, from_dict, validate

    run_dir = Path(run_dir)
    path = run_dir / JOB_FILE
    if not path.exists():
        raise ValueError(f"{path} not found: {run_dir} was not planned as a job (walkforward.py and experiment.py "
                         "write one per run)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: cannot parse the YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict) or not {"scorer", "config"} <= set(raw):
        raise ValueError(f"{path}: expected a mapping with scorer and config")
    return Job(run_dir, validate(from_dict(TrainConfig, raw["config"])), raw["scorer"], raw.get("options") or {},
               tuple(Path(p) for p in raw.get("needs") or ()), raw.get("label") or "")


def unfinished(run_dir: Path) -> bool:
    """A run folder whose training has not reached its last update."""
    from agents.config import RUN_CONFIG_FILE, load_config

    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    if not lines:
        return True
    cfg = load_config(run_dir / RUN_CONFIG_FILE)
    return json.loads(lines[-1])["update"] < cfg.num_updates


def run_job(job: Job) -> tuple[dict[str, Any], bool]:
    """(the run's scores, whether this call made them): read back when saved and current; else trained (from scratch,
    or resumed from its latest checkpoint when it stopped mid-way; not at all when its training is finished) and
    scored, with the time each took, the scores written whole. KeyboardInterrupt when the training was interrupted;
    agents.runs.lock.RunLocked when another live process holds the folder."""
    from agents.config import RUN_CONFIG_FILE
    from agents.training.loop import train

    saved = job.saved_scores()
    if saved is not None:
        return saved, False
    run_dir = job.run_dir
    t0 = time.perf_counter()
    if not (run_dir / "checkpoints").exists() or unfinished(run_dir):
        resume = (run_dir / RUN_CONFIG_FILE).exists()
        result = train(None if resume else job.config, run_dir, resume=resume)
        if result.interrupted:
            raise KeyboardInterrupt(f"{run_dir}: training was interrupted; the same command resumes it")
    t1 = time.perf_counter()
    scores = job.scoring().score_run(run_dir, **job.options)
    scores.update(train_s=t1 - t0, score_s=time.perf_counter() - t1)
    path = run_dir / job.scoring().SCORE_FILE
    tmp = path.with_name(path.name + ".tmp")  # a scoring cut short leaves no half file under the name
    tmp.write_text(json.dumps(scores, indent=1))
    tmp.replace(path)
    return scores, True


def main(argv: list[str] | None = None) -> int:
    """Runs the job of one run folder in this process: 0 done (or already done), 2 no job there, 75 the folder is held
    by another process, 130 interrupted; a failure prints its traceback and exits 1."""
    from agents.devices.gpus import leave_gpu_memory_to_advisor

    leave_gpu_memory_to_advisor()  # before anything imports JAX: the advisor shares the GPUs

    from agents.command_line import CommandParser, print_error
    from agents.runs.lock import RunLocked

    ap = CommandParser(prog="python -m agents.runs.jobs", description=__doc__)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a run folder holding a job.yaml (walkforward.py and "
                    "experiment.py plan them)")
    args = ap.parse_args(argv)
    try:
        job = read_job(args.run_dir)
    except ValueError as e:
        print_error(e)
        return 2
    print(f"job {job.name}: {job.run_dir}", file=sys.stderr, flush=True)
    try:
        _, made = run_job(job)
    except RunLocked as e:
        print_error(e)
        return EXIT_LOCKED
    except KeyboardInterrupt as e:
        print(f"stopped: {e or 'interrupted; the same command resumes'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"job {job.name}: {'scored' if made else 'already scored'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
