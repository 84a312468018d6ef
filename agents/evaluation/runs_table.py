"""`scripts/runs.py`: training runs side by side, each as its own end says it: the best checkpoint out of sample (its
run's test split) against flat and against buy-and-hold with 95% intervals over sessions, the deflated Sharpe ratio
over the trials on its data, and what trade.py's gate would do with it (agents.evaluation.report.verdict). A
checkpoint's out-of-sample walk is made once and kept in RUN/evidence/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agents.command_line import CommandParser
from agents.config import RUN_CONFIG_FILE


def run_dirs(roots: list[Path]) -> list[Path]:
    """Every run folder (a saved config and checkpoints) at or directly under each root, in name order."""
    found = []
    for root in roots:
        candidates = [root] if (root / RUN_CONFIG_FILE).exists() else sorted(p for p in root.iterdir() if p.is_dir())
        found += [p for p in candidates if (p / RUN_CONFIG_FILE).exists() and (p / "checkpoints").is_dir()]
    return found


def run_row(run_dir: Path) -> dict:
    """One run's row: what its data, advisor and steps were, and its out-of-sample verdict."""
    from agents.evaluation.report import verdict
    from agents.evaluation.saved_run import out_of_sample
    from agents.evidence.eprocess import scale_of
    from agents.config import to_dict
    from agents.runs.saved_runs import load_run_config
    from agents.runs.trials import count_trials

    cfg = load_run_config(run_dir)
    v = verdict(out_of_sample(run_dir, "best"), count_trials(run_dir, to_dict(cfg)), scale_of(cfg.env.prop_firm),
                cfg.gate_against)
    gate = v.pop("gate")
    return {"run": str(run_dir), "data": str(cfg.data.source), "llm": cfg.llm, "steps": cfg.total_steps, **v,
            "gate": "live" if gate.live else "paper", "gate_against": gate.against, "gate_reason": gate.reason()}


def interval(x) -> str:
    return "–" if x is None else f"{x[0]:,.0f} [{x[1]:,.0f}, {x[2]:,.0f}]"


def main(argv: list[str] | None = None) -> int:
    ap = CommandParser(description=__doc__)
    ap.add_argument("folders", nargs="*", type=Path, default=[Path("runs")], metavar="FOLDER",
                    help="run folders, or folders of runs (default: runs)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        print(f"error: {', '.join(missing)}: no such folder", file=sys.stderr)
        return 2
    dirs = run_dirs(args.folders)
    if not dirs:
        print(f"error: no run folder (a {RUN_CONFIG_FILE} and checkpoints/) in {', '.join(map(str, args.folders))}",
              file=sys.stderr)
        return 2
    rows = []
    for run_dir in dirs:
        try:
            rows.append(run_row(run_dir))
        except (FileNotFoundError, ValueError) as error:  # a run without a finished checkpoint, or data gone
            print(f"{run_dir}: skipped ({str(error).splitlines()[0]})", file=sys.stderr)
    table = Table(title="out of sample: each run's best checkpoint on its test split (95% intervals over sessions)")
    for name in ("run", "data", "llm", "steps", "sessions", "P&L vs flat", "buy-and-hold", "vs buy-and-hold", "DSR",
                 "trials", "gate"):
        table.add_column(name, justify="left" if name in ("run", "data", "llm", "gate") else "right")
    for r in rows:
        table.add_row(Path(r["run"]).name, r["data"], r["llm"], f"{r['steps']:,}", str(r["sessions"]),
                      interval(r["pnl"]), "–" if r["buy_and_hold"] is None else f"{r['buy_and_hold']:,.0f}",
                      interval(r["vs_buy_and_hold"]), f"{r['dsr']:.2f}", str(r["trials"]),
                      f"{r['gate']} (vs {r['gate_against'].replace('_', '-')})")
    Console(width=None if sys.stdout.isatty() else 220).print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=float))
        print(f"wrote {args.json}")
    return 0 if rows else 2
