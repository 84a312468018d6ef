"""jaxenv.metrics on hand-made walks whose every figure is known, and the buy-and-hold benchmark's trace."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from jaxenv import EnvConfig, TradingEnv
from jaxenv.config import PropFirmRules
from jaxenv.evaluate import buy_and_hold
from jaxenv.metrics import (
    calmar,
    daily_pnl,
    max_drawdown,
    prop_firm_result,
    sharpe_daily,
    sortino_daily,
    step_days,
    trade_stats,
    trades_table,
    underwater,
    walk_metrics,
)
from tests.conftest import SESSION_BARS, bar_at, rth_index

RULES = PropFirmRules()  # $50,000 start, $3,000 profit target
ROOT252 = math.sqrt(252)


def walk(n: int, **columns) -> dict[str, np.ndarray]:
    """A trace of n steps deciding on bars 0..n-1 with nothing happening, then `columns` set."""
    trace = {
        "t": np.arange(n), "pnl": np.zeros(n), "breach": np.zeros(n, bool), "commission": np.zeros(n),
        "entry_side": np.zeros(n, int), "entry_price": np.zeros(n), "exit_reason": np.zeros(n, int),
        "exit_price": np.zeros(n), "trade_pnl": np.zeros(n),
    }
    trace.update({k: v if isinstance(v, dict) else np.asarray(v) for k, v in columns.items()})
    trace["equity"] = columns.get("equity", RULES.starting_balance + np.cumsum(trace["pnl"]))
    return trace


def test_each_step_belongs_to_the_day_its_pnl_is_marked_on():
    stamps = rth_index(3)
    pnl = np.zeros(2 * SESSION_BARS)
    pnl[0] = 10.0  # decided on day 1's first bar, marked at its second
    pnl[SESSION_BARS - 1] = 5.0  # decided on day 1's last bar, marked at day 2's first bar
    pnl[-1] = 7.0
    days = daily_pnl(walk(len(pnl), pnl=pnl), stamps)
    assert list(days.index.astype(str)) == ["2024-03-04", "2024-03-05", "2024-03-06"]
    assert days.tolist() == [10.0, 5.0, 7.0]  # the last step is marked on day 3's first bar


def test_sharpe_and_sortino_of_daily_pnl():
    daily = pd.Series([100.0, -50.0, 200.0, -100.0, 50.0])  # mean 40
    std = math.sqrt((60**2 + 90**2 + 160**2 + 140**2 + 10**2) / 4)  # sample std
    assert sharpe_daily(daily) == pytest.approx(40 / std * ROOT252)
    downside = math.sqrt((50**2 + 100**2) / 5)  # = 50: losses only, over all 5 days
    assert sortino_daily(daily) == pytest.approx(40 / 50 * ROOT252) == pytest.approx(40 / downside * ROOT252)
    assert sharpe_daily(pd.Series([5.0, 5.0])) is None and sharpe_daily(pd.Series([5.0])) is None
    assert sortino_daily(pd.Series([5.0, 1.0])) is None  # no losing day


def test_max_drawdown_of_the_mark_to_market_curve():
    pnl = np.array([100.0, -300.0, 50.0, 400.0, -100.0])  # cumulative 100, -200, -150, 250, 150
    np.testing.assert_allclose(underwater(pnl), [0, 300, 250, 0, 100])
    assert max_drawdown(pnl) == 300.0
    assert max_drawdown(np.array([-40.0, 10.0])) == 40.0  # the start (0) is a peak
    assert max_drawdown(np.zeros(0)) == 0.0


def test_calmar_is_annualised_pnl_over_max_drawdown():
    daily = pd.Series([100.0, -50.0, 250.0])  # mean 100
    assert calmar(daily, 400.0) == pytest.approx(100 * 252 / 400)
    assert calmar(daily, 0.0) is None


def test_win_rate_profit_factor_and_expectancy_of_trades():
    out = trade_stats(np.array([300.0, -100.0, -100.0, 200.0, 0.0]))
    assert out == {"trades": 5.0, "win_rate": 0.4, "profit_factor": 2.5, "expectancy": 60.0}
    assert trade_stats(np.array([50.0]))["profit_factor"] is None  # no losing trade: undefined
    assert trade_stats(np.zeros(0)) == {"trades": 0.0, "win_rate": None, "profit_factor": None, "expectancy": None}


def test_trades_table_pairs_entries_with_exits_and_keeps_advice_at_entry():
    stamps = rth_index(1)
    trace = walk(
        12,
        entry_side=[0, 0, 1, 0, 0, 0, 0, 0, -1, 0, 1, 0],  # long at step 2, short in and out at step 8, open at 10
        entry_price=[0, 0, 100.25, 0, 0, 0, 0, 0, 99.0, 0, 98.0, 0],
        exit_reason=[0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0],
        exit_price=[0, 0, 0, 0, 0, 101.0, 0, 0, 99.5, 0, 0, 0],
        trade_pnl=[0, 0, 0, 0, 0, 10.72, 0, 0, -14.28, 0, 0, 0],
        advice_valid=np.arange(12) == 2,
        advice_action=np.full(12, 1),
        advice_confidence=np.full(12, 0.8),
        advice_from=np.where(np.arange(12) == 2, 0, -1),
        reasons={0: "trend up"},
    )
    trades = trades_table(trace, stamps, contracts=2)
    assert len(trades) == 2  # the position opened at step 10 is still open
    first, second = trades.iloc[0], trades.iloc[1]
    assert first.entry_time == stamps[3] and first.exit_time == stamps[6]  # fills on the bar after the decision
    assert (first.side, first.contracts, first.exit_reason, first.bars_held) == ("long", 2, "take_profit", 4)
    assert (first.entry_price, first.exit_price, first.pnl) == (100.25, 101.0, 10.72)
    assert (first.advice_action, first.advice_confidence, first.advice_reason) == ("BUY", 0.8, "trend up")
    assert (second.side, second.exit_reason, second.bars_held) == ("short", "stop_loss", 1)  # in and out on one bar
    assert second.advice_action == "" and np.isnan(second.advice_confidence) and second.advice_reason == ""
    no_advice = trades_table({k: v for k, v in trace.items() if not k.startswith("advice")}, stamps)
    assert (no_advice["advice_action"] == "").all() and no_advice["advice_confidence"].isna().all()


def test_prop_firm_result_counts_breaches_and_the_target_before_the_first():
    days = pd.Series(["d1"] * 3 + ["d2"] * 3)
    equity = [51_000, 53_000, 50_500, 48_000, 49_000, 47_000]
    breach = [False, False, False, True, False, True]
    out = prop_firm_result(walk(6, equity=equity, breach=breach), days, RULES)
    assert out == {"breaches": 2.0, "days_to_first_breach": 2.0, "prop_passed": 1.0}  # $53,000 on day 1
    late = prop_firm_result(walk(6, equity=[51_000, 52_000, 50_000, 47_000, 53_500, 53_500], breach=breach), days,
                            RULES)
    assert late["prop_passed"] == 0.0  # the target was reached only by the account after the breach
    clean = prop_firm_result(walk(6, equity=[50_000] * 6), days, RULES)
    assert clean == {"breaches": 0.0, "days_to_first_breach": None, "prop_passed": 0.0}


def test_walk_metrics_of_a_two_day_walk():
    """Two trades: +$300 net on day 1 and -$100 net on day 2, $8.56 commission each (NQ: $2.14 × 2 sides × 2)."""
    stamps = rth_index(3)
    n = 2 * SESSION_BARS
    d2 = bar_at(1, 10, 0)
    trace = walk(
        n,
        pnl=np.where(np.arange(n) == 10, 300.0, 0.0) + np.where(np.arange(n) == d2, -100.0, 0.0),
        entry_side=np.isin(np.arange(n), [5, d2 - 3]).astype(int),
        exit_reason=np.isin(np.arange(n), [10, d2]).astype(int) * 2,
        trade_pnl=np.where(np.arange(n) == 10, 300.0, 0.0) + np.where(np.arange(n) == d2, -100.0, 0.0),
        commission=np.isin(np.arange(n), [5, 10, d2 - 3, d2]) * 4.28,
    )
    m = walk_metrics(trace, stamps, RULES)
    assert step_days(trace, stamps).nunique() == 3  # the last step is marked on day 3's first bar
    assert m["net_pnl"] == 200.0 and m["days"] == 3.0 and m["trades"] == 2.0
    assert m["win_rate"] == 0.5 and m["profit_factor"] == 3.0 and m["expectancy"] == 100.0
    assert m["trades_per_day"] == pytest.approx(2 / 3)
    assert m["avg_holding_bars"] == pytest.approx((6 + 4) / 2)  # bars 6..11 and bars d2-2..d2+1
    assert m["commissions"] == pytest.approx(17.12)
    assert m["commission_share"] == pytest.approx(17.12 / 217.12)
    assert m["max_drawdown"] == 100.0
    daily = pd.Series([300.0, -100.0, 0.0])
    assert m["sharpe_daily"] == pytest.approx(sharpe_daily(daily))
    assert m["calmar"] == pytest.approx(daily.mean() * 252 / 100)
    assert (m["breaches"], m["days_to_first_breach"], m["prop_passed"]) == (0.0, None, 0.0)


def test_buy_and_hold_holds_the_agents_size_across_sessions(hand_market):
    hm = hand_market(days=3)  # flat at 18,000 ...
    hm.set_bar(len(hm.frame) - 1, 18_000.0, 18_051.0, 17_999.0, 18_050.0)  # ... up 50 points on the last bar
    market = hm.build()
    env = TradingEnv(EnvConfig(contracts_per_trade=3))  # the benchmark holds what the agent trades: 3 contracts
    lo, hi = market.first_decision_bar, market.num_bars
    trace = buy_and_hold(env, market, (lo, hi))
    expected = 3 * ((18_050.0 - 0.25 - (18_000.0 + 0.25)) * 20.0 - 2 * 2.14)  # a tick of slippage each way, $20/pt
    assert trace["pnl"].sum() == pytest.approx(expected)
    assert trace["trade_pnl"][-1] == pytest.approx(expected) and trace["commission"].sum() == pytest.approx(3 * 4.28)
    m = walk_metrics(trace, market.timestamps, env.config.prop_firm)
    assert m["trades"] == 1.0 and m["net_pnl"] == pytest.approx(expected) and m["breaches"] == 0.0


def test_a_walk_summary_gives_the_spread_of_its_trades_for_a_standard_error():
    """A walk's net P&L is noisy; its summary carries one trade's P&L spread so a reader can weigh it."""
    stamps = rth_index(1)
    trace = walk(5, entry_side=[1, 0, -1, 0, 0], exit_reason=[0, 1, 0, 2, 0], trade_pnl=[0.0, 100.0, 0.0, -300.0, 0.0],
                 pnl=[0.0, 100.0, 0.0, -300.0, 0.0])
    figures = walk_metrics(trace, stamps, RULES)
    assert figures["trades"] == 2 and figures["net_pnl"] == -200.0
    assert figures["trade_pnl_std"] == pytest.approx(200.0 * math.sqrt(2))  # sample std of +100 and -300
    one = walk(5, entry_side=[1, 0, 0, 0, 0], exit_reason=[0, 1, 0, 0, 0], trade_pnl=[0.0, 100.0, 0.0, 0.0, 0.0])
    assert walk_metrics(one, stamps, RULES)["trade_pnl_std"] == 0.0  # one trade
