"""Seeded synthetic minute bars: regular-trading-hours sessions with overnight gaps, an intraday volatility
smile, regimes that switch between trend and range, and fat-tailed returns. No download needed.

Presets:
- `default`: the main job's market; weak trends, mostly noise.
- `signal`: trend regimes whose drift persists for hundreds of bars, a learnable edge after costs.
- `headlines`: a per-bar headline whose sentiment tracks a hidden drift regime that the prices alone reveal
  only slowly; numeric features carry no direct trace of it.
- `headlines_then_trend`: the news of `headlines` in the session's first half only, and trend regimes a policy can
  read from prices (independent of the news) in its second half only: the two edges never drift the same bar, and
  the clock says which one is on.

Pair presets, two instruments drawn together (`generate_pair`; loaded as a set, jaxenv.market_set):
- `pair`: two correlated index futures (the first leg at NQ's price level, the second at ES's) with no edge: their
  same-bar moves correlate, neither leads, each alone is a random walk.
- `pair_signal`: the second leg's move leads the first leg's by a few bars, an edge only the pair shows: each series
  alone is a random walk (no autocorrelation) and their same-bar moves are uncorrelated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from jaxenv.contracts import ContractSpec

BARS_PER_SESSION = 390  # 09:30 to 15:59 bar opens
NEWS_BARS = BARS_PER_SESSION // 2  # split_session: the session's first bars, where only the news drifts

# Hidden regimes.
RANGE, TREND_UP, TREND_DOWN = 0, 1, 2


@dataclass(frozen=True)
class SyntheticPreset:
    start_price: float = 18_000.0
    daily_vol: float = 0.012  # close-to-close volatility as a fraction of price
    overnight_gap_vol: float = 0.004
    tail_df: float = 4.0  # Student-t degrees of freedom of minute returns
    regime_mean_bars: float = 180.0  # mean regime duration
    trend_drift_sigma: float = 0.03  # drift per bar in trend regimes, in units of the bar's sigma
    range_reversion: float = 0.02  # pull toward the regime's anchor price per bar in range regimes
    headline_drift_sigma: float = 0.0  # drift of the hidden news regime (headlines preset)
    headline_regime_mean_bars: float = 60.0
    headline_accuracy: float = 0.95  # share of headlines whose sentiment matches the hidden regime
    # the news drifts (and its headlines carry sentiment) in the session's first half only, the trends in its second
    # half only: the two edges never drift the same bar, and the time of day says which one is on
    split_session: bool = False


PRESETS: dict[str, SyntheticPreset] = {
    "default": SyntheticPreset(),
    # Drift that persists for a whole trend regime: direction matters, so a random policy earns little.
    "signal": SyntheticPreset(trend_drift_sigma=0.15, regime_mean_bars=240.0),
    # A hidden news regime drifts prices; the headlines name its direction (the fusion experiment's advisor reads
    # them), the prices reveal it only slowly.
    "headlines": SyntheticPreset(trend_drift_sigma=0.0, headline_drift_sigma=0.12),
    # The same news in the morning, and in the afternoon trends a policy can read from prices that the headline
    # knows nothing of: an agent that follows the headline in the morning and the prices in the afternoon can add
    # the two edges (docs/findings.md).
    "headlines_then_trend": SyntheticPreset(trend_drift_sigma=0.12, regime_mean_bars=240.0, headline_drift_sigma=0.12,
                                            split_session=True),
}

_POSITIVE = [
    "{co} beats earnings estimates, shares surge",
    "Fed officials signal patience, stocks rally",
    "Strong jobs data lifts risk appetite",
    "{co} upgraded to buy on robust demand",
    "Tech rebound gains momentum as yields ease",
    "Consumer confidence jumps to a two-year high",
]
_NEGATIVE = [
    "{co} misses estimates, shares plunge",
    "Hawkish Fed remarks spark a selloff",
    "Weak manufacturing data deepens recession fears",
    "{co} downgraded to sell on slowing growth",
    "Tech stocks slump as yields spike",
    "Consumer confidence falls to a two-year low",
]
_QUIET = [  # no sentiment: none of the mock advisor's bullish or bearish words
    "{co} to present at an industry conference next week",
    "Markets await the Fed's minutes",
    "Trading volumes thin ahead of the holiday",
    "{co} names a new chief financial officer",
    "Treasury publishes its auction schedule",
    "Analysts split on the outlook for {co}",
]
_COMPANIES = ["Apple", "Microsoft", "Nvidia", "Amazon", "Alphabet", "Meta", "Tesla", "Broadcom"]


def _intraday_vol_smile(n: int) -> np.ndarray:
    """U-shaped volatility multiplier over a session: high at the open, low at lunch, rising into the close."""
    x = np.linspace(0.0, 1.0, n)
    smile = 0.75 + 1.1 * np.exp(-x / 0.06) + 0.45 * np.exp(-(1.0 - x) / 0.08)
    return smile / np.sqrt(np.mean(smile**2))


def _markov_regimes(rng: np.random.Generator, n: int, mean_bars: float, n_states: int) -> np.ndarray:
    switch = rng.random(n) < 1.0 / mean_bars
    draws = rng.integers(0, n_states, size=n)
    regime = np.empty(n, dtype=np.int64)
    current = int(draws[0])
    for i in range(n):  # a plain loop: n is at most a few hundred thousand and this runs once
        if switch[i]:
            current = int(draws[i])
        regime[i] = current
    return regime


class SyntheticMarket(NamedTuple):
    bars: pd.DataFrame  # OHLCV indexed by tz-aware stamps (bar opens) in the exchange's zone, no text
    # presets with a news regime: one row per story, in time order: the bar it arrives on, that bar's stamp and its
    # headline; it stays the latest story until the next. None for the others
    news: pd.DataFrame | None


def on_ticks(open_: np.ndarray, high: np.ndarray, low: np.ndarray, close: np.ndarray,
             tick: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Drawn prices rounded to the instrument's tick grid, the high and low still bounding the open and close."""
    def to_ticks(x: np.ndarray) -> np.ndarray:
        return np.round(x / tick) * tick

    open_, close = to_ticks(open_), to_ticks(close)
    high = np.maximum(to_ticks(high), np.maximum(open_, close))
    low = np.minimum(to_ticks(low), np.minimum(open_, close))
    return open_, high, low, close


