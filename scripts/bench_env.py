"""Suite `env`: our environment stepped jitted and vmapped with random valid actions (auto-reset included),
against gymnax CartPole-v1 stepped the same way in the same run."""

from __future__ import annotations

import time

import gymnax
import jax
import jax.numpy as jnp

from bench_common import BenchOptions, peak_host_memory_mb, timed_repeats
from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market

DEFAULT_ENVS = [256, 1024, 4096, 16384]


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
    run = make_runner(env, params, n_envs, n_steps, masked)
    t0 = time.perf_counter()
    jax.block_until_ready(run(state, key))
    compile_s = time.perf_counter() - t0
    timing = timed_repeats(lambda: jax.block_until_ready(run(state, key)), reps, warmup=0)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state)) / n_envs
    obs_bytes = env.observation_space(params).shape[0] * 4
    return {
        "steps_per_s": n_envs * n_steps / timing["median_s"],
        "steps_per_s_min": n_envs * n_steps / timing["max_s"],
        "steps_per_s_max": n_envs * n_steps / timing["min_s"],
        "compile_s": compile_s,
        "bytes_per_env": int(state_bytes + obs_bytes),
        "median_s": timing["median_s"],
        "min_s": timing["min_s"],
        "max_s": timing["max_s"],
    }


def run(opts: BenchOptions) -> list[dict]:
    envs = opts.envs or ([256, 1024] if opts.quick else DEFAULT_ENVS)
    n_steps = 50 if opts.quick else 200
    market = load_market(DataConfig(source="synthetic:default", synthetic_days=20 if opts.quick else 120))
    ours = TradingEnv(EnvConfig())
    params = ours.make_params(market, "train")
    cartpole, cartpole_params = gymnax.make("CartPole-v1")
    results = []
    for n in envs:
        mine = time_env(ours, params, n, n_steps, opts.reps, masked=True)
        base = time_env(cartpole, cartpole_params, n, n_steps, opts.reps, masked=False)
        results.append(
            {
                "suite": "env",
                "envs": n,
                "steps_per_s": mine["steps_per_s"],
                "baseline_steps_per_s": base["steps_per_s"],
                "ratio": mine["steps_per_s"] / base["steps_per_s"],
                "bytes_per_env": mine["bytes_per_env"],
                "steps_per_s_min": mine["steps_per_s_min"],
                "steps_per_s_max": mine["steps_per_s_max"],
                "compile_s": mine["compile_s"],
                "steps_per_rep": n * n_steps,
                "reps": opts.reps,
                "peak_host_mb": peak_host_memory_mb(),
                "config": {"obs_size": ours.obs_size, "data": "synthetic:default", "actions": "random valid"},
            }
        )
    return results
