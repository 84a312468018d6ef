"""Causal features, computed once on the host with pandas and stored as float32 arrays.

Every value at bar t uses bars <= t only: rolling windows and Wilder/EMA smoothing look back, session
aggregates are cumulative within the session (the week, for daily bars), and warm-up gaps are filled with 0, never
back-filled.
`FEATURES` documents each one (docs/environment.md's feature table is `feature_table_markdown()`'s output).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.sessions import DAILY, SessionInfo

ATR_WINDOW = 14
WARMUP_BARS = 400  # longest look-back below (SMA300 slope over 20 bars, ADX70 smoothing) with margin
OPENING_RANGE_MINUTES = 30  # the opening range: the session's first 30 minutes (at least its first bar)


@dataclass(frozen=True)
class Feature:
    group: str
    name: str
    formula: str
    window: str


FEATURES: list[Feature] = [
    # 11 per-bar features, observed for each of the last `window` bars.
    Feature("bar", "ret_atr", "(close − previous close) / ATR14", "2 bars"),
    Feature("bar", "range_atr", "(high − low) / ATR14", "1 bar"),
    Feature("bar", "body_atr", "(close − open) / ATR14", "1 bar"),
    Feature("bar", "volume_z", "(volume − mean60) / std60, clipped to ±5", "60 bars"),
    Feature("bar", "rsi14", "Wilder RSI(14) / 100 − 0.5", "14 bars"),
    Feature("bar", "adx14", "Wilder ADX(14) / 100", "28 bars"),
    Feature("bar", "atr_pct", "ATR14 / close × 1000", "14 bars"),
    Feature("bar", "vwap_dist", "(close − session VWAP) / ATR14 / 10, clipped to ±3", "session"),
    Feature("bar", "sma20_slope", "(SMA20 − SMA20 five bars ago) / ATR14", "25 bars"),
    Feature("bar", "sma50_slope", "(SMA50 − SMA50 ten bars ago) / ATR14", "60 bars"),
    Feature("bar", "time_of_day", "minutes since the session's open / its length (daily bars: weekday / 5)", "clock"),
    # 10 extended market context features (current bar only).
    Feature("context", "ret5_atr", "(close − close 5 bars ago) / ATR14", "5 bars"),
    Feature("context", "ret15_atr", "(close − close 15 bars ago) / ATR14", "15 bars"),
    Feature("context", "ret60_atr", "(close − close 60 bars ago) / ATR14 / 5", "60 bars"),
    Feature("context", "rvol30_bps", "std of 1-bar log returns over 30 bars × 1e4 / 10", "30 bars"),
    Feature("context", "rvol_ratio", "rvol30 / rvol120 − 1", "120 bars"),
    Feature("context", "session_high_dist", "(session high so far − close) / ATR14 / 10", "session"),
    Feature("context", "session_low_dist", "(close − session low so far) / ATR14 / 10", "session"),
    Feature("context", "session_range_atr", "(session high − session low so far) / ATR14 / 10", "session"),
    Feature("context", "opening_range_pos", "(close − OR low) / (OR high − OR low) − 0.5, OR = first 30 minutes", "session"),
    Feature("context", "session_volume_ratio", "session volume so far / (mean bar volume × bars so far) − 1", "1 session"),
    # 8 multi-timeframe features: the same indicators on 5× and 15× longer look-backs.
    Feature("mtf", "rsi70", "Wilder RSI(70) / 100 − 0.5 (RSI14 of 5-minute bars)", "70 bars"),
    Feature("mtf", "rsi210", "Wilder RSI(210) / 100 − 0.5 (RSI14 of 15-minute bars)", "210 bars"),
    Feature("mtf", "sma100_slope", "(SMA100 − SMA100 20 bars ago) / ATR14", "120 bars"),
    Feature("mtf", "sma300_slope", "(SMA300 − SMA300 20 bars ago) / ATR14", "320 bars"),
    Feature("mtf", "adx70", "Wilder ADX(70) / 100", "140 bars"),
    Feature("mtf", "macd_hist", "(EMA60 − EMA130 − its EMA45) / ATR14", "175 bars"),
    Feature("mtf", "bollinger_b", "(close − SMA100) / (2 × std100)", "100 bars"),
    Feature("mtf", "stoch70", "(close − low70) / (high70 − low70) − 0.5", "70 bars"),
    # 10 pattern-recognition features.
    Feature("pattern", "body_ratio", "(close − open) / (high − low)", "1 bar"),
    Feature("pattern", "upper_wick", "(high − max(open, close)) / (high − low)", "1 bar"),
    Feature("pattern", "lower_wick", "(min(open, close) − low) / (high − low)", "1 bar"),
    Feature("pattern", "inside_bar", "1 if high < previous high and low > previous low", "2 bars"),
    Feature("pattern", "outside_bar", "1 if high > previous high and low < previous low", "2 bars"),
    Feature("pattern", "bull_engulfing", "1 if up bar whose body covers the previous down bar's body", "2 bars"),
    Feature("pattern", "bear_engulfing", "1 if down bar whose body covers the previous up bar's body", "2 bars"),
    Feature("pattern", "doji", "1 if |close − open| ≤ 0.1 × (high − low)", "1 bar"),
    Feature("pattern", "swing_structure", "(higher highs − lower lows) over the last 5 bars / 5", "6 bars"),
    Feature("pattern", "breakout20", "+1 if close > the previous 20 bars' high, −1 if < their low", "21 bars"),
]
# The last five observation features come from the account state inside the environment.
RISK_FEATURES: list[Feature] = [
    Feature("risk", "drawdown_buffer", "(equity − drawdown threshold) / trailing drawdown", "account"),
    Feature("risk", "consecutive_losses", "consecutive losing trades / 5, clipped to 2", "account"),
    Feature("risk", "win_rate_last10", "wins / trades over the last 10 trades (0.5 before any)", "account"),
    Feature("risk", "trades_today", "trades closed this session / 10", "session"),
    Feature("risk", "session_pnl", "(equity − equity at the session's start) / 1000", "session"),
]
N_BAR_FEATURES = sum(f.group == "bar" for f in FEATURES)
N_CONTEXT_FEATURES = len(FEATURES) - N_BAR_FEATURES


def _wilder(x: pd.Series, n: int) -> pd.Series:
    return x.ewm(alpha=1.0 / n, adjust=False).mean()


def _rsi(close: pd.Series, n: int) -> pd.Series:
    d = close.diff()
    up = _wilder(d.clip(lower=0.0), n)
    down = _wilder((-d).clip(lower=0.0), n)
    return 100.0 - 100.0 / (1.0 + up / down.replace(0.0, np.nan))


def _true_range(h: pd.Series, lo: pd.Series, c: pd.Series) -> pd.Series:
    pc = c.shift(1)
    return pd.concat([h - lo, (h - pc).abs(), (lo - pc).abs()], axis=1).max(axis=1)


def _adx(h: pd.Series, lo: pd.Series, c: pd.Series, n: int) -> pd.Series:
    up, down = h.diff(), -lo.diff()
    plus_dm = pd.Series(np.where((up > down) & (up > 0), up, 0.0), index=h.index)
    minus_dm = pd.Series(np.where((down > up) & (down > 0), down, 0.0), index=h.index)
    atr = _wilder(_true_range(h, lo, c), n)
    plus_di = 100.0 * _wilder(plus_dm, n) / atr
    minus_di = 100.0 * _wilder(minus_dm, n) / atr
    dx = 100.0 * (plus_di - minus_di).abs() / (plus_di + minus_di).replace(0.0, np.nan)
    return _wilder(dx, n)


# Indicators in the units a person reads (prompts show them), computed beside the scaled features from the same
# series: name -> what it is.
INDICATORS: dict[str, str] = {
    "rsi14": "Wilder RSI(14), 0..100",
    "adx14": "Wilder ADX(14), 0..100",
    "vwap_dist_pct": "(close − session VWAP) / close, percent",
    "ret15_pct": "close-to-close change over 15 bars, percent",
}


def compute_features(frame: pd.DataFrame, sessions: SessionInfo):
    """Returns (bar_features [n, 11], context_features [n, 28], atr [n], indicators {INDICATORS name: [n]}) as
    float32 arrays. Features are scaled for the network; indicators are the raw values prompts show. Session
    features aggregate over `sessions.period_id`: the trading session of intraday bars, the week of daily bars."""
    o, h, lo, c, v = (frame[k].astype(np.float64).reset_index(drop=True) for k in ("open", "high", "low", "close", "volume"))
    sid = pd.Series(sessions.period_id)
    atr = _wilder(_true_range(h, lo, c), ATR_WINDOW)
    atr_safe = atr.where(atr > 0)
    logret = np.log(c).diff()

    typical = (h + lo + c) / 3.0
    cum_pv = (typical * v).groupby(sid).cumsum()
    cum_v = v.groupby(sid).cumsum()
    vwap = (cum_pv / cum_v.replace(0.0, np.nan)).fillna(c)

    def slope(n: int, lag: int) -> pd.Series:
        sma = c.rolling(n).mean()
        return (sma - sma.shift(lag)) / atr_safe

    vol_mean, vol_std = v.rolling(60).mean(), v.rolling(60).std()
    rsi14, adx14 = _rsi(c, 14), _adx(h, lo, c, 14)
    bar = pd.DataFrame(
        {
            "ret_atr": c.diff() / atr_safe,
            "range_atr": (h - lo) / atr_safe,
            "body_atr": (c - o) / atr_safe,
            "volume_z": ((v - vol_mean) / vol_std.replace(0.0, np.nan)).clip(-5, 5),
            "rsi14": rsi14 / 100.0 - 0.5,
            "adx14": adx14 / 100.0,
            "atr_pct": atr / c * 1000.0,
            "vwap_dist": ((c - vwap) / atr_safe / 10.0).clip(-3, 3),
            "sma20_slope": slope(20, 5),
            "sma50_slope": slope(50, 10),
            "time_of_day": pd.Series(sessions.time_of_day),
        }
    )

    sess_high = h.groupby(sid).cummax()
    sess_low = lo.groupby(sid).cummin()
    bar_in_session = sid.groupby(sid).cumcount()
    early = sessions.minutes_into_session < OPENING_RANGE_MINUTES if sessions.interval_minutes != DAILY else False
    opening = pd.Series(early | (bar_in_session.to_numpy() == 0))
    or_high = h.where(opening).groupby(sid).cummax().groupby(sid).ffill()
    or_low = lo.where(opening).groupby(sid).cummin().groupby(sid).ffill()
    per_period = sessions.bars_per_period
    rv30, rv120 = logret.rolling(30).std(), logret.rolling(120).std()
    ema = lambda x, n: x.ewm(span=n, adjust=False).mean()  # noqa: E731
    macd = ema(c, 60) - ema(c, 130)
    sma100, std100 = c.rolling(100).mean(), c.rolling(100).std()
    low70, high70 = lo.rolling(70).min(), h.rolling(70).max()
    rng = (h - lo).replace(0.0, np.nan)
    ph, pl, po, pc = h.shift(1), lo.shift(1), o.shift(1), c.shift(1)
    higher_highs = (h > ph).astype(float).rolling(5).sum()
    lower_lows = (lo < pl).astype(float).rolling(5).sum()
    context = pd.DataFrame(
        {
            "ret5_atr": (c - c.shift(5)) / atr_safe,
            "ret15_atr": (c - c.shift(15)) / atr_safe,
            "ret60_atr": (c - c.shift(60)) / atr_safe / 5.0,
            "rvol30_bps": rv30 * 1e4 / 10.0,
            "rvol_ratio": rv30 / rv120.replace(0.0, np.nan) - 1.0,
            "session_high_dist": (sess_high - c) / atr_safe / 10.0,
            "session_low_dist": (c - sess_low) / atr_safe / 10.0,
            "session_range_atr": (sess_high - sess_low) / atr_safe / 10.0,
            "opening_range_pos": (c - or_low) / (or_high - or_low).replace(0.0, np.nan) - 0.5,
            "session_volume_ratio": cum_v / (v.rolling(per_period, min_periods=min(30, per_period)).mean()
                                             * (bar_in_session + 1)) - 1.0,
            "rsi70": _rsi(c, 70) / 100.0 - 0.5,
            "rsi210": _rsi(c, 210) / 100.0 - 0.5,
            "sma100_slope": slope(100, 20),
            "sma300_slope": slope(300, 20),
            "adx70": _adx(h, lo, c, 70) / 100.0,
            "macd_hist": (macd - ema(macd, 45)) / atr_safe,
            "bollinger_b": (c - sma100) / (2.0 * std100.replace(0.0, np.nan)),
            "stoch70": (c - low70) / (high70 - low70).replace(0.0, np.nan) - 0.5,
            "body_ratio": (c - o) / rng,
            "upper_wick": (h - np.maximum(o, c)) / rng,
            "lower_wick": (np.minimum(o, c) - lo) / rng,
            "inside_bar": ((h < ph) & (lo > pl)).astype(float),
            "outside_bar": ((h > ph) & (lo < pl)).astype(float),
            "bull_engulfing": ((c > o) & (pc < po) & (c >= po) & (o <= pc)).astype(float),
            "bear_engulfing": ((c < o) & (pc > po) & (c <= po) & (o >= pc)).astype(float),
            "doji": ((c - o).abs() <= 0.1 * (h - lo)).astype(float),
            "swing_structure": (higher_highs - lower_lows) / 5.0,
            "breakout20": np.sign(
                (c > h.shift(1).rolling(20).max()).astype(float) - (c < lo.shift(1).rolling(20).min()).astype(float)
            ),
        }
    )
    assert list(bar.columns) == [f.name for f in FEATURES if f.group == "bar"]
    assert list(context.columns) == [f.name for f in FEATURES if f.group != "bar"]

    def finish(x: pd.DataFrame) -> np.ndarray:
        # Warm-up NaNs become 0 (not back-filled, which would leak the future); clip guards extreme outliers.
        arr = x.to_numpy(dtype=np.float64)
        arr = np.where(np.isfinite(arr), arr, 0.0)
        return np.clip(arr, -50.0, 50.0).astype(np.float32)

    # The first bar's true range is its own high − low, so ATR is defined from bar 0; a zero-range start
    # (flat prices) is floored at one tick-sized fraction so stop distances never collapse to zero.
    atr_out = np.maximum(atr.to_numpy(), 1e-6 * c.to_numpy()).astype(np.float32)
    indicators = pd.DataFrame({
        "rsi14": rsi14.fillna(50.0),  # warm-up bars read as neutral
        "adx14": adx14.fillna(0.0),
        "vwap_dist_pct": (c - vwap) / c * 100.0,
        "ret15_pct": ((c - c.shift(15)) / c * 100.0).fillna(0.0),
    })
    assert list(indicators.columns) == list(INDICATORS)
    return finish(bar), finish(context), atr_out, {k: indicators[k].to_numpy(np.float32) for k in INDICATORS}


def feature_table_markdown() -> str:
    rows = ["| group | feature | formula | window |", "|---|---|---|---|"]
    for f in FEATURES + RISK_FEATURES:
        rows.append(f"| {f.group} | `{f.name}` | {f.formula} | {f.window} |")
    return "\n".join(rows)
