r"""Throughput benchmarks. Each suite prints a Markdown table; `--json` writes the shared format
{"machine": {...}, "options": {...}, "results": [{"suite": ..., "steps_per_s" or "prompts_per_s": ..., ...}]},
`--plot` draws steps/s against env count, `--markdown` writes a whole report (BENCHMARKS.md is one).

    python scripts/benchmark.py env --envs 256,1024,4096 --json results/env.json
    python scripts/benchmark.py env train --quick
    python scripts/benchmark.py all --markdown BENCHMARKS.md --json docs/results/benchmarks.json \
        --plot docs/results/benchmarks.png
    python scripts/benchmark.py --from-json docs/results/benchmarks.json --markdown BENCHMARKS.md   # re-render, no timing
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path

from benchmarks.common import (
    BenchInputError,
    BenchOptions,
    cpu_caches,
    cpu_model,
    host_memory_gb,
    load_average,
    markdown_table,
    package_versions,
)

SUITES = {  # suite name -> module exposing run(opts) -> list[dict]; `all` runs them in this order
    "env": "benchmarks.env",
    "account": "benchmarks.account",
    "train": "benchmarks.train",
    "hybrid": "benchmarks.hybrid",
    "sb3": "benchmarks.sb3",
    "bridge": "benchmarks.bridge",
    "llm": "benchmarks.llm",
    "scale": "benchmarks.scale",
    "phi3": "benchmarks.phi3",
    "market": "benchmarks.market",
    "learning": "benchmarks.learning",
    "walk": "benchmarks.walk",
}
INSTALL_HINTS = {  # a suite's missing module -> what installs it
    "sb3_contrib": 'pip install -e ".[sb3]"',
    "stable_baselines3": 'pip install -e ".[sb3]"',
    "torch": 'pip install -e ".[sidecar]"',
    "transformers": 'pip install -e ".[sidecar]"',
}
PACKAGES = ["jax", "jaxlib", "flax", "optax", "gymnax", "gymnasium", "numpy", "torch", "transformers",
            "stable-baselines3", "sb3-contrib"]  # fmt: skip


def machine_facts() -> dict:
    facts = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_caches": cpu_caches(),
        "memory_gb": round(host_memory_gb(), 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(PACKAGES),
    }
    try:
        import jax

        facts["jax_devices"] = [str(d) if d.platform == "cpu" else f"{d} ({d.device_kind})" for d in jax.devices()]
    except Exception as err:  # the report still has value without it
        facts["jax_devices"] = [f"unavailable: {err}"]
    return facts


def import_suite(name: str):
    """(the suite's module, None), or (None, why) naming what is missing and what installs it."""
    try:
        return importlib.import_module(SUITES[name]), None
    except ImportError as err:
        missing = (getattr(err, "name", None) or "").split(".")[0]
        hint = f" (install it with: {INSTALL_HINTS[missing]})" if missing in INSTALL_HINTS else ""
        return None, f"cannot import {SUITES[name]}: {err}{hint}"


def suite_markdown(module, rows: list[dict]) -> str:
    """The suite's own tables when it defines `markdown(rows)`, else every scalar field."""
    render = getattr(module, "markdown", None)
    return render(rows) if render else markdown_table(rows)


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for suite in dict.fromkeys(r["suite"] for r in results):
        rows = sorted((r for r in results if r["suite"] == suite and "envs" in r and "steps_per_s" in r), key=lambda r: r["envs"])
        for variant in dict.fromkeys(r.get("advisor") for r in rows):  # the hybrid suite has one line per advisor
            line = [r for r in rows if r.get("advisor") == variant]
            x, y = [r["envs"] for r in line], [r["steps_per_s"] for r in line]
            err = [[r["steps_per_s"] - r.get("steps_per_s_min", r["steps_per_s"]) for r in line],
                   [r.get("steps_per_s_max", r["steps_per_s"]) - r["steps_per_s"] for r in line]]  # fmt: skip
            label = suite if variant is None else f"{suite}: {variant}"
            if suite == "sb3":
                label = "sb3: MaskablePPO (torch)"
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
        base = [r for r in rows if r.get("baseline_steps_per_s")]
        if base and suite != "hybrid":
            label = f"{suite}: {base[0].get('baseline', 'baseline')}"
            ax.plot([r["envs"] for r in base], [r["baseline_steps_per_s"] for r in base], ls="--", marker="x", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("parallel environments")
    ax.set_ylabel("environment steps per second")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report_markdown(report: dict, sections: dict[str, str], plot_path: Path | None, doc_path: Path) -> str:
    """A whole Markdown report: how it was made, on what, under what load, then each suite's tables."""
    m, run = report["machine"], report["run"]
    caches = ", ".join(f"{k} {v}" for k, v in m["cpu_caches"].items())
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v != "not installed")
    gpu = any(not d.startswith(("cpu", "TFRT_CPU")) for d in m["jax_devices"])
    if "commands" in run:  # several reports merged by --from-json
        made = (f"Generated by {len(run['commands'])} commands, one after the other on one machine "
                f"({run['wall_minutes']:.1f} min in all, the last finished {run['finished']}): "
                + "; ".join(f"`{c}`" for c in run["commands"]) + ". Rerun them to refresh this file.")
    else:
        made = (f"Generated by `{run['command']}` ({run['wall_minutes']:.1f} min, {run['finished']}); rerun it to "
                "refresh this file.")
    lines = [
        "# Benchmarks" + ("" if not gpu else f" on a GPU: {m['jax_devices'][0]}"),
        "",
        made + " The prose of each section comes from its suite's `markdown()` in `benchmarks/*.py`.",
        "",
        f"- **Machine**: {m['cpu']}, {m['cores']} cores ({caches}), {m['memory_gb']} GiB RAM, {m['platform']}",
        f"- **JAX device**: {', '.join(m['jax_devices'])}"
        + ("" if gpu else " (no GPU in this run: every figure here is CPU; a GPU run writes its own report)"),
        f"- **Load average** (1/5/15 min) at start {run['load_avg_start']}, at end {run['load_avg_end']}: "
        "other jobs on the machine lower every figure",
        f"- **Packages**: {packages}; Python {m['python']}",
        "- **Method**: each figure is the median of timed repetitions after a warm-up, [min–max] beside it; compile "
        "time apart; peak host memory is the process's resident-set high-water mark during that case alone",
    ]
    if report["skipped"]:
        lines.append("- **Skipped**: " + "; ".join(f"`{k}`: {v}" for k, v in report["skipped"].items()))
    if report["failed"]:
        lines.append("- **Failed**: " + ", ".join(f"`{k}`" for k in report["failed"]) + " (tracebacks in the JSON report)")
    if plot_path:
        rel = os.path.relpath(plot_path, doc_path.parent)
        lines += ["", f"![steps per second against parallel environments]({rel})"]
    for name, body in sections.items():
        lines += ["", f"## {name}", "", body]
    if not gpu:
        gpu_report = json.loads(GPU_REPORT.read_text()) if GPU_REPORT.exists() else None
        lines += ["", "## GPU", "", gpu_rows_markdown(gpu_report)]
    return "\n".join(lines) + "\n"


# The GPU figures issue 23 asks for, and how each is measured; a CPU report fills them from the GPU report, if any.
GPU_REPORT = Path(__file__).resolve().parent.parent / "docs" / "results" / "gpu" / "benchmarks.json"
GPU_MARKDOWN = "docs/benchmarks-gpu.md"
GPU_FIGURES = [
    ("env steps/s against gymnax CartPole, 4,096 / 65,536 / 262,144 envs",
     "`python scripts/benchmark.py env --envs 4096,65536,262144`"),
    ("PPO steps/s, 4,096 and 65,536 envs", "`python scripts/benchmark.py train --envs 4096,65536`"),
    ("hybrid with the mock advisor, 4,096 envs: prompts/s, coverage, ratio to RL-only",
     "`python scripts/benchmark.py hybrid --envs 4096`"),
    ("hybrid with a Phi-3-mini-architecture model, random weights, bf16 score mode (and int4), 4,096 envs",
     "`python scripts/benchmark.py phi3`"),
    ("one advisor-learning (QLoRA) round on that model", "`python scripts/benchmark.py phi3`"),
]


def gpu_figures(rows: list[dict]) -> list[str]:
    """GPU_FIGURES' values from a GPU report's results, in GPU_FIGURES' order ('not measured' where absent)."""
    def of(suite, case=None):
        return [r for r in rows if r.get("suite") == suite and (case is None or r.get("case") == case)]

    def millions(x):
        return f"{x / 1e6:,.1f}M"

    env = sorted(of("env"), key=lambda r: r["envs"])
    train = sorted((r for r in of("train", "update") if "steps_per_s" in r), key=lambda r: r["envs"])
    hybrid = sorted(of("hybrid"), key=lambda r: r["envs"])
    score, learning, phi3_hybrid = of("phi3", "score"), of("phi3", "learning"), of("phi3", "hybrid")
    best = {}
    for r in score:  # each quantization's fastest micro-batch
        if r["quantize"] not in best or r["prompts_per_s"] > best[r["quantize"]]["prompts_per_s"]:
            best[r["quantize"]] = r
    names = {"none": "bf16", "int8": "int8", "int4": "int4"}
    values = [
        " / ".join(f"{millions(r['steps_per_s'])} (CartPole {millions(r['baseline_steps_per_s'])})" for r in env),
        " / ".join(f"{millions(r['steps_per_s'])} at {r['envs']:,}" for r in train),
        " / ".join(f"{r['ratio']:.2f} of RL-only at {r['envs']:,} envs ({r['coverage']:.1%} advised)" for r in hybrid),
        "; ".join([", ".join(f"score {names[q]} {r['prompts_per_s']:,.0f} prompts/s (micro-batch {r['micro_batch']})"
                             for q, r in best.items())]
                  + [f"training at {r['envs']:,} envs, {names[r['quantize']]}: {r['ratio']:.2f} of RL-only, "
                     f"{r['coverage']:.2%} advised" for r in phi3_hybrid]),
        " / ".join(f"{names[r['quantize']]}: {r['round_s']:.0f} s ({r['steps']} steps of {r['batch_size']}, "
                   f"{r['train_examples'] + r['val_examples']:,} examples)" for r in learning),
    ]
    return [v or "not measured" for v in values]


def gpu_rows_markdown(gpu_report: dict | None = None) -> str:
    """The GPU section of a report made on a CPU: the GPU report's headline figures where one was measured
    (GPU_REPORT), else every figure left empty, never estimated."""
    if gpu_report is None:
        intro = ("No GPU was at hand for this report, so these rows are empty; a run of the same commands on a GPU "
                 "machine fills them (each command prints the JAX backend and devices first).")
        values = ["not measured"] * len(GPU_FIGURES)
    else:
        intro = (f"Measured on {gpu_report['machine']['jax_devices'][0]}, the last command finished "
                 f"{gpu_report['run']['finished']}; [{GPU_MARKDOWN}]({GPU_MARKDOWN}) has every table, the commands "
                 "and what the figures mean.")
        values = gpu_figures(gpu_report["results"])
    return "\n".join([intro, "", "| figure | value | command |", "|---|---|---|",
                      *(f"| {figure} | {value} | {how} |" for (figure, how), value in zip(GPU_FIGURES, values))])


def merged_report(reports: list[dict]) -> dict:
    """One report of several made on one machine (one command each): their results in order, every command run."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    devices = {tuple(r["machine"]["jax_devices"]) for r in reports}
    if len(devices) > 1:
        raise ValueError(f"the reports were made on different devices: {sorted(devices)}")
    return {
        **first,
        "run": {"commands": [r["run"]["command"] for r in reports],
                "wall_minutes": sum(r["run"]["wall_minutes"] for r in reports),
                "finished": max(r["run"]["finished"] for r in reports),
                "load_avg_start": first["run"]["load_avg_start"], "load_avg_end": reports[-1]["run"]["load_avg_end"]},
        "skipped": {k: v for r in reports for k, v in r.get("skipped", {}).items()},
        "failed": {k: v for r in reports for k, v in r.get("failed", {}).items()},
        "results": [row for r in reports for row in r["results"]],
    }  # fmt: skip


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))


def rendered_sections(report: dict) -> dict[str, str]:
    """Each suite's section of a saved report, rendered again by the suite's current `markdown()`."""
    sections = {}
    for name in SUITES:
        rows = [r for r in report["results"] if r.get("suite") == name]
        if name in report.get("skipped", {}):
            sections[name] = f"Skipped: {report['skipped'][name]}"
        elif name in report.get("failed", {}):
            sections[name] = "Failed (traceback in the JSON report)"
        elif rows:
            module, why_not = import_suite(name)
            sections[name] = suite_markdown(module, rows) if module else markdown_table(rows)
    return sections


def write_outputs(report: dict, sections: dict[str, str], plot_path: Path | None, markdown_path: Path | None) -> None:
    if plot_path:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        machine = report["machine"]
        title = f"{machine['jax_devices'][0]} · {machine['cpu']}, {machine['cores']} cores · load avg at start {report['run']['load_avg_start'][0]}"
        plot(report["results"], plot_path, title)
        print(f"wrote {plot_path}", file=sys.stderr)
    if markdown_path:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(report_markdown(report, sections, plot_path, markdown_path))
        print(f"wrote {markdown_path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """scripts/benchmark.py: runs the named suites (or re-renders a saved report); 1 when a suite failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from agents.command_line import CommandParser

    parser = CommandParser(description=__doc__)
    parser.add_argument("suites", nargs="*", metavar="SUITE",  # checked below: choices reject an empty list
                        help=f"one or more of {', '.join(SUITES)}; `all` runs every suite")  # fmt: skip
    parser.add_argument("--envs", type=str, default=None, help="comma-separated env counts to sweep, e.g. 1024,4096")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions: under a minute a suite")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions after the warm-up (default 5, quick 2)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here (after every suite)")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of steps/s against env count here")
    parser.add_argument("--markdown", type=Path, default=None, help="write a whole Markdown report here")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None, metavar="PATH",
                        help="measure nothing: write --markdown / --plot from reports --json wrote earlier (several: "
                             "one report of their results, e.g. suites run one command each on the same machine)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.suites if name not in [*SUITES, "all"]]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join([*SUITES, 'all'])}")
    if bool(args.suites) == bool(args.from_json):
        parser.error("name the suites to run, or give --from-json to re-render a saved report")
    if args.from_json:
        if not (args.markdown or args.plot or args.json):
            parser.error("--from-json writes --markdown, --plot and/or --json (the reports merged); give at least one")
        reports = []
        for path in args.from_json:
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError) as err:
                parser.error(f"--from-json {path}: {err}")
        try:
            report = merged_report(reports)
        except ValueError as err:
            parser.error(f"--from-json: {err}")
        if args.json:
            write_json(args.json, report)
            print(f"wrote {args.json}", file=sys.stderr)
        write_outputs(report, rendered_sections(report), args.plot, args.markdown)
        return 0

    envs = [int(x) for x in args.envs.split(",")] if args.envs else None
    if envs and any(n < 1 for n in envs):
        parser.error("--envs takes positive integers")
    if args.reps is not None and args.reps < 1:
        parser.error("--reps takes a positive integer")
    opts = BenchOptions(envs=envs, quick=args.quick, reps=args.reps or (2 if args.quick else 5))
    names = list(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))

    from agents.devices.parallel import print_banner

    print_banner()  # the JAX backend and devices every figure below was measured on
    started = time.perf_counter()
    report = {
        "machine": machine_facts(),
        "run": {"command": shlex.join(["python", "scripts/benchmark.py", *argv]), "load_avg_start": load_average()},
        "options": vars(opts),
        "skipped": {},
        "failed": {},
        "results": [],
    }
    sections: dict[str, str] = {}
    for name in names:
        module, why_not = import_suite(name)
        if module is None:
            print(f"suite {name}: SKIPPED, {why_not}", file=sys.stderr, flush=True)
            report["skipped"][name] = why_not
            sections[name] = f"Skipped: {why_not}"
            continue
        print(f"running suite {name} ...", file=sys.stderr, flush=True)
        try:
            rows = module.run(opts)
        except BenchInputError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except Exception:
            if len(names) == 1:
                raise
            # One broken suite must not throw away a long sweep: report it, go on, exit non-zero at the end.
            report["failed"][name] = traceback.format_exc()
            print(f"suite {name}: FAILED\n{report['failed'][name]}", file=sys.stderr, flush=True)
            sections[name] = f"Failed: `{traceback.format_exc(limit=0).strip()}` (traceback in the JSON report)"
            continue
        sections[name] = suite_markdown(module, rows)
        print(f"\n### {name}\n\n{sections[name]}\n", flush=True)
        report["results"] += rows
        if args.json:
            write_json(args.json, report)  # a long sweep keeps what it measured if a later suite fails

    report["run"].update(
        load_avg_end=load_average(),
        wall_minutes=(time.perf_counter() - started) / 60,
        finished=datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    )
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    write_outputs(report, sections, args.plot, args.markdown)
    if report["failed"]:
        print(f"failed suites: {', '.join(report['failed'])}", file=sys.stderr)
        return 1
    return 0
