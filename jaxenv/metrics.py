"""Performance metrics of a walk (`jaxenv.walk_split`'s per-bar trace) on the bars' own clock.

Step i of a trace decides on the close of bar `t[i]` and its P&L is marked at the close of bar `t[i] + 1`, so
every step is dated by bar `t[i] + 1` (no step is credited to a bar before its P&L exists). A trading day is a
session of the instrument's calendar, labelled by the date it closes on (`market.sessions.day`), so an overnight
session belongs to the day it closes; without those labels, a bar's own date. Money is in the instrument's currency
(dollars by default); the walk's P&L is mark-to-market after commissions and slippage.

    daily = daily_pnl(trace, market.timestamps, market.sessions.day)
    metrics = walk_metrics(trace, market.timestamps, cfg.env.prop_firm, market.sessions.day)
    trades = trades_table(trace, market.timestamps, contracts=1)  # one row per closed trade
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from bridge.protocol import ACTIONS
from jaxenv.config import PropFirmRules
from jaxenv.env import EXIT_REASONS, NO_EXIT

DAYS_PER_YEAR = 252  # trading days: daily Sharpe, Sortino and Calmar are annualised with it

Trace = Mapping[str, np.ndarray]

# name -> what it is; the order of the console table and of docs/evaluation.md's definitions.
METRICS: dict[str, str] = {
    "net_pnl": "net P&L after commissions and slippage, mark-to-market",
    "sharpe_daily": "mean / std of daily P&L × √252",
    "sortino_daily": "mean daily P&L / downside deviation × √252",
    "max_drawdown": "largest fall of cumulative P&L from its running peak",
    "calmar": "annualised P&L (mean daily × 252) / max drawdown",
    "win_rate": "winning trades / trades",
    "profit_factor": "sum of winning trades / |sum of losing trades|",
    "expectancy": "mean net P&L per trade",
    "trade_pnl_std": "sample std of closed trades' P&L (net P&L's standard error is about this × √trades)",
    "trades": "closed trades",
    "trades_per_day": "closed trades / trading days",
    "avg_holding_bars": "mean bars from the entry bar to the exit bar, both counted",
    "commissions": "commissions paid",
    "commission_share": "commissions / |P&L before commissions|",
    "breaches": "trailing-drawdown breaches (each starts a fresh account)",
    "days_to_first_breach": "trading day (1-based) of the first breach",
    "prop_passed": "1 if the first account reached the profit target before any breach",
    "days": "trading days walked",
    "bars": "decisions (bars) walked",
}


Days = np.ndarray  # datetime64[D] per bar: the trading day of its session (jaxenv.sessions.SessionInfo.day)


def step_days(trace: Trace, timestamps: pd.DatetimeIndex, days: Days | None = None) -> pd.Series:
    """Per step, the trading day its P&L belongs to: `days` of the bar it is marked on (the date its session closes
    on), or that bar's own date."""
    marked = np.asarray(trace["t"]) + 1
    if days is None:
        labels = np.asarray(timestamps.date)[marked]
    else:
        labels = pd.DatetimeIndex(np.asarray(days)[marked]).date
    return pd.Series(labels, name="day")


def daily_pnl(trace: Trace, timestamps: pd.DatetimeIndex, days: Days | None = None) -> pd.Series:
    """P&L per trading day walked, days without trades included (as 0)."""
    return pd.Series(np.asarray(trace["pnl"], np.float64)).groupby(step_days(trace, timestamps, days).to_numpy()).sum()


def sharpe_daily(daily: pd.Series) -> float | None:
    """mean / sample std of daily P&L × √252; None with fewer than 2 days or no variation."""
    if len(daily) < 2 or daily.std(ddof=1) == 0:
        return None
    return float(daily.mean() / daily.std(ddof=1) * math.sqrt(DAYS_PER_YEAR))


def sortino_daily(daily: pd.Series) -> float | None:
    """mean daily P&L / downside deviation × √252, the downside deviation being the root mean square of
    min(daily P&L, 0) over all days; None without a losing day."""
    downside = math.sqrt(float((np.minimum(daily.to_numpy(), 0.0) ** 2).mean())) if len(daily) else 0.0
    if downside == 0:
        return None
    return float(daily.mean() / downside * math.sqrt(DAYS_PER_YEAR))


def underwater(pnl: np.ndarray) -> np.ndarray:
    """Per step, how far cumulative P&L (marked at each bar's close) is below its running peak, the start (0)
    counting as a peak; >= 0."""
    equity = np.cumsum(np.asarray(pnl, np.float64))
    return np.maximum.accumulate(np.maximum(equity, 0.0)) - equity


def max_drawdown(pnl: np.ndarray) -> float:
    drawdown = underwater(pnl)
    return float(drawdown.max()) if len(drawdown) else 0.0


def calmar(daily: pd.Series, drawdown: float) -> float | None:
    """Annualised P&L (mean daily P&L × 252) / max drawdown; None without a drawdown."""
    if drawdown <= 0 or not len(daily):
        return None
    return float(daily.mean() * DAYS_PER_YEAR / drawdown)


def trade_stats(trade_pnl: np.ndarray) -> dict[str, float | None]:
    """Win rate, profit factor and expectancy of closed trades' net P&L (a trade at exactly 0 is not a win)."""
    pnl = np.asarray(trade_pnl, np.float64)
    wins, losses = pnl[pnl > 0], pnl[pnl < 0]
    return {
        "trades": float(len(pnl)),
        "win_rate": float(len(wins) / len(pnl)) if len(pnl) else None,
        "profit_factor": float(wins.sum() / -losses.sum()) if len(losses) else None,
        "expectancy": float(pnl.mean()) if len(pnl) else None,
    }


