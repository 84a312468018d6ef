"""Several instruments on one timeline: each loaded and checked on its own (jaxenv.market.load_market, its causal
features computed on its own bars before any join), then joined.

The joint timeline is the union of the instruments' bar stamps (compared as instants), restricted to their overlap:
from the latest first bar to the earliest last bar. On a joint bar where an instrument has no bar of its own it is
absent (`present` False): its close is carried forward (open = high = low = close = the previous close, volume 0),
its features, ATR and indicators are its previous bar's (never a later one's), and it has no text (text_index -1).

Calendar rule: every instrument must fit the first instrument's calendar. All share its exchange zone and weekend
rule, and either the same calendar (jaxenv.scale.same_calendar: the same session and regular hours), or sessions
that coincide with the joint sessions as loaded (NQ's regular-hours bars, 09:30-16:00, with a stock's 09:30-16:00;
NQ's full session with a stock is refused). The joint sessions (session_id, minute_of_day, the flat rules' clock)
are the first instrument's calendar over the joint stamps: its regular hours when every joint bar lies inside them,
else its full session; daily bars are one bar per trading day.

    markets = load_market_set([("NQ", "NQ.csv"), ("ES", "ES.csv")], DataConfig())
    markets = load_market_set([("NQ", "synthetic:pair_signal"), ("ES", "synthetic:pair_signal")], DataConfig())
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.config import DataConfig, resolve_data_config
from jaxenv.contracts import ContractSpec
from jaxenv.data import DataValidationError, too_few_bars
from jaxenv.market import FIRST_DECISION_BAR, Market, load_market, market_from_frame, market_splits, splits_text
from jaxenv.scale import same_calendar
from jaxenv.sessions import DAILY, SessionInfo, choose_schedule, interval_text, outside_schedule, session_info
from jaxenv.synthetic import PAIR_PRESETS, generate_pair

SET_DOC = "docs/environment.md, Several instruments (data)"


@dataclass
class MarketSet:
    """Instruments on one joint timeline. `markets[i]` is instrument i re-indexed onto it: every array has
    `num_bars` rows, its `timestamps`, `sessions` and `splits` are the set's, so code for one Market reads any of
    them."""

    symbols: tuple[str, ...]
    sources: tuple[str, ...]
    markets: tuple[Market, ...]
    present: np.ndarray  # bool [n, I]: instrument i has a bar of its own at joint bar t
    timestamps: pd.DatetimeIndex  # the joint stamps, in the first instrument's exchange zone
    sessions: SessionInfo  # on the first instrument's calendar
    splits: dict[str, tuple[int, int]]  # name -> [start, end) joint bar indices, on whole sessions
    own_bars: tuple[int, ...]  # each instrument's bars as loaded (before the overlap cut)
    own_spans: tuple[tuple[pd.Timestamp, pd.Timestamp], ...]  # each instrument's first and last bar as loaded

    @property
    def num_bars(self) -> int:
        return len(self.timestamps)

    @property
    def num_instruments(self) -> int:
        return len(self.symbols)

    @property
    def interval_minutes(self) -> int:
        return self.sessions.interval_minutes

    @property
    def first_decision_bar(self) -> int:
        return FIRST_DECISION_BAR

    @property
    def coverage(self) -> np.ndarray:
        """float [I]: each instrument's share of the joint bars where it has a bar of its own."""
        return self.present.mean(axis=0)

    @property
    def report(self) -> list[str]:
        """The set's load report, one line each: the timeline and overlap, each instrument's bars and coverage, the
        sessions and the splits."""
        daily = self.interval_minutes == DAILY
        when = (lambda t: f"{t:%Y-%m-%d}") if daily else (lambda t: f"{t:%Y-%m-%d %H:%M}")
        lines = [f"{'instruments':<11} {', '.join(self.symbols)} on one timeline of {interval_text(self.interval_minutes)}"
                 f" bars: {self.num_bars:,} bars, the overlap {when(self.timestamps[0])} to "
                 f"{when(self.timestamps[-1])} (the latest first bar to the earliest last bar)"]
        for i, (symbol, source, bars, (first, last)) in enumerate(zip(self.symbols, self.sources, self.own_bars,
                                                                     self.own_spans)):
            share, absent = self.coverage[i], int((~self.present[:, i]).sum())
            lines.append(f"{symbol:<11} {source}: {bars:,} bars, {when(first)} to {when(last)}; present on "
                         f"{share:.1%} of the joint bars ({absent:,} absent: the last close carried, volume 0)")
        sessions, spec = self.sessions, self.markets[0].contract
        hours = "one bar a trading day" if daily else f"{sessions.schedule.text()} {spec.timezone}"
        lines.append(f"{'sessions':<11} {sessions.num_sessions:,} sessions on {spec.symbol}'s calendar ({hours})")
        lines.append(f"{'splits':<11} {splits_text(self.splits, sessions.session_id, self.first_decision_bar)}")
        return lines


