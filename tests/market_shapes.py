"""Market data files in the shapes researchers bring, written by the tests: hourly 24x5 spot FX around 1.1 across a
daylight-saving change, daily equity bars around 800 with holidays, minute futures stamped in UTC, hourly 6E."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.tseries.holiday import USFederalHolidayCalendar

from jaxenv.contracts import get_contract
from jaxenv.synthetic import generate_bars

NEW_YORK = "America/New_York"


def _ohlc(rng: np.random.Generator, n: int, start: float, sigma: float, tick: float, drift: float = 0.0) -> dict:
    """A random walk of n bars (each bar's open is the previous close) on a tick grid, with wicks."""
    steps = rng.standard_t(4, n) / np.sqrt(2.0) * sigma + drift
    close = start * np.exp(np.cumsum(steps))
    open_ = np.concatenate([[start], close[:-1]])
    wick = np.abs(rng.normal(0, 0.5 * sigma, (2, n)))
    high = np.maximum(open_, close) * np.exp(wick[0])
    low = np.minimum(open_, close) * np.exp(-wick[1])
    grid = lambda x: np.round(x / tick) * tick  # noqa: E731
    open_, close = grid(open_), grid(close)
    return {"open": open_, "high": np.maximum(grid(high), np.maximum(open_, close)),
            "low": np.minimum(grid(low), np.minimum(open_, close)), "close": close,
            "volume": np.round(rng.lognormal(7, 0.4, n))}


def fx_session_stamps(first_day: str, days: int, close: str = "17:00", hours: int = 24) -> pd.DatetimeIndex:
    """Hourly bar opens of `days` weekday sessions that close at `close` New York time and last `hours` hours."""
    out = []
    for day in pd.bdate_range(first_day, periods=days):
        end = pd.Timestamp(f"{day:%Y-%m-%d} {close}")
        start = end - pd.Timedelta(hours=hours)
        out.append(pd.date_range(start, end, freq="h", inclusive="left"))
    return pd.DatetimeIndex(np.concatenate([s.values for s in out])).tz_localize(NEW_YORK)


def hourly_fx(days: int = 40, seed: int = 0, drift: float = 0.0) -> pd.DataFrame:
    """EURUSD-like hourly bars, 24x5 (Sunday 17:00 to Friday 17:00 New York), prices around 1.1 with 5 decimals,
    bars ~14 pips high-to-low; the default span crosses the US daylight-saving change of 2024-03-10."""
    index = fx_session_stamps("2024-02-12", days)
    frame = pd.DataFrame(_ohlc(np.random.default_rng(seed), len(index), 1.0850, 0.0009, 0.00001, drift), index=index)
    frame.index.name = "timestamp"
    return frame


def hourly_6e(days: int = 40, seed: int = 1) -> pd.DataFrame:
    """CME 6E-like hourly bars, 18:00-17:00 New York (23 a session), prices on the 0.00005 grid."""
    index = fx_session_stamps("2024-02-12", days, close="17:00", hours=23)
    frame = pd.DataFrame(_ohlc(np.random.default_rng(seed), len(index), 1.0850, 0.0009, 0.00005), index=index)
    frame.index.name = "timestamp"
    return frame


def trading_days(first: str, n: int) -> pd.DatetimeIndex:
    """n weekdays from `first` without US federal holidays."""
    holidays = USFederalHolidayCalendar().holidays("2015-01-01", "2035-12-31")
    days = pd.bdate_range(first, periods=int(n * 1.1) + 30)
    return days[~days.isin(holidays)][:n]


def daily_equity(n: int = 1200, seed: int = 8, drift: float = 0.0) -> pd.DataFrame:
    """Daily bars of a stock around 800 (cents), dated without a time of day, with holidays missing."""
    index = trading_days("2019-01-02", n)
    frame = pd.DataFrame(_ohlc(np.random.default_rng(seed), n, 800.0, 0.015, 0.01, drift), index=index)
    frame.index.name = "date"
    return frame


def minute_futures(days: int = 5, seed: int = 3) -> pd.DataFrame:
    """NQ regular-hours minute bars, stamped in New York time (the synthetic market's)."""
    return generate_bars("default", get_contract("NQ"), days, seed)


def to_utc(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out.index = out.index.tz_convert("UTC")
    return out


def write_csv(frame: pd.DataFrame, path, naive: bool = False, dates: bool = False) -> str:
    """The frame as a CSV with a `timestamp` column: with its UTC offset, naive wall time, or dates."""
    out = frame.copy()
    if dates:
        out.index = out.index.strftime("%Y-%m-%d")
    elif naive:
        out.index = out.index.tz_localize(None) if out.index.tz is not None else out.index
    out.index.name = "timestamp"
    out.to_csv(path)
    return str(path)
