"""The end-of-run comparison: the best and latest checkpoints (and a hybrid run's ablations) against the env's
baselines on the validation and test splits, written to RUN_DIR/summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from tqdm import tqdm

from agents.advice.acting import make_acting
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
    agents.evaluation.advised_walk.run_ablations). Writes RUN_DIR/summary.json."""
    setup = setup or make_env_setup(cfg)
    if setup.evaluate is None:
        return {}
    ppo = make_train(cfg, setup.env, setup.params, make_acting(cfg, setup.env) if cfg.llm != "none" else None,
                     frozen_steps=frozen_steps(cfg))
    ckpt = RunCheckpoints(run_dir, cfg.checkpoint.keep)
    abstract = jax.eval_shape(ppo.init, jax.random.PRNGKey(cfg.seed), setup.params)
    agents = {"latest": ckpt.restore(abstract)}
    if ckpt.best.latest_step() is not None:
        agents["best"] = ckpt.restore(abstract, best=True)
    ckpt.close()

    key = jax.random.PRNGKey(cfg.seed + 10_000)
    summary: dict = {"score": setup.score_label, **{f"{k}_update": host["update"] for k, (_, host) in agents.items()}}
    evaluator = AgentEvaluator(cfg, ppo, setup, lambda update: checkpoint_adapter(cfg, run_dir, update),
                               log_dir=run_dir)
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
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