def _refuse(source: str, problem: str) -> DataValidationError:
    return DataValidationError(f"{source}: {problem}")


def _pair_markets(group: list[tuple[int, DataConfig]], preset: str) -> dict[int, Market]:
    """The two instruments of a `synthetic:PAIR` source, drawn together (jaxenv.synthetic.generate_pair), each then
    checked as load_market checks a synthetic market."""
    if len(group) != 2:
        source = group[0][1].source
        raise _refuse(source, f"a pair preset: give it to exactly two instruments of the set, got {len(group)} "
                              f"({SET_DOC})")
    (i, a), (j, b) = group
    try:
        frames = generate_pair(preset, (a.contract, b.contract), a.synthetic_days, a.synthetic_seed)
    except ValueError as error:
        raise _refuse(a.source, str(error)) from None
    out = {}
    for k, cfg, frame in ((i, a, frames[0]), (j, b, frames[1])):
        note = f"synthetic regular-hours minute bars in {cfg.contract.timezone}"
        out[k] = market_from_frame(frame, cfg.source, cfg, stamps_note=note)
    return out


def _load_each(instruments: list[tuple[str | ContractSpec, str]], base: DataConfig) -> list[Market]:
    configs: list[DataConfig] = []
    seen: dict[str, str] = {}
    for symbol, source in instruments:
        try:
            cfg = resolve_data_config(dataclasses.replace(base, contract=symbol, source=source))
        except ValueError as error:
            raise _refuse(source, str(error)) from None
        name = cfg.contract.symbol
        if name in seen:
            raise _refuse(source, f"instrument {name} is given twice in the set (also for {seen[name]}); each "
                                  "instrument once")
        seen[name] = source
        configs.append(cfg)
    pairs: dict[str, list[tuple[int, DataConfig]]] = {}
    for i, cfg in enumerate(configs):
        preset = cfg.source.split(":", 1)[1] if cfg.source.startswith("synthetic:") else ""
        if preset in PAIR_PRESETS:
            pairs.setdefault(preset, []).append((i, cfg))
    loaded: dict[int, Market] = {}
    for preset, group in pairs.items():
        loaded.update(_pair_markets(group, preset))
    return [loaded[i] if i in loaded else _load_one(cfg) for i, cfg in enumerate(configs)]


def _load_one(cfg: DataConfig) -> Market:
    """load_market, its mends said the way a set declares an instrument (its item of data.instruments), not as the
    single instrument's --set data.contract."""
    try:
        return load_market(cfg)
    except DataValidationError as error:
        symbol = cfg.contract.symbol
        message = re.sub(r"--set data\.contract\.(\w+)=(\S+?),",
                         rf"its item of data.instruments with contract: {{base: {symbol}, \1: \2}},", str(error))
        message = re.sub(r"--set data\.contract=(\w+)", r"its item of data.instruments with contract: \1", message)
        raise DataValidationError(message.replace("with data.contract=NAME", "with contract: NAME there")) from None


def _calendar_problem(first: Market, other: Market, joint_schedule) -> str:
    """Why `other` does not fit the first instrument's calendar; "" where it does."""
    a, b = first.contract, other.contract
    if b.timezone != a.timezone:
        return (f"{b.symbol}'s exchange zone {b.timezone} is not {a.symbol}'s {a.timezone} ({first.source}): the "
                f"instruments of one set share one calendar ({SET_DOC})")
    if b.weekends != a.weekends:
        return (f"{b.symbol} trades {'every day' if b.weekends else 'Monday to Friday'} but {a.symbol} "
                f"({first.source}) {'every day' if a.weekends else 'Monday to Friday'}: the instruments of one set "
                f"share one calendar ({SET_DOC})")
    if same_calendar(a, b) or first.interval_minutes == DAILY:
        return ""
    own = other.sessions.schedule
    if (own.open, own.close) != (joint_schedule.open, joint_schedule.close):
        return (f"{b.symbol}'s sessions ({own.text()} {b.timezone}) do not coincide with the set's, on {a.symbol}'s "
                f"calendar ({joint_schedule.text()} {a.timezone}, {first.source}): the instruments of one set share "
                f"one calendar: the same session hours as loaded, or the same instrument calendar ({SET_DOC})")
    return ""


