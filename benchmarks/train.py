"""Suite `train`: real PPO updates (rollout + GAE + epochs × minibatches) on the trading env.

    python scripts/benchmark.py train --envs 1024,4096 --json results/train.json

Per env count (case `update`): env steps per second over whole updates after compilation, the compile time,
peak host memory, the network's FLOPs per env step from the layer shapes (rollout forward + every epoch's
forward and backward, backward ≈ 2× forward) and the achieved GFLOP/s = steps/s × FLOPs / 1e9. The rollout is
also compiled and timed alone; learning is the rest of the update. Sizes run in ascending order, and a size
whose memory, projected from the sizes measured before it, would not fit in the available memory is skipped.
Case `compile`: the first update's trace + compile time over a grid of env counts × rollout lengths, compiled
from shapes alone (nothing is allocated, so large grids cost only compile time).
"""

from __future__ import annotations

import os
import sys

import jax

from agents.config import load_config
from agents.rl.networks import update_flops_per_step
from agents.rl.ppo import make_train
from agents.training.update import Update
from benchmarks.common import (
    BenchOptions,
    available_memory_gb,
    fmt,
    fmt_range,
    host_memory_gb,
    jax_device_name,
    on_gpu,
    peak_host_memory_mb,
    rates,
    reset_peak_memory,
    scaling_note,
    table,
    timed_repeats,
)

DEFAULT_ENVS = [256, 1024, 4096, 16384, 65536]  # 65536 only where its projected memory fits
QUICK_ENVS = [256]
COMPILE_ENVS = [256, 4096, 65536]  # the compile grid; shapes only, so 65536 costs no memory
COMPILE_STEPS = [16, 64, 256]
QUICK_NUM_STEPS = 16
REP_BUDGET_S = 60.0  # per timed case: large sizes get fewer reps (at least 3)
MEMORY_HEADROOM = 0.8  # run a size only if its projected peak fits in this share of the available memory


def build_ppo(n_envs: int, num_steps: int, env, env_params):
    cfg = load_config(None, ["llm=none", f"num_envs={n_envs}", f"ppo.num_steps={num_steps}", "total_steps=1000000000"])
    return cfg, make_train(cfg.ppo, cfg.network, env, env_params, num_envs=cfg.num_envs, num_updates=cfg.num_updates)


def compile_update(ppo, num_steps: int, env_params, state, shardings=None) -> tuple[Update, float]:
    """(the update as training runs it, agents.training.update.Update, compiled ahead; its trace + compile seconds).
    `state` may be shapes (jax.eval_shape)."""
    update = Update(ppo, num_steps, env_params).compile(state, shardings)
    return update, update.compile_s


def projected_peak_mb(measured: list[dict], steps_per_update: int) -> float | None:
    """Peak host memory for an update of `steps_per_update` env steps, from a least-squares line through the
    measured (steps per update, peak MB) pairs: memory grows with the trajectory, envs × T. None below two sizes."""
    points = [(r["steps_per_update"], r["peak_host_mb"]) for r in measured if "peak_host_mb" in r]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y + slope * (steps_per_update - mean_x)


def time_updates(ppo, env_params, reps: int, *, num_steps: int, steps_per_update: int) -> tuple[dict, object]:
    """Whole PPO updates: compile, then a warm-up and timed updates. Returns the figures and the state after them."""
    reset_peak_memory()
    key = jax.random.PRNGKey(0)
    update, compile_s = compile_update(ppo, num_steps, env_params, jax.eval_shape(ppo.init, key, env_params))
    holder = {"state": jax.jit(ppo.init)(key, env_params)}

    def one_update():
        holder["state"], _ = update(holder["state"])  # its metrics come to the host: the update has finished

    timing = timed_repeats(one_update, reps, budget_s=REP_BUDGET_S)
    figures = {
        **rates(steps_per_update, timing),
        "compile_s": compile_s,
        "update_s": timing["median_s"],
        "update_min_s": timing["min_s"],
        "update_max_s": timing["max_s"],
        "reps": timing["reps"],
        "cores_used": timing["cores_used"],
        "peak_host_mb": peak_host_memory_mb(),
    }
    return figures, holder["state"]


