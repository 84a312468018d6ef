"""The learned trust on a small version of docs/advisor.md's fusion experiment (configs/headlines.yaml): the trust in an
advisor that reads the headline rises and the fused agent beats the policy alone on validation; the trust in an
advisor that answers at random falls and the agent ends near the policy alone. Minutes of training:
`pytest -m slow tests/test_fusion_learning.py`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.config import load_config
from agents.training.comparison import final_comparison
from agents.training.loop import train

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["num_envs=256", "total_steps=1000000", "log.progress=false", "log.tensorboard=false",
         "checkpoint.eval_every_updates=10", "checkpoint.every_updates=100"]


def run(tmp_path: Path, name: str, overrides: list[str]) -> tuple[dict, list[float]]:
    cfg = load_config(ROOT / "configs" / "headlines.yaml", SMALL + overrides)
    result = train(cfg, tmp_path / name)
    summary = final_comparison(cfg, result.run_dir, result.setup)
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    trust = [m["mean_trust"] for m in map(json.loads, lines) if "mean_trust" in m]
    return summary, trust


def held_out(summary: dict) -> float:
    """Net P&L of the best-on-validation checkpoint on the test split: out of sample for model selection."""
    return summary["test"]["agent_best"]["score"]


def best_val(summary: dict) -> float:
    return summary["val"]["agent_best"]["score"]


@pytest.mark.slow
def test_trust_rises_for_an_informed_advisor_and_falls_for_a_random_one(tmp_path):
    rl_only, _ = run(tmp_path, "rl_only", ["llm=none"])
    informed, informed_trust = run(tmp_path, "informed", [])
    random, random_trust = run(tmp_path, "random", ["hybrid.mock.answers=random"])

    early, late = slice(0, 5), slice(-5, None)
    assert np.mean(informed_trust[late]) > np.mean(informed_trust[early]) + 0.1  # the news reader earns trust ...
    assert np.mean(random_trust[late]) < np.mean(random_trust[early])  # ... a coin-flipping advisor loses it
    assert best_val(informed) > best_val(rl_only)  # and the informed advice is used to profit
    # Ignoring a coin-flipping advisor costs little: the agent stays near the policy alone.
    assert held_out(random) > held_out(rl_only) - 0.5 * abs(held_out(rl_only)) - 2_000
    # The random advice alone loses money where the informed advice alone does not.
    assert informed["test"]["ablation_llm_only"]["score"] > max(0.0, random["test"]["ablation_llm_only"]["score"])
