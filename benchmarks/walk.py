"""Suite `walk`: how fast a validation walk that training waits for gets its keys answered, on an idle machine and
with one CPU-bound process beside it (a machine doing other work too).

    python scripts/benchmark.py walk --json docs/results/walk-advisor/walk.json

The main command's settings (the embedded defaults: SmolLM2, its prompt template, the default market), no advice
store. Per condition, as in a training run at its first validation walk: training's advisor is started as training
starts it (`hybrid.sidecar`: 1 thread at nice 19) and given one submission of its budget's worth of training keys,
so that it is busy as it would be; then the walk's link is started as `AgentEvaluator` starts it
(`agents.advisor.pacer.walk_pacer`) and asks the first KEYS keys the validation walk reads ahead of it
(`QueryPacer.ask_all`), timed from the first submission to the last answer (the model's loading is not). Beside:
one `python -c "while True: pass"` at normal priority, started before the advisors and stopped after. Each condition
starts fresh processes. `--quick`: 64 keys.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import BenchOptions, load_average, table

KEYS = 512
QUICK_KEYS = 64
CONDITIONS = {"idle": 0, "one CPU-bound process beside": 1}  # condition -> busy processes beside the walk
OVERRIDES = ["llm=smollm2", "hybrid.store=", "log.progress=false", "log.tensorboard=false"]


@contextlib.contextmanager
def busy_processes(n: int):
    """`n` processes that keep one core each busy at normal priority, for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def walk_row(condition: str, beside: int, n_keys: int) -> dict:
    from agents.advice.table import walk_keys
    from agents.advisor.pacer import training_pacer, walk_pacer
    from agents.config import load_config
    from jaxenv import load_market

    cfg = load_config(None, OVERRIDES)
    market = load_market(cfg.data)
    train_start, train_end = market.split_range("train")
    val_start, val_end = market.split_range("val")
    k = cfg.hybrid.query.interval
    with busy_processes(beside):
        # training's advisor, as QueryLoop starts it
        train = training_pacer(cfg.hybrid, cfg.llm, cfg.env, cfg.data, cfg.seed, market, None)
        walk = None
        try:
            train_keys = walk_keys(train_start, train_end, k)
            train.advisor.submit(train_keys[:train.budget])  # busy with its latest query step, as at a walk
            walk = walk_pacer(cfg.hybrid, cfg.llm, cfg.env, cfg.data, market)
            keys = walk_keys(val_start, val_end, k, cfg.hybrid.query.entries_only)[:n_keys]
            load = load_average()
            t0 = time.perf_counter()
            walk.ask_all(keys)
            seconds = time.perf_counter() - t0
        finally:
            if walk is not None:
                walk.close()
            train.close()
    return {"suite": "walk", "condition": condition, "beside": beside, "keys": len(keys),
            "training_budget": int(train.budget), "seconds": seconds, "keys_per_s": len(keys) / seconds,
            "load_avg": load}


def run(opts: BenchOptions) -> list[dict]:
    n = QUICK_KEYS if opts.quick else KEYS
    rows = []
    for condition, beside in CONDITIONS.items():
        print(f"  walk: {n} validation keys, {condition} ...", file=sys.stderr, flush=True)
        rows.append(walk_row(condition, beside, n))
    idle = next((r for r in rows if r["beside"] == 0), None)
    for r in rows:
        r["of_idle"] = r["keys_per_s"] / idle["keys_per_s"] if idle else float("nan")
    return rows


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "No walk rows."
    return "\n".join([
        ("The first validation walk's keys answered by the walk's advisor while training waits for it (the main "
         "command's settings, SmolLM2, no store), with training's own advisor (nice 19) busy with a query step's "
         "keys: idle, and with one CPU-bound process at normal priority beside it."),
        "",
        table(rows, [
            ("condition", lambda r: r["condition"]),
            ("keys", lambda r: r["keys"]),
            ("seconds", lambda r: f"{r['seconds']:.1f}"),
            ("keys/s", lambda r: f"{r['keys_per_s']:.2f}"),
            ("of idle", lambda r: f"{r['of_idle']:.2f}" if np.isfinite(r["of_idle"]) else "-"),
            ("load avg (1 min) at start", lambda r: f"{r['load_avg'][0]:.2f}"),
        ]),
    ])
