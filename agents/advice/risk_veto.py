"""The risk veto: a mask over actions, vectorised over envs, applied before sampling.

Rules (each can be turned off), judged against the bracket's break-even win rate p0 (`break_even_win_rate`): a
losing streak that an agent winning at p0 has with probability <= `significance` (8 losses for a 1.5/3-ATR
bracket); drawdown buffer below 20% of the trailing drawdown; so few wins in the last 10 trades (at least 5)
that an agent at p0 shows them with probability <= `significance`. Fixed thresholds (a number of losses, p0
minus a margin) remain available. A firing rule blocks BUY, SELL and ENABLE_TRAIL; HOLD is never vetoed. A
veto lasts `cooldown_bars` bars or until a new session, whichever comes first. A rule fires again only after
another trade has closed, so when its condition outlives the veto the agent is let back in rather than locked out
for good. Near the drawdown limit (`near_the_limit`), an env bound to its advice enters only on the advice's side
(agents.advice.acting applies it, where the advice is).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax.scipy.stats import binom

from agents.config import VetoConfig
from bridge.protocol import action_flags
from jaxenv.env import BUY, ENABLE_TRAIL, RECENT_TRADES, SELL, EnvParams, EnvState, drawdown_room

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


def losing_streak_limit(cfg: VetoConfig, params: EnvParams) -> jax.Array:
    """Losses in a row that fire the rule (0: off). `auto`: the shortest streak an agent winning at the break-even
    rate p0 has with probability (1 − p0)^n <= significance (8 for 1.5/3; 3 in a row happen 30% of the time)."""
    if cfg.consecutive_losses != "auto":
        return jnp.asarray(int(cfg.consecutive_losses), jnp.int32)
    p0 = break_even_win_rate(params)
    return jnp.ceil(jnp.log(cfg.significance) / jnp.log1p(-p0)).astype(jnp.int32)


def fewest_wins_allowed(cfg: VetoConfig, params: EnvParams) -> jax.Array:
    """[RECENT_TRADES + 1] float: for n = 0..RECENT_TRADES recent trades, the win-rate rule fires when they won fewer
    than this. `auto`: wins w fire when an agent at the break-even rate p0 has at most w with binomial probability
    <= significance; a number: when their win rate is below p0 less that margin. Computed once per step, not per env."""
    p0 = break_even_win_rate(params)
    n = jnp.arange(RECENT_TRADES + 1)  # recent trades; also the win counts w they can have
    if cfg.win_rate_margin != "auto":
        return n * (p0 - float(cfg.win_rate_margin))  # wins < n (p0 − margin)  ⟺  win rate < p0 − margin
    k = n[None, :]
    pmf = jnp.where(k <= n[:, None], binom.pmf(k, n[:, None], p0), 0.0)
    cdf = jnp.cumsum(pmf, axis=1)  # [n, w]: P(wins <= w | n trades at p0)
    return jnp.sum(cdf <= cfg.significance, axis=1).astype(jnp.float32)  # the w that fire are 0 .. this − 1


def rule_conditions(cfg: VetoConfig, state: EnvState, params: EnvParams, streak: jax.Array,
                    fewest_wins: jax.Array) -> jax.Array:
    """[3] bool for one env: which rules' conditions hold in its state (`streak`, `fewest_wins`: the thresholds of
    losing_streak_limit and fewest_wins_allowed)."""
    buffer = drawdown_room(state, params)
    wins = jax.lax.population_count(state.recent_wins)
    return jnp.stack(
        [
            (streak > 0) & (state.consecutive_losses >= streak),
            (cfg.min_drawdown_buffer > 0) & (buffer < cfg.min_drawdown_buffer),
            (state.trades >= cfg.min_trades_for_win_rate) & (state.recent_count > 0)
            & (wins < fewest_wins[state.recent_count]),
        ],
        axis=-1,
    )


def near_the_limit(cfg: VetoConfig, state: EnvState, params: EnvParams) -> jax.Array:
    """[N] bool: envs whose account is within `advised_only_below` of the trailing drawdown (a share of it; 0: off)
    (vmapped env state, leaves [N]). Those bound to their advice enter only where it names the side (HybridActing):
    there an entry must be the best one, and the advice's are better than the policy's own."""
    if not cfg.enabled or cfg.advised_only_below <= 0:
        return jnp.zeros(state.side.shape, bool)
    buffer = drawdown_room(state, params)
    return buffer < cfg.advised_only_below


def apply_veto(cfg: VetoConfig, veto: VetoState, state: EnvState, params: EnvParams, mask: jax.Array):
    """Updates the veto for the envs' current states (vmapped env state, leaves [N]) and removes vetoed
    actions from `mask` [N, 6]. Returns (mask, veto, fired [N, 3] rules that fired now, active [N])."""
    if not cfg.enabled:
        return mask, veto, jnp.zeros((mask.shape[0], len(RULES)), bool), jnp.zeros(mask.shape[0], bool)
    thresholds = losing_streak_limit(cfg, params), fewest_wins_allowed(cfg, params)
    conditions = jax.vmap(rule_conditions, in_axes=(None, 0, None, None, None))(cfg, state, params, *thresholds)
    fired = conditions & (state.trades[:, None] != veto.fired_at_trades)
    any_fired = fired.any(axis=-1)
    veto = VetoState(
        until_bar=jnp.where(any_fired, state.t + cfg.cooldown_bars, veto.until_bar),
        session=jnp.where(any_fired, state.session, veto.session),
        fired_at_trades=jnp.where(fired, state.trades[:, None], veto.fired_at_trades),
    )
    active = (state.t < veto.until_bar) & (state.session == veto.session)
    blocked = jnp.array(action_flags(BLOCKED_ACTIONS))
    return mask & ~(active[:, None] & blocked[None, :]), veto, fired, active
