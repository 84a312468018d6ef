"""The end-of-run comparison: the best and latest checkpoints (and a hybrid run's ablations) against the env's
baselines on the validation and test splits, written to RUN_DIR/summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from tqdm import tqdm

from agents.advice.acting import training_acting
from agents.config import TrainConfig
from agents.rl.ppo import make_train
from agents.runs.adapters import checkpoint_adapter
from agents.runs.checkpoints import RunCheckpoints
from agents.training.env_setup import EnvSetup, make_env_setup
from agents.training.transfer import frozen_steps
from agents.training.validation import AgentEvaluator


def final_comparison(cfg: TrainConfig, run_dir: str | Path, setup: EnvSetup | None = None) -> dict:
    """Scores the run's best and latest checkpoints against the env's baselines (flat, random-valid, ...) with the run's
    evaluator (the validation split for the trading env, which also picked the best checkpoint) and, where the
    env has one, on the held-out test split. For hybrid runs the best checkpoint's parts are scored too (RL only,
    LLM only, fused with and without veto, and LLM only from the frozen advisor when it learned:
    agents.evaluation.advised_walk.run_ablations). Writes RUN_DIR/summary.json.

    It takes the run's whole config: it rebuilds and restores the run (env, networks, checkpoints, advisor), which
    reads nearly every section, and hands each part below it its sections."""
    setup = setup or make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    if setup.evaluate is None:
        return {}
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, training_acting(cfg.hybrid, cfg.llm, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates,
                     frozen_steps=frozen_steps(cfg.ppo, cfg.transfer, cfg.steps_per_update))
    ckpt = RunCheckpoints(run_dir, cfg.checkpoint.keep)
    abstract = jax.eval_shape(ppo.init, jax.random.PRNGKey(cfg.seed), setup.params)
    agents = {"latest": ckpt.restore(abstract)}
    if ckpt.best.latest_step() is not None:
        agents["best"] = ckpt.restore(abstract, best=True)
    ckpt.close()

    key = jax.random.PRNGKey(cfg.seed + 10_000)
    summary: dict = {"score": setup.score_label, **{f"{k}_update": host["update"] for k, (_, host) in agents.items()}}
    evaluator = AgentEvaluator(ppo, setup, cfg.hybrid, cfg.llm, cfg.env, cfg.data,
                               lambda update: checkpoint_adapter(cfg.hybrid, run_dir, update), log_dir=run_dir,
                               normalize_obs=cfg.ppo.normalize_obs, greedy=cfg.checkpoint.eval_deterministic,
                               progress=cfg.log.progress)
    splits = evaluator.splits()
    ablations = evaluator.ablations
    walks = len(splits) * (len(agents) + len(ablations) + len(setup.baselines))
    # A hybrid run's walks take minutes on a CPU: a bar shows they progress.
    bar = tqdm(total=walks, desc="end-of-run comparison", unit="walk", disable=not cfg.log.progress,
               dynamic_ncols=True)

    def walked(name: str, score):
        bar.set_postfix_str(name, refresh=False)
        bar.update(1)
        return score

    try:
        for split, evaluate in splits.items():
            scores = {f"agent_{k}": walked(f"{split} {k}", evaluator(state, split, key))
                      for k, (state, _) in agents.items()}
            state = agents.get("best", agents["latest"])[0]
            scores.update({f"ablation_{name}": walked(f"{split} {name}", evaluator(state, split, key, name))
                           for name in ablations})
            scores.update({name: walked(f"{split} {name}", evaluate(baseline, (), key))
                           for name, baseline in setup.baselines.items()})
            summary[split] = scores
    finally:
        bar.close()
        evaluator.close()
    if setup.market_set is not None:
        summary["account"] = account_summary(summary, setup.market_set.symbols)
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def account_summary(summary: dict, symbols: tuple[str, ...]) -> dict:
    """An account of several instruments, on each split: the agent's (best checkpoint's, else latest's) net P&L after
    costs against flat's and the set's buy-and-hold (each instrument's move held in the agent's size, no costs: the
    gate's bar), and each instrument's figures keyed by symbol (net P&L, trades, ...)."""
    out: dict = {"symbols": list(symbols)}
    for split in ("val", "test"):
        if split not in summary:
            continue
        scores = summary[split]
        who = "agent_best" if "agent_best" in scores else "agent_latest"
        agent = scores[who]
        out[split] = {"agent": who, "net_pnl": agent["net_pnl"], "flat": scores["flat"]["net_pnl"],
                      "buy_and_hold": agent["held_pnl"], "trades": agent["trades"],
                      "instruments": agent["instruments"]}
    return out
