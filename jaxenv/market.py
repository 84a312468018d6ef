"""A market: validated bars of one instrument, their sessions on its calendar, causal features and non-overlapping
time splits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.config import DataConfig, resolve_data_config
from jaxenv.contracts import ContractSpec
from jaxenv.data import (
    ROW_FIX,
    DataValidationError,
    Refusal,
    daylight_saving_problem,
    invalid_rows,
    is_dates,
    read_raw_bars,
    row_list,
    to_exchange_time,
    too_few_bars,
)
from jaxenv.features import WARMUP_BARS, compute_features
from jaxenv.folds import session_splits
from jaxenv.news import news_context
from jaxenv.scale import Scale, check_scale, same_calendar
from jaxenv.sessions import (
    LIKELY_ZONES,
    Schedule,
    SessionInfo,
    ZoneFit,
    decision_times,
    fit_zone,
    measure_interval,
    outside_sessions,
    session_info,
    zone_fits,
)
from jaxenv.synthetic import generate_bars

SPLITS = ("train", "val", "test")
MAX_WINDOW = 64  # the observation window may not exceed this; it sets the minimum data length
FIRST_DECISION_BAR = WARMUP_BARS + MAX_WINDOW  # no decision before the features' warm-up and one observation window


@dataclass
class Market:
    source: str
    contract: ContractSpec
    timestamps: pd.DatetimeIndex
    open: np.ndarray  # float64 prices
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray
    bar_features: np.ndarray  # float32 [n, 11]
    context_features: np.ndarray  # float32 [n, 28]
    atr: np.ndarray  # float32 [n], ATR14 in price units
    indicators: dict[str, np.ndarray]  # jaxenv.features.INDICATORS: float32 [n] each, in a person's units
    sessions: SessionInfo  # from the instrument's calendar; sessions.interval_minutes is the bar interval
    session_minutes: int  # scheduled length of one session
    text_table: list[str]  # distinct headlines (data.news: bar contexts); the policy never sees them, prompts do
    text_index: np.ndarray  # int32 [n] into text_table; -1 where a bar has no text
    splits: dict[str, tuple[int, int]]  # name -> [start, end) bar indices
    dropped_rows: int = 0
    dropped_note: str = ""  # which rows data.drop_invalid_rows dropped, and why
    stamps_note: str = ""  # how the file's stamps were read: their zone, or dates
    stamps_zone: str = ""  # the zone naive stamps were read in (auto's pick included); "" for offsets or dates
    scale: Scale | None = None  # the bars in the instrument's ticks
    news_note: str = ""  # data.news: the items read, shown and never shown (and why), the bars with news

    @property
    def num_bars(self) -> int:
        return len(self.close)

    @property
    def interval_minutes(self) -> int:
        return self.sessions.interval_minutes

    @property
    def episode_bars(self) -> int:
        """The default episode length (env.max_steps_in_episode = 0): five sessions, or a year of daily bars."""
        return self.sessions.episode_bars

    @property
    def first_decision_bar(self) -> int:
        """No decision before the features' warm-up and one full observation window have passed."""
        return FIRST_DECISION_BAR

    def split_range(self, split: str | tuple[int, int]) -> tuple[int, int]:
        if isinstance(split, tuple):
            start, end = split
        elif split in self.splits:
            start, end = self.splits[split]
        else:
            raise ValueError(f"unknown split {split!r}; use one of {', '.join(self.splits)} or a (start, end) pair")
        start = max(start, self.first_decision_bar)
        if not 0 <= start < end - 1 <= self.num_bars - 1:
            raise ValueError(f"split {split!r} = [{start}, {end}) leaves no bars to trade in {self.num_bars} bars")
        return start, end


def _session_aligned_bounds(session_id: np.ndarray, fractions: np.ndarray) -> list[int]:
    """Split points moved to the first bar of the session nearest to each fraction of the data."""
    starts = np.flatnonzero(np.diff(session_id, prepend=-1))
    n = len(session_id)
    out = []
    for f in fractions:
        target = f * n
        out.append(int(starts[np.argmin(np.abs(starts - target))]))
    return out


