"""Suite `account`: one prop-firm account trading several instruments (jaxenv.account_env.AccountEnv, issue 77)
stepped as the `env` suite steps TradingEnv, beside TradingEnv in the same run.

    python scripts/benchmark.py account --envs 4096 --json results/account.json

Three cases on the same NQ bars (synthetic:pair, 120 days: its NQ leg, and NQ + ES for two instruments): TradingEnv,
AccountEnv with that one instrument, AccountEnv with both (UNCAPPED: the default prop firm without a cap on contracts
(env.prop_firm.max_contracts=.inf) and no correlated pairs, the account limits the committed figures were measured
under). Each a jitted `lax.scan` of vmapped
steps with random valid actions (one per instrument from each head's mask), auto-reset included, observations and
rewards consumed by a checksum. The cases are timed in turn within each round (TradingEnv, one, two; again), so that
other load on the machine falls on all three alike; each figure is the median over the rounds with min and max.
An account step moves every instrument of one account one bar: account-steps/s = envs × steps / s. Targets (issue 77):
two instruments >= 0.6× one; one instrument >= 0.95× TradingEnv.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.common import BenchOptions, fmt_range, jax_device_name, load_average, table
from jaxenv import DataConfig, EnvConfig, PropFirmRules, TradingEnv
from jaxenv.account_env import AccountEnv
from jaxenv.market_set import MarketSet, load_market_set

DEFAULT_ENVS = [4096]
# The account's limits the suite steps under: no cap on contracts, no half-size rule, no correlated pairs
UNCAPPED = dataclasses.replace(EnvConfig(), prop_firm=dataclasses.replace(PropFirmRules(), max_contracts=math.inf))
TARGET_TWO_VS_ONE = 0.6
TARGET_ONE_VS_TRADING = 0.95


def first_instrument(market_set: MarketSet) -> MarketSet:
    """The set of its first instrument alone, on the same timeline."""
    return dataclasses.replace(market_set, symbols=market_set.symbols[:1], sources=market_set.sources[:1],
                               markets=market_set.markets[:1], present=market_set.present[:, :1],
                               own_bars=market_set.own_bars[:1], own_spans=market_set.own_spans[:1])


def random_valid(key: jax.Array, mask: jax.Array) -> jax.Array:
    """A uniformly random valid action per env ([N] from a mask [N, A]), or per head ([N, I] from [N, I, A]), each
    head drawn on its own [N, A] rows as the product's samplers draw them (drawn as one [N·I, A] batch, XLA on CPU
    fused every instrument's mask into each row of the draw: docs/findings.md)"""
    if mask.ndim == 2:
        return jax.random.categorical(key, jnp.where(mask, 0.0, -jnp.inf))
    keys = jax.random.split(key, mask.shape[1])
    return jnp.stack([jax.random.categorical(k, jnp.where(mask[:, i], 0.0, -jnp.inf)) for i, k in enumerate(keys)],
                     axis=1)


def make_runner(env, params, n_envs: int, n_steps: int):
    """A jitted loop of n_steps vmapped steps with random valid actions (benchmarks.env's, for either env: an
    AccountEnv's mask is [I, 6], so its actions are [I]); every observation leaf and the rewards feed a checksum."""
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    mask_fn = jax.vmap(env.action_mask, in_axes=(0, None))

    @jax.jit
    def run(state, key):
        def body(carry, key):
            state, checksum = carry
            k_act, k_step = jax.random.split(key)
            action = random_valid(k_act, mask_fn(state, params))
            obs, state, reward, _, _, _ = step(jax.random.split(k_step, n_envs), state, action, params)
            total = sum(leaf.sum() for leaf in jax.tree.leaves(obs))
            return (state, checksum + total + reward.sum()), None

        (state, checksum), _ = jax.lax.scan(body, (state, 0.0), jax.random.split(key, n_steps))
        return state, checksum

    return run


def compiled_case(env, params, n_envs: int, n_steps: int) -> dict:
    key = jax.random.PRNGKey(0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n_envs), params)
    t0 = time.perf_counter()
    run = make_runner(env, params, n_envs, n_steps).lower(state, key).compile()
    compile_s = time.perf_counter() - t0
    obs = env.get_obs(jax.tree.map(lambda x: x[0], state), params)
    bytes_per_env = sum(x.nbytes for x in jax.tree.leaves(state)) / n_envs + sum(x.nbytes for x in jax.tree.leaves(obs))
    return {"call": lambda: jax.block_until_ready(run(state, key)), "compile_s": compile_s,
            "bytes_per_env": int(bytes_per_env), "times": [], "cpu": 0.0}