def generate_bars(preset: str, contract: ContractSpec, days: int, seed: int) -> pd.DataFrame:
    """Regular-hours minute bars (09:30-15:59) indexed by tz-aware timestamps in the contract's exchange zone, on its
    tick grid; for a preset with news a `headline` column: each bar's latest story."""
    bars, news = generate_market(preset, contract, days, seed)
    if news is None:
        return bars
    latest = np.searchsorted(news["bar"].to_numpy(), np.arange(len(bars)), side="right") - 1
    return bars.assign(headline=news["headline"].to_numpy()[latest])


def generate_market(preset: str, contract: ContractSpec, days: int, seed: int) -> SyntheticMarket:
    """The bars of `generate_bars` and, for a preset with news, its stories as items."""
    if preset in PAIR_PRESETS:
        raise ValueError(f"synthetic:{preset} is a pair of instruments: load it as a set of two "
                         f"(jaxenv.market_set.load_market_set([(\"NQ\", \"synthetic:{preset}\"), "
                         f"(\"ES\", \"synthetic:{preset}\")], data))")
    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic preset {preset!r}; choose one of {', '.join(PRESETS)} (pairs of "
                         f"instruments: {', '.join(PAIR_PRESETS)})")
    if days < 2:
        raise ValueError(f"synthetic markets need at least 2 days (data.synthetic_days), got {days}")
    p = PRESETS[preset]
    rng = np.random.default_rng(seed)
    n = days * BARS_PER_SESSION

    session_days = pd.bdate_range("2024-01-02", periods=days)
    minute_offsets = pd.to_timedelta(np.arange(BARS_PER_SESSION) + 9 * 60 + 30, unit="min")
    stamps = (session_days.values[:, None] + minute_offsets.values[None, :]).reshape(-1)
    index = pd.DatetimeIndex(stamps).tz_localize(contract.timezone)

    bar_sigma = p.daily_vol / np.sqrt(BARS_PER_SESSION)  # as a fraction of price
    smile = np.tile(_intraday_vol_smile(BARS_PER_SESSION), days)
    # Unit-variance Student-t shocks: fat tails with the volatility the preset asks for.
    shocks = rng.standard_t(p.tail_df, size=n) / np.sqrt(p.tail_df / (p.tail_df - 2.0))
    regime = _markov_regimes(rng, n, p.regime_mean_bars, 3)
    news = _markov_regimes(rng, n, p.headline_regime_mean_bars, 2) * 2 - 1  # -1 or +1
    trend_on = np.ones(n, dtype=bool)
    if p.split_session:  # masks, no draws: the other presets keep their bars
        morning = np.tile(np.arange(BARS_PER_SESSION) < NEWS_BARS, days)
        news = news * morning
        trend_on = ~morning

    log_ret = np.empty(n)
    log_close = np.empty(n)
    log_open = np.empty(n)
    level = np.log(p.start_price)
    anchor = level
    for i in range(n):
        session_start = i % BARS_PER_SESSION == 0
        if session_start and i > 0:
            level += rng.normal(0.0, p.overnight_gap_vol)
        if i == 0 or regime[i] != regime[i - 1]:
            anchor = level
        sig = bar_sigma * smile[i]
        r = sig * shocks[i]
        if regime[i] == TREND_UP and trend_on[i]:
            r += p.trend_drift_sigma * sig
        elif regime[i] == TREND_DOWN and trend_on[i]:
            r += -p.trend_drift_sigma * sig
        elif regime[i] == RANGE:  # a trend regime while trends are off (split_session) is plain noise
            r += p.range_reversion * (anchor - level)
        r += p.headline_drift_sigma * sig * news[i]
        log_open[i] = level
        level += r
        log_close[i] = level
        log_ret[i] = r

    open_ = np.exp(log_open)
    close = np.exp(log_close)
    wick_sigma = bar_sigma * smile * 0.5
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0.0, 1.0, n)) * wick_sigma)
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0.0, 1.0, n)) * wick_sigma)

    open_, high, low, close = on_ticks(open_, high, low, close, contract.tick_size)

    volume = np.round(
        800.0 * smile**2 * rng.lognormal(0.0, 0.35, n) * (1.0 + np.abs(log_ret) / (bar_sigma * smile))
    )
    frame = pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": volume.astype(np.float64)},
        index=index,
    )
    frame.index.name = "timestamp"
    if not p.headline_drift_sigma:
        return SyntheticMarket(frame, None)
    arrivals, headlines = _stories(rng, news, p.headline_accuracy)  # a preset with a news regime writes its stories
    stories = pd.DataFrame({"bar": arrivals, "timestamp": index[arrivals], "headline": headlines})
    return SyntheticMarket(frame, stories)