def _on_timeline(market: Market, joint_ns: np.ndarray, timestamps: pd.DatetimeIndex, sessions: SessionInfo,
                 splits: dict[str, tuple[int, int]]) -> tuple[Market, np.ndarray]:
    """`market` on the joint stamps, and where it has a bar of its own: on the others, its latest bar at or before
    the stamp, carried (its close as open, high and low, volume 0, no text)."""
    own_ns = market.timestamps.as_unit("ns").asi8
    pos = np.searchsorted(own_ns, joint_ns, side="right") - 1
    assert (pos >= 0).all(), "the overlap starts at or after every instrument's first bar"
    present = own_ns[pos] == joint_ns
    close = market.close[pos]

    def bar(values: np.ndarray) -> np.ndarray:
        return np.where(present, values[pos], close)

    moved = dataclasses.replace(
        market,
        timestamps=timestamps,
        open=bar(market.open),
        high=bar(market.high),
        low=bar(market.low),
        close=close,
        volume=np.where(present, market.volume[pos], 0.0),
        bar_features=market.bar_features[pos],
        context_features=market.context_features[pos],
        atr=market.atr[pos],
        indicators={name: values[pos] for name, values in market.indicators.items()},
        sessions=sessions,
        session_minutes=sessions.session_minutes,
        text_index=np.where(present, market.text_index[pos], -1).astype(np.int32),
        splits=dict(splits),
    )
    return moved, present


def load_market_set(instruments: list[tuple[str | ContractSpec, str]], base: DataConfig | None = None) -> MarketSet:
    """Loads each (symbol, source) of `instruments` (a CSV/Parquet path or synthetic:PRESET; a pair preset such as
    synthetic:pair_signal names both instruments of the pair, drawn together) as load_market does, with `base`'s
    other data settings, then joins them on one timeline (the module's docstring). Refused, with a
    DataValidationError whose first words name the file: an instrument's own problems, an instrument given twice,
    bar intervals that differ, calendars that do not fit one timeline, no overlap or too few joint bars."""
    base = base or DataConfig()
    if not instruments:
        raise DataValidationError("a market set needs at least one instrument: [(symbol, source), ...]")
    markets = _load_each(list(instruments), base)
    first = markets[0]
    for market in markets[1:]:
        if market.interval_minutes != first.interval_minutes:
            raise _refuse(market.source, f"{market.contract.symbol}'s bars are {interval_text(market.interval_minutes)}"
                                         f" apart but {first.contract.symbol}'s ({first.source}) "
                                         f"{interval_text(first.interval_minutes)}: the instruments of one set share "
                                         f"one bar interval ({SET_DOC})")
    own = [market.timestamps.as_unit("ns").asi8 for market in markets]
    start, end = max(ns[0] for ns in own), min(ns[-1] for ns in own)
    if start > end:
        late = int(np.argmax([ns[0] for ns in own]))
        early = int(np.argmin([ns[-1] for ns in own]))
        span = lambda m: f"{m.timestamps[0]} to {m.timestamps[-1]}"  # noqa: E731
        raise _refuse(markets[late].source, f"its bars ({span(markets[late])}) do not overlap those of "
                                            f"{markets[early].source} ({span(markets[early])}): a set needs a span where "
                                            f"every instrument has bars ({SET_DOC})")
    joint_ns = np.unique(np.concatenate(own))
    joint_ns = joint_ns[(joint_ns >= start) & (joint_ns <= end)]
    timestamps = (pd.DatetimeIndex(joint_ns, tz="UTC").tz_convert(first.contract.timezone)
                  .as_unit(first.timestamps.unit).rename(first.timestamps.name))
    schedule = choose_schedule(timestamps, first.contract, first.interval_minutes)
    for market in markets[1:]:
        problem = _calendar_problem(first, market, schedule)
        if problem:
            raise _refuse(market.source, problem)
    for market, ns in zip(markets, own):
        inside = market.timestamps[(ns >= start) & (ns <= end)]
        outside = outside_schedule(inside, first.contract, schedule)
        if outside.any():
            raise _refuse(market.source, f"{outside.sum()} of its bars (the first at {inside[outside][0]}) fall outside "
                                         f"the set's sessions on {first.contract.symbol}'s calendar "
                                         f"({schedule.text()} {first.contract.timezone}) ({SET_DOC})")
    sources = " and ".join(market.source for market in markets)
    min_bars = FIRST_DECISION_BAR + 2
    if len(timestamps) < min_bars:
        raise _refuse(sources, f"their overlap: {too_few_bars(len(timestamps), min_bars)} ({SET_DOC})")
    sessions = session_info(timestamps, first.contract, first.interval_minutes, schedule)
    cfg = dataclasses.replace(base, contract=first.contract, source=first.source)
    splits = market_splits(sessions.session_id, cfg, sources)
    moved, present = zip(*(_on_timeline(market, joint_ns, timestamps, sessions, splits) for market in markets))
    return MarketSet(
        symbols=tuple(market.contract.symbol for market in markets),
        sources=tuple(market.source for market in markets),
        markets=tuple(moved),
        present=np.stack(present, axis=1),
        timestamps=timestamps,
        sessions=sessions,
        splits=splits,
        own_bars=tuple(market.num_bars for market in markets),
        own_spans=tuple((market.timestamps[0], market.timestamps[-1]) for market in markets),
    )
