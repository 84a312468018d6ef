"""The risk veto's settings tried on trained agents: each run's latest checkpoint walks a path of its synthetic preset
with the fused agent under several veto variants, and the table gives, per variant, the mean over seeds of P&L,
breaches and max drawdown, and each one's paired difference from the veto off [bootstrap 95% interval over seeds].

The default path is a tuning path, drawn apart from the one `scripts/experiment.py --fresh-days N` scores on (seed
offset 2000 against 1000): settings chosen here are then measured there, on bars they were not chosen on.

    python experiments/veto_variants.py --runs results/experiment-record-bound/runs \\
        --arm news_pass --seeds 0-4 --variant off --variant on \\
        --variant 'rules_only:advised_only_below=0' --account-days 10 --json PATH

A variant is `off` (no veto), `on` (the run's veto settings as the code reads them now) or `NAME:KEY=VALUE,...`:
the veto on, with those `hybrid.veto` keys changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from experiments.fusion import FRESH_SEED_OFFSET, bootstrap, fresh_market, parse_seeds

TUNING_OFFSET = 2 * FRESH_SEED_OFFSET  # the tuning path's data seed offset: not the experiment's fresh path
METRICS = ("net_pnl", "breaches", "max_drawdown", "trades", "veto_rate")
# --account-days: the share of fresh accounts (one started at each block of that many days) that breached, and that
# reached the profit target before any breach (a prop evaluation passed). One walk's breach count moves a lot with
# one changed trade, since a breach starts a fresh account with all its risk ahead: many short accounts weigh more.
ACCOUNT_METRICS = ("accounts_breached", "accounts_passed")
PAIRED = ("net_pnl", "breaches", "max_drawdown", *ACCOUNT_METRICS)


def parse_variant(text: str) -> tuple[str, dict | None]:
    """`off` -> ("off", None); `on` -> ("on", {}); `NAME:KEY=VALUE,...` -> (NAME, {KEY: VALUE}) with values read as
    the config reads them (numbers, or text such as `auto`). Raises ValueError naming what is wrong."""
    from agents.config import VetoConfig

    if text in ("off", "on"):
        return text, (None if text == "off" else {})
    name, sep, pairs = text.partition(":")
    if not sep or not name or not pairs:
        raise ValueError(f"--variant {text!r}: use off, on or NAME:KEY=VALUE[,KEY=VALUE]")
    defaults = {f.name: f.default for f in dataclasses.fields(VetoConfig) if f.name != "enabled"}
    changes = {}
    for pair in pairs.split(","):
        key, eq, value = pair.partition("=")
        if not eq or key not in defaults:
            raise ValueError(f"--variant {text!r}: {key!r} is not a hybrid.veto key ({', '.join(sorted(defaults))})")
        try:  # counts stay integers (the veto's bar arithmetic is int32); a count that may be `auto` is kept as text
            number = float(value)
            changes[key] = (str(int(number)) if key == "consecutive_losses"
                            else int(number) if isinstance(defaults[key], int) else number)
        except ValueError:
            if value != "auto":
                raise ValueError(f"--variant {text!r}: {key}={value!r} is not a number or auto") from None
            changes[key] = value
    return name, changes


def account_windows(day: np.ndarray, first_bar: int, account_days: int) -> list[tuple[int, int]]:
    """[start, end) bars of consecutive blocks of `account_days` trading days (`day` per bar), from `first_bar` on; a
    last block shorter than that is left out."""
    days, starts = np.unique(day[first_bar:], return_index=True)
    starts = starts + first_bar
    bounds = [*starts[::account_days], len(day)]
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])][: len(days) // account_days]


def walk_variants(run_dir: Path, variants: dict[str, dict | None], days: int, offset: int,
                  account_days: int = 0) -> dict[str, dict]:
    """The fused agent of the run's latest checkpoint, walked over `days` days of its preset's path `offset`, once
    per variant: {variant: walk figures}; with `account_days`, also as fresh accounts of that many days each."""
    import jax

    from agents.advice.usage import walk_advice_metrics
    from agents.evaluation.saved_run import advised_walk, load_run, walk_bounds
    from agents.runs.saved_runs import load_run_config
    from jaxenv.metrics import walk_metrics

    cfg = load_run_config(run_dir)
    run = load_run(run_dir, "latest", data=fresh_market(cfg.data, days, offset))
    if not run.advised:
        run.close()
        raise ValueError(f"{run_dir}: a run without an advisor has no veto to vary")
    bounds = walk_bounds(run.market, "all")

    def figures(trace):
        return walk_metrics(trace, run.market.timestamps, run.cfg.env.prop_firm, run.market.sessions.day)

    out = {}
    try:
        for name, changes in variants.items():
            veto = False if changes is None else dataclasses.replace(cfg.hybrid.veto, enabled=True, **changes)
            walk = advised_walk(run, veto=veto)
            trace = walk(bounds, jax.random.PRNGKey(0))
            m = {**figures(trace), **walk_advice_metrics(trace)}
            out[name] = {k: float(m[k]) for k in METRICS}
            if account_days:
                accounts = [figures(walk(w, jax.random.PRNGKey(0)))
                            for w in account_windows(run.market.sessions.day, bounds[0], account_days)]
                out[name]["accounts"] = len(accounts)
                out[name]["accounts_breached"] = float(np.mean([a["breaches"] > 0 for a in accounts]))
                out[name]["accounts_passed"] = float(np.mean([a["prop_passed"] for a in accounts]))
    finally:
        run.close()
    return out


def summary_table(rows: dict[str, dict[str, dict]]) -> tuple[dict, str]:
    """rows {seed: {variant: figures}} -> ({variant: {metric: mean, paired_metric: bootstrap}}, markdown)."""
    seeds = list(rows)
    variants = list(rows[seeds[0]])
    summary: dict[str, dict] = {}
    metrics = [k for k in (*METRICS, *ACCOUNT_METRICS) if k in rows[seeds[0]][variants[0]]]
    for v in variants:
        s = {k: float(np.mean([rows[x][v][k] for x in seeds])) for k in metrics}
        if "off" in variants and v != "off":
            for k in PAIRED:
                if k in metrics:
                    s[f"{k}_vs_off"] = bootstrap([rows[x][v][k] - rows[x]["off"][k] for x in seeds])
        summary[v] = s

    def paired(s, k, fmt):
        f = s.get(f"{k}_vs_off")
        return "" if f is None else f"{fmt(f['mean'])} [{fmt(f['ci95'][0])}, {fmt(f['ci95'][1])}]"

    money, count, share = (lambda x: f"{x:,.0f}"), (lambda x: f"{x:.1f}"), (lambda x: f"{x:.0%}")
    accounts = "accounts_breached" in metrics
    head = "| variant | P&L | − off | breaches | − off | max drawdown | − off | trades | vetoed |"
    if accounts:
        head += " accounts breached | − off | accounts passed | − off |"
    lines = [head, "|" + "---|" * head.count(" | ")]
    for v, s in summary.items():
        line = (f"| {v} | {money(s['net_pnl'])} | {paired(s, 'net_pnl', money)} | {count(s['breaches'])} | "
                f"{paired(s, 'breaches', count)} | {money(s['max_drawdown'])} | "
                f"{paired(s, 'max_drawdown', money)} | {money(s['trades'])} | {s['veto_rate']:.3f} |")
        if accounts:
            line += (f" {share(s['accounts_breached'])} | {paired(s, 'accounts_breached', share)} | "
                     f"{share(s['accounts_passed'])} | {paired(s, 'accounts_passed', share)} |")
        lines.append(line)
    return summary, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, type=Path, help="the experiment's run folder (its --runs)")
    ap.add_argument("--arm", required=True, help="the arm whose runs to walk, e.g. news_pass")
    ap.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,2")
    ap.add_argument("--variant", action="append", default=[], metavar="VARIANT",
                    help="off, on or NAME:KEY=VALUE[,KEY=VALUE] (hybrid.veto keys); repeat for each")
    ap.add_argument("--days", type=int, default=120, help="days of the path")
    ap.add_argument("--offset", type=int, default=TUNING_OFFSET,
                    help=f"the path's data seed offset (default {TUNING_OFFSET}, the tuning path; "
                         f"{FRESH_SEED_OFFSET}: the experiment's fresh path)")
    ap.add_argument("--account-days", type=int, default=0, metavar="D",
                    help="also walk fresh accounts of D trading days, one from each block of D days of the path, "
                         "for the share that breached and that passed (reached the profit target first)")
    ap.add_argument("--json", type=Path, help="write every walk's figures and the summary here, and the table beside "
                    "it (.md)")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        variants = dict(parse_variant(v) for v in (args.variant or ["off", "on"]))
        if args.days < 1:
            raise ValueError("--days: must be at least 1")
        if not 0 <= args.account_days <= args.days:
            raise ValueError(f"--account-days: must be between 0 (off) and --days ({args.days})")
        run_dirs = [args.runs / f"{args.arm}-s{seed}" for seed in seeds]
        missing = [str(d) for d in run_dirs if not (d / "config.yaml").exists()]
        if missing:
            raise ValueError(f"--runs: no run folder {missing[0]}")
        rows = {}
        for seed, run_dir in zip(seeds, run_dirs):
            rows[str(seed)] = walk_variants(run_dir, variants, args.days, args.offset, args.account_days)
            print(f"{args.arm}-s{seed}", json.dumps(rows[str(seed)]), flush=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary, table = summary_table(rows)
    print(table)
    if args.json:
        command = shlex.join(["python", "experiments/veto_variants.py", *(sys.argv[1:] if argv is None else argv)])
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")  # never half a file
        tmp.write_text(json.dumps({"command": command, "arm": args.arm, "days": args.days, "offset": args.offset,
                                   "variants": variants, "runs": rows, "summary": summary}, indent=1))
        tmp.replace(args.json)
        args.json.with_suffix(".md").write_text(f"`{command}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
