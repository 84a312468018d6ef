"""The trials a result was chosen among: every training run in a folder of runs is recorded there once its first
update is done (RUNS/trials.jsonl: its folder, a digest of its config without the seed, the seed, its data), so that
the deflated Sharpe ratio (agents.evidence.overfitting) counts the configurations and seeds trained on the same data,
not a number typed in. A run that died before its first update (an advisor that did not start) tried nothing and is
not recorded; a run that trained and was then stopped, or whose folder is deleted, stays counted: it was tried.
`scripts/trials.py` lists a ledger.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from agents.config import ACCOUNT_LIMITS

TRIALS_FILE = "trials.jsonl"
# what a run reports, resumes or is judged with, not what it tries
NOT_A_TRIAL = ("seed", "log", "devices", "checkpoint", "transfer", "gate_against")


def _trial(run_dir: Path, settings: dict) -> dict:
    """The run's line of the ledger, from its whole config as data (`settings`: agents.config.to_dict's)."""
    tried = {k: v for k, v in settings.items() if k not in NOT_A_TRIAL}
    data = settings["data"]
    if not data.get("instruments"):  # one instrument: its digest as before data.instruments existed
        tried["data"] = {k: v for k, v in data.items() if k != "instruments"}
    tried["env"] = {**tried["env"], "prop_firm": _rules_as_before(tried["env"]["prop_firm"])}
    # started from another run's agent: another trial than a fresh start (where that run lies is not tried); a fresh
    # run's digest stays as it was
    if settings["transfer"]["init_from"]:
        tried["transfer"] = {k: v for k, v in settings["transfer"].items() if k != "init_from"}
    digest = hashlib.sha256(json.dumps(tried, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"run": Path(run_dir).name, "config": digest, "seed": settings["seed"], "data": trial_data(data)}


def _rules_as_before(rules):
    """The prop-firm rules as a digest saw them before the account limits joined them: the half-size rule and the
    correlated pairs left out while unset, a whole max_contracts as an integer (a run's digest does not change)."""
    if not isinstance(rules, dict):
        return rules
    rules = {k: v for k, v in rules.items() if not (k in ACCOUNT_LIMITS and not v)}
    if isinstance(rules.get("max_contracts"), float) and rules["max_contracts"].is_integer():
        rules["max_contracts"] = int(rules["max_contracts"])
    return rules


def trial_data(data: dict) -> str:
    """What a run trained on, as its ledger line names it: data.source, or a set's SYMBOL=PATH items joined by
    commas (`data`: the config's data section as data)."""
    items = data.get("instruments") or []
    if not items:
        return data["source"]
    named = []
    for item in items:
        if isinstance(item, str):
            named.append(item)
        else:
            contract = item["contract"]
            named.append(f"{contract['symbol'] if isinstance(contract, dict) else contract}={item['source']}")
    return ",".join(named)


def record_trial(run_dir: Path, settings: dict) -> None:
    """Adds a run that trained (its first update is done) to its folder's ledger (one whole line, appended), from its
    whole config as data (`settings`: agents.config.to_dict's). Lines written before runs were recorded this way say
    when their run `started` instead: some may never have trained."""
    line = {**_trial(run_dir, settings), "trained": time.strftime("%Y-%m-%d %H:%M:%S")}
    path = Path(run_dir).parent / TRIALS_FILE
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def read_trials(path: Path) -> list[dict]:
    """A ledger's trials, oldest first."""
    trials = []
    for text in Path(path).read_text().splitlines():
        try:
            line = json.loads(text)
        except ValueError:  # a line cut short by a crash: not a trial
            continue
        if isinstance(line, dict) and "run" in line:  # a walk-forward's own ledger names no run: not a run's trial
            trials.append(line)
    return trials


def counted(trials: list[dict], data: str) -> set[tuple[str, int]]:
    """The trials on `data` the deflated Sharpe ratio counts: distinct (config, seed)."""
    return {(t.get("config"), t.get("seed")) for t in trials if t.get("data") == data}


def count_trials(run_dir: Path, settings: dict) -> int:
    """Distinct (config, seed) trials on the run's data in its folder's ledger, the run's own included (`settings`:
    the run's whole config as data, agents.config.to_dict's)."""
    path = Path(run_dir).parent / TRIALS_FILE
    own = _trial(run_dir, settings)
    trials = read_trials(path) if path.exists() else []
    return len(counted(trials, own["data"]) | {(own["config"], own["seed"])})
