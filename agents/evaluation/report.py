"""What `scripts/evaluate.py` writes: the console table (rich), the same table as markdown, the JSON of every
figure, trades.csv, and PNG plots (equity with the trailing-drawdown threshold and the trades, underwater
drawdown, training curves from metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from rich.table import Table  # noqa: E402

from agents.advice.risk_veto import RULES  # noqa: E402
from agents.advice.usage import ADVICE_METRICS  # noqa: E402
from agents.evaluation.saved_run import GATED, OVERFITTING_METRICS  # noqa: E402
from jaxenv.contracts import ContractSpec, price_decimals  # noqa: E402
from jaxenv.env import NO_EXIT  # noqa: E402
from jaxenv.metrics import METRICS, Trace, trades_table, underwater  # noqa: E402

LABELS = {
    "net_pnl": "net P&L", "sharpe_daily": "Sharpe (daily)", "sortino_daily": "Sortino (daily)",
    "max_drawdown": "max drawdown", "calmar": "Calmar", "win_rate": "win rate", "profit_factor": "profit factor",
    "expectancy": "expectancy / trade", "trade_pnl_std": "std of trade P&L", "trades": "trades",
    "trades_per_day": "trades / day",
    "avg_holding_bars": "avg holding (bars)", "commissions": "commissions", "commission_share": "commissions / gross",
    "breaches": "breaches", "days_to_first_breach": "days to 1st breach", "prop_passed": "prop-firm target",
    "days": "trading days", "bars": "bars walked",
    "advice_coverage": "advice coverage", "advice_coverage_current": "advice coverage (current advisor)",
    "advice_confidence": "advice confidence", "agreement": "advice agrees",
    "override_rate": "overridden by advice", "mean_trust": "mean trust g", "veto_rate": "vetoed decisions",
    "wait_rate": "waited for advice", "bracket_kept_rate": "advised bracket kept",
    "bound_rate": "bound to advice",
    "psr": "PSR (P(Sharpe > 0))", "dsr": "deflated Sharpe ratio", "trials": "trials on this data",
    **{f"vetoes_{rule}": f"vetoes: {rule.replace('_', ' ')}" for rule in RULES},
}
MONEY = {"net_pnl", "max_drawdown", "expectancy", "trade_pnl_std", "commissions"}
PERCENT = {"win_rate", "commission_share", "advice_coverage", "advice_coverage_current", "agreement", "override_rate", "veto_rate", "wait_rate",
           "bracket_kept_rate", "bound_rate"}
WHOLE = {"trades", "breaches", "days_to_first_breach", "days", "bars", "trials", *(f"vetoes_{rule}" for rule in RULES)}


def _number(name: str, value: float) -> str:
    if name in MONEY:
        return f"{'-' if value < 0 else ''}${abs(value):,.0f}"
    if name in PERCENT:
        return f"{value:.1%}"
    if name in WHOLE:
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    return f"{value:.2f}"


def format_metric(name: str, summary: dict[str, Any]) -> str:
    """One cell: the value, or `mean ± half-width of the 95% interval` over several walks; `—` if undefined."""
    value = summary.get(name)
    if value is None:
        return "—"
    if name == "prop_passed":
        return ("pass" if value else "fail") if summary["n"] == 1 else f"{value:.0%} pass"
    interval = summary.get("ci95", {}).get(name)
    if interval is None:
        return _number(name, value)
    return f"{_number(name, value)} ± {_number(name, (interval[1] - interval[0]) / 2).lstrip('-')}"


def columns(summary: dict[str, Any]) -> dict[str, dict]:
    """policy name -> its summary, in table order: the agent, the agent as its gate allows it to trade, its
    ablations, the baselines."""
    gated = {GATED: summary["gated"]} if "gated" in summary else {}
    return {"agent": summary["agent"], **gated, **summary["ablations"], **summary["baselines"]}


def rows(summary: dict[str, Any]) -> list[str]:
    """The metrics shown: every one of METRICS, then how advice was used when any column walked with advice (a run
    without an advisor shows no rows of zeros), then the agent's overfitting figures."""
    cols = columns(summary).values()
    advised = any(c.get(m) for c in cols for m in ADVICE_METRICS)
    extra = [m for m in (*(ADVICE_METRICS if advised else ()), *OVERFITTING_METRICS) if any(m in c for c in cols)]
    return [*METRICS, *extra]


def gate_lines(summary: dict[str, Any]) -> list[str]:
    """The gate's verdict of each run's walk, one line each."""
    return [f"gate ({i + 1}): {g['mode']} at the walk's end: {g['reason']}"
            for i, g in enumerate(summary.get("gate", []))]


def rich_table(summary: dict[str, Any]) -> Table:
    setup = summary["setup"]
    walks = f"{setup['episodes']} episodes" if setup["episodes"] else "whole split"
    title = (f"{', '.join(setup['checkpoints'])} on {setup['data']} {setup['split']} "
             f"({walks}, {setup['seeds']} seed{'s' if setup['seeds'] > 1 else ''})")
    if "instrument" in setup:  # evaluations written before instruments were recorded have none
        title += f"\n{setup['instrument']['description']}"
    table = Table(title=title)
    table.add_column("metric")
    for name in columns(summary):
        table.add_column(name, justify="right")
    for metric in rows(summary):
        table.add_row(LABELS[metric], *(format_metric(metric, s) for s in columns(summary).values()))
    return table


