"""Suite `scale`: whole PPO updates with the envs sharded over 1, 2 and all local devices, and hybrid updates with
the mock advisor for 1 and 2 advisor workers (`hybrid.sidecar.workers`), in one run.

    python scripts/benchmark.py scale --envs 4096 --json docs/results/scale.json

JAX fixes its device count when it starts, so each device count is measured in its own Python process
(`python -m benchmarks.scale DEVICES ENVS NUM_STEPS REPS`, which prints one JSON row). On a CPU-only machine the
devices are forced host devices (`XLA_FLAGS=--xla_force_host_platform_device_count=D`): they share the same cores,
so the figure shows what sharding costs (partitioning, the cross-device collectives of the gradient mean, the
normaliser and the global minibatch shuffle), not a speed-up; on a machine with several GPUs the same rows show
how far the devices add compute. The advisor-worker rows reuse the `hybrid` suite's measuring function.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import BenchOptions, fmt, fmt_range, load_average, table

DEFAULT_ENVS = 4096
QUICK_ENVS = 256
QUICK_NUM_STEPS = 16
WORKERS = (1, 2)
REP_BUDGET_S = 60.0  # per device count: slow cases get fewer reps (benchmarks.common.timed_repeats)


def device_counts() -> list[int]:
    """1, 2 and all local devices: the accelerators this machine has, or on CPU 1 and 2 forced host devices
    (forcing more than the cores would only split the same cores finer)."""
    import jax

    have = jax.local_device_count() if jax.default_backend() != "cpu" else 2
    return sorted({1, min(2, have), have})


def time_devices(devices: int, n_envs: int, num_steps: int, reps: int) -> dict:
    """Runs in the child process: compiles the sharded update for `devices` local devices and times it."""
    import jax

    from agents.config import load_config
    from agents.devices.parallel import make_mesh
    from agents.rl.ppo import make_train
    from agents.rl.sharding import state_shardings
    from agents.training.update import Update
    from benchmarks.common import rates, timed_repeats
    from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market

    cfg = load_config(None, ["llm=none", f"num_envs={n_envs}", f"ppo.num_steps={num_steps}",
                             "total_steps=1000000000", f"devices={devices}"])
    env = TradingEnv(EnvConfig())
    env_params = env.make_params(load_market(DataConfig(source="synthetic:default")), "train")
    mesh = make_mesh(cfg.num_envs, cfg.devices)
    ppo = make_train(cfg.ppo, cfg.network, env, env_params, None, mesh, num_envs=cfg.num_envs,
                     num_updates=cfg.num_updates)
    key = jax.random.PRNGKey(0)
    shardings = state_shardings(jax.eval_shape(ppo.init, key, env_params), mesh, n_envs)
    holder = {"state": jax.jit(ppo.init, out_shardings=shardings)(key, env_params)}
    update = Update(ppo, num_steps, env_params).compile(holder["state"], shardings)  # as training runs it

    def one_update():
        holder["state"], _ = update(holder["state"])  # its metrics come to the host: the update has finished

    timing = timed_repeats(one_update, reps, budget_s=REP_BUDGET_S)
    return {**rates(cfg.steps_per_update, timing), "reps": timing["reps"], "cores_used": timing["cores_used"],
            "device": f"{jax.default_backend()} x {mesh.size}", "load_avg_1m": load_average()[0]}


def measure_devices(devices: int, n_envs: int, num_steps: int, reps: int) -> dict:
    """One device count's row, measured in a fresh process (forced host devices on CPU)."""
    import jax

    env = dict(os.environ)
    if jax.default_backend() == "cpu":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "benchmarks.scale", str(devices), str(n_envs), str(num_steps),
                           str(reps)], cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scale: {devices} devices failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(opts: BenchOptions) -> list[dict]:
    from agents.config import load_config
    from agents.training.env_setup import make_env_setup
    from benchmarks.hybrid import ADVISORS, base_overrides, time_hybrid

    n_envs = (opts.envs or [QUICK_ENVS if opts.quick else DEFAULT_ENVS])[0]
    num_steps = QUICK_NUM_STEPS if opts.quick else load_config(None, []).ppo.num_steps
    rows = []
    for devices in device_counts():
        print(f"  scale: {n_envs} envs on {devices} device(s) ...", file=sys.stderr, flush=True)
        rows.append({"suite": "scale", "case": "devices", "envs": n_envs, "num_steps": num_steps,
                     "devices": devices, **measure_devices(devices, n_envs, num_steps, opts.reps)})
    rl_cfg = load_config(None, base_overrides(n_envs, num_steps) + ["llm=none"])
    setup = make_env_setup(rl_cfg.env_name, rl_cfg.env, rl_cfg.data, rl_cfg.checkpoint.eval_episodes)
    for workers in WORKERS:
        print(f"  scale: {n_envs} envs, mock advisor with {workers} worker(s) ...", file=sys.stderr, flush=True)
        figures = time_hybrid(ADVISORS["mock"], n_envs, num_steps, opts.reps, setup,
                              [f"hybrid.sidecar.workers={workers}"])
        rows.append({"suite": "scale", "case": "advisor_workers", "envs": n_envs, "num_steps": num_steps,
                     "advisor": "mock", "devices": 1, **figures})
    return rows


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "No scale rows."
    devices = [r for r in rows if r["case"] == "devices"]
    workers = [r for r in rows if r["case"] == "advisor_workers"]
    backend = devices[0]["device"].split(" ")[0] if devices else "cpu"
    lines = [
        (f"Whole PPO updates of {rows[0]['envs']:,} envs × {rows[0]['num_steps']} steps (`--llm none`) with the "
         "envs sharded over D local devices (`--devices D`, each device count in its own process), then hybrid "
         "updates with the mock advisor for 1 and 2 advisor workers (`--advisor-workers`); load = the 1-minute load "
         "average at the end of the case."),
        "",
        table(devices, [
            ("devices", lambda r: r["devices"]),
            ("steps/s", lambda r: fmt_range(r, "steps_per_s")),
            ("× 1 device", lambda r: f"{r['steps_per_s'] / devices[0]['steps_per_s']:.2f}"),
            ("cores used", lambda r: f"{r['cores_used']:.2f}"),
            ("load", lambda r: f"{r['load_avg_1m']:.1f}"),
        ]),
    ]
    if workers:
        lines += ["", table(workers, [
            ("advisor workers", lambda r: r["workers"]),
            ("hybrid steps/s", lambda r: fmt_range(r, "steps_per_s")),
            ("RL-only steps/s", lambda r: fmt(r["rl_only_steps_per_s"])),
            ("ratio", lambda r: f"{r['ratio']:.2f}"),
            ("answers/s", lambda r: fmt(r["answers_per_s"])),
            ("load", lambda r: f"{r['load_avg_1m']:.1f}"),
        ])]
    if backend == "cpu":
        lines += ["", ("What this shows and does not: on CPU the D devices are forced host devices that share the "
                  "same cores, so the rows measure what sharding costs (partitioning and the collectives that "
                  "combine gradients, normaliser statistics and the global minibatch shuffle across devices), "
                  "not a speed-up; adding devices adds compute only where each is its own accelerator (several "
                  "GPUs). The mock advisor answers from rules in microseconds, so its worker rows show the "
                  "bridge's overhead per worker, not a model's throughput.")]
    return "\n".join(lines)


if __name__ == "__main__":  # the child process of `measure_devices`: one JSON row on stdout
    devices_arg, envs_arg, steps_arg, reps_arg = (int(a) for a in sys.argv[1:5])
    print(json.dumps(time_devices(devices_arg, envs_arg, steps_arg, reps_arg)))
