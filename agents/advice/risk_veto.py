"""The risk veto: a mask over actions, vectorised over envs, applied before sampling.

Rules (each can be turned off): 3+ consecutive losses; drawdown buffer below 20% of the trailing drawdown;
win rate of the last 10 trades below the bracket's break-even win rate minus a margin (`win_rate_threshold`) once
at least 5 trades exist. A firing rule blocks BUY, SELL and
ENABLE_TRAIL; HOLD is never vetoed. A veto lasts `cooldown_bars` bars or until a new session, whichever
comes first. A rule fires again only after another trade has closed, so when its condition outlives the
veto the agent is let back in rather than locked out for good.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from agents.config import VetoConfig
from jaxenv.env import BUY, ENABLE_TRAIL, SELL, EnvParams, EnvState, drawdown_threshold, recent_win_rate

RULES = ("consecutive_losses", "drawdown_buffer", "win_rate")
BLOCKED_ACTIONS = (BUY, SELL, ENABLE_TRAIL)


@struct.dataclass
class VetoState:
    until_bar: jax.Array  # [N] int32: vetoed while the env's bar is below this ...
    session: jax.Array  # [N] int32: ... and still in this session
    fired_at_trades: jax.Array  # [N, 3] int32: the env's trade count when each rule last fired (-1 never)

    @classmethod
    def create(cls, n_envs: int) -> "VetoState":
        return cls(
            until_bar=jnp.zeros(n_envs, jnp.int32),
            session=jnp.full(n_envs, -1, jnp.int32),
            fired_at_trades=jnp.full((n_envs, len(RULES)), -1, jnp.int32),
        )


def break_even_win_rate(params: EnvParams) -> jax.Array:
    """The win rate at which a stop/target bracket breaks even before costs: a win earns target, a loss costs stop."""
    return params.stop_atr_mult / (params.stop_atr_mult + params.target_atr_mult)


def win_rate_threshold(cfg: VetoConfig, params: EnvParams) -> jax.Array:
    """The win-rate rule fires below this: the break-even win rate less `win_rate_margin` (10 trades are a noisy
    estimate; a fixed 40% fired on a 1.5/3-ATR bracket that breaks even at 33% and blocked profitable entries)."""
    return break_even_win_rate(params) - cfg.win_rate_margin


def rule_conditions(cfg: VetoConfig, state: EnvState, params: EnvParams) -> jax.Array:
    """[N, 3] bool: which rules' conditions hold in each env's state."""
    buffer = (state.equity - drawdown_threshold(state.peak, params)) / params.trailing_drawdown
    win_rate = recent_win_rate(state)
    return jnp.stack(
        [
            (cfg.consecutive_losses > 0) & (state.consecutive_losses >= cfg.consecutive_losses),
            (cfg.min_drawdown_buffer > 0) & (buffer < cfg.min_drawdown_buffer),
            (state.trades >= cfg.min_trades_for_win_rate) & (win_rate < win_rate_threshold(cfg, params)),
        ],
        axis=-1,
    )


def apply_veto(cfg: VetoConfig, veto: VetoState, state: EnvState, params: EnvParams, mask: jax.Array):
    """Updates the veto for the envs' current states (vmapped env state, leaves [N]) and removes vetoed
    actions from `mask` [N, 6]. Returns (mask, veto, fired [N, 3] rules that fired now, active [N])."""
    if not cfg.enabled:
        return mask, veto, jnp.zeros((mask.shape[0], len(RULES)), bool), jnp.zeros(mask.shape[0], bool)
    conditions = jax.vmap(rule_conditions, in_axes=(None, 0, None))(cfg, state, params)
    fired = conditions & (state.trades[:, None] != veto.fired_at_trades)
    any_fired = fired.any(axis=-1)
    veto = VetoState(
        until_bar=jnp.where(any_fired, state.t + cfg.cooldown_bars, veto.until_bar),
        session=jnp.where(any_fired, state.session, veto.session),
        fired_at_trades=jnp.where(fired, state.trades[:, None], veto.fired_at_trades),
    )
    active = (state.t < veto.until_bar) & (state.session == veto.session)
    blocked = jnp.zeros(mask.shape[-1], bool).at[jnp.array(BLOCKED_ACTIONS)].set(True)
    return mask & ~(active[:, None] & blocked[None, :]), veto, fired, active
