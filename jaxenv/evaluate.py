"""Walking a whole split bar by bar with one account, for validation, baselines and evaluation.

A drawdown breach does not end the walk: it is counted and a fresh account continues from the next bar,
so every policy is scored on the same bars.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxenv.env import EnvParams, TradingEnv, drawdown_threshold
from jaxenv.market import Market

PolicyFn = Callable[..., jax.Array]


@partial(jax.jit, static_argnames=("env", "policy_fn", "num_steps"))
def _walk(env: TradingEnv, params: EnvParams, policy_fn: PolicyFn, policy_state: Any, key: jax.Array, num_steps: int):
    def body(carry, _):
        state, key = carry
        key, act_key, reset_key = jax.random.split(key, 3)
        obs = env.get_obs(state, params)
        mask = env.action_mask(state, params)
        if policy_state is None:
            action = policy_fn(obs, mask, act_key)
        else:
            action = policy_fn(policy_state, obs, mask, act_key)
        next_state, reward, terminated, info = env.transition(state, action, params)
        step = {
            "t": state.t,
            "action": jnp.asarray(action, jnp.int32),
            "pnl": next_state.equity - state.equity,
            "equity": next_state.equity,
            "threshold": drawdown_threshold(next_state.peak, params),
            "position": next_state.side,
            "breach": terminated,
            **{k: info[k] for k in ("entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl", "invalid_action")},
        }
        fresh = env.initial_state(reset_key, params, bar=next_state.t)
        next_state = jax.tree.map(lambda f, s: jax.lax.select(terminated, f, s), fresh, next_state)
        return (next_state, key), step

    state = env.initial_state(key, params)
    _, trace = jax.lax.scan(body, (state, key), None, length=num_steps)
    return trace


def walk_split(
    env: TradingEnv,
    market: Market,
    split: str | tuple[int, int],
    policy_fn: PolicyFn,
    key: jax.Array,
    policy_state: Any = None,
) -> dict[str, np.ndarray]:
    """Per-bar trace of one account walking the split. `policy_fn(obs, mask, key) -> action` for one env,
    or `policy_fn(policy_state, obs, mask, key)` when policy_state (e.g. network params) is given; keep
    policy_fn the same object between calls so the walk compiles once."""
    params = env.make_params(market, split, sequential=True)
    num_steps = int(params.max_steps_in_episode)
    trace = _walk(env, params, policy_fn, policy_state, key, num_steps)
    return {k: np.asarray(v) for k, v in trace.items()}


def summarize(trace: dict[str, np.ndarray]) -> dict[str, float]:
    exits = trace["exit_reason"] > 0
    pnls = trace["trade_pnl"][exits]
    equity_curve = np.cumsum(trace["pnl"])
    drawdown = np.maximum.accumulate(np.maximum(equity_curve, 0.0)) - equity_curve
    return {
        "net_pnl": float(equity_curve[-1]) if len(equity_curve) else 0.0,
        "trades": float(exits.sum()),
        "win_rate": float((pnls > 0).mean()) if len(pnls) else 0.0,
        "breaches": float(trace["breach"].sum()),
        "max_drawdown": float(drawdown.max()) if len(drawdown) else 0.0,
        "bars": float(len(equity_curve)),
    }


def evaluate_policy(
    env: TradingEnv,
    market: Market,
    split: str | tuple[int, int],
    policy_fn: PolicyFn,
    key: jax.Array,
    policy_state: Any = None,
) -> dict[str, float]:
    """Net P&L (mark-to-market, after costs), trades, win rate, breaches and max drawdown on a split."""
    return summarize(walk_split(env, market, split, policy_fn, key, policy_state))

