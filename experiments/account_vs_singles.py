"""Does one account agent on two instruments beat two agents trained on one instrument each (issue 77)? Reads three
finished walk-forwards of the same sessions (scripts/walkforward.py: the account on both files, then each instrument
alone) and compares their stitched out-of-sample paths seed by seed: the account's P&L per session against the sum of
the two single agents' (each on its own instrument, as two separate accounts), with a 95% interval over seeds and
blocks of sessions (experiments.fusion.seeds_and_days_interval), and each instrument's share.

    python -m experiments.account_vs_singles --account results/walk-forward/pair_signal-account \
        --singles results/walk-forward/pair_signal-NQ results/walk-forward/pair_signal-ES \
        --out docs/results/walk-forward/pair_signal-compare

Writes compare.json and compare.md to --out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from agents.command_line import CommandParser, print_error
from experiments.fusion import seeds_and_days_interval

ARM = "rl_only"  # the arm compared: the RL account against the RL single agents


def stitched_sessions(summary: dict) -> dict[int, dict[str, float]]:
    """Each seed's out-of-sample P&L per session, the folds' test windows back to back (walkforward.json's runs)."""
    out: dict[int, dict[str, float]] = {}
    for fold in sorted(summary["runs"], key=lambda name: int(name.removeprefix("fold"))):
        for seed, scores in summary["runs"][fold][ARM].items():
            out.setdefault(int(seed), {}).update(scores["test"]["sessions"])
    return out


def matrix(paths: dict[int, dict[str, float]], seeds: list[int], days: list[str]) -> np.ndarray:
    return np.array([[paths[s].get(d, 0.0) for d in days] for s in seeds], np.float64)


def compare(account: dict, singles: list[dict]) -> dict:
    """The account's stitched path against the singles' summed, per seed and pooled (the module's docstring)."""
    paths = stitched_sessions(account)
    single_paths = [stitched_sessions(s) for s in singles]
    seeds = sorted(set(paths).intersection(*single_paths))
    days = sorted(paths[seeds[0]])
    for other in single_paths:
        if sorted(other[seeds[0]]) != days:
            raise ValueError("the walk-forwards' out-of-sample sessions differ: were they run with the same folds on "
                             "the same sessions?")
    acc = matrix(paths, seeds, days)
    each = [matrix(p, seeds, days) for p in single_paths]
    both = sum(each)

    def interval(m: np.ndarray) -> dict:
        return {"mean": float(m.sum(1).mean()), "ci95": seeds_and_days_interval([m])}

    return {"seeds": seeds, "sessions": len(days), "first_day": days[0], "last_day": days[-1],
            "account": interval(acc), "singles_summed": interval(both),
            "singles": [interval(m) for m in each], "account_minus_singles": interval(acc - both),
            "account_instruments": account["summary"]["arms"][ARM].get("instruments", {}),
            "gate_opened": {"account": account["summary"]["arms"][ARM]["gate_opened"],
                            "singles": [s["summary"]["arms"][ARM]["gate_opened"] for s in singles]}}


def table(result: dict, names: list[str], command: str) -> str:
    def cell(f: dict) -> str:
        lo, hi = f["ci95"]
        return f"{f['mean']:,.0f} [{lo:,.0f}, {hi:,.0f}]"

    g = result["gate_opened"]
    rows = [("the account on both", result["account"], g["account"]),
            *((f"{name} alone", f, o) for name, f, o in zip(names, result["singles"], g["singles"])),
            ("the two single agents summed", result["singles_summed"], None),
            ("the account minus the singles summed", result["account_minus_singles"], None)]
    lines = [f"`{command}`", "",
             f"{result['sessions']} out-of-sample sessions ({result['first_day']} to {result['last_day']}), seeds "
             f"{result['seeds']}; P&L summed over the stitched test windows, mean over seeds [95% interval over seeds "
             "and blocks of sessions].", "",
             "| agent | out-of-sample P&L | gate opened (share of seeds) |", "|---|---|---|"]
    lines += [f"| {name} | {cell(f)} | {'–' if opened is None else f'{opened:.0%}'} |" for name, f, opened in rows]
    if result["account_instruments"]:
        lines += ["", "The account's instruments (mean over seeds): " + "; ".join(
            f"{s} {f['net_pnl']:,.0f} in {f['trades']:,.0f} trades" for s, f in result["account_instruments"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = CommandParser(description=__doc__)
    ap.add_argument("--account", required=True, help="the account's walk-forward folder (its walkforward.json)")
    ap.add_argument("--singles", nargs="+", required=True, help="each single instrument's walk-forward folder")
    ap.add_argument("--out", required=True, help="where compare.json and compare.md go")
    args = ap.parse_args(argv)
    try:
        folders = [Path(args.account), *map(Path, args.singles)]
        for folder in folders:
            if not (folder / "walkforward.json").is_file():
                raise FileNotFoundError(f"{folder}: no walkforward.json (run scripts/walkforward.py to its end first)")
        account, *singles = (json.loads((f / "walkforward.json").read_text()) for f in folders)
        result = compare(account, singles)
    except (FileNotFoundError, ValueError) as e:
        print_error(e)
        return 2
    names = [Path(s).name for s in args.singles]
    command = "python -m experiments.account_vs_singles " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    (out / "compare.md").write_text(table(result, names, command))
    print((out / "compare.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
