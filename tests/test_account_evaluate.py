"""The account walk over a MarketSet (jaxenv.account_evaluate, issue 77): with one instrument it is evaluate.py's walk
bar for bar; with two, each instrument's P&L and trades are its own and sum to the account's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bridge.protocol import BUY, HOLD, SELL
from jaxenv.account_env import AccountEnv
from jaxenv.account_evaluate import (
    INSTRUMENT_COLUMNS,
    evaluate_account,
    held_set_pnl,
    logits_policy,
    walk_account,
)
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.env import TradingEnv
from jaxenv.evaluate import evaluate_policy, held_pnl, walk_split
from jaxenv.market_set import load_market_set
from jaxenv.metrics import METRICS
from tests.conftest import account_config

# Scans of a thousand steps: left out of the JAX_DISABLE_JIT=1 pass, where they take minutes.
KEY = jax.random.PRNGKey(3)


@pytest.fixture(scope="module")
def one_nq():
    return load_market_set([("NQ", "synthetic:default")], DataConfig(synthetic_days=6))


@pytest.fixture(scope="module")
def pair():
    return load_market_set([("NQ", "synthetic:pair"), ("ES", "synthetic:pair")], DataConfig(synthetic_days=6))


def random_valid(obs, mask, key):
    return jax.random.categorical(key, jnp.where(mask, 0.0, -1e9))


def always_buy(obs, mask, key):
    return jnp.asarray(BUY, jnp.int32)


@pytest.mark.parametrize("policy", [random_valid, always_buy], ids=["random_valid", "always_buy"])
def test_one_instrument_walks_as_walk_split(one_nq, policy):
    """The same market, split, key and actions (the account's act gives walk_split's policy its first head's mask):
    every column of the trace bit for bit, and the same figures."""
    config = EnvConfig()
    single, env = TradingEnv(config), AccountEnv(account_config(config))
    market = one_nq.markets[0]

    def act(obs, state, params, key):
        return policy(obs, env.action_mask(state, params)[0], key)[None]

    ours = walk_account(env, one_nq, "train", act, KEY)
    theirs = walk_split(single, market, "train", policy, KEY)
    for name, column in theirs.items():
        mine = ours[name][:, 0] if name in INSTRUMENT_COLUMNS else ours[name]
        np.testing.assert_array_equal(mine, column, err_msg=name)
    assert (ours["entry_side"] != 0).sum() > 10 and ours["breach"].any() == theirs["breach"].any()

    figures = evaluate_account(env, one_nq, "train", act, KEY)
    expected = evaluate_policy(single, market, "train", policy, KEY)
    assert {k: figures[k] for k in METRICS} == expected
    nq = figures["instruments"]["NQ"]
    assert nq["trades"] == expected["trades"] and nq["net_pnl"] == pytest.approx(expected["net_pnl"], abs=0.5)
    assert nq["held_pnl"] == pytest.approx(float(held_pnl(market.close, ours["t"], market.contract, 1).sum()))
    assert sum(figures["sessions"]["pnl"]) == pytest.approx(expected["net_pnl"], abs=1e-6)
    assert len(figures["sessions"]["days"]) == expected["days"]


def test_buy_the_first_hold_the_second(pair):
    """BUY on NQ whenever flat (a BUY while long is refused and flagged), HOLD on ES: ES trades nothing and makes
    nothing, and the account's P&L, trades and commissions are NQ's."""
    env = AccountEnv(account_config())

    def act(obs, state, params, key):
        return jnp.array([BUY, HOLD], jnp.int32)

    trace = walk_account(env, pair, "train", act, KEY)
    assert trace["action"].shape == (len(trace["t"]), 2)
    figures = evaluate_account(env, pair, "train", act, KEY)
    nq, es = figures["instruments"]["NQ"], figures["instruments"]["ES"]
    assert es["trades"] == 0 and es["net_pnl"] == 0 and es["commissions"] == 0
    assert (trace["entry_side"][:, 1] == 0).all() and (trace["position"][:, 1] == 0).all()
    assert nq["trades"] > 10 and figures["trades"] == nq["trades"]
    assert figures["net_pnl"] == pytest.approx(nq["net_pnl"], abs=1.0)  # float32 books: cents per bar at most
    assert figures["commissions"] == pytest.approx(nq["commissions"], abs=1e-3)
    np.testing.assert_allclose(trace["instrument_pnl"].sum(axis=1), trace["pnl"], atol=0.02)
    # the set's buy-and-hold: both held, summed, no costs
    held = held_set_pnl(pair, trace["t"], 1)
    assert es["held_pnl"] == pytest.approx(float(held[:, 1].sum())) and es["held_pnl"] != 0
    assert figures["held_pnl"] == pytest.approx(nq["held_pnl"] + es["held_pnl"])
    sessions = figures["sessions"]
    assert len(sessions["days"]) == figures["days"] == len(sessions["pnl"]) == len(sessions["held"])
    assert sum(sessions["pnl"]) == pytest.approx(figures["net_pnl"]) and sum(sessions["held"]) == pytest.approx(
        figures["held_pnl"])


def test_sampled_heads_keep_the_account_rules(pair):
    """A policy of logits [I, 6] sampled head by head under the sequential masks (logits_policy, with a
    policy_state): under a one-mini cap and NQ/ES correlated, no action is refused and never two positions are open;
    greedy takes each head's best allowed action."""
    env = AccountEnv(account_config(max_contracts=1.0, correlated=[["NQ", "ES"]]))
    sampled = logits_policy(env, lambda weights, obs: jnp.broadcast_to(weights, (2, 6)))
    trace = walk_account(env, pair, "train", sampled, KEY, policy_state=jnp.zeros(6))
    assert not trace["invalid_action"].any()
    assert (np.abs(trace["position"]).sum(axis=1) <= 1).all()
    assert (trace["entry_side"] != 0).sum(axis=0).min() > 5  # both instruments traded

    prefer_sell = jnp.zeros(6).at[SELL].set(5.0)
    greedy = logits_policy(env, lambda weights, obs: jnp.broadcast_to(weights, (2, 6)), deterministic=True)
    figures = evaluate_account(env, pair, "train", greedy, KEY, policy_state=prefer_sell)
    trace = walk_account(env, pair, "train", greedy, KEY, policy_state=prefer_sell)
    assert not trace["invalid_action"].any() and (trace["entry_side"] <= 0).all()
    # NQ, head 0, sells whenever flat; ES sells only while NQ is flat and stays flat on the bar
    assert figures["instruments"]["NQ"]["trades"] > figures["instruments"]["ES"]["trades"]


@pytest.mark.nojit
def test_the_account_benchmarks_report_says_where_a_target_is_missed(pair):
    """benchmarks/account.py's report: each ratio against its target, by how much it misses; first_instrument keeps
    the set's timeline."""
    from benchmarks.account import first_instrument, markdown

    one = first_instrument(pair)
    assert one.symbols == ("NQ",) and one.present.shape == (pair.num_bars, 1) and one.num_bars == pair.num_bars
    base = {"suite": "account", "envs": 4096, "compile_s": 1.0, "cores_used": 1.9, "working_set_mb": 4.0, "reps": 5,
            "load_avg_start": [1.0, 1.0, 1.0], "load_avg_end": [1.0, 1.0, 1.0],
            "config": {"data": "synthetic:pair", "rules": "no cap, no pairs", "steps_per_scan": 200}}
    rows = [{**base, "env": "TradingEnv", "instruments": 1, "account_steps_per_s": 100.0, "instrument_steps_per_s": 100.0},
            {**base, "env": "AccountEnv", "instruments": 1, "account_steps_per_s": 96.0, "instrument_steps_per_s": 96.0,
             "ratio_to_trading_env": 0.96},
            {**base, "env": "AccountEnv", "instruments": 2, "account_steps_per_s": 48.0, "instrument_steps_per_s": 96.0,
             "ratio_to_one": 0.5}]
    text = markdown(rows)
    assert "one instrument ÷ TradingEnv at 4,096 envs 0.960 (meets the 0.95 target)" in text
    assert "two instruments ÷ one at 4,096 envs 0.500 (misses the 0.6 target by 0.100, 17% short)" in text
