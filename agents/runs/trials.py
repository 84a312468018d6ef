"""The trials a result was chosen among: every training run started in a folder of runs is recorded there as it
starts (RUNS/trials.jsonl: its folder, a digest of its config without the seed, the seed, its data), so that the
deflated Sharpe ratio (agents.evidence.overfitting) counts the configurations and seeds tried on the same data, not a
number typed in. A run whose folder is deleted stays counted: it was tried.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from agents.config import to_dict

TRIALS_FILE = "trials.jsonl"
NOT_A_TRIAL = ("seed", "log", "devices", "checkpoint", "transfer")  # what a run reports or resumes with, not tries


def _trial(run_dir: Path, cfg) -> dict:
    settings = to_dict(cfg)
    tried = {k: v for k, v in settings.items() if k not in NOT_A_TRIAL}
    if cfg.transfer.init_from:  # started from another run's agent: another trial than a fresh start (where that
        # run lies is not tried); a fresh run's digest stays as it was
        tried["transfer"] = {k: v for k, v in settings["transfer"].items() if k != "init_from"}
    digest = hashlib.sha256(json.dumps(tried, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"run": Path(run_dir).name, "config": digest, "seed": cfg.seed, "data": cfg.data.source}


def record_trial(run_dir: Path, cfg) -> None:
    """Adds a new run to its folder's ledger (one whole line, appended)."""
    line = {**_trial(run_dir, cfg), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = Path(run_dir).parent / TRIALS_FILE
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def count_trials(run_dir: Path, cfg) -> int:
    """Distinct (config, seed) trials on the run's data in its folder's ledger, the run's own included."""
    path = Path(run_dir).parent / TRIALS_FILE
    own = _trial(run_dir, cfg)
    seen = {(own["config"], own["seed"])}
    if path.exists():
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:  # a line cut short by a crash: not a trial
                continue
            if line.get("data") == own["data"]:
                seen.add((line.get("config"), line.get("seed")))
    return len(seen)