def markdown_table(summary: dict[str, Any]) -> str:
    cols = columns(summary)
    instrument = summary["setup"].get("instrument")
    lines = [f"Instrument: {instrument['description']}", ""] if instrument else []
    lines += ["| metric | " + " | ".join(cols) + " |", "|---" + "|---:" * len(cols) + "|"]
    lines += [f"| {LABELS[m]} | " + " | ".join(format_metric(m, s) for s in cols.values()) + " |" for m in rows(summary)]
    return "\n".join([*lines, "", *gate_lines(summary)]) + "\n"


def summed_interval(pnl: np.ndarray) -> tuple[float, float, float]:
    """(sum, low, high) of per-session P&L: the sum with its 95% t-interval over the sessions."""
    from scipy import stats

    n = len(pnl)
    half = float(stats.t.ppf(0.975, n - 1) * pnl.std(ddof=1) * np.sqrt(n)) if n > 1 else float("nan")
    return float(pnl.sum()), float(pnl.sum()) - half, float(pnl.sum()) + half


def verdict(record, trials: int, scale: float, against: str = "flat") -> dict[str, Any]:
    """What a checkpoint's out-of-sample record shows: its sessions' P&L summed against flat and against buy-and-hold
    (None where the record has no buy-and-hold), each with a 95% interval over the sessions; the deflated Sharpe ratio
    over `trials`; and its gate (agents.evidence.gate.Gate) against the run's bar as trade.py would start it."""
    from agents.evidence.gate import Gate
    from agents.evidence.overfitting import deflated_sharpe_ratio

    pnl = np.asarray(record.pnl, np.float64)
    out: dict[str, Any] = {"sessions": len(pnl), "pnl": summed_interval(pnl), "buy_and_hold": None,
                           "vs_buy_and_hold": None, "trials": trials,
                           "dsr": deflated_sharpe_ratio(pnl, trials)["dsr"] if len(pnl) > 2 else float("nan"),
                           "gate": Gate.start(record, scale, against)}
    if record.buy_and_hold is not None:
        held = np.asarray(record.buy_and_hold, np.float64)
        out["buy_and_hold"], out["vs_buy_and_hold"] = float(held.sum()), summed_interval(pnl - held)
    return out


def verdict_lines(record, trials: int, scale: float, checkpoint: str, against: str = "flat") -> list[str]:
    """What a run shows out of sample (`verdict`), in words: its P&L on its test split against flat and against
    buy-and-hold with their intervals and the deflated Sharpe ratio; the gate's verdict for trade.py; and, where the
    agent did not beat buy-and-hold and the gate's bar is flat, so."""
    v = verdict(record, trials, scale, against)
    total, lo, hi = v["pnl"]
    gate = v["gate"]
    trade = ("trade.py will send its orders to the broker" if gate.live else
             "trade.py will paper-trade this agent until its record passes")
    compared = f"against flat's 0 [{lo:,.0f}, {hi:,.0f}]"
    if v["vs_buy_and_hold"] is not None:
        gap, gap_lo, gap_hi = v["vs_buy_and_hold"]
        compared += (f" and buy-and-hold's {v['buy_and_hold']:,.0f} (the difference {gap:,.0f} [{gap_lo:,.0f}, "
                    f"{gap_hi:,.0f}])")
    lines = [f"out of sample ({record.source}, {v['sessions']} sessions, {checkpoint} checkpoint): P&L {total:,.0f} "
             f"{compared} (95% intervals over sessions); deflated Sharpe ratio {v['dsr']:.2f} over {trials} "
             f"trial{'s' if trials > 1 else ''} on this data",
             f"gate: {gate.reason()}: {trade}"]
    if against == "flat" and v["vs_buy_and_hold"] is not None and not v["vs_buy_and_hold"][1] > 0:
        lines.append("note: the agent has not shown that it beats buy-and-hold here; the gate's bar is flat, which an "
                     "agent that only holds long on a rising market can clear (--gate-against buy_and_hold raises it)")
    return lines


def write_json(summary: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False))


def write_trades(trace: Trace, timestamps: pd.DatetimeIndex, contracts: int, contract: ContractSpec,
                 path: Path) -> pd.DataFrame:
    """trades.csv: prices at the instrument's tick precision (EURUSD's 1.18713), the rest (money) at 2 decimals."""
    trades = trades_table(trace, timestamps, contracts)
    priced(trades, contract).to_csv(path, index=False, float_format="%.2f")
    return trades


def priced(trades: pd.DataFrame, contract: ContractSpec) -> pd.DataFrame:
    """trades_table's rows with their entry and exit prices as text at the instrument's tick precision."""
    price = f"{{:.{price_decimals(contract)}f}}".format
    return trades.assign(entry_price=trades["entry_price"].map(price), exit_price=trades["exit_price"].map(price))