def splits_text(splits: dict[str, tuple[int, int]], session_id: np.ndarray, first_decision_bar: int) -> str:
    """The load report's splits line: each split's bars and sessions, and the feature warm-up."""
    parts = []
    for name in SPLITS:
        start, end = splits[name]
        count = len(np.unique(session_id[start:end])) if end > start else 0
        parts.append(f"{name} {end - start:,} bars / {count:,} session{'s' if count != 1 else ''}")
    return f"{', '.join(parts)}; the first {first_decision_bar} bars are feature warm-up"


def market_splits(session_id: np.ndarray, cfg: DataConfig, source: str) -> dict[str, tuple[int, int]]:
    """The splits `data.splits` names by session (a walk-forward's fold), else the time fractions."""
    if not cfg.splits:
        return time_splits(session_id, cfg.train_frac, cfg.val_frac)
    try:
        return session_splits(session_id, cfg.splits)
    except ValueError as error:
        raise DataValidationError(f"{source}: {error}") from None


def time_splits(session_id: np.ndarray, train_frac: float, val_frac: float) -> dict[str, tuple[int, int]]:
    if not (0 < train_frac < 1 and 0 < val_frac < 1 and train_frac + val_frac < 1):
        raise ValueError(f"split fractions train={train_frac}, val={val_frac} must be positive and sum below 1")
    n = len(session_id)
    a, b = _session_aligned_bounds(session_id, np.array([train_frac, train_frac + val_frac]))
    if not 0 < a < b < n:  # too few sessions to cut on session starts: cut on bars instead
        a, b = int(train_frac * n), int((train_frac + val_frac) * n)
    return {"train": (0, a), "val": (a, b), "test": (b, n)}


def _when(index: pd.DatetimeIndex) -> str:
    """Where bars fall in the week, by the hour, the most bars first: "Friday 17:00", "Monday 17:00-17:59 (60),
    Tuesday 17:00-17:59 (60)"."""
    stamps = pd.DataFrame({"day": index.strftime("%A"), "hour": index.hour, "minute": index.minute})
    hours = stamps.groupby(["day", "hour"], sort=False)["minute"].agg(["min", "max", "size"])
    hours = hours.sort_values("size", ascending=False, kind="stable")
    shown = []
    for (day, hour), (first, last, bars) in hours.iloc[:3].iterrows():
        span = f"{day} {hour:02d}:{first:02d}" + (f"-{hour:02d}:{last:02d}" if last > first else "")
        shown.append(span if len(hours) == 1 else f"{span} ({bars})")
    return ", ".join(shown) + (f" and {len(hours) - 3} other hours" if len(hours) > 3 else "")


def _outside(spec: ContractSpec, index: pd.DatetimeIndex, outside: np.ndarray, rows: np.ndarray,
             schedule: Schedule) -> str:
    """"2 of 933 bars fall outside EURUSD's sessions (17:00-17:00 America/New_York, Monday to Friday) at rows 121,
    597 (Friday 17:00)": the bars of `outside` that have a place in exchange time."""
    at = np.flatnonzero(outside & ~np.asarray(index.isna()))
    days = "" if spec.weekends else ", Monday to Friday"
    return (f"{len(at)} of {len(index)} bars fall outside {spec.symbol}'s sessions ({schedule.text()} {spec.timezone}"
            f"{days}) at {row_list(rows[at])} ({_when(index[at])})")


OTHER_HOURS = ("If the instrument trades other hours, declare them in data.contract (session_open, session_close, "
               "weekends); --set data.drop_invalid_rows=true drops these bars")


