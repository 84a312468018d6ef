"""Throughput benchmarks. Each suite prints a Markdown table and can write JSON in the shared format
{"machine": {...}, "results": [{"suite": ..., ...}, ...]} and a plot of steps/s against env count.

    python scripts/benchmark.py env --envs 256,1024,4096,16384 --json results/env.json
    python scripts/benchmark.py all --quick
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import BenchOptions, cpu_model, package_versions  # noqa: E402

SUITES = {  # suite name -> module exposing run(opts) -> list[dict]
    "env": "bench_env",
    "train": "bench_train",
    "bridge": "bench_bridge",
    "llm": "bench_llm",
}
RATE_KEYS = ("steps_per_s", "prompts_per_s")


def machine_facts() -> dict:
    facts = {
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(["jax", "jaxlib", "flax", "optax", "gymnax", "numpy", "torch", "transformers"]),
    }
    try:
        import jax

        facts["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as err:  # the report still has value without it
        facts["jax_devices"] = [f"unavailable: {err}"]
    return facts


def markdown_table(results: list[dict]) -> str:
    keys: list[str] = []
    for r in results:
        for k, v in r.items():
            if k not in keys and not isinstance(v, (dict, list)):
                keys.append(k)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in results:
        cells = []
        for k in keys:
            v = r.get(k, "")
            cells.append(f"{v:,.3g}" if isinstance(v, float) and abs(v) < 1000 else (f"{v:,.0f}" if isinstance(v, float) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for suite in dict.fromkeys(r["suite"] for r in results):
        rows = [r for r in results if r["suite"] == suite and "envs" in r and "steps_per_s" in r]
        if rows:
            ax.plot([r["envs"] for r in rows], [r["steps_per_s"] for r in rows], marker="o", label=suite)
        base = [r for r in rows if "baseline_steps_per_s" in r]
        if base:
            ax.plot([r["envs"] for r in base], [r["baseline_steps_per_s"] for r in base], ls="--", marker="x", label=f"{suite}: CartPole-v1")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("parallel environments")
    ax.set_ylabel("environment steps per second")
    ax.set_title(f"Throughput on {cpu_model()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=[*SUITES, "all"], help="which suite to run; `all` runs every suite")
    parser.add_argument("--envs", type=str, default=None, help="comma-separated env counts to sweep, e.g. 1024,4096")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions: under a minute")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions after the warm-up (default 5, quick 2)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of steps/s against env count here")
    args = parser.parse_args()

    envs = [int(x) for x in args.envs.split(",")] if args.envs else None
    if envs and any(n < 1 for n in envs):
        parser.error("--envs takes positive integers")
    opts = BenchOptions(envs=envs, quick=args.quick, reps=args.reps or (2 if args.quick else 5))
    names = list(SUITES) if args.suite == "all" else [args.suite]
    results: list[dict] = []
    for name in names:
        try:
            module = importlib.import_module(SUITES[name])
        except ImportError as err:
            print(f"suite {name}: skipped ({err})", file=sys.stderr)
            continue
        print(f"running suite {name} ...", file=sys.stderr, flush=True)
        suite_results = module.run(opts)
        print(f"\n### {name}\n\n{markdown_table(suite_results)}\n", flush=True)
        results += suite_results

    report = {"machine": machine_facts(), "options": vars(opts), "results": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
