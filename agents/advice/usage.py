"""How an agent used its advice: coverage, agreement, overrides, trust and vetoes. The acting step
(agents.advice.acting.HybridActing.act) sums its figures per step (`stats`); `advice_metrics` turns sums into
rates. Training sums a rollout's steps, evaluation a walk's (the walk's trace keeps each step's stats under
`STAT_PREFIX`), so both report the same figures under the same names."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from agents.advice.risk_veto import RULES

# name -> what it is: the figures of advice_metrics (training logs, evaluation tables and JSON)
ADVICE_METRICS: dict[str, str] = {
    "advice_coverage": "share of decisions made with valid advice (from any version of the advisor)",
    "advice_coverage_current": "share of decisions made with valid advice from the advisor's current version",
    "advice_confidence": "mean confidence of the advice in force (decayed with its age) over advised decisions",
    "agreement": "share of advised decisions where the advice names the policy's most probable action",
    "override_rate": "share of decisions whose action the advice changed",
    "mean_trust": "mean trust gate g over advised decisions (learned fusion)",
    "veto_rate": "share of decisions where the veto blocked an otherwise valid action",
    "wait_rate": "share of decisions where a flat account waited for the answer in flight instead of entering",
    "bracket_kept_rate": "share of decisions where a trade entered on advice kept its bracket: its stop could not move",
    "bound_rate": "share of decisions where the env was bound to its advice (hybrid.query.bind_on)",
    **{f"vetoes_{rule}": f"times the {rule.replace('_', ' ')} rule started a veto" for rule in RULES},
}
STAT_PREFIX = "stat_"  # a walk trace's columns of the acting step's per-step stats


def advice_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    """Every ADVICE_METRICS figure from the acting step's stats summed over the decisions of interest."""
    decisions = max(float(sums["decisions"]), 1.0)
    advised = max(float(sums["with_advice"]), 1.0)
    return {
        "advice_coverage": float(sums["with_advice"]) / decisions,
        "advice_coverage_current": float(sums.get("with_current_advice", 0.0)) / decisions,
        "advice_confidence": float(sums["advice_confidence"]) / advised,
        "agreement": float(sums["agreement"]) / advised,
        "override_rate": float(sums["overrides"]) / decisions,
        "mean_trust": float(sums["trust"]) / advised,
        "veto_rate": float(sums["vetoed"]) / decisions,
        "wait_rate": float(sums["waited"]) / decisions,
        "bracket_kept_rate": float(sums["bracket_kept"]) / decisions,
        "bound_rate": float(sums["bound"]) / decisions,
        **{f"vetoes_{rule}": float(sums[f"veto_fired_{rule}"]) for rule in RULES},
    }


def walk_advice_metrics(trace: Mapping[str, np.ndarray]) -> dict[str, float]:
    """advice_metrics of one advised walk: its trace's per-step stats, summed."""
    return advice_metrics({k[len(STAT_PREFIX):]: np.asarray(v, np.float64).sum()
                           for k, v in trace.items() if k.startswith(STAT_PREFIX)})