def _where_outside(spec: ContractSpec, wall: pd.DatetimeIndex, fit: ZoneFit, rows: np.ndarray, column: str) -> str:
    """The bars `fit` leaves outside the sessions: stamps that are no time in its zone, bars outside the sessions."""
    found = []
    if fit.index.isna().any():
        found.append(f"column '{column}' has {daylight_saving_problem(wall, fit.zone, rows)}")
    if (fit.outside & ~np.asarray(fit.index.isna())).any():
        found.append(_outside(spec, fit.index, fit.outside, rows, fit.schedule))
    return " and ".join(found)


def _zone_note(zone: str, why: str, spec: ContractSpec) -> str:
    note = f"naive, taken as {zone} ({why})"
    return note if zone == spec.timezone else f"{note}, converted to {spec.timezone}"


def _naive_stamps(wall: pd.DatetimeIndex, rows: np.ndarray, spec: ContractSpec, interval: int, source_timezone: str,
                  column: str) -> tuple[ZoneFit | None, str, str, bool]:
    """Naive stamps placed on `spec`'s calendar: in data.source_timezone, the exchange's zone by default, or in the
    likely zone that fits the sessions best (auto). Returns the fit (None on a tie), the note for the load report,
    advice where the fit leaves bars outside the sessions (the zone that fits best, and what would remain under
    it), and whether that advice is a problem by itself (a tie, or a better zone than the default)."""
    if source_timezone != "auto":
        zone = source_timezone or spec.timezone
        fit = fit_zone(wall, zone, spec, interval)
        note = _zone_note(zone, "data.source_timezone" if source_timezone else "the instrument's exchange zone", spec)
        if not fit.outside.any():
            return fit, note, "", False
    fits = zone_fits(wall, spec, interval, (spec.timezone, *LIKELY_ZONES))
    best = fits[0]
    tied = [other.zone for other in fits if other.rank == best.rank]
    if source_timezone == "auto":
        if len(tied) > 1:
            return None, "", (f"data.source_timezone=auto: the naive stamps fit {', '.join(tied)} equally "
                              f"({best.rank[0]} bars outside {spec.symbol}'s sessions under each) but read as "
                              "different instants: name the file's zone, --set data.source_timezone=ZONE"), True
        runner = f"; the next best, {fits[1].zone}, {fits[1].rank[0]}" if len(fits) > 1 else ""
        why = f"data.source_timezone=auto: the best fit of the likely zones, {best.rank[0]} bars outside{runner}"
        return best, _zone_note(best.zone, why, spec), OTHER_HOURS, False
    if best.rank >= fit.rank:
        tried = ", ".join(z for z in LIKELY_ZONES if z != zone)
        return fit, note, f"No likely zone fits them better (tried {tried}). {OTHER_HOURS}", False
    if len(tied) > 1:
        advice = (f"They fit {', '.join(tied)} equally ({best.rank[0]} bars outside under each): name the file's "
                  "zone, --set data.source_timezone=ZONE")
    else:
        remain = best.outside.sum()
        where = _where_outside(spec, wall, best, rows, column) if remain else "every bar lies inside a session"
        drop = f" and --set data.drop_invalid_rows=true drops those {remain}" if remain else ""
        advice = (f"They fit {best.zone} best: as {best.zone}, {where}: --set data.source_timezone={best.zone} "
                  f"(data.source_timezone=auto takes the best fit){drop}")
    return fit, note, advice, not source_timezone


