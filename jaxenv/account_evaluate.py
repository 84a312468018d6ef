"""Walking a split of a MarketSet bar by bar with one account trading every instrument (issue 77), as
`jaxenv.evaluate` walks one instrument: for validation, baselines and evaluation.

The walk is evaluate.py's: a drawdown breach does not end it, it is counted and a fresh account continues from the next
bar (no new entry until the next session), so every policy is scored on the same bars. Each bar the acting function
chooses one action per instrument:

    act(obs, state, params, key) -> actions [I]                  # no policy_state
    act(policy_state, obs, state, params, key) -> actions [I]    # e.g. network params
    act(policy_state, carry, obs, state, params, key) -> (actions [I], carry)   # a carry: what the act keeps

`obs` is the AccountObs at bar t; `state` and `params` let a policy choose head by head under the account's sequential
masks (`env.sequential_mask(state, params, i, chosen)`, or `env.sample_actions(key, state, params, logits)` for
logits [I, 6]); `logits_policy` builds such an act from a network. An action the masks forbid is taken as HOLD and
flagged (trace["invalid_action"]), as in every walk.

    trace = walk_account(env, market_set, "test", act, key)                  # per-bar trace, account and [n, I] columns
    figures = evaluate_account(env, market_set, "test", act, key)           # walk_metrics' figures of the account,
    figures["instruments"]["NQ"]["net_pnl"], figures["sessions"]["pnl"]       # each instrument's, each session's
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxenv.account_env import AccountEnv, AccountParams, AccountState
from jaxenv.env import CLOSE, NO_EXIT, commission, drawdown_threshold, marked_equity
from jaxenv.evaluate import continue_after_breach, held_pnl
from jaxenv.market_set import MarketSet
from jaxenv.metrics import Trace, step_days, trade_stats, trades_table, walk_metrics

ActFn = Callable[..., jax.Array]

# The trace's columns with one entry per instrument ([n, I]); every other column is the account's ([n]).
INSTRUMENT_COLUMNS = ("action", "position", "entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl",
                      "invalid_action", "unfilled", "instrument_pnl", "instrument_commission")
# Each instrument's figures in evaluate_account's "instruments" entry.
INSTRUMENT_FIGURES = ("net_pnl", "trades", "win_rate", "expectancy", "commissions", "held_pnl", "unfilled")


def logits_policy(env: AccountEnv, logits_fn: Callable[..., jax.Array], deterministic: bool = False) -> ActFn:
    """An act for the walk from `logits_fn(policy_state, obs) -> logits [I, 6]`: head by head in instrument order under
    the sequential masks (env.sample_actions), sampled, or the argmax where `deterministic`. Build it once and keep
    the object: the walk compiles once per act."""

    def act(policy_state, obs, state, params, key):
        return env.sample_actions(key, state, params, logits_fn(policy_state, obs), deterministic)[0]

    return act


def account_trace_step(state: AccountState, actions, next_state: AccountState, terminated, info: dict,
                       params: AccountParams) -> dict[str, jax.Array]:
    """One bar of an account walk's trace: evaluate.trace_step's account columns ([n]) and INSTRUMENT_COLUMNS [I].
    An instrument's P&L is its mark's change (each open position at its bar's close, the carried close where absent)
    plus its cash on the bar (an entry's commission, an exit's gross P&L less its commission): the instruments' P&L
    sum to the account's."""
    inst = params.inst
    mark = jax.vmap(marked_equity, in_axes=(None, 0, 0, 0, 0))
    before = mark(0.0, state.legs.side, state.legs.entry_price, inst.bars[:, state.t, CLOSE], inst)
    after = mark(0.0, next_state.legs.side, next_state.legs.entry_price, inst.bars[:, next_state.t, CLOSE], inst)
    fee = jax.vmap(commission)(inst)
    entered = info["entry_side"] != 0
    exited = info["exit_reason"] != NO_EXIT
    cash = jnp.where(entered, -fee, 0.0) + jnp.where(exited, info["trade_pnl"] + fee, 0.0)
    return {
        "t": state.t,
        "pnl": next_state.equity - state.equity,
        "equity": next_state.equity,
        "threshold": drawdown_threshold(next_state.peak, params),
        "breach": terminated,
        "commission": next_state.commissions - state.commissions,
        "action": jnp.asarray(actions, jnp.int32),
        "position": next_state.legs.side,
        **{k: info[k] for k in ("entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl",
                                "invalid_action", "unfilled")},
        "instrument_pnl": after - before + cash,
        "instrument_commission": jnp.where(entered, fee, 0.0) + jnp.where(exited, fee, 0.0),
    }


@partial(jax.jit, static_argnames=("env", "act", "num_steps"))
def _walk(env: AccountEnv, params: AccountParams, act: ActFn, policy_state: Any, key: jax.Array, num_steps: int,
          act_carry: Any = None):
    def body(carry, _):
        state, key, act_carry = carry
        key, act_key, reset_key = jax.random.split(key, 3)
        obs = env.get_obs(state, params)
        if policy_state is None:
            actions = act(obs, state, params, act_key)
        elif act_carry is None:
            actions = act(policy_state, obs, state, params, act_key)
        else:
            actions, act_carry = act(policy_state, act_carry, obs, state, params, act_key)
        actions = jnp.asarray(actions, jnp.int32)
        next_state, _, terminated, info = env.transition(state, actions, params)
        step = account_trace_step(state, actions, next_state, terminated, info, params)
        return (continue_after_breach(env, next_state, terminated, reset_key, params), key, act_carry), step

    state = env.initial_state(key, params)
    _, trace = jax.lax.scan(body, (state, key, act_carry), None, length=num_steps)
    return trace


def walk_account(env: AccountEnv, market_set: MarketSet, split: str | tuple[int, int], act: ActFn, key: jax.Array,
                 policy_state: Any = None, carry: Any = None) -> dict[str, np.ndarray]:
    """Per-bar trace of one account walking the split of every instrument of `market_set` (evaluate.walk_split's
    account columns, [n]; INSTRUMENT_COLUMNS [n, I] in the set's instrument order). `act`: the module's docstring; keep
    it the same object between calls so the walk compiles once. `carry`: the act's at the first bar, for an act that
    keeps one (a policy_state is then needed)."""
    params = env.make_params(market_set, split, sequential=True)
    trace = _walk(env, params, act, policy_state, key, int(params.max_steps_in_episode), carry)
    return {k: np.asarray(v) for k, v in trace.items()}


def instrument_trace(trace: Trace, i: int) -> dict[str, np.ndarray]:
    """Instrument i's part of an account trace with walk_split's columns: its action, position, entries, exits, P&L and
    commissions; equity, threshold and breach stay the account's."""
    out = {k: np.asarray(trace[k])[:, i] for k in INSTRUMENT_COLUMNS}
    out["pnl"], out["commission"] = out.pop("instrument_pnl"), out.pop("instrument_commission")
    return {**{k: np.asarray(trace[k]) for k in ("t", "equity", "threshold", "breach")}, **out}


def held_set_pnl(market_set: MarketSet, t: np.ndarray, contracts: int) -> np.ndarray:
    """[len(t), I]: each instrument's buy-and-hold P&L at each step (evaluate.held_pnl: the move from the decision
    bar's close to the next close, held in the agent's size, no costs; an absent bar's carried close does not move).
    The set's buy-and-hold is the sum over instruments."""
    return np.stack([held_pnl(m.close, t, m.contract, contracts) for m in market_set.markets], axis=1)


def account_metrics(trace: Trace, market_set: MarketSet, rules) -> dict:
    """jaxenv.metrics.METRICS of the account: walk_metrics' figures, the trades those of every instrument (in the
    order they closed). With one instrument, walk_metrics' figures of the same trace."""
    trades = pd.concat([trades_table(instrument_trace(trace, i), market_set.timestamps)
                        for i in range(market_set.num_instruments)]).sort_values("exit_time", kind="stable")
    return walk_metrics(trace, market_set.timestamps, rules, market_set.sessions.day, trades=trades)


def account_figures(trace: Trace, market_set: MarketSet, env: AccountEnv) -> dict:
    """The figures of an account walk (walk_account's trace): METRICS of the account, then
    `held_pnl` (the set's buy-and-hold, costless), `instruments` {symbol: INSTRUMENT_FIGURES} and `sessions`
    {"days", "pnl", "held"}: each session's account P&L and the set's buy-and-hold on it, as the gate counts sessions
    (labelled by the day they close on: agents.evidence.gate.OutOfSample's fields)."""
    figures = account_metrics(trace, market_set, env.config.prop_firm)
    held = held_set_pnl(market_set, np.asarray(trace["t"]), env.config.contracts_per_trade)
    days = step_days(trace, market_set.timestamps, market_set.sessions.day).to_numpy()
    instruments = {}
    for i, symbol in enumerate(market_set.symbols):
        own = instrument_trace(trace, i)
        stats = trade_stats(trades_table(own, market_set.timestamps)["pnl"].to_numpy())
        instruments[symbol] = {
            "net_pnl": float(np.asarray(own["pnl"], np.float64).sum()),
            "trades": stats["trades"],
            "win_rate": stats["win_rate"],
            "expectancy": stats["expectancy"],
            "commissions": float(np.asarray(own["commission"], np.float64).sum()),
            "held_pnl": float(held[:, i].sum()),
            "unfilled": float(np.asarray(own["unfilled"]).sum()),
        }
    by_session = pd.DataFrame({"pnl": np.asarray(trace["pnl"], np.float64), "held": held.sum(axis=1)}).groupby(days).sum()
    return {
        **figures,
        "held_pnl": float(held.sum()),
        "instruments": instruments,
        "sessions": {"days": [str(d) for d in by_session.index], "pnl": by_session["pnl"].tolist(),
                     "held": by_session["held"].tolist()},
    }


def evaluate_account(env: AccountEnv, market_set: MarketSet, split: str | tuple[int, int], act: ActFn,
                     key: jax.Array, policy_state: Any = None, carry: Any = None) -> dict:
    """account_figures of one account walking the split (walk_account): the account's METRICS (net P&L after costs
    first, trades, breaches, the prop-firm result), the set's buy-and-hold, each instrument's P&L and trades, each
    session's account P&L."""
    return account_figures(walk_account(env, market_set, split, act, key, policy_state, carry), market_set, env)


__all__ = [
    "INSTRUMENT_COLUMNS", "INSTRUMENT_FIGURES", "account_figures", "account_metrics", "evaluate_account",
    "held_set_pnl", "instrument_trace", "logits_policy", "walk_account",
]
