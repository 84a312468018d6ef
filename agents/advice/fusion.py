"""Fusing the policy with the LLM's advice, on distributions.

- `learned`: a small Flax network reads fusion features and outputs a trust gate g in (0, 1); the acting
  distribution is (1 − g)·π_rl + g·π_llm over the valid actions (g = 0 without valid advice). PPO trains it
  through the exact log-probability of the action sampled from that mixture.
- `rules`: the seeds' priority rules pick between the policy's sample and the advice's action; a step where
  the rules override the sample carries no policy gradient (the policy did not choose it).
- `switch`: valid advice acts (its most probable valid action) and the policy acts everywhere else; nothing is
  learned about trust. With an advisor that passes where it has no view, each part acts where it knows something.
  As in `rules`, a step the advice decided carries no policy gradient.
- `none`: the policy alone.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from agents.advice.table import AdviceView
from bridge.protocol import HOLD

# The trust gate's logit before training, the same for every input: sigmoid(−2) ≈ 0.12, trusting the advice little
GATE_INIT_LOGIT = -2.0


class TrustGate(nn.Module):
    """Fusion features [..., F] → trust gate g [...] in (0, 1); before training sigmoid(GATE_INIT_LOGIT) everywhere."""

    hidden: int = 64

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        x = nn.tanh(nn.Dense(self.hidden)(features))
        x = nn.tanh(nn.Dense(self.hidden)(x))
        logit = nn.Dense(1, kernel_init=nn.initializers.zeros, bias_init=nn.initializers.constant(GATE_INIT_LOGIT))(x)
        return jax.nn.sigmoid(logit[..., 0])


def masked_advice_probs(advice_probs: jax.Array, mask: jax.Array) -> jax.Array:
    """The advice restricted to valid actions and renormalised; all-invalid advice becomes HOLD."""
    p = jnp.where(mask, advice_probs, 0.0)
    total = p.sum(-1, keepdims=True)
    hold = jax.nn.one_hot(HOLD, p.shape[-1])
    return jnp.where(total > 1e-8, p / jnp.maximum(total, 1e-8), hold)


def fusion_features(pi_rl: jax.Array, advice: AdviceView, context: jax.Array) -> jax.Array:
    """The seeds' fusion inputs: policy probabilities and confidence, the advice's probabilities and
    (decayed) confidence, agreement, age, and market/account context (regime, volatility, win rate,
    consecutive losses, time of day, position) taken from the observation."""
    rl_conf = pi_rl.max(-1)
    agree = (jnp.argmax(pi_rl, -1) == jnp.argmax(advice.probs, -1)) & advice.valid
    return jnp.concatenate(
        [
            pi_rl,
            rl_conf[..., None],
            advice.probs * advice.valid[..., None],
            advice.confidence[..., None],
            agree[..., None].astype(jnp.float32),
            advice.age_frac[..., None],
            advice.valid[..., None].astype(jnp.float32),
            context,
        ],
        axis=-1,
    )


def mix(pi_rl: jax.Array, pi_llm: jax.Array, gate: jax.Array, mask: jax.Array) -> jax.Array:
    """(1 − g)·π_rl + g·π_llm, masked and renormalised; both inputs are distributions over valid actions."""
    p = (1.0 - gate[..., None]) * pi_rl + gate[..., None] * pi_llm
    p = jnp.where(mask, p, 0.0)
    return p / jnp.maximum(p.sum(-1, keepdims=True), 1e-12)


def rules_action(
    rl_action: jax.Array,
    pi_rl: jax.Array,
    advice: AdviceView,
    mask: jax.Array,
    llm_weight: float = 0.3,
) -> jax.Array:
    """The seeds' priorities, vectorised: agreement → take it; RL confident (> 0.9) and LLM not (≤ 0.6) →
    RL; LLM confident and RL not → LLM; both below 0.5 → HOLD; otherwise the larger of the weighted
    confidences (1 − llm_weight)·rl vs llm_weight·llm. An invalid choice falls back to the policy's sample."""
    rl_conf = pi_rl.max(-1)
    llm_conf = advice.confidence
    llm_action = jnp.argmax(advice.probs, -1)
    weighted_llm = llm_weight * llm_conf > (1.0 - llm_weight) * rl_conf
    chosen = jnp.where(
        llm_action == rl_action,
        rl_action,
        jnp.where(
            (rl_conf > 0.9) & (llm_conf <= 0.6),
            rl_action,
            jnp.where(
                (llm_conf > 0.9) & (rl_conf <= 0.6),
                llm_action,
                jnp.where((rl_conf < 0.5) & (llm_conf < 0.5), HOLD, jnp.where(weighted_llm, llm_action, rl_action)),
            ),
        ),
    )
    chosen = jnp.where(advice.valid, chosen, rl_action)
    valid_choice = jnp.take_along_axis(mask, chosen[..., None], -1)[..., 0]
    return jnp.where(valid_choice, chosen, rl_action)