def prop_firm_result(trace: Trace, days: pd.Series, rules: PropFirmRules) -> dict[str, float | None]:
    """Breaches, the trading day of the first one, and whether the first account reached the profit target
    (equity at a bar's close >= starting balance + profit target) before breaching."""
    breach = np.asarray(trace["breach"], bool)
    day_number = pd.factorize(days)[0] + 1  # 1-based trading day of each step
    first = int(np.argmax(breach)) if breach.any() else len(breach)
    reached = np.asarray(trace["equity"][:first], np.float64) >= rules.starting_balance + rules.profit_target
    return {
        "breaches": float(breach.sum()),
        "days_to_first_breach": float(day_number[first]) if breach.any() else None,
        "prop_passed": float(reached.any()),
    }


def trades_table(trace: Trace, timestamps: pd.DatetimeIndex, contracts: int = 1) -> pd.DataFrame:
    """One row per closed trade: entry/exit time (bar open stamps) and price, side, contracts, net P&L, exit
    reason, bars held, and the advice in force at the entry decision when the trace has it (columns
    `advice_action`/`advice_confidence`/`advice_valid` per step and `reasons` {key: text} with `advice_from` (the key in force), as
    agents.evaluation.advised_walk writes); empty otherwise. A position still open at the walk's end is not a trade."""
    entries = np.flatnonzero(np.asarray(trace["entry_side"]) != 0)
    exits = np.flatnonzero(np.asarray(trace["exit_reason"]) != NO_EXIT)
    if not len(exits) <= len(entries) <= len(exits) + 1 or np.any(entries[: len(exits)] > exits):
        raise ValueError("trace: entries and exits do not alternate (one position at a time)")
    entries = entries[: len(exits)]
    t = np.asarray(trace["t"])
    entry_bar, exit_bar = t[entries] + 1, t[exits] + 1  # orders fill on the bar after the decision
    frame = pd.DataFrame({
        "entry_time": timestamps[entry_bar],
        "exit_time": timestamps[exit_bar],
        "side": np.where(np.asarray(trace["entry_side"])[entries] > 0, "long", "short"),
        "contracts": contracts,
        "entry_price": np.asarray(trace["entry_price"], np.float64)[entries],
        "exit_price": np.asarray(trace["exit_price"], np.float64)[exits],
        "pnl": np.asarray(trace["trade_pnl"], np.float64)[exits],
        "exit_reason": [EXIT_REASONS[r] for r in np.asarray(trace["exit_reason"])[exits]],
        "bars_held": exit_bar - entry_bar + 1,
    })
    frame["advice_action"], frame["advice_confidence"], frame["advice_reason"] = "", np.nan, ""
    if "advice_valid" in trace:
        valid = np.asarray(trace["advice_valid"], bool)[entries]
        actions = np.asarray(trace["advice_action"])[entries]
        frame["advice_action"] = [ACTIONS[a] if v else "" for a, v in zip(actions, valid)]
        confidence = np.asarray(trace["advice_confidence"], np.float64)[entries]
        frame["advice_confidence"] = np.where(valid, confidence, np.nan)
        if "reasons" in trace and "advice_from" in trace:
            sources = np.asarray(trace["advice_from"])[entries]
            frame["advice_reason"] = [trace["reasons"].get(int(s), "") if v else "" for s, v in zip(sources, valid)]
    return frame


def walk_metrics(trace: Trace, timestamps: pd.DatetimeIndex, rules: PropFirmRules, days: Days | None = None,
                 trades: pd.DataFrame | None = None) -> dict:
    """Every metric of METRICS for one walk: the one scorer of a walk (training's validation, evaluate.py, the
    benchmarks and experiments), trading days from `days` (the market's `sessions.day`; else each bar's date). None
    where a metric is undefined (e.g. profit factor without a losing trade), so JSON stays valid. `trades`: the walk's
    trades_table (an account's: every instrument's trades); None reads them from the trace's one position."""
    pnl = np.asarray(trace["pnl"], np.float64)
    days = step_days(trace, timestamps, days)
    daily = pd.Series(pnl).groupby(days.to_numpy()).sum()
    trades = trades_table(trace, timestamps) if trades is None else trades
    commissions = float(np.asarray(trace["commission"], np.float64).sum())
    net = float(pnl.sum())
    gross = net + commissions
    drawdown = max_drawdown(pnl)
    out = {
        "net_pnl": net,
        "sharpe_daily": sharpe_daily(daily),
        "sortino_daily": sortino_daily(daily),
        "max_drawdown": drawdown,
        "calmar": calmar(daily, drawdown),
        **trade_stats(trades["pnl"].to_numpy()),
        "trade_pnl_std": float(trades["pnl"].std(ddof=1)) if len(trades) > 1 else 0.0,
        "trades_per_day": len(trades) / len(daily) if len(daily) else None,
        "avg_holding_bars": float(trades["bars_held"].mean()) if len(trades) else None,
        "commissions": commissions,
        "commission_share": commissions / abs(gross) if gross else None,
        **prop_firm_result(trace, days, rules),
        "days": float(len(daily)),
        "bars": float(len(pnl)),
    }
    return {name: out[name] for name in METRICS}