def bench_one(n_envs: int, num_steps: int, reps: int, env, env_params, measured: list[dict]) -> dict:
    cfg, ppo = build_ppo(n_envs, num_steps, env, env_params)
    row = {"suite": "train", "case": "update", "envs": n_envs, "num_steps": num_steps}
    need_mb = projected_peak_mb(measured, cfg.steps_per_update)
    if need_mb is not None and need_mb / 1024 > MEMORY_HEADROOM * available_memory_gb():
        return {**row, "skipped": f"needs ~{need_mb / 1024:.1f} GiB (projected from the smaller sizes), "
                                  f"{available_memory_gb():.1f} GiB available"}  # fmt: skip
    figures, state = time_updates(ppo, env_params, reps, num_steps=cfg.ppo.num_steps,
                                  steps_per_update=cfg.steps_per_update)
    row.update(figures)
    # Where the time goes: the rollout alone (compiled apart); learning (GAE + epochs) is the rest.
    rollout = jax.jit(ppo.rollout_chunk, static_argnums=1).lower(state, num_steps, env_params).compile()
    rollout_t = timed_repeats(lambda: jax.block_until_ready(rollout(state, env_params)), reps,
                              budget_s=REP_BUDGET_S / 4)
    flops = update_flops_per_step(cfg.network, ppo.obs_dim, ppo.num_actions, cfg.ppo.update_epochs)
    return {
        **row,
        "flops_per_step": flops,
        "achieved_gflops": figures["steps_per_s"] * flops / 1e9,
        "rollout_s": rollout_t["median_s"],
        "rollout_cores_used": rollout_t["cores_used"],
        "learn_s": figures["update_s"] - rollout_t["median_s"],
        "steps_per_update": cfg.steps_per_update,
        "epochs": cfg.ppo.update_epochs,
        "minibatches": cfg.ppo.num_minibatches,
        "network": f"actor {cfg.network.actor_hidden} critic {cfg.network.critic_hidden} {cfg.network.activation}",
        "obs_dim": ppo.obs_dim,
        "device": jax_device_name(),
    }


def compile_grid(cases: list[tuple[int, int]], env, env_params) -> list[dict]:
    """The first update's compile time for each (env count, rollout length)."""
    rows = []
    for n, t in cases:
        _, ppo = build_ppo(n, t, env, env_params)
        _, compile_s = compile_update(ppo, t, env_params, jax.eval_shape(ppo.init, jax.random.PRNGKey(0), env_params))
        rows.append({"suite": "train", "case": "compile", "envs": n, "num_steps": t, "compile_s": compile_s})
    return rows


def run(opts: BenchOptions) -> list[dict]:
    from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market

    env = TradingEnv(EnvConfig())
    env_params = env.make_params(load_market(DataConfig(source="synthetic:default")), "train")
    envs = opts.envs or (QUICK_ENVS if opts.quick else DEFAULT_ENVS)
    num_steps = QUICK_NUM_STEPS if opts.quick else load_config(None, []).ppo.num_steps
    results = []
    for n in sorted(envs):
        print(f"  train: {n} envs ...", file=sys.stderr, flush=True)
        results.append(bench_one(n, num_steps, opts.reps, env, env_params, measured=results))
    print("  train: compile grid ...", file=sys.stderr, flush=True)
    grid_envs = opts.envs or (QUICK_ENVS if opts.quick else COMPILE_ENVS)
    measured = {(r["envs"], r["num_steps"]) for r in results if "compile_s" in r}  # updates compiled them already
    grid = [(n, t) for n in grid_envs for t in ([QUICK_NUM_STEPS] if opts.quick else COMPILE_STEPS) if (n, t) not in measured]
    return results + compile_grid(grid, env, env_params)


def markdown(rows: list[dict]) -> str:
    updates = [r for r in rows if r.get("case") == "update" and "steps_per_s" in r]
    skipped = [r for r in rows if "skipped" in r]
    parts = []
    if updates:
        u = updates[0]
        parts.append(
            f"Whole PPO updates ({u['num_steps']}-step rollout + GAE + {u['epochs']} epochs × {u['minibatches']} "
            f"minibatches, {u['network']}, {u['obs_dim']}-float observations) after compilation. FLOPs per env step "
            f"from the layer shapes: the rollout's forward pass plus, per epoch, forward + backward (backward 2× "
            f"forward, 1× for each net's first layer, whose input needs no gradient) = {u['flops_per_step'] / 1e6:.2f} "
            "MFLOP. The rollout is compiled and timed alone; learning (GAE + epochs) is the rest of the update."
        )
        parts.append(table(updates, [
            ("envs", lambda r: r["envs"]),
            ("steps/s [min–max]", lambda r: fmt_range(r, "steps_per_s")),
            ("update s", lambda r: r["update_s"]),
            ("rollout s", lambda r: r["rollout_s"]),
            ("learn s", lambda r: r["learn_s"]),
            ("GFLOP/s", lambda r: r["achieved_gflops"]),
            ("cores busy: update / rollout", lambda r: f"{r['cores_used']:.2f} / {r['rollout_cores_used']:.2f}"),
            ("compile s", lambda r: r["compile_s"]),
            ("peak host MB", lambda r: r["peak_host_mb"]),
            ("reps", lambda r: r["reps"]),
        ]))  # fmt: skip
        parts.append(scaling_note(updates, what="Training steps/s"))
        parts.append(why_training_scales(updates))
    for r in skipped:
        parts.append(f"{r['envs']:,} envs × {r['num_steps']} steps: skipped, {r['skipped']}.")
    compiles = [r for r in rows if "compile_s" in r and "num_steps" in r]
    if compiles:
        steps = sorted({r["num_steps"] for r in compiles})
        cell = {(r["envs"], r["num_steps"]): r for r in compiles}
        lines = ["| envs | " + " | ".join(f"T = {t}" for t in steps) + " |", "|" + "---|" * (len(steps) + 1)]
        for n in sorted({r["envs"] for r in compiles}):
            cells = [fmt(cell[n, t]["compile_s"]) if (n, t) in cell else "—" for t in steps]
            lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
        parts.append(
            "Compile time in seconds of the first update (trace + XLA compile, from shapes alone) against env count "
            "and rollout length T:\n\n" + "\n".join(lines)
        )
        parts.append(compile_and_memory_note(compiles, updates))
    return "\n\n".join(part for part in parts if part)