def text_table_and_index(texts: np.ndarray, which: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct `texts`, sorted, and each bar's index into them (bar i has texts[which[i]]); -1 where a bar's
    text is blank: a bar without text has none, so no prompt shows an empty headline."""
    table, inverse = np.unique(np.asarray(texts, dtype=str), return_inverse=True)
    blank = np.char.strip(table) == ""
    position = np.where(blank, -1, np.cumsum(~blank) - 1)
    return list(table[~blank]), position[inverse.reshape(-1)][which].astype(np.int32)


def _bar_texts(frame: pd.DataFrame, cfg: DataConfig, sessions: SessionInfo, news_zone: str | None
               ) -> tuple[list[str], np.ndarray, str]:
    """The market's text table and index, from data.news (each bar's context) or else the bars' own text column,
    and the load report's news line."""
    n = len(frame)
    if not cfg.news:
        if "headline" in frame:
            return *text_table_and_index(frame["headline"].to_numpy(dtype=str), np.arange(n)), ""
        return *text_table_and_index(np.array([""]), np.zeros(n, np.int64)), ""
    decisions = decision_times(pd.DatetimeIndex(frame.index), sessions, cfg.contract.timezone)
    context = news_context(cfg, decisions, news_zone)
    ignored = "; the bars' own text column ignored (data.news replaces it)" if "headline" in frame else ""
    return *text_table_and_index(context.texts, context.which), context.note + ignored


def market_from_frame(
    frame: pd.DataFrame, source: str, cfg: DataConfig, stamps_note: str | None = None, read_note: str = "",
    column: str = "timestamp",
) -> Market:
    """A Market of `frame` (OHLCV columns, a DatetimeIndex; its `column` in the file) traded as `cfg.contract`. Every
    check runs and one refusal names every problem found: rows that fail validation, the price scale against the
    instrument's tick, the bar interval, the stamps' zone and the bars outside the instrument's sessions (those two
    under the built-in whose tick fits, where the instrument's does not). Naive stamps are read in
    data.source_timezone (the exchange's zone by default; auto: the likely zone that fits the sessions best), others
    converted to the exchange's zone. `stamps_note` replaces the note of how the stamps were read, `read_note`
    comes first in it. A data.news file is joined to the bars that remain (jaxenv.news), its naive stamps read in
    the bars' zone."""
    try:
        cfg = resolve_data_config(cfg)
    except ValueError as error:
        raise DataValidationError(f"{source}: {error}") from None
    contract: ContractSpec = cfg.contract
    refusal = Refusal(source)
    index = pd.DatetimeIndex(frame.index)
    naive = index.tz is None and not is_dates(index)
    note, stamps_zone = "", ""
    # the zone of naive stamps in the news file: the bars' ("" = the exchange's), or the one auto finds for them
    news_zone = None if cfg.source_timezone == "auto" else cfg.source_timezone
    if not naive:
        index, note = to_exchange_time(index, None, contract.timezone, cfg.source_timezone or None, source, column)
    dropped: list[str] = []  # what drop_invalid_rows dropped, for the load report
    bad, texts = invalid_rows(frame.set_axis(index, axis=0))
    if texts and not cfg.drop_invalid_rows:
        refusal.add(f"{'; '.join(texts)} ({ROW_FIX})")
    elif texts:
        dropped.append(f"{bad.sum()} failing validation ({row_list(np.flatnonzero(bad))})")
    rows = np.flatnonzero(~bad)  # the file's row of each bar still in
    frame, index = frame.iloc[rows], index[rows]

    # The calendar the stamps are checked on: the instrument's, or where its tick does not fit the prices, that of
    # the built-ins whose tick fits (when they share one), so the one refusal names the zone as well
    scale, interval, calendar = None, None, None
    if len(frame):
        bars = tuple(frame[c].to_numpy(np.float64) for c in ("open", "high", "low", "close"))
        checked = check_scale(bars, contract, cfg.min_range_ticks, rows)
        scale, calendar = checked.scale, contract
        if checked.problem:
            refusal.add(checked.problem)
            fitting = checked.fitting
            same = fitting and all(same_calendar(other, fitting[0]) for other in fitting)
            calendar = fitting[0] if same else None
        interval, problem = measure_interval(index, rows)
        if problem:
            refusal.add(problem)
    if interval is not None and calendar is not None:
        as_other = "" if calendar is contract else f"as {calendar.symbol}, "
        if naive:
            fit, note, advice, must_change = _naive_stamps(index, rows, calendar, interval, cfg.source_timezone,
                                                           column)
            if fit is None:
                refusal.add(as_other + advice)
            else:
                stamps_zone = fit.zone
                if cfg.source_timezone == "auto":
                    news_zone = fit.zone
        else:
            outside, schedule = outside_sessions(index, calendar, interval)
            fit, advice, must_change = ZoneFit(calendar.timezone, index, outside, 0, schedule), OTHER_HOURS, False
        if fit is not None and fit.outside.any():
            where = _where_outside(calendar, index, fit, rows, column)
            if cfg.drop_invalid_rows and not must_change:
                dropped.append(where)
            else:
                refusal.add(f"{as_other}{where}; the stamps are {stamps_note or note}. {advice}")
        if fit is not None:
            keep = np.flatnonzero(~fit.outside)
            frame, index, rows = frame.iloc[keep], fit.index[keep], rows[keep]
    elif naive and cfg.source_timezone != "auto" and len(frame):  # no sessions to place them in, but a zone
        zone = cfg.source_timezone or contract.timezone
        not_a_time = daylight_saving_problem(index, zone, rows)
        if not_a_time:
            refusal.add(f"column '{column}' has {not_a_time}; naive stamps are taken as {zone}")
    min_bars = WARMUP_BARS + MAX_WINDOW + 2
    if len(frame) < min_bars:
        refusal.add(too_few_bars(len(frame), min_bars))
    refusal.raise_any()
    frame = frame.set_axis(index, axis=0)
    bars = tuple(frame[c].to_numpy(np.float64) for c in ("open", "high", "low", "close"))
    sessions = session_info(frame.index, contract, interval)
    bar_features, context_features, atr, indicators = compute_features(frame, sessions)
    table, text_index, news_note = _bar_texts(frame, cfg, sessions, news_zone)
    return Market(
        source=source,
        contract=contract,
        timestamps=frame.index,
        open=bars[0],
        high=bars[1],
        low=bars[2],
        close=bars[3],
        volume=frame["volume"].to_numpy(np.float64),
        bar_features=bar_features,
        context_features=context_features,
        atr=atr,
        indicators=indicators,
        sessions=sessions,
        session_minutes=sessions.session_minutes,
        text_table=table,
        text_index=text_index,
        splits=market_splits(sessions.session_id, cfg, source),
        dropped_rows=len(bad) - len(frame),
        dropped_note="; ".join(dropped),
        stamps_note="; ".join(filter(None, [read_note, stamps_note or note])),
        stamps_zone=stamps_zone,
        scale=scale,
        news_note=news_note,
    )


