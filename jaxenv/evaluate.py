"""Walking a whole split bar by bar with one account, for validation, baselines and evaluation.

A drawdown breach does not end the walk: it is counted and a fresh account continues from the next bar, so every
policy is scored on the same bars. The fresh account takes no new entry until the next session, as a prop firm's
breached account trades no more that day: a session never loses more than the room its account had at its start, plus
a gap through the liquidation price.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxenv.env import SESSION_CLOSE, EnvParams, TradingEnv, drawdown_threshold
from jaxenv.market import Market
from jaxenv.metrics import walk_metrics

PolicyFn = Callable[..., jax.Array]


def trace_step(state, action, next_state, terminated, info: dict, params: EnvParams) -> dict[str, jax.Array]:
    """One bar of a walk's trace (also used by the advised walk in agents/, so both traces have the same columns)."""
    return {
        "t": state.t,
        "action": jnp.asarray(action, jnp.int32),
        "pnl": next_state.equity - state.equity,
        "equity": next_state.equity,
        "threshold": drawdown_threshold(next_state.peak, params),
        "position": next_state.side,
        "breach": terminated,
        "commission": next_state.commissions - state.commissions,  # both sides when a trade opens and closes here
        **{k: info[k] for k in ("entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl", "invalid_action")},
    }


def continue_after_breach(env: TradingEnv, next_state, terminated, key: jax.Array, params: EnvParams):
    """A breached account is replaced by a fresh one at the next bar, so the walk covers every bar; it enters nothing
    until the next session."""
    fresh = env.initial_state(key, params, bar=next_state.t).replace(entry_locked=jnp.ones((), bool))
    return jax.tree.map(lambda f, s: jax.lax.select(terminated, f, s), fresh, next_state)


def policy_step(env: TradingEnv, params: EnvParams, policy_fn: PolicyFn, policy_state: Any, state, key: jax.Array):
    """One decision of a walk: the action of the account at bar state.t, from bars <= t only. A walk is this and
    `advance_step`, bar after bar (an agent's own walks and trading add its acting step around them:
    agents.evaluation.advised_walk)."""
    obs = env.get_obs(state, params)
    mask = env.action_mask(state, params)
    if policy_state is None:
        return policy_fn(obs, mask, key)
    return policy_fn(policy_state, obs, mask, key)


def advance_step(env: TradingEnv, params: EnvParams, state, action, reset_key: jax.Array):
    """The bar after a decision (t + 1): the order's fill, stops, targets and the drawdown rule. Returns the account
    at t + 1 (a fresh one after a breach) and the trace's row for bar t."""
    next_state, _, terminated, info = env.transition(state, action, params)
    step = trace_step(state, action, next_state, terminated, info, params)
    return continue_after_breach(env, next_state, terminated, reset_key, params), step


@partial(jax.jit, static_argnames=("env", "policy_fn", "num_steps"))
def _walk(env: TradingEnv, params: EnvParams, policy_fn: PolicyFn, policy_state: Any, key: jax.Array, num_steps: int):
    def body(carry, _):
        state, key = carry
        key, act_key, reset_key = jax.random.split(key, 3)
        action = policy_step(env, params, policy_fn, policy_state, state, act_key)
        next_state, step = advance_step(env, params, state, action, reset_key)
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


def evaluate_policy(
    env: TradingEnv,
    market: Market,
    split: str | tuple[int, int],
    policy_fn: PolicyFn,
    key: jax.Array,
    policy_state: Any = None,
) -> dict[str, float]:
    """Every jaxenv.metrics.METRICS figure of one account walking the split (net P&L after costs first)."""
    trace = walk_split(env, market, split, policy_fn, key, policy_state)
    return walk_metrics(trace, market.timestamps, env.config.prop_firm, market.sessions.day)



def held_pnl(close: np.ndarray, t: np.ndarray, contract, contracts: int) -> np.ndarray:
    """Buy-and-hold's P&L of each step of a walk or a trade (`t`: the decision bars, each step marked at t + 1's
    close): the market's move from the decision bar's close, held in the agent's size (`contracts` of `contract`, a
    jaxenv.contracts.ContractSpec), no costs. The gate's buy-and-hold bar (agents.evidence.gate):
    a hold that is never sold pays no exit, so a walk and trade.py over the same bars count the same."""
    t = np.asarray(t)
    close = np.asarray(close, np.float64)
    return (close[t + 1] - close[t]) * float(contract.point_value) * contracts


def buy_and_hold(env: TradingEnv, market: Market, split: str | tuple[int, int]) -> dict[str, np.ndarray]:
    """The market benchmark as a trace with walk_split's columns: the size the agent trades (env.contracts_per_trade)
    bought at the open of the walk's first fill bar (plus slippage) and sold at its last close (minus slippage), one
    commission each way, held through sessions and stops alike. The trailing-drawdown rule is counted, not enforced:
    at a breach a fresh account takes over the same position."""
    params = env.make_params(market, split, sequential=True)
    start, end = int(params.start_bar), int(params.end_bar)
    t = np.arange(start, end - 1)
    units = float(params.contracts)
    point_value, commission = float(params.point_value) * units, float(params.commission_per_side) * units
    slippage = float(params.slippage)
    close = market.close[start + 1 : end]
    entry_price = market.open[start + 1] + slippage
    marks = np.concatenate([[entry_price], close[:-1]])
    pnl = (close - marks) * point_value
    fees = np.zeros(len(t))
    fees[0] += commission
    fees[-1] += commission
    pnl = pnl - fees
    pnl[-1] -= slippage * point_value

    rules = env.config.prop_firm

    def threshold_of(peak: float) -> float:
        return min(peak - rules.trailing_drawdown, rules.starting_balance + rules.trail_stop_offset)

    equity, threshold, breach = np.empty(len(t)), np.empty(len(t)), np.zeros(len(t), bool)
    account = peak = rules.starting_balance
    for i, step_pnl in enumerate(pnl):  # bar closes only: the env also checks each bar's adverse extreme
        account += step_pnl
        breach[i] = account <= threshold_of(peak)
        peak = max(peak, account)
        equity[i], threshold[i] = account, threshold_of(peak)
        if breach[i]:
            account = peak = rules.starting_balance
    last = len(t) - 1
    event = lambda at, value: np.where(np.arange(len(t)) == at, value, 0)  # noqa: E731
    return {
        "t": t,
        "action": event(0, 1).astype(np.int32),  # BUY once
        "pnl": pnl,
        "equity": equity,
        "threshold": threshold,
        "position": np.where(np.arange(len(t)) < last, 1, 0),
        "breach": breach,
        "commission": fees,
        "entry_side": event(0, 1),
        "entry_price": event(0, entry_price).astype(np.float64),
        "exit_reason": event(last, SESSION_CLOSE),
        "exit_price": event(last, close[-1] - slippage).astype(np.float64),
        "trade_pnl": event(last, pnl.sum()).astype(np.float64),
        "invalid_action": np.zeros(len(t), bool),
    }
