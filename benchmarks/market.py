"""Suite `market`: what a market's length costs before training starts, measured in one run.

    python scripts/benchmark.py market --json docs/results/market-length.json

Per market length (the default synthetic market's 120 days, and 40 times that: 4,800 days, about five years of
full-hours minute bars), in a fresh process each: loading the market (bars and features), then the first hybrid
update with the mock advisor (`--llm mock`, strict, 4,096 envs; its time is mostly compilation), a second update
(compiled), the process's peak memory, and how many of XLA's "Constant folding an instruction is taking" warnings
reached stderr (the market's arrays are arguments of the jitted programs, so none should: a market compiled in as a
constant was folded at every start, longer the longer the market). `--quick`: 256 envs, 16 steps, 120 and 480 days.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import BenchOptions, peak_host_memory_mb, table

DEFAULT_DAYS = 120  # jaxenv.config.DataConfig.synthetic_days
LENGTHS = (1, 40)  # multiples of the default market
QUICK_LENGTHS = (1, 4)
DEFAULT_ENVS = 4096
QUICK_ENVS = 256
QUICK_NUM_STEPS = 16
FOLDING_WARNING = "Constant folding an instruction is taking"
TARGET_RATIO = 1.5  # issue 64: the first update on a market 40x the default within 1.5x of the default's


def time_market(days: int, n_envs: int, num_steps: int | None) -> dict:
    """Runs in the child process: loads a market of `days`, then times a mock-hybrid run's first two updates."""
    import jax

    from agents.advice.acting import make_acting
    from agents.advisor.query_loop import QueryLoop
    from agents.config import load_config
    from agents.rl.ppo import make_train
    from agents.training.env_setup import make_env_setup
    from agents.training.update import Update

    overrides = ["llm=mock", "hybrid.link.latency=strict", f"num_envs={n_envs}", f"data.synthetic_days={days}",
                 "log.progress=false", "log.tensorboard=false", "total_steps=1000000000"]
    if num_steps:
        overrides.append(f"ppo.num_steps={num_steps}")
    cfg = load_config(None, overrides)
    t0 = time.perf_counter()
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    load_s = time.perf_counter() - t0
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, setup.market, None, seed=cfg.seed,
                     num_steps=cfg.ppo.num_steps)
    try:
        update = Update(ppo, cfg.ppo.num_steps, setup.params, loop)
        state = jax.jit(ppo.init)(jax.random.PRNGKey(0), setup.params)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            state, _ = update(state)  # its metrics come to the host: the update has finished
            times.append(time.perf_counter() - t)
    finally:
        loop.close()
    return {"days": days, "bars": int(setup.market.num_bars), "envs": n_envs, "num_steps": cfg.ppo.num_steps,
            "load_s": load_s, "first_update_s": times[0], "second_update_s": times[1],
            "peak_memory_mb": peak_host_memory_mb()}


def measure_market(days: int, n_envs: int, num_steps: int | None) -> dict:
    """One length's row, measured in a fresh process (its own compilation cache and peak memory)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "benchmarks.market", str(days), str(n_envs), str(num_steps or 0)],
                          cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"market: {days} days failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return {**row, "folding_warnings": done.stderr.count(FOLDING_WARNING)}


def run(opts: BenchOptions) -> list[dict]:
    n_envs = (opts.envs or [QUICK_ENVS if opts.quick else DEFAULT_ENVS])[0]
    num_steps = QUICK_NUM_STEPS if opts.quick else None
    rows = []
    for times in QUICK_LENGTHS if opts.quick else LENGTHS:
        days = DEFAULT_DAYS * times
        print(f"  market: {days} days ({times}x the default), {n_envs} envs, first mock-hybrid update ...",
              file=sys.stderr, flush=True)
        rows.append({"suite": "market", "case": "first_update", "times_default": times,
                     **measure_market(days, n_envs, num_steps)})
    base = rows[0]["first_update_s"]
    for row in rows:
        row["vs_default"] = row["first_update_s"] / base
    return rows


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "No market rows."
    longest = rows[-1]
    verdict = "within" if longest["vs_default"] <= TARGET_RATIO else "NOT within"
    return "\n".join([
        (f"A mock-hybrid run's first two updates ({rows[0]['envs']:,} envs × {rows[0]['num_steps']} steps, strict) on "
         "synthetic markets of several lengths, each length in its own process: load = the market's bars and "
         "features; the first update is mostly compilation; folding = XLA's constant-folding warnings on stderr "
         "(the market is an argument of the programs, not a constant); memory = the process's peak resident set."),
        "",
        table(rows, [
            ("days", lambda r: f"{r['days']:,} ({r['times_default']}x)"),
            ("bars", lambda r: f"{r['bars']:,}"),
            ("load s", lambda r: f"{r['load_s']:.1f}"),
            ("first update s", lambda r: f"{r['first_update_s']:.1f}"),
            ("× default", lambda r: f"{r['vs_default']:.2f}"),
            ("second update s", lambda r: f"{r['second_update_s']:.1f}"),
            ("peak memory MB", lambda r: f"{r['peak_memory_mb']:,.0f}"),
            ("folding warnings", lambda r: r["folding_warnings"]),
        ]),
        "",
        (f"The first update at {longest['times_default']}x is {longest['vs_default']:.2f}x the default's: {verdict} "
         f"the target of {TARGET_RATIO}x."),
    ])


if __name__ == "__main__":  # the child process of `measure_market`: one JSON row on stdout
    days_arg, envs_arg, steps_arg = (int(a) for a in sys.argv[1:4])
    print(json.dumps(time_market(days_arg, envs_arg, steps_arg or None)))
