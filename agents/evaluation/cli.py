"""Evaluate a trained run from its checkpoint: the agent against baselines on the same bars, with reports.

    python scripts/evaluate.py --run-dir runs/x                          # best checkpoint, test split, greedy
    python scripts/evaluate.py --run-dir runs/x --checkpoint 40 --split val --json val.json
    python scripts/evaluate.py --run-dir runs/x --data bars.parquet      # every bar of another file
    python scripts/evaluate.py --run-dir runs/pair --data NQ=a.csv --data ES=b.csv   # an account: one file each
    python scripts/evaluate.py --run-dir runs/pair --advisor smollm2     # and the advice alone on each instrument
    python scripts/evaluate.py --run-dir runs/x --episodes 50 --seeds 3  # random 5-session episodes
    python scripts/evaluate.py --run-dir runs/s0 --run-dir runs/s1 --run-dir runs/s2   # training seeds pooled

Writes to --out (default RUN/eval/<checkpoint>-<split>): evaluation.json (or --json PATH), table.md, trades.csv,
equity.png, underwater.png, training.png; prints the table. A run on several instruments (train.py --data SYM=PATH
repeated) walks its account over --split (or every bar of --data SYMBOL=PATH, once per instrument) with the same
table, the gated walk, the set's buy-and-hold and each instrument's figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agents.command_line import CommandParser, data_items, is_data_path, print_error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", action="append", required=True, metavar="RUN",
                    help="run folder made by scripts/train.py; repeat to pool several runs (e.g. training seeds)")
    ap.add_argument("--checkpoint", default="best", metavar="STEP|best|latest",
                    help="which checkpoint: best (on validation; latest when there is none), latest, or an update")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--split", choices=["val", "test"], help="the run's own split to walk (default test)")
    where.add_argument("--data", action="append", metavar="PATH",
                       help="walk every bar of this CSV/Parquet file (or synthetic:PRESET) instead of the run's data; "
                       "a run on several instruments takes SYMBOL=PATH once per instrument")
    ap.add_argument("--episodes", type=int, default=0, metavar="N",
                    help="N random episodes (env.max_steps_in_episode bars each) instead of one walk of everything")
    ap.add_argument("--sample", action="store_true", help="sample actions instead of taking the most probable")
    ap.add_argument("--seeds", type=int, default=1, metavar="N",
                    help="evaluation seeds; with more than one walk the table shows mean ± 95%% interval")
    ap.add_argument("--json", metavar="PATH", help="write every figure here (default OUT/evaluation.json)")
    ap.add_argument("--out", metavar="DIR", help="folder for the table, trades.csv and plots "
                    "(default RUN/eval/<checkpoint>-<split>)")
    ap.add_argument("--advisor", metavar="LLM", help="a run on several instruments (trained without advice): walk "
                    "this advisor's advice alone on every instrument too, under the account's rules, as the ablation "
                    "llm_only (mock, smollm2 or a model path; the run's hybrid section configures it)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.episodes < 0:
        ap.error("--seeds must be >= 1 and --episodes >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from rich.console import Console

    from agents.config import ConfigError
    from agents.devices.parallel import print_banner
    from agents.evaluation.report import (
        gate_lines,
        markdown_table,
        plot_equity,
        plot_training,
        plot_underwater,
        rich_table,
        write_json,
        write_trades,
    )
    from agents.evaluation.saved_run import EvalOptions, evaluate, load_run
    from agents.runs.saved_runs import CheckpointMismatch
    from jaxenv import DataValidationError
    from jaxenv.load_report import dropped_text

    from agents.evaluation.account_run import is_account_run

    try:
        if any(is_account_run(run_dir) for run_dir in args.run_dir):  # several instruments in one account
            return account_main(args)
    except (ConfigError, FileNotFoundError) as e:
        print_error(e)
        return 2
    split = args.split or ("all" if args.data else "test")
    options = EvalOptions(split=split, episodes=args.episodes, seeds=args.seeds, progress=not args.no_progress)
    try:
        if args.advisor:
            raise ValueError("--advisor: a run on one instrument walks its own advisor's ablations; --advisor is for a "
                             "run on several instruments")
        data = single_data(args.data)
        runs = [load_run(run_dir, args.checkpoint, data, args.sample) for run_dir in args.run_dir]
        for run in runs:  # what train.py's load report says of dropped rows, on one line
            if run.market.dropped_rows:
                print(f"warning: {run.market.source}: dropped {dropped_text(run.market)}", file=sys.stderr)
        print_banner(None, runs[0].cfg.llm)  # walks are one env each: they run on the first device
        result = evaluate(runs, options)
    except (ConfigError, DataValidationError, FileNotFoundError, CheckpointMismatch, ValueError) as e:
        print_error(e)
        return 2

    first = runs[0]
    label = f"{first.saved.label}-{split}" + (f"-{args.episodes}ep" if args.episodes else "")
    out = Path(args.out) if args.out else first.saved.run_dir / "eval" / label
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    json_path = Path(args.json) if args.json else out / "evaluation.json"
    write_json(summary, json_path)
    (out / "table.md").write_text(markdown_table(summary))
    console = Console(width=None if sys.stdout.isatty() else 200)  # piped: no wrapping
    console.print(rich_table(summary))
    for line in gate_lines(summary):
        console.print(line)

    timestamps = first.market.timestamps
    agent = result.first_traces["agent"]
    trades = write_trades(agent, timestamps, first.cfg.env.contracts_per_trade, first.market.contract,
                          out / "trades.csv")
    first_walk = "" if len(result.bars) == 1 and args.seeds == 1 else " (first walk)"
    plot_equity(agent, timestamps, out / "equity.png",
                f"{first.saved.run_dir.name} {first.saved.label} on {split}{first_walk}: {len(trades)} trades")
    plot_underwater({name: result.first_traces[name] for name in ("agent", "buy_and_hold")}, timestamps,
                    out / "underwater.png", f"drawdown from the running peak of cumulative P&L{first_walk}")
    written = ["table.md", "trades.csv", "equity.png", "underwater.png"]
    run_name = first.saved.run_dir.name
    if plot_training(first.saved.run_dir / "metrics.jsonl", out / "training.png", f"training: {run_name}"):
        written.append("training.png")
    print(f"wrote {json_path} and {out}/: {', '.join(written)}")
    return 0



def single_data(items: list[str] | None) -> str | None:
    """--data for a run on one instrument: its one file (the last given where several are), or None; SYMBOL=PATH is
    an account's and a ValueError, one line."""
    single, account = data_items(items)
    if account:
        raise ValueError(f"--data: {account[0]} is SYMBOL=PATH, one instrument of an account, but the run trades one "
                         "instrument: give one PATH")
    return single