def run(opts: BenchOptions) -> list[dict]:
    envs = opts.envs or ([256] if opts.quick else DEFAULT_ENVS)
    n_steps = 50 if opts.quick else 200
    days = 20 if opts.quick else 120
    pair = load_market_set([("NQ", "synthetic:pair"), ("ES", "synthetic:pair")], DataConfig(synthetic_days=days))
    one = first_instrument(pair)
    single, account = TradingEnv(EnvConfig()), AccountEnv(UNCAPPED)
    setups = [("TradingEnv", 1, single, single.make_params(pair.markets[0], "train")),
              ("AccountEnv", 1, account, account.make_params(one, "train")),
              ("AccountEnv", 2, account, account.make_params(pair, "train"))]
    results = []
    for n in envs:
        print(f"  account: {n} envs ...", file=sys.stderr, flush=True)
        cases = [compiled_case(env, params, n, n_steps) for _, _, env, params in setups]
        load_start = load_average()
        for case in cases:  # warm-up
            case["call"]()
        for _ in range(opts.reps):  # rounds: each case once, in turn
            for case in cases:
                cpu0, t0 = time.process_time(), time.perf_counter()
                case["call"]()
                case["times"].append(time.perf_counter() - t0)
                case["cpu"] += time.process_time() - cpu0
        load_end = load_average()
        rows = []
        for (name, instruments, _, _), case in zip(setups, cases):
            times, work = case["times"], n * n_steps
            rows.append({
                "suite": "account",
                "case": "step",
                "env": name,
                "instruments": instruments,
                "envs": n,
                "account_steps_per_s": work / statistics.median(times),
                "account_steps_per_s_min": work / max(times),
                "account_steps_per_s_max": work / min(times),
                "instrument_steps_per_s": work * instruments / statistics.median(times),
                "compile_s": case["compile_s"],
                "cores_used": case["cpu"] / sum(times),
                "working_set_mb": case["bytes_per_env"] * n / 2**20,
                "reps": len(times),
                "load_avg_start": load_start,
                "load_avg_end": load_end,
                "device": jax_device_name(),
                "config": {"data": f"synthetic:pair, {days} days (NQ; NQ + ES)", "actions": "random valid",
                           "rules": "env.prop_firm.max_contracts=.inf (no cap), no pairs", "steps_per_scan": n_steps},
            })
        trading, one_row, two_row = rows
        one_row["ratio_to_trading_env"] = one_row["account_steps_per_s"] / trading["account_steps_per_s"]
        two_row["ratio_to_one"] = two_row["account_steps_per_s"] / one_row["account_steps_per_s"]
        results += rows
    return results


def markdown(rows: list[dict]) -> str:
    cfg = rows[0]["config"]
    intro = (
        f"One account trading several instruments (`AccountEnv`) stepped as the env suite steps `TradingEnv`, beside "
        f"it in the same run: a jitted `lax.scan` of {cfg['steps_per_scan']} vmapped steps, random valid actions (one "
        f"per instrument), auto-reset included, observations and rewards consumed by a checksum; {cfg['data']}; "
        f"{cfg['rules']}. The three cases are timed in turn within each round, so other load falls on them alike. An "
        "account step moves every instrument of one account one bar. Targets (issue 77): two instruments ≥ "
        f"{TARGET_TWO_VS_ONE}× one; one instrument ≥ {TARGET_ONE_VS_TRADING}× `TradingEnv`."
    )
    columns = [
        ("envs", lambda r: r["envs"]),
        ("env", lambda r: r["env"]),
        ("instruments", lambda r: r["instruments"]),
        ("account-steps/s [min–max]", lambda r: fmt_range(r, "account_steps_per_s")),
        ("instrument-steps/s", lambda r: r["instrument_steps_per_s"]),
        ("ratio", lambda r: r.get("ratio_to_trading_env", r.get("ratio_to_one", ""))),
        ("cores busy", lambda r: r["cores_used"]),
        ("working set MB", lambda r: r["working_set_mb"]),
        ("compile s", lambda r: r["compile_s"]),
        ("reps", lambda r: r["reps"]),
    ]
    notes = []
    for r in rows:
        if "ratio_to_trading_env" in r:
            notes.append(verdict(f"one instrument ÷ TradingEnv at {r['envs']:,} envs", r["ratio_to_trading_env"],
                                 TARGET_ONE_VS_TRADING))
        if "ratio_to_one" in r:
            notes.append(verdict(f"two instruments ÷ one at {r['envs']:,} envs", r["ratio_to_one"], TARGET_TWO_VS_ONE))
    load = f"load average (1/5/15 min) {rows[0]['load_avg_start']} at the start, {rows[-1]['load_avg_end']} at the end"
    return "\n\n".join([intro, table(rows, columns),
                        "Ratio: one instrument's ÷ TradingEnv's, two instruments' ÷ one's (medians). "
                        + "; ".join(notes) + f" ({load})."])


def verdict(what: str, ratio: float, target: float) -> str:
    if ratio >= target:
        return f"{what} {ratio:.3f} (meets the {target} target)"
    return f"{what} {ratio:.3f} (misses the {target} target by {target - ratio:.3f}, {1 - ratio / target:.0%} short)"
