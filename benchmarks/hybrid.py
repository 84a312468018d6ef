"""Suite `hybrid`: what the LLM advisor costs in training throughput, measured in one run.

    python scripts/benchmark.py hybrid --envs 4096 --json results/hybrid.json

Per env count, whole PPO updates on synthetic:headlines of
- `rl_only`: `--llm none`, one compiled update (the baseline);
- `mock`: the mock advisor in its own process through the real bridge, k = 5, B = 256, strict latency;
- `smollm2` (not with --quick, and only where the embedded model is installed): auto budget.
Each hybrid row carries steps/s, the RL-only steps/s of the same env count, their ratio, the advice coverage
(share of decisions made with valid advice), the budget B used, prompts per update and the wait per query step.
"""

from __future__ import annotations

import sys
import time

import jax

from agents.advice.acting import make_acting
from agents.advisor.query_loop import QueryLoop
from agents.config import load_config
from agents.rl.ppo import make_train
from benchmarks.common import BenchOptions, fmt_range, jax_device_name, peak_host_memory_mb, rates, table, timed_repeats
from benchmarks.train import time_updates

DEFAULT_ENVS = [4096]
QUICK_ENVS = [256]
QUICK_NUM_STEPS = 20
ADVISORS = {  # name -> config overrides
    "mock": ["llm=mock", "hybrid.budget=256", "hybrid.query.interval=5", "hybrid.latency=strict"],
    "smollm2": ["llm=smollm2", "hybrid.budget=auto", "hybrid.query.interval=5", "hybrid.latency=strict"],
}
WARMUP_UPDATES = 2  # untimed updates first: compilation, and the auto budget settling
TARGET_RATIO = 0.85  # issue 5: training with the mock advisor at >= 85% of RL-only steps/s


def base_overrides(n_envs: int, num_steps: int) -> list[str]:
    return [f"num_envs={n_envs}", f"ppo.num_steps={num_steps}", "total_steps=1000000000",
            "data.source=synthetic:headlines", "log.progress=false", "log.tensorboard=false"]


def smollm2_available() -> bool:
    try:
        from llm_sidecar.models import find_smollm2_gguf

        find_smollm2_gguf()
        return True
    except Exception as err:  # not installed: the suite says so instead of failing
        print(f"  hybrid: smollm2 skipped ({err})", file=sys.stderr)
        return False


def time_rl_only(n_envs: int, num_steps: int, reps: int, setup) -> dict:
    cfg = load_config(None, base_overrides(n_envs, num_steps) + ["llm=none"])
    figures, _ = time_updates(cfg, make_train(cfg, setup.env, setup.params), reps)
    return figures


def time_hybrid(advisor: str, n_envs: int, num_steps: int, reps: int, setup) -> dict:
    cfg = load_config(None, base_overrides(n_envs, num_steps) + ADVISORS[advisor])
    ppo = make_train(cfg, setup.env, setup.params, make_acting(cfg, setup.env))
    t0 = time.perf_counter()
    loop = QueryLoop(cfg, ppo, setup.market, None)
    start_s = time.perf_counter() - t0
    try:
        holder = {"state": jax.jit(ppo.init)(jax.random.PRNGKey(0)), "metrics": []}

        def one():
            holder["state"], m = loop.update(holder["state"])
            holder["metrics"].append(jax.device_get(m))

        timing = timed_repeats(one, reps, warmup=WARMUP_UPDATES)
    finally:
        loop.close()
    timed = holder["metrics"][WARMUP_UPDATES:]

    def mean(key: str) -> float:
        return float(sum(float(m[key]) for m in timed) / len(timed))

    return {
        **rates(cfg.steps_per_update, timing),
        "reps": timing["reps"],
        "coverage": mean("advice_coverage"),
        "budget": mean("llm_budget"),
        "prompts_per_update": mean("llm_prompts"),
        "wait_s_per_query": mean("llm_wait_s_per_query"),
        "latency_p50_s": mean("llm_latency_p50_s"),
        "parse_errors": mean("llm_parse_error"),
        "timeouts": mean("llm_timeout"),
        "sidecar_start_s": start_s,
    }


