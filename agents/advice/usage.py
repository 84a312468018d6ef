"""How an agent used its advice: coverage, agreement, overrides, trust and vetoes, from the acting step's
per-step sums. One function serves training (the rollout's sums) and evaluation (a walk's)."""

from __future__ import annotations

import numpy as np

from agents.advice.risk_veto import RULES


def acting_metrics(stats: dict) -> dict:
    """Rates from the acting step's per-step sums (agents.acting.HybridActing stats)."""
    decisions = max(float(stats["decisions"]), 1.0)
    with_advice = max(float(stats["with_advice"]), 1.0)
    return {
        "llm_coverage": float(stats["with_advice"]) / decisions,
        "llm_advice_confidence": float(stats["advice_confidence"]) / with_advice,
        "llm_agreement": float(stats["agreement"]) / with_advice,
        "llm_override_rate": float(stats["overrides"]) / decisions,
        "llm_trust": float(stats["trust"]) / with_advice,
        "veto_rate": float(stats["veto_active"]) / decisions,
        **{f"veto_fired_{r}": float(stats[f"veto_fired_{r}"]) for r in RULES},
    }


# name -> what it is: how a hybrid walk used its advice (evaluation tables and JSON, after jaxenv.metrics.METRICS)
HYBRID_METRICS: dict[str, str] = {
    "advice_coverage": "share of decisions made with valid advice",
    "agreement": "share of advised decisions where the advice names the policy's most probable action",
    "override_rate": "share of decisions whose action the advice changed",
    "mean_trust": "mean trust gate g over advised decisions (learned fusion)",
    "veto_rate": "share of decisions where the veto blocked an otherwise valid action",
    **{f"vetoes_{rule}": f"times the {rule.replace('_', ' ')} rule started a veto" for rule in RULES},
}


def hybrid_metrics(trace: dict) -> dict[str, float]:
    """Every HYBRID_METRICS figure of one advised walk's trace."""
    valid = np.asarray(trace["advice_valid"], bool)
    n = max(len(valid), 1)
    out = {
        "advice_coverage": float(valid.sum() / n),
        "agreement": float(trace["agrees"][valid].mean()) if valid.any() else 0.0,
        "override_rate": float(np.asarray(trace["overridden"]).sum() / n),
        "mean_trust": float(trace["trust"][valid].mean()) if valid.any() else 0.0,
        "veto_rate": float(np.asarray(trace["vetoed"]).sum() / n),
    }
    out.update({f"vetoes_{rule}": float(np.asarray(trace[f"veto_fired_{rule}"]).sum()) for rule in RULES})
    return out