def account_lines(figures: dict[str, Any], what: str) -> list[str]:
    """An account of several instruments on a split, two lines: its P&L against flat's and the set's buy-and-hold
    (each instrument's move held in the agent's size, no costs), its trades, then each instrument's P&L, trades and
    buy-and-hold. `figures`: net_pnl, flat, buy_and_hold, trades and instruments {symbol: {net_pnl, trades, held_pnl}}
    (summary.json's account entry of a split, or evaluation.json's account); `what`: e.g. "test (NQ + ES, best
    checkpoint)"."""
    return [f"account {what}: P&L {figures['net_pnl']:,.2f} against flat's {figures['flat']:,.2f} and the set's "
            f"buy-and-hold {figures['buy_and_hold']:,.2f} (held in the agent's size, no costs); "
            f"{figures['trades']:.0f} trades",
            "  " + "; ".join(f"{symbol}: P&L {own['net_pnl']:,.2f}, {own['trades']:.0f} trades, buy-and-hold "
                             f"{own['held_pnl']:,.2f}" for symbol, own in figures["instruments"].items())]


def _date_ticks(ax, trace: Trace, timestamps: pd.DatetimeIndex, max_ticks: int = 8) -> None:
    """Steps on the x axis (nights and weekends take no room), labelled with the dates of some session starts."""
    days = pd.Series(timestamps[np.asarray(trace["t"]) + 1].date)
    starts = np.flatnonzero(days.ne(days.shift()).to_numpy())
    chosen = starts[:: max(1, int(np.ceil(len(starts) / max_ticks)))]
    ax.set_xticks(chosen, [days[i].strftime("%Y-%m-%d") for i in chosen], rotation=30, ha="right", fontsize=8)


def plot_equity(trace: Trace, timestamps: pd.DatetimeIndex, path: Path, title: str) -> None:
    """Account equity at each bar's close, the trailing-drawdown threshold below it, entries (▲ long, ▼ short)
    and exits (green: winning trade, red: losing), and breaches (a fresh account starts at the next bar)."""
    x = np.arange(len(trace["t"]))
    equity = np.asarray(trace["equity"], np.float64)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.plot(x, equity, lw=0.8, color="tab:blue", label="equity (mark-to-market)")
    ax.plot(x, trace["threshold"], lw=0.9, ls="--", color="tab:red", label="trailing-drawdown threshold")
    side = np.asarray(trace["entry_side"])
    for sign, marker, color, label in ((1, "^", "tab:green", "long entry"), (-1, "v", "tab:orange", "short entry")):
        at = side == sign
        ax.scatter(x[at], equity[at], marker=marker, s=14, color=color, label=label, zorder=3)
    exits = np.asarray(trace["exit_reason"]) != NO_EXIT
    won = np.asarray(trace["trade_pnl"]) > 0
    ax.scatter(x[exits & won], equity[exits & won], s=5, color="green", label="exit, win", zorder=3)
    ax.scatter(x[exits & ~won], equity[exits & ~won], s=5, color="red", label="exit, loss", zorder=3)
    for i, at in enumerate(np.flatnonzero(trace["breach"])):
        ax.axvline(at, color="black", lw=0.6, alpha=0.5, label="breach" if i == 0 else None)
    ax.set_title(title)
    ax.set_ylabel("account equity ($)")
    _date_ticks(ax, trace, timestamps)
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_underwater(traces: dict[str, Trace], timestamps: pd.DatetimeIndex, path: Path, title: str) -> None:
    """How far each policy's cumulative P&L is below its running peak, bar by bar (the first is filled)."""
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for i, (name, trace) in enumerate(traces.items()):
        depth = -underwater(trace["pnl"])
        if i == 0:
            ax.fill_between(np.arange(len(depth)), depth, 0.0, color="tab:red", alpha=0.4, lw=0, label=name)
        else:
            ax.plot(depth, lw=0.8, ls="--", label=name)
    first = next(iter(traces.values()))
    ax.set_title(title)
    ax.set_ylabel("drawdown ($)")
    _date_ticks(ax, first, timestamps)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


TRAINING_PANELS = (  # metrics.jsonl key, panel title
    ("episode_pnl", "training episodes: mean P&L ($)"),
    ("val_net_pnl", "validation split: net P&L ($)"),
    ("entropy", "policy entropy"),
    ("approx_kl", "approx. KL per update"),
)


def plot_training(metrics_jsonl: Path, path: Path, title: str) -> bool:
    """Training curves against env steps; False (nothing written) when the run logged none of them."""
    if not metrics_jsonl.exists():
        return False
    log = pd.read_json(metrics_jsonl, lines=True)
    panels = [(k, t) for k, t in TRAINING_PANELS if k in log and log[k].notna().any()]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), squeeze=False)
    for ax, (key, panel_title) in zip(axes[0], panels):
        points = log[["env_steps", key]].dropna()
        ax.plot(points["env_steps"] / 1e6, points[key], marker="o" if len(points) < 30 else None, ms=3, lw=1)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel("env steps (M)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
