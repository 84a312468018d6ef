"""Suite `env`: our environment stepped jitted and vmapped with random valid actions (auto-reset included),
against gymnax CartPole-v1 stepped the same way in the same run.

    python scripts/benchmark.py env --envs 256,1024,4096,16384,65536 --json results/env.json

Per env count: steps/s (median of the timed repetitions, with min and max), compile time, peak host memory of
the case, and the working set (env state + observation per env × envs) that each step streams through memory.
"""

from __future__ import annotations

import os
import sys
import time

import gymnax
import jax
import jax.numpy as jnp

from benchmarks.common import (
    BenchOptions,
    cpu_caches,
    fmt_range,
    jax_device_name,
    on_gpu,
    peak_host_memory_mb,
    rates,
    reset_peak_memory,
    scaling_note,
    table,
    timed_repeats,
)
from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market

DEFAULT_ENVS = [256, 1024, 4096, 16384, 65536]
REP_BUDGET_S = 20.0  # per timed case: large sizes get fewer reps (at least 3)


def make_runner(env, params, n_envs: int, n_steps: int, masked: bool):
    """A jitted loop of n_steps vectorised steps. Observations and rewards feed a checksum so the compiler
    cannot drop the work that produces them."""
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    mask_fn = jax.vmap(env.action_mask, in_axes=(0, None)) if masked else None

    @jax.jit
    def run(state, key):
        def body(carry, key):
            state, checksum = carry
            k_act, k_step = jax.random.split(key)
            if masked:
                logits = jnp.where(mask_fn(state, params), 0.0, -jnp.inf)
            else:
                logits = jnp.zeros((n_envs, env.num_actions))
            action = jax.random.categorical(k_act, logits)
            obs, state, reward, _, _, _ = step(jax.random.split(k_step, n_envs), state, action, params)
            return (state, checksum + obs.sum() + reward.sum()), None

        (state, checksum), _ = jax.lax.scan(body, (state, 0.0), jax.random.split(key, n_steps))
        return state, checksum

    return run


def time_env(env, params, n_envs: int, n_steps: int, reps: int, masked: bool) -> dict:
    key = jax.random.PRNGKey(0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n_envs), params)
    t0 = time.perf_counter()
    run = make_runner(env, params, n_envs, n_steps, masked).lower(state, key).compile()
    compile_s = time.perf_counter() - t0
    timing = timed_repeats(lambda: jax.block_until_ready(run(state, key)), reps, budget_s=REP_BUDGET_S)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state)) / n_envs
    obs_bytes = env.observation_space(params).shape[0] * 4
    return {
        **rates(n_envs * n_steps, timing),
        "compile_s": compile_s,
        "bytes_per_env": int(state_bytes + obs_bytes),
        "cores_used": timing["cores_used"],
        "reps": timing["reps"],
    }


def run(opts: BenchOptions) -> list[dict]:
    envs = opts.envs or ([256, 1024] if opts.quick else DEFAULT_ENVS)
    n_steps = 50 if opts.quick else 200
    days = 20 if opts.quick else 120
    market = load_market(DataConfig(source="synthetic:default", synthetic_days=days))
    ours = TradingEnv(EnvConfig())
    params = ours.make_params(market, "train")
    cartpole, cartpole_params = gymnax.make("CartPole-v1")
    results = []
    for n in envs:
        print(f"  env: {n} envs ...", file=sys.stderr, flush=True)
        reset_peak_memory()
        mine = time_env(ours, params, n, n_steps, opts.reps, masked=True)
        peak_mb = peak_host_memory_mb()  # ours alone, before CartPole runs
        base = time_env(cartpole, cartpole_params, n, n_steps, opts.reps, masked=False)
        results.append(
            {
                "suite": "env",
                "case": "step",
                "envs": n,
                **mine,
                "baseline": "gymnax CartPole-v1",
                "baseline_steps_per_s": base["steps_per_s"],
                "ratio": mine["steps_per_s"] / base["steps_per_s"],
                "working_set_mb": mine["bytes_per_env"] * n / 2**20,
                "steps_per_rep": n * n_steps,
                "peak_host_mb": peak_mb,
                "device": jax_device_name(),
                "config": {"obs_size": ours.obs_size, "data": f"synthetic:default, {days} days", "actions": "random valid",
                           "steps_per_scan": n_steps},
            }
        )
    return results