def run(opts: BenchOptions) -> list[dict]:
    from agents.training.env_setup import make_env_setup

    num_steps = QUICK_NUM_STEPS if opts.quick else load_config(None, []).ppo.num_steps
    setup = make_env_setup(load_config(None, base_overrides(256, num_steps) + ["llm=none"]))
    advisors = ["mock"] if opts.quick or not smollm2_available() else ["mock", "smollm2"]
    results = []
    for n in opts.envs or (QUICK_ENVS if opts.quick else DEFAULT_ENVS):
        print(f"  hybrid: {n} envs, RL only ...", file=sys.stderr, flush=True)
        rl = time_rl_only(n, num_steps, opts.reps, setup)
        for advisor in advisors:
            print(f"  hybrid: {n} envs, {advisor} advisor ...", file=sys.stderr, flush=True)
            figures = time_hybrid(advisor, n, num_steps, opts.reps, setup)
            results.append({
                "suite": "hybrid",
                "advisor": advisor,
                "envs": n,
                "num_steps": num_steps,
                "query_interval": 5,
                **figures,
                "rl_only_steps_per_s": rl["steps_per_s"],
                "ratio": figures["steps_per_s"] / rl["steps_per_s"],
                "peak_host_mb": peak_host_memory_mb(),
                "device": jax_device_name(),
            })
    return results



def markdown(rows: list[dict]) -> str:
    if not rows:
        return "No hybrid rows."
    r0 = rows[0]
    intro = (
        f"Whole PPO updates ({r0['num_steps']}-step rollouts as chunks of k = {r0['query_interval']} steps with a "
        "query step between chunks, synthetic:headlines, strict latency) with the advisor in its own process "
        "through the real bridge, against RL-only updates (`--llm none`) of the same env count in the same run. "
        f"`ratio` = hybrid ÷ RL-only steps/s (target for the mock advisor ≥ {TARGET_RATIO}); coverage = share of "
        "decisions made with valid advice; B = prompts per query step (`auto`: sized from the sidecar's measured "
        "rate); wait = time per query step spent waiting for the previous step's answers."
    )
    body = table(rows, [
        ("advisor", lambda r: r["advisor"]),
        ("envs", lambda r: r["envs"]),
        ("steps/s [min–max]", lambda r: fmt_range(r, "steps_per_s")),
        ("RL-only steps/s", lambda r: r["rl_only_steps_per_s"]),
        ("ratio", lambda r: r["ratio"]),
        ("coverage", lambda r: f"{r['coverage']:.1%}"),
        ("B", lambda r: r["budget"]),
        ("prompts / update", lambda r: r["prompts_per_update"]),
        ("wait s / query step", lambda r: r["wait_s_per_query"]),
        ("answer latency p50 s", lambda r: r["latency_p50_s"]),
        ("sidecar start s", lambda r: r["sidecar_start_s"]),
        ("peak host MB", lambda r: r["peak_host_mb"]),
        ("reps", lambda r: r["reps"]),
    ])  # fmt: skip
    notes = []
    for r in rows:
        if r["advisor"] == "mock":
            detail = f"{'meets' if r['ratio'] >= TARGET_RATIO else 'misses'} the {TARGET_RATIO} target"
        else:
            detail = f"{r['coverage']:.1%} of decisions advised with B = {r['budget']:.0f}"
        notes.append(f"{r['advisor']} at {r['envs']:,} envs: {r['ratio']:.2f} of RL-only throughput ({detail})")
    why = ("Where the time goes: the rollout is split into T/k jitted chunks, and each query step adds a device "
           "round trip (selection, state gather), prompt rendering, a shared-memory submit and, in strict mode, "
           "the wait for the previous step's answers; the sidecar shares the CPU cores with the JAX trainer, so "
           "its work slows the chunks it hides behind. Learning, most of an update, is unchanged.")
    return "\n\n".join([intro, body, "; ".join(notes) + ".", why])