def span(values: list[float], form: str) -> str:
    """`low–high` of the values as `form` writes them, or one figure when they print the same."""
    low, high = format(min(values), form), format(max(values), form)
    return low if low == high else f"{low}–{high}"


def why_training_scales(updates: list[dict]) -> str:
    """The measured reasons, in words: where an update's time goes, the FLOP rate across sizes, cores kept busy."""
    learn_share = [r["learn_s"] / r["update_s"] for r in updates]
    gflops = [r["achieved_gflops"] for r in updates]
    cores = [r["cores_used"] for r in updates]
    text = (
        f"Why: learning (GAE + epochs of minibatch forward and backward passes) is {span(learn_share, '.0%')} of an "
        f"update, and it is matrix multiplication over minibatches of envs × steps / {updates[0]['minibatches']} "
        f"rows. The update ran at {span(gflops, '.0f')} GFLOP/s across the sizes"
    )
    if on_gpu(updates[0]):
        text += f" on {updates[0]['device'].split(': ', 1)[1]}"
    else:
        text += f" and kept {span(cores, '.2f')} of {os.cpu_count()} cores busy"
        if min(cores) < 0.85 * os.cpu_count():
            text += ": not all of them; other jobs held the rest (see the load average), which caps every figure here"
    if max(gflops) <= 1.15 * min(gflops):
        return text + (". A flat FLOP rate means the smallest size's minibatches already keep the cores' vector "
                       "units as busy as the largest's: more envs only make each update longer.")
    best = max(updates, key=lambda r: r["achieved_gflops"])
    if best is updates[-1]:
        return text + ". The FLOP rate still rises with the batch: larger batches use the hardware better."
    last = updates[-1]
    return text + (f". The FLOP rate peaks at {best['envs']:,} envs ({best['achieved_gflops']:.0f} GFLOP/s) and is "
                   f"{last['achieved_gflops']:.0f} at {last['envs']:,} (whose update holds "
                   f"{last['peak_host_mb'] / 1024:.1f} GiB): past {best['envs']:,} envs more envs do not raise it, "
                   "they only make each update longer.")


def compile_and_memory_note(compiles: list[dict], updates: list[dict]) -> str:
    """How compile time varies over the grid; what the measured memory growth projects for the grid's largest size."""
    def means_by(key: str) -> dict[int, float]:
        groups = {v: [r["compile_s"] for r in compiles if r[key] == v] for v in sorted({r[key] for r in compiles})}
        return {v: sum(ts) / len(ts) for v, ts in groups.items()}

    by_t, by_envs = means_by("num_steps"), means_by("envs")
    text = (f"Mean compile time by T: {', '.join(f'{t:,}: {s:.1f} s' for t, s in by_t.items())}; by envs: "
            f"{', '.join(f'{n:,}: {s:.1f} s' for n, s in by_envs.items())}.")  # fmt: skip
    if all(max(m.values()) <= 1.3 * min(m.values()) for m in (by_t, by_envs)):
        text += (" Flat: the rollout is a `lax.scan`, so its body compiles once whatever T is, and the env count is "
                 "only a dimension of the same operations; compile time follows the program, not the array sizes.")
    measured = [r for r in updates if "peak_host_mb" in r]
    largest = max(compiles, key=lambda r: (r["envs"], r["num_steps"] == 64))
    steps = largest["envs"] * largest["num_steps"]
    need_mb = projected_peak_mb(measured, steps)
    if need_mb is not None and largest["envs"] > max(r["envs"] for r in measured):
        rate = max(r["steps_per_s"] for r in measured)
        per_step_kb = (projected_peak_mb(measured, steps + 1000) - need_mb) * 1024 / 1000
        text += (
            f" Peak host memory grows by ~{per_step_kb:.1f} KB per env step of the update (the trajectory, its "
            f"shuffled copy, minibatch gathers), so {largest['envs']:,} envs × {largest['num_steps']} steps would "
            f"peak near {need_mb / 1024:.1f} GiB of this machine's {host_memory_gb():.0f} GiB, and at the best "
            f"measured {rate:,.0f} steps/s one update would take ~{steps / rate / 60:.0f} min: the default sweep "
            f"stops at {max(r['envs'] for r in measured):,} envs for time (`--envs {largest['envs']}` runs it; a "
            f"size projected past {MEMORY_HEADROOM:.0%} of the available memory is skipped)."
        )
    return text