def markdown(rows: list[dict]) -> str:
    cfg = rows[0]["config"]
    caches = cpu_caches()
    intro = (
        f"Our env and gymnax CartPole-v1 stepped the same way in the same run: a jitted `lax.scan` of "
        f"{cfg['steps_per_scan']} vmapped steps, random valid actions, auto-reset included, observations and rewards "
        f"consumed by a checksum so nothing is optimised away ({cfg['obs_size']}-float observations, "
        f"{cfg['data']}). Working set = env state + observation per env × envs."
    )
    columns = [
        ("envs", lambda r: r["envs"]),
        ("our env steps/s [min–max]", lambda r: fmt_range(r, "steps_per_s")),
        ("CartPole-v1 steps/s", lambda r: r["baseline_steps_per_s"]),
        ("ours ÷ CartPole", lambda r: r["ratio"]),
        ("cores busy", lambda r: r["cores_used"]),
        ("working set MB", lambda r: r["working_set_mb"]),
        ("compile s", lambda r: r["compile_s"]),
        ("peak host MB", lambda r: r["peak_host_mb"]),
        ("reps", lambda r: r["reps"]),
    ]
    parts = [intro, table(rows, columns), scaling_note(rows, what="Our env's steps/s")]
    if len(rows) > 1:
        parts.append(why_it_stops(rows, caches.get("L3")))
    return "\n\n".join(part for part in parts if part)


def why_it_stops(rows: list[dict], l3: str | None) -> str:
    """The measured reasons, in words: cores kept busy, and where the working set leaves the last-level cache."""
    rows = sorted(rows, key=lambda r: r["envs"])
    first, last = rows[0], rows[-1]
    if on_gpu(first):
        steps = " → ".join(f"{r['steps_per_s'] / 1e6:,.0f}M at {r['envs']:,}" for r in rows)
        return (f"Why: on a GPU each scan iteration is a few kernels over all the envs, whose launch and fixed costs "
                f"barely grow with the env count, so steps/s grows with the envs ({steps}) for as long as the GPU has "
                f"idle cores. The cores-busy column is host CPU time: on a GPU the host "
                "only launches the jitted scan. CartPole's 4-float state does far less work per step.")
    text = (
        f"Why: a step is elementwise work over the envs, which XLA splits across the cores once the arrays are "
        f"large enough, and each scan iteration has a fixed cost that more envs amortise. Our process kept "
        f"{first['cores_used']:.2f} cores busy at {first['envs']:,} envs and {last['cores_used']:.2f} at "
        f"{last['envs']:,} (CPU time ÷ wall time, on {os.cpu_count()} cores)"
    )
    if last["cores_used"] >= 0.85 * os.cpu_count():
        text += ": all of them, so more envs only add work per step."
    else:
        text += ": not all of them; the rest went to other jobs (see the load average) or sat idle."
    l3_mb = cache_mb(l3)
    past = [r for r in rows if l3_mb and r["working_set_mb"] > l3_mb]
    if past and past[0] is not first:
        before = rows[rows.index(past[0]) - 1]
        change = past[0]["steps_per_s"] / before["steps_per_s"] - 1
        text += (
            f" The working set outgrows the {l3} L3 cache between {before['envs']:,} and {past[0]['envs']:,} envs "
            f"(steps/s changed by {change:+.0%} there): past it, a step's state and observations no longer stay "
            "in cache between steps."
        )
    return text + " CartPole's 4-float state does far less work per step."


def cache_mb(size: str | None) -> float | None:
    """'32768K' -> 32.0 (MiB), as /sys reports cache sizes."""
    if not size:
        return None
    units = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
    return float(size[:-1]) * units[size[-1]] if size[-1] in units else float(size) / 2**20