def load_market(cfg: DataConfig | None = None) -> Market:
    """Loads `cfg.source`: a CSV/Parquet path, or `synthetic:PRESET` generated from `cfg.synthetic_seed`."""
    cfg = cfg or DataConfig()
    try:
        cfg = resolve_data_config(cfg)
    except ValueError as error:
        raise DataValidationError(str(error)) from None
    contract: ContractSpec = cfg.contract
    if cfg.source.startswith("synthetic:"):
        preset = cfg.source.split(":", 1)[1] or "default"
        try:
            frame = generate_bars(preset, contract, cfg.synthetic_days, cfg.synthetic_seed)
        except ValueError as error:  # an unknown preset or too few days: the config's fault, one line
            raise DataValidationError(f"data.source {cfg.source}: {error}") from None
        note = f"synthetic regular-hours minute bars in {contract.timezone}"
        return market_from_frame(frame, cfg.source, cfg, stamps_note=note)
    frame, wall, column, read_note = read_raw_bars(cfg.source, cfg.date_format, cfg.text_column)
    note = None
    if frame.index.tz is not None or is_dates(wall):  # stamps with offsets, or dates: no zone to infer
        index, note = to_exchange_time(pd.DatetimeIndex(frame.index), wall, contract.timezone,
                                       cfg.source_timezone or None, cfg.source, column)
        frame = frame.set_axis(index, axis=0)
    return market_from_frame(frame, cfg.source, cfg, stamps_note=note, read_note=read_note, column=column)
