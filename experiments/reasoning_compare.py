r"""Does thinking change the advice? Score mode against reason-then-score (llm_sidecar.reasoning: a thought, then
the action labels scored after it) for the embedded SmolLM2 on the headlines preset (synthetic:headlines), per
seed:

  - direction accuracy on held-out prompts: `--prompts` flat-position prompts with a synthetic:headlines headline
    (half bullish, half bearish; experiments/lora_probe.py's prompts, fresh draws per seed, only those on the LoRA
    learner's held-out side), scored right when the top action is BUY after bullish and SELL after bearish news,
    and among the prompts whose top action is BUY or SELL (`called`);
  - LLM-only P&L: the advisor alone (the `llm_only` ablation walk: its top action, HOLD where there is none) on a
    `--walk-bars` window of the validation and test splits, the seed picking the window (seed s: the s-th window
    from the split's start), every query reasoned in the reasoned arm;
  - prompts/s of each arm (the direction prompts, in batches of `--batch`).

The advisor is frozen (the base model) unless `--adapter` names a learned LoRA adapter (e.g. one saved by
experiments/lora_headlines.py), which is then compared the same way. Intervals: percentile bootstrap (experiments/
fusion.bootstrap) over the pooled held-out prompts for accuracy, over the seeds (windows) for P&L.

    python scripts/advisor_learning/reasoning_compare.py --seeds 0 1 2 --prompts 64 --tokens 48 --walk-bars 600 \
        --json docs/results/reasoning_compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ARMS = ("score", "reasoned")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/headlines_lora.yaml",
                    help="the headlines preset with the embedded SmolLM2 (default: %(default)s)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    ap.add_argument("--prompts", type=int, default=64, help="held-out direction prompts per seed (default: 64)")
    ap.add_argument("--tokens", type=int, default=48, help="the reasoning budget: tokens per thought (default: 48)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per batch for the direction prompts (default: 16)")
    ap.add_argument("--walk-bars", type=int, default=600,
                    help="bars per LLM-only walk window; 0 = no walks (default: %(default)s)")
    ap.add_argument("--splits", nargs="*", default=["val", "test"], choices=["val", "test"], help="walked splits")
    ap.add_argument("--adapter", default=None, help="a learned LoRA adapter to compare as well (default: frozen only)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1; the CPU is shared)")
    ap.add_argument("--json", default="docs/results/reasoning_compare.json", help="results file (default: %(default)s)")
    args = ap.parse_args(argv)
    for flag in ("prompts", "tokens", "batch", "threads"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} must be at least 1")
    if args.walk_bars < 0:
        raise SystemExit("--walk-bars must be >= 0")
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").exists():
        raise SystemExit(f"--adapter {args.adapter}: not a peft adapter directory (no adapter_config.json)")
    return args


def held_out_prompts(renderer, n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """`n` flat-position headline prompts on the learner's held-out side (bullish and bearish alternating)."""
    from experiments.lora_probe import flat_headline_prompts
    from llm_sidecar.learning import held_out

    prompts, bull = flat_headline_prompts(renderer, 12 * n, np.random.default_rng(1000 + seed), fields_seed=2000 + seed)
    keep = np.array([held_out(p, 0.2) for p in prompts])
    chosen = np.concatenate([np.flatnonzero(keep & bull)[: (n + 1) // 2], np.flatnonzero(keep & ~bull)[: n // 2]])
    if len(chosen) < n:
        raise SystemExit(f"seed {seed}: only {len(chosen)} held-out prompts of {n}")
    return [prompts[i] for i in chosen], bull[chosen]


def direction(renderer, reasoning: dict, adapter: str | None, prompts: list[str], bull: np.ndarray,
              batch: int) -> dict[str, dict]:
    """Each arm's per-prompt correctness, its share of BUY/SELL calls, prompts/s and (reasoned) thought parse rate."""
    from bridge.protocol import BUY, SELL
    from experiments.lora_probe import smollm2
    from llm_sidecar.reasoning import Reasoner

    backend = smollm2(renderer, adapter)
    reasoner = Reasoner(backend, reasoning)
    out = {}
    for arm, answer in (("score", backend.advise), ("reasoned", reasoner.think)):
        answer(prompts[:2])  # warm-up
        t0 = time.perf_counter()
        parts = [answer(prompts[i : i + batch]) for i in range(0, len(prompts), batch)]
        elapsed = time.perf_counter() - t0
        top = np.concatenate([p.probs for p in parts]).argmax(1)
        right = np.where(bull, top == BUY, top == SELL)
        called = (top == BUY) | (top == SELL)
        text_ok = [p.text_ok for p in parts if p.text_ok is not None]
        out[arm] = {"right": right.astype(float).tolist(), "called": called.tolist(),
                    "prompts_per_s": len(prompts) / elapsed, "load_avg_1min": os.getloadavg()[0],
                    "thought_parse_rate": float(np.concatenate(text_ok).mean()) if text_ok else None,
                    "top_counts": np.bincount(top, minlength=6).tolist()}
    return out


def walk_config(args: argparse.Namespace, arm: str, prompts_file: str):
    """The preset with the frozen (or given) advisor, no learning; the reasoned arm thinks at every query."""
    from agents.config import load_config

    overrides = ["hybrid.learning.enabled=false", f"hybrid.link.prompts={prompts_file}",
                 f"hybrid.sidecar.threads={args.threads}", f"hybrid.sidecar.adapter={args.adapter or ''}"]
    if arm == "reasoned":  # every key asked is answered with a thought
        overrides += ["hybrid.reasoning.enabled=true"]
    return load_config(args.config, overrides)


def walks(args: argparse.Namespace, prompts_file: str) -> dict[str, dict]:
    """LLM-only net P&L per arm, split and seed window. The policy's weights are an untrained init: with the advice
    alone acting (HOLD where there is none) they only pick which flat bars are queried, alike in both arms."""
    import jax

    from agents.advice.acting import make_acting
    from agents.evaluation.advised_walk import ABLATIONS, LLM_ONLY, AdvisedWalker, advised_summary
    from agents.rl.ppo import make_train
    from agents.training.env_setup import make_env_setup

    out: dict[str, dict] = {}
    for arm in ARMS:
        cfg = walk_config(args, arm, prompts_file)
        setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
        ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                         num_envs=cfg.num_envs, num_updates=cfg.num_updates)
        state = ppo.init(jax.random.PRNGKey(0), setup.params)
        walker = AdvisedWalker(cfg.hybrid, cfg.llm, cfg.data, ppo, setup.env, setup.market,
                               normalize_obs=cfg.ppo.normalize_obs, greedy=cfg.checkpoint.eval_deterministic)
        try:
            for split in args.splits:
                start, end = setup.market.split_range(split)
                for seed in args.seeds:
                    window = (start + seed * args.walk_bars, start + (seed + 1) * args.walk_bars)
                    if window[1] > end:
                        raise SystemExit(f"{split}: {len(args.seeds)} windows of {args.walk_bars} bars do not fit in "
                                         f"its {end - start} bars; lower --walk-bars")
                    t0 = time.perf_counter()
                    trace = walker.walk(state.params, state.obs_norm, window, jax.random.PRNGKey(seed),
                                        **ABLATIONS[LLM_ONLY])
                    summary = advised_summary(trace, setup.market.timestamps, cfg.env.prop_firm,
                                              setup.market.sessions.day)
                    figures = {"window": list(window), "net_pnl": summary["net_pnl"], "trades": summary["trades"],
                               "walk_s": time.perf_counter() - t0, "load_avg_1min": os.getloadavg()[0],
                               **{k: v for k, v in summary.items() if k.startswith("llm_")}}
                    out.setdefault(arm, {}).setdefault(split, {})[seed] = figures
                    print(f"walk {arm} {split} seed {seed}: net P&L {figures['net_pnl']:,.0f}, "
                          f"{figures['trades']:.0f} trades, {figures['walk_s']:.0f} s", flush=True)
        finally:
            walker.close()
    return out


def summarize(args: argparse.Namespace, results: dict) -> dict:
    from experiments.fusion import bootstrap

    summary: dict = {}
    for advisor, per_seed in results["direction"].items():
        for arm in ARMS:
            right = [x for seed in args.seeds for x in per_seed[seed][arm]["right"]]
            called = [bool(c) for seed in args.seeds for c in per_seed[seed][arm]["called"]]
            parse = [per_seed[seed][arm]["thought_parse_rate"] for seed in args.seeds]
            summary[f"{advisor}/{arm}"] = {
                "direction_accuracy": bootstrap(right),
                "called_accuracy": bootstrap([r for r, c in zip(right, called) if c]),
                "called_share": float(np.mean(called)),
                "per_seed_accuracy": [float(np.mean(per_seed[seed][arm]["right"])) for seed in args.seeds],
                "prompts_per_s": bootstrap([per_seed[seed][arm]["prompts_per_s"] for seed in args.seeds]),
                "thought_parse_rate": None if parse[0] is None else float(np.mean(parse)),
            }
    for arm, splits in results.get("walks", {}).items():
        for split, per_seed in splits.items():
            summary[f"{results['advisor_for_walks']}/{arm}"][f"{split}_net_pnl"] = bootstrap(
                [per_seed[seed]["net_pnl"] for seed in args.seeds])
            summary[f"{results['advisor_for_walks']}/{arm}"][f"{split}_trades"] = float(
                np.mean([per_seed[seed]["trades"] for seed in args.seeds]))
    return summary


def _cell(b: dict, money: bool = False) -> str:
    if b.get("mean") is None:
        return "—"
    fmt = (lambda x: f"{x:,.0f}") if money else (lambda x: f"{x:.3f}")
    return f"{fmt(b['mean'])} [{fmt(b['ci95'][0])}, {fmt(b['ci95'][1])}]"


def table(args: argparse.Namespace, summary: dict) -> str:
    head = ["advisor / arm", "direction accuracy [95% CI]", "accuracy of BUY/SELL calls (share called)",
            *[f"LLM-only {s} P&L [95% CI]" for s in args.splits], "prompts/s", "thought parse rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summary.items():
        cells = [name, _cell(s["direction_accuracy"]),
                 f"{_cell(s['called_accuracy'])} ({s['called_share']:.0%})",
                 *[_cell(s[f"{split}_net_pnl"], money=True) if f"{split}_net_pnl" in s else "—"
                   for split in args.splits],
                 f"{s['prompts_per_s']['mean']:.2f}",
                 "—" if s["thought_parse_rate"] is None else f"{s['thought_parse_rate']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from bridge import PromptRenderer
    from bridge.prompts import DEFAULT_PROMPTS_PATH

    torch.set_num_threads(args.threads)
    renderer = PromptRenderer.from_yaml()
    reasoning = {**renderer.reasoning, "max_new_tokens": args.tokens}
    advisors = {"frozen": None, **({"learned": args.adapter} if args.adapter else {})}
    results: dict = {"args": vars(args), "load_avg_1min_start": os.getloadavg()[0], "direction": {}}
    t0 = time.perf_counter()
    for name, adapter in advisors.items():
        per_seed = {}
        for seed in args.seeds:
            prompts, bull = held_out_prompts(renderer, args.prompts, seed)
            per_seed[seed] = direction(renderer, reasoning, adapter, prompts, bull, args.batch)
            print(f"{name} seed {seed}: " + ", ".join(
                f"{arm} accuracy {np.mean(r['right']):.3f} at {r['prompts_per_s']:.2f} prompts/s"
                for arm, r in per_seed[seed].items()), flush=True)
        results["direction"][name] = per_seed
    if args.walk_bars:
        data = yaml.safe_load(Path(DEFAULT_PROMPTS_PATH).read_text())
        data["reasoning"]["max_new_tokens"] = args.tokens
        with tempfile.TemporaryDirectory() as tmp:
            prompts_file = str(Path(tmp) / "prompts.yaml")
            Path(prompts_file).write_text(yaml.safe_dump(data, sort_keys=False))
            results["advisor_for_walks"] = "learned" if args.adapter else "frozen"
            results["walks"] = walks(args, prompts_file)
    results["wall_s"] = time.perf_counter() - t0
    results["summary"] = summarize(args, results)
    results["table"] = table(args, results["summary"])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(results["table"])
    return 0