def account_main(args: argparse.Namespace) -> int:
    """evaluate.py on a run trained on several instruments in one account (agents.evaluation.account_run): the table
    of the account's walk against its baselines, its P&L against the set's buy-and-hold, each instrument's P&L and
    trades, and one note on what is not walked for an account; the same files as for one instrument."""
    from rich.console import Console

    from agents.config import ConfigError
    from agents.devices.parallel import print_banner
    from agents.evaluation.account_run import (
        account_trades,
        account_views,
        evaluate_account_run,
        is_account_run,
        load_account_run,
    )
    from agents.evaluation.report import (
        account_lines,
        gate_lines,
        markdown_table,
        plot_equity,
        plot_training,
        plot_underwater,
        rich_table,
        write_json,
    )
    from agents.runs.saved_runs import CheckpointMismatch, load_run_config, refuse_instrument_set
    from bridge import SidecarError
    from jaxenv import DataValidationError

    run_dir = next(run_dir for run_dir in args.run_dir if is_account_run(run_dir))
    split = args.split or ("all" if args.data else "test")
    try:
        cfg = load_run_config(run_dir)
        bare = any(map(is_data_path, args.data or []))
        for given, why in ((len(args.run_dir) > 1, "pooling it with other runs is not built yet: evaluate it alone"),
                           (bare, "give --data SYMBOL=PATH once per instrument, in the run's order"),
                           (args.episodes, "random episodes of an account are not built yet: drop --episodes")):
            if given:
                refuse_instrument_set(cfg, run_dir, why)
        run = load_account_run(run_dir, args.checkpoint, args.sample, args.data)
        print_banner(None, run.cfg.llm)
        summary, trace = evaluate_account_run(run, split, args.seeds, args.advisor, not args.no_progress)
    except (ConfigError, DataValidationError, FileNotFoundError, CheckpointMismatch, ValueError, SidecarError) as e:
        print_error(e)
        return 2

    out = Path(args.out) if args.out else run.saved.run_dir / "eval" / f"{run.saved.label}-{split}"
    out.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.json) if args.json else out / "evaluation.json"
    write_json(summary, json_path)
    names = " + ".join(summary["instruments"])
    lines = [*account_lines(summary["account"], f"{split} ({names}, {run.saved.label})"),
             f"note: not walked for an account yet: {summary['not_walked']}; PSR and DSR are of the account's P&L per "
             "session"]
    (out / "table.md").write_text(markdown_table(summary) + "\n".join(lines) + "\n")  # the table's gate lines in it
    console = Console(width=None if sys.stdout.isatty() else 200)  # piped: no wrapping
    console.print(rich_table(summary))
    for line in [*gate_lines(summary), *lines]:
        console.print(line, highlight=False)

    timestamps = run.setup.market_set.timestamps
    trades = account_trades(run, trace)
    trades.to_csv(out / "trades.csv", index=False, float_format="%.2f")
    account, held = account_views(run, trace)
    first_walk = " (first walk)" if args.seeds > 1 and run.sampled else ""
    plot_equity(account, timestamps, out / "equity.png",
                f"{run.saved.run_dir.name} {run.saved.label} on {split}, account of {names}{first_walk}: "
                f"{len(trades)} trades")
    plot_underwater({"agent": account, "buy_and_hold": held}, timestamps, out / "underwater.png",
                    f"drawdown from the running peak of cumulative P&L{first_walk}")
    written = ["table.md", "trades.csv", "equity.png", "underwater.png"]
    if plot_training(run.saved.run_dir / "metrics.jsonl", out / "training.png", f"training: {run.saved.run_dir.name}"):
        written.append("training.png")
    print(f"wrote {json_path} and {out}/: {', '.join(written)}")
    return 0
