"""Where in the session an agent earns: P&L and entries in the first and second half of each session, on a fresh
path of the runs' synthetic preset (the path `scripts/experiment.py --fresh-days N` scores them on).

On `synthetic:headlines_then_trend` the news drifts only in the first half and the trends only in the second, so
this says which edge each part trades, and how much of each the fused agent keeps (docs/advisor.md). A step of the
walk (its P&L, from one bar's close to the next, and its entry) belongs to the half of the bar it was decided at.

    python experiments/session_halves.py --runs results/experiment-fusion-headlines-then-trend/runs \
        --arms rl_only,news_pass,news_pass_switch --seeds 0-4 --fresh-days 120 --json PATH
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from experiments.fusion import parse_arms, parse_seeds

HALVES = ("first", "second")


def bar_halves(market) -> np.ndarray:
    """[n] 0 for a bar in its session's first half, 1 in its second."""
    return (market.sessions.minutes_into_session >= market.session_minutes / 2).astype(np.int32)


def halves_of(trace: dict, halves: np.ndarray) -> dict[str, float]:
    """P&L earned on each half's bars, and entries decided in each half."""
    t = np.asarray(trace["t"])
    pnl = np.asarray(trace["pnl"], np.float64)
    entered = np.asarray(trace["entry_side"]) != 0
    half = halves[t]
    out: dict[str, float] = {}
    for i, name in enumerate(HALVES):
        out[f"pnl_{name}"] = float(pnl[half == i].sum())
        out[f"entries_{name}"] = int((entered & (half == i)).sum())
    return out


def score(run_dir: Path, fresh_days: int, with_advice_alone: bool) -> dict[str, dict]:
    import jax

    from agents.evaluation.saved_run import ablation_walks, agent_walk, load_run, walk_bounds
    from agents.runs.saved_runs import load_run_config
    from experiments.fusion import fresh_market

    cfg = load_run_config(run_dir)
    run = load_run(run_dir, "latest", data=fresh_market(cfg.data, fresh_days))
    halves = bar_halves(run.market)
    bars = walk_bounds(run.market, "all")
    try:
        out = {"agent": halves_of(agent_walk(run)(bars, jax.random.PRNGKey(0)), halves)}
        if with_advice_alone and run.advised:
            out["advice_alone"] = halves_of(ablation_walks(run)["llm_only"].walk(bars, jax.random.PRNGKey(0)), halves)
    finally:
        run.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True, type=Path, help="the experiment's run folder (its --runs)")
    ap.add_argument("--arms", required=True, help="comma-separated arms, e.g. rl_only,news_pass")
    ap.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,2")
    ap.add_argument("--fresh-days", type=int, default=120, help="days of the fresh path (as the experiment's)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    try:
        arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows: dict[str, dict] = {}
    advice_alone = None
    for arm in arms:
        for seed in seeds:
            run_dir = args.runs / f"{arm}-s{seed}"
            if not run_dir.is_dir():
                print(f"error: --runs: no run folder {run_dir}", file=sys.stderr)
                return 2
            got = score(run_dir, args.fresh_days, advice_alone is None)
            advice_alone = advice_alone or got.get("advice_alone")
            rows.setdefault(arm, {})[str(seed)] = got["agent"]
            print(arm, seed, got["agent"], flush=True)
    table = ["| who | P&L, first half | P&L, second half | entries, first half | entries, second half |",
             "|---|---|---|---|---|"]
    means = {}
    for arm, by_seed in rows.items():
        means[arm] = {k: float(np.mean([s[k] for s in by_seed.values()])) for k in next(iter(by_seed.values()))}
    if advice_alone is not None:
        means["advice alone"] = advice_alone
    for who, m in means.items():
        table.append(f"| {who} | {m['pnl_first']:,.0f} | {m['pnl_second']:,.0f} | {m['entries_first']:,.0f} | "
                     f"{m['entries_second']:,.0f} |")
    print("\n".join(table))
    if args.json:
        args.json.write_text(json.dumps({"fresh_days": args.fresh_days, "seeds": rows, "means": means}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
