"""List the trials recorded in a folder of runs (RUNS/trials.jsonl, agents/runs/trials.py): one row per training run
(when it was recorded, its folder, the digest of its config without the seed, the seed, its data, whether it trained)
and how many trials the deflated Sharpe ratio counts on each data set: the distinct configs and seeds.

A run is recorded once its first update is done. Lines written before that rule were written as each run started, so
a run that died at start-up may be among them: the listing says which of those left no trained run folder.

    python scripts/trials.py runs                    # the ledger of the runs in runs/
    python scripts/trials.py runs/trials.jsonl
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

import argparse
import sys
from pathlib import Path

from agents.command_line import CommandParser
from agents.config import RUN_CONFIG_FILE
from agents.runs.trials import TRIALS_FILE, counted, read_trials

COLUMNS = ("recorded", "run", "config", "seed", "data", "trained")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ledger", metavar="RUNS", help=f"a folder of runs (holding {TRIALS_FILE}) or the ledger file")
    return ap.parse_args(argv)


def ledger_file(given: Path) -> Path:
    """The ledger `given` names; a ValueError says why there is none."""
    if given.is_file():
        return given
    if not given.is_dir():
        raise ValueError(f"{given}: no such folder or file")
    if (given / TRIALS_FILE).is_file():
        return given / TRIALS_FILE
    if (given / RUN_CONFIG_FILE).is_file():  # a run's folder: the ledger is its folder of runs'
        raise ValueError(f"{given} is a run; its trials are listed with its folder of runs: python scripts/trials.py "
                         f"{given.parent}")
    raise ValueError(f"{given} holds no {TRIALS_FILE}: no run has trained in it")


def row(trial: dict, runs: Path) -> list[str]:
    """The trial's row; `runs`: its folder of runs."""
    if "trained" in trial:  # recorded after its first update
        recorded, trained = trial["trained"], "yes"
    else:  # recorded as it started: it trained if its folder logged an update (one that died at start-up left none)
        metrics = runs / trial["run"] / "metrics.jsonl"
        recorded, trained = trial["started"], "yes" if metrics.is_file() and metrics.stat().st_size > 0 else "?"
    return [recorded, trial["run"], trial["config"], str(trial["seed"]), trial["data"], trained]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        path = ledger_file(Path(args.ledger))
        trials = read_trials(path)
        if not trials:
            raise ValueError(f"{path}: no training run is recorded in it")
    except (OSError, ValueError) as error:  # ValueError: also a file that is not text
        print(f"error: {error}", file=sys.stderr)
        return 2

    rows = [list(COLUMNS)] + [row(t, path.parent) for t in trials]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    print(f"{path}: {len(trials)} run{'s' if len(trials) != 1 else ''} recorded")
    for r in rows:
        print("  ".join(text.ljust(width) for text, width in zip(r, widths)).rstrip())
    if any(r[-1] == "?" for r in rows):
        print("?: recorded as it started, and its folder holds no update: it died at start-up, or its folder was "
              "deleted. Counted; if it never trained, delete its line")
    for data in dict.fromkeys(t["data"] for t in trials):  # each data set, in the order first tried
        n = len(counted(trials, data))
        print(f"{data}: the deflated Sharpe ratio counts {n} trial{'s' if n != 1 else ''} (distinct configs and seeds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
