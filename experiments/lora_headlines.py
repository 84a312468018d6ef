r"""Does the advisor get better by learning from outcomes? For each seed: a hybrid run on synthetic:headlines
(configs/headlines_lora.yaml) in which the embedded SmolLM2 answers in score mode and the market's move after each
answered query goes to the LoRA learner; then the advisor alone (LLM-only: its top action, HOLD where there is
no advice) walks the validation split twice, frozen (the base model) and with the adapter saved beside the run's
final checkpoint, and both answer the direction probe's bullish and bearish headlines (experiments/lora_probe.py).

    python scripts/advisor_learning/lora_headlines_experiment.py --seeds 0 1 2 --splits val test
    python scripts/advisor_learning/lora_headlines_experiment.py --seeds 0 --set hybrid.learning.lr=1e-4

Writes OUT/results.json (per seed: both walks' figures, the learning rounds' held-out figures, the probe's) and
OUT/table.md; the runs are under OUT/runs/seed<S>. The schedule is short for a CPU: `--updates` PPO updates with
one learning round at the end (hybrid.learning.every_updates = updates, finished before the final checkpoint);
a GPU can afford the config's own schedule (--updates 32 --every 4).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from agents.config import load_config

ROUND_FIGURES = ("train_examples", "val_examples", "steps", "adopted", "val_loss_before", "val_loss", "kl_to_base",
                 "direction_accuracy_base", "direction_accuracy", "learn_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/headlines_lora.yaml", help="the run's config (default: %(default)s)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default: 0 1 2)")
    ap.add_argument("--updates", type=int, default=6, help="PPO updates per run (default: %(default)s)")
    ap.add_argument("--every", type=int, help="updates between learning rounds (default: --updates, one round)")
    ap.add_argument("--splits", nargs="+", default=["val"], choices=["val", "test"],
                    help="splits the advisor alone walks, frozen and learned (default: val)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key, as in train.py; repeatable")
    ap.add_argument("--out", default="results/lora_headlines", help="output folder (default: %(default)s)")
    ap.add_argument("--save-adapter", metavar="DIR",
                    help="copy the learned adapter (one seed) to DIR, e.g. adapters/smollm2-headlines (the one shipped)")
    return ap.parse_args(argv)


def last_rounds(run_dir: Path) -> list[dict]:
    """The figures of every finished learning round, from the run's metrics.jsonl."""
    rounds = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "lora_steps" in m:
            rounds.append({"update": m["update"], **{k: m.get(f"lora_{k}") for k in ROUND_FIGURES}})
    return rounds


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> dict:
    import jax

    from agents.advice.acting import make_acting
    from agents.rl.ppo import make_train
    from agents.runs.adapters import checkpoint_adapter
    from agents.training.loop import train
    from agents.training.validation import AgentEvaluator

    overrides = [f"seed={seed}", "checkpoint.eval_every_updates=0",
                 f"hybrid.learning.every_updates={args.every or args.updates}", *args.overrides]
    steps_per_update = load_config(args.config, overrides).steps_per_update
    cfg = load_config(args.config, [*overrides, f"total_steps={args.updates * steps_per_update}"])
    run_dir = out / "runs" / f"seed{seed}"
    t0 = time.perf_counter()
    result = train(cfg, run_dir)
    train_s = time.perf_counter() - t0
    if result.interrupted:
        raise SystemExit(f"seed {seed}: training was interrupted")
    learned = checkpoint_adapter(cfg.hybrid, run_dir, result.update)
    if not last_rounds(run_dir):  # the adapter is the base model's: frozen and learned would compare equal
        buffer = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1]).get("lora_buffer", 0)
        print(f"WARNING: seed {seed}: no learning round finished ({buffer:.0f} examples gathered, "
              f"hybrid.learning.min_examples {cfg.hybrid.learning.min_examples}): use more --updates, or "
              "hybrid.link.latency=strict so that every query is answered", flush=True)
    ppo = make_train(cfg.ppo, cfg.network, result.setup.env, result.setup.params,
                     make_acting(cfg.hybrid, result.setup.env), num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    evaluator = AgentEvaluator(ppo, result.setup, cfg.hybrid, cfg.llm, cfg.env, cfg.data, lambda update: learned,
                               normalize_obs=cfg.ppo.normalize_obs, greedy=cfg.checkpoint.eval_deterministic,
                               progress=cfg.log.progress)
    walks: dict = {}
    try:
        for split in args.splits:
            key = jax.random.PRNGKey(seed + 10_000)
            for name, ablation in (("frozen", "llm_only_frozen"), ("learned", "llm_only")):
                t = time.perf_counter()
                figures = evaluator(result.state, split, key, ablation)
                figures["walk_s"] = time.perf_counter() - t
                walks[f"{split}_{name}"] = figures
                print(f"seed {seed} {split} {name}: net P&L {figures['net_pnl']:,.0f}, {figures['trades']:.0f} trades, "
                      f"{figures['walk_s']:.0f} s", flush=True)
    finally:
        evaluator.close()
    return {"seed": seed, "train_s": train_s, "adapter": learned, "rounds": last_rounds(run_dir), "walks": walks,
            "outcome_agreement": outcome_agreement(learned), "probe": direction_probe(learned)}


def outcome_agreement(adapter: str | None) -> dict:
    """How much the run's outcomes could teach about the news: the share of the market moves after its answered
    prompts that went the headline's way (experiments/lora_replay.py's figure; 0.5 is no signal)."""
    from experiments.lora_replay import headline_agreement
    from llm_sidecar.learning import load_experiences

    if adapter is None:
        return {"move_share": float("nan"), "moves": 0}
    train, val = load_experiences(adapter)
    move_share, moves = headline_agreement(train + val)
    return {"move_share": move_share, "moves": moves}


def direction_probe(adapter: str | None) -> dict:
    """experiments/lora_probe.py's figures for the base model and the learned adapter: did the advisor
    learn to answer bullish and bearish headlines differently?"""
    from bridge import PromptRenderer
    from experiments.lora_probe import direction_figures, probe_prompts, score

    renderer = PromptRenderer.from_yaml()
    prompts, bull = probe_prompts(renderer)
    return {name: direction_figures(score(renderer, prompts, a), bull) for name, a in (("frozen", None), ("learned", adapter))}


def standard_error(walk: dict) -> float:
    """The walk's net P&L's standard error from its trades' spread (NaN for results saved without it)."""
    return walk.get("trade_pnl_std", float("nan")) * float(np.sqrt(walk["trades"]))


def pnl_cell(pnl: float, se: float) -> str:
    return f"{pnl:,.0f}" if np.isnan(se) else f"{pnl:,.0f} ± {se / 1000:.1f}k"


def table(results: list[dict], splits: list[str]) -> str:
    """One row per seed, then the mean over seeds of the P&L and direction accuracy columns (does learning help
    on average, not on a lucky seed)."""
    head = ["seed", "moves agreeing with the headline",
            *[f"{s} P&L frozen / learned (± standard error)" for s in splits],
            "held-out direction accuracy base → learned",
            "held-out loss before → after", "KL", "adopted",
            "probe P(BUY) bull − bear, frozen → learned", "probe top action HOLD/BUY/SELL, learned"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        rnd = r["rounds"][-1] if r["rounds"] else {}
        agreement = {"move_share": float("nan"), "moves": 0, **r.get("outcome_agreement", {})}
        cells = [str(r["seed"]), f"{agreement['move_share']:.3f} of {agreement['moves']}"]
        for s in splits:
            walks = [r["walks"][f"{s}_{name}"] for name in ("frozen", "learned")]
            cells.append(" / ".join(pnl_cell(w["net_pnl"], standard_error(w)) for w in walks))
        cells += [f"{rnd.get('direction_accuracy_base', float('nan')):.3f} → "
                  f"{rnd.get('direction_accuracy', float('nan')):.3f}",
                  f"{rnd.get('val_loss_before', float('nan')):.3f} → {rnd.get('val_loss', float('nan')):.3f}",
                  f"{rnd.get('kl_to_base', float('nan')):.3f}", str(bool(rnd.get("adopted")))]
        frozen, learned = r["probe"]["frozen"], r["probe"]["learned"]
        cells += [f"{frozen['p_buy_bull'] - frozen['p_buy_bear']:+.3f} → {learned['p_buy_bull'] - learned['p_buy_bear']:+.3f}",
                  f"{learned['top_hold']:.0%} / {learned['top_buy']:.0%} / {learned['top_sell']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    if len(results) > 1:
        def mean(values) -> float:
            return float(np.mean(list(values)))

        cells = ["mean", ""]
        for s in splits:
            # no standard error here: the frozen advisor's walks are often one and the same walk for every seed
            cells.append(f"{mean(r['walks'][f'{s}_frozen']['net_pnl'] for r in results):,.0f} / "
                         f"{mean(r['walks'][f'{s}_learned']['net_pnl'] for r in results):,.0f}")
        rounds = [r["rounds"][-1] for r in results if r["rounds"]]
        cells.append(f"{mean(r.get('direction_accuracy_base', np.nan) for r in rounds):.3f} → "
                     f"{mean(r.get('direction_accuracy', np.nan) for r in rounds):.3f}" if rounds else "")
        lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.updates < 1 or (args.every is not None and args.every < 1):
        raise SystemExit("--updates and --every must be at least 1")
    if args.save_adapter and len(args.seeds) != 1:
        raise SystemExit("--save-adapter: give one seed (--seeds S), whose adapter it saves")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        results.append(run_seed(args, seed, out))
        # written after every seed, so a stopped experiment keeps what it measured
        (out / "results.json").write_text(json.dumps({"args": vars(args), "seeds": results}, indent=2, default=str))
        (out / "table.md").write_text(table(results, args.splits))
    print(table(results, args.splits))
    if args.save_adapter:
        save_adapter(results[0]["adapter"], Path(args.save_adapter))
    return 0


def save_adapter(adapter: str | None, dest: Path) -> None:
    """The learned adapter's weights and config copied to `dest` (whole or not at all), without the experiences it
    learned from (they stay in the run folder)."""
    if adapter is None:
        raise SystemExit("--save-adapter: no learning round finished, so there is no learned adapter to save")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(adapter, tmp, ignore=shutil.ignore_patterns("experiences*"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"learned adapter saved to {dest}", flush=True)