def _stories(rng: np.random.Generator, news: np.ndarray, accuracy: float) -> tuple[np.ndarray, list[str]]:
    """The bars on which a new story arrives (the first bar, then every few bars) and their headlines."""
    arrivals: list[int] = []
    headlines: list[str] = []
    for i in range(len(news)):
        if i == 0 or rng.random() < 0.2:
            truthful = rng.random() < accuracy
            if news[i] == 0:  # no news drift: a headline without sentiment, or (untruthful) a random bullish or bearish
                headline = quiet_headline(rng) if truthful else random_headline(rng, bullish=rng.random() < 0.5)
            else:
                headline = random_headline(rng, bullish=(news[i] if truthful else -news[i]) > 0)
            arrivals.append(i)
            headlines.append(headline)
    return np.array(arrivals, dtype=np.int64), headlines


def _headline_from(rng: np.random.Generator, pool: list[str]) -> str:
    """A template of `pool` (drawn first), filled with a company (drawn second)."""
    return pool[rng.integers(len(pool))].format(co=_COMPANIES[rng.integers(len(_COMPANIES))])


def random_headline(rng: np.random.Generator, bullish: bool) -> str:
    return _headline_from(rng, _POSITIVE if bullish else _NEGATIVE)


def quiet_headline(rng: np.random.Generator) -> str:
    return _headline_from(rng, _QUIET)


def headline_sentiment(text: str) -> int:
    """+1 if `text` holds a bullish headlines-preset headline, -1 a bearish one, 0 neither (or both)."""
    def found(pool: list[str]) -> bool:
        return any(max(t.split("{co}"), key=len) in text for t in pool)

    return int(found(_POSITIVE)) - int(found(_NEGATIVE))


@dataclass(frozen=True)
class PairPreset:
    """Two instruments' minute bars drawn together, without regimes: Student-t shocks on the intraday smile."""

    start_prices: tuple[float, float] = (18_000.0, 4_800.0)  # the first leg at NQ's level, the second at ES's
    daily_vols: tuple[float, float] = (0.014, 0.011)
    overnight_gap_vol: float = 0.004
    tail_df: float = 4.0
    correlation: float = 0.0  # of the two legs' same-bar shocks (and overnight gaps)
    lead_bars: int = 0  # the second leg's shock at bar t moves the first leg at bar t + lead_bars ...
    lead_weight: float = 0.0  # ... by this many of the first leg's bar sigmas per sigma of the second's


