"""The `train` benchmark suite: real PPO updates (rollout + GAE + epochs × minibatches) on the trading env.

    python scripts/benchmark.py train --envs 1024,4096 --json results/train.json

Per env count: compile time, env steps per second over whole updates (after compilation), the network's
FLOPs per env step from the layer shapes (rollout forward + every epoch's forward and backward, backward ≈ 2×
forward) and the achieved GFLOP/s = steps/s × FLOPs / 1e9. The rollout and learning phases are also timed
apart, to show where an update's time goes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

from bench_common import BenchOptions, peak_host_memory_mb, timed_repeats  # noqa: E402

from agents.config import load_config  # noqa: E402
from agents.networks import update_flops_per_step  # noqa: E402
from agents.ppo import make_train  # noqa: E402

DEFAULT_ENVS = [1024, 4096]
QUICK_ENVS = [256]


def bench_one(n_envs: int, reps: int, quick: bool, env, env_params) -> dict:
    overrides = [f"num_envs={n_envs}", "total_steps=1000000000"]
    if quick:
        overrides.append("ppo.num_steps=16")
    cfg = load_config(None, overrides)
    ppo = make_train(cfg, env, env_params)
    state = jax.jit(ppo.init)(jax.random.PRNGKey(0))

    t0 = time.perf_counter()
    update = jax.jit(ppo.update).lower(state).compile()
    compile_s = time.perf_counter() - t0

    holder = {"state": state}

    def one_update():
        holder["state"], m = update(holder["state"])
        jax.block_until_ready(m)

    timing = timed_repeats(one_update, reps)
    steps = cfg.steps_per_update
    steps_per_s = steps / timing["median_s"]
    flops = update_flops_per_step(cfg.network, ppo.obs_dim, ppo.num_actions, cfg.ppo.update_epochs)

    # Where the time goes: the same update as its two phases, compiled apart.
    rollout = jax.jit(ppo.rollout_chunk, static_argnums=1).lower(holder["state"], cfg.ppo.num_steps).compile()
    after_rollout, traj = rollout(holder["state"])
    learn = jax.jit(ppo.learn).lower(after_rollout, traj).compile()
    rollout_t = timed_repeats(lambda: jax.block_until_ready(rollout(holder["state"])), reps)
    learn_t = timed_repeats(lambda: jax.block_until_ready(learn(after_rollout, traj)), reps)

    return {
        "suite": "train",
        "envs": n_envs,
        "steps_per_s": steps_per_s,
        "compile_s": compile_s,
        "flops_per_step": flops,
        "achieved_gflops": steps_per_s * flops / 1e9,
        "update_s": timing["median_s"],
        "update_min_s": timing["min_s"],
        "update_max_s": timing["max_s"],
        "rollout_s": rollout_t["median_s"],
        "learn_s": learn_t["median_s"],
        "steps_per_update": steps,
        "num_steps": cfg.ppo.num_steps,
        "epochs": cfg.ppo.update_epochs,
        "minibatches": cfg.ppo.num_minibatches,
        "network": f"actor {cfg.network.actor_hidden} critic {cfg.network.critic_hidden} {cfg.network.activation}",
        "obs_dim": ppo.obs_dim,
        "reps": timing["reps"],
        "device": str(jax.devices()[0]),
        "peak_host_mb": peak_host_memory_mb(),
    }


def run(opts: BenchOptions) -> list[dict]:
    from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market

    env = TradingEnv(EnvConfig())
    env_params = env.make_params(load_market(DataConfig(source="synthetic:default")), "train")
    envs = opts.envs or (QUICK_ENVS if opts.quick else DEFAULT_ENVS)
    results = []
    for n in envs:
        print(f"  train: {n} envs ...", file=sys.stderr, flush=True)
        results.append(bench_one(n, opts.reps, opts.quick, env, env_params))
    return results