# A single lag and no same-bar correlation in pair_signal: then the first leg's shocks stay serially uncorrelated (a
# random walk alone), and the lead is the only thing the pair adds.
PAIR_PRESETS: dict[str, PairPreset] = {
    "pair": PairPreset(correlation=0.85),
    "pair_signal": PairPreset(lead_bars=3, lead_weight=0.35),
}


def generate_pair(preset: str, contracts: tuple[ContractSpec, ContractSpec], days: int, seed: int
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Regular-hours minute bars (09:30-15:59) of two instruments on the same stamps, each indexed in its contract's
    exchange zone and on its tick grid: `pair` correlated with no edge, `pair_signal` with the second leg leading
    the first by `lead_bars` bars (PAIR_PRESETS)."""
    if preset not in PAIR_PRESETS:
        raise ValueError(f"unknown synthetic pair preset {preset!r}; choose one of {', '.join(PAIR_PRESETS)}")
    if days < 2:
        raise ValueError(f"synthetic markets need at least 2 days (data.synthetic_days), got {days}")
    if len(contracts) != 2:
        raise ValueError(f"synthetic:{preset} is a pair: it needs two instruments, got {len(contracts)}")
    p = PAIR_PRESETS[preset]
    rng = np.random.default_rng(seed)
    n = days * BARS_PER_SESSION
    session_days = pd.bdate_range("2024-01-02", periods=days)
    minute_offsets = pd.to_timedelta(np.arange(BARS_PER_SESSION) + 9 * 60 + 30, unit="min")
    wall = pd.DatetimeIndex((session_days.values[:, None] + minute_offsets.values[None, :]).reshape(-1))
    smile = np.tile(_intraday_vol_smile(BARS_PER_SESSION), days)

    def t_shocks(size) -> np.ndarray:
        return rng.standard_t(p.tail_df, size=size) / np.sqrt(p.tail_df / (p.tail_df - 2.0))

    lead_z, own_z = t_shocks(n), t_shocks(n)  # the second leg's shocks; the first leg's own
    lagged = np.zeros(n)
    if p.lead_bars:
        lagged[p.lead_bars:] = lead_z[:-p.lead_bars]
    own_weight = np.sqrt(1.0 - p.correlation**2 - p.lead_weight**2)
    first_z = p.correlation * lead_z + p.lead_weight * lagged + own_weight * own_z
    gaps = rng.normal(0.0, p.overnight_gap_vol, size=(days, 2))
    gaps[:, 0] = p.correlation * gaps[:, 1] + np.sqrt(1.0 - p.correlation**2) * gaps[:, 0]
    wick_draws = np.abs(rng.normal(0.0, 1.0, size=(2, 2, n)))
    volume_draws = rng.lognormal(0.0, 0.35, size=(2, n))

    frames = []
    for leg, (z, contract) in enumerate(zip((first_z, lead_z), contracts)):
        bar_sigma = p.daily_vols[leg] / np.sqrt(BARS_PER_SESSION)
        sig = bar_sigma * smile
        log_ret = sig * z
        gap = np.zeros(n)
        gap[BARS_PER_SESSION::BARS_PER_SESSION] = gaps[1:, leg]  # before each session's first bar but the first
        log_open = np.log(p.start_prices[leg]) + np.cumsum(gap) + np.concatenate([[0.0], np.cumsum(log_ret)[:-1]])
        log_close = log_open + log_ret
        open_, close = np.exp(log_open), np.exp(log_close)
        high = np.maximum(open_, close) * np.exp(wick_draws[leg, 0] * sig * 0.5)
        low = np.minimum(open_, close) * np.exp(-wick_draws[leg, 1] * sig * 0.5)
        open_, high, low, close = on_ticks(open_, high, low, close, contract.tick_size)
        volume = np.round(800.0 * smile**2 * volume_draws[leg] * (1.0 + np.abs(z)))
        frame = pd.DataFrame({"open": open_, "high": high, "low": low, "close": close, "volume": volume},
                             index=wall.tz_localize(contract.timezone))
        frame.index.name = "timestamp"
        frames.append(frame)
    return frames[0], frames[1]
