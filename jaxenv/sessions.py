"""Bar intervals and trading sessions from the instrument's calendar.

Which session a bar belongs to, and whether it is the last bar a position may be held on, follow from the
instrument's session hours and the bar's own stamp (exchange time), never from the next bar's: data gaps do not
start sessions. Intraday bars (minute to hourly) group into the instrument's sessions: its regular hours when every
bar lies inside them, else its full session (24-hour and 24x5 ones included). Daily bars are one bar per session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.contracts import ContractSpec, minutes_of
from jaxenv.data import DataValidationError, row_list

DAILY = 1440  # interval_minutes of daily bars
DAILY_EPISODE_BARS = 252  # the default episode of daily bars: one trading year
EPISODE_SESSIONS = 5  # the default episode of intraday bars: five sessions
_MINUTE_NS = 60_000_000_000
_NEVER = np.int64(2**62)  # a cutoff that never comes: positions may be held across sessions
# Where naive stamps usually come from, tried after the exchange's zone: UTC, the US exchanges' zones, London, Central
# Europe, and the servers of retail FX brokers (Europe/Athens, EET/EEST; Etc/GMT-2 and Etc/GMT-3, fixed UTC+2, UTC+3).
LIKELY_ZONES = ("UTC", "America/New_York", "America/Chicago", "Europe/London", "Europe/Berlin", "Europe/Athens",
                "Etc/GMT-2", "Etc/GMT-3")


@dataclass(frozen=True)
class Schedule:
    """The session hours bars are grouped into (exchange time, minutes after midnight; close 1440 = midnight)."""

    hours: str  # "regular" (the instrument's regular hours), "full" (its whole session) or "daily" (one bar each)
    open: int
    close: int

    @property
    def minutes(self) -> int:
        return (self.close - self.open) % 1440 or 1440

    def text(self) -> str:
        hhmm = lambda m: f"{m // 60 % 24:02d}:{m % 60:02d}"  # noqa: E731
        return f"{hhmm(self.open)}-{hhmm(self.close)}"


@dataclass
class SessionInfo:
    session_id: np.ndarray  # int32, increasing: the instrument's trading session of each bar
    minute_of_day: np.ndarray  # int32, exchange time
    minutes_into_session: np.ndarray  # int32, since the session's scheduled open (0 for daily bars)
    day: np.ndarray  # datetime64[D]: the trading day, the date the session closes on
    period_id: np.ndarray  # int32: what session features aggregate over: the session (intraday) or the week (daily)
    time_of_day: np.ndarray  # float64: how far into that period, 0..1 (daily bars: weekday / 5)
    interval_minutes: int  # DAILY for daily bars
    schedule: Schedule

    @property
    def session_minutes(self) -> int:
        return self.schedule.minutes

    @property
    def bars_per_period(self) -> int:
        """Bars of one full period on the calendar (390 for regular-hours minute bars, 5 for daily bars)."""
        if self.interval_minutes == DAILY:
            return 5
        return math.ceil(self.schedule.minutes / self.interval_minutes)

    @property
    def episode_bars(self) -> int:
        """The default episode length: five sessions of intraday bars, a trading year of daily bars."""
        if self.interval_minutes == DAILY:
            return DAILY_EPISODE_BARS
        return EPISODE_SESSIONS * self.bars_per_period

    @property
    def num_sessions(self) -> int:
        return int(self.session_id[-1]) + 1 if len(self.session_id) else 0


def interval_text(minutes: int) -> str:
    return "daily" if minutes == DAILY else f"{minutes} minute{'s' if minutes > 1 else ''}"


def detect_interval(index: pd.DatetimeIndex, source: str) -> int:
    """The bar interval in minutes (DAILY for daily bars): the most common step between stamps. Steps shorter than
    it (bars closer together than the interval) are errors."""
    interval, problem = measure_interval(index)
    if problem:
        raise DataValidationError(f"{source}: {problem}")
    return interval


def measure_interval(index: pd.DatetimeIndex, rows: np.ndarray | None = None) -> tuple[int | None, str]:
    """The bar interval (None where the stamps have none) and what is wrong with their steps ("" where nothing is),
    naming the file's `rows` of the bars (default: their positions). Bars closer together than the interval leave it
    known, so the other checks can still run."""
    ns = index.as_unit("ns").asi8
    steps = np.diff(ns)
    positive = steps[steps > 0]
    if not len(positive):
        return None, f"cannot tell the bar interval from {len(index)} bar(s)"
    values, counts = np.unique(positive, return_counts=True)
    mode = values[np.argmax(counts)] / _MINUTE_NS
    if 23 * 60 <= mode <= 25 * 60:
        interval, shortest = DAILY, 12 * 60
    elif mode > 25 * 60:
        return None, f"bars are mostly {mode / 1440:.3g} days apart; the longest bar interval supported is daily"
    elif mode < 1 or mode != round(mode):
        return None, (f"bars are mostly {mode * 60:.4g} seconds apart; bars must be whole minutes (1, 5, 15, 30, 60 "
                      "minutes) or daily: resample the file")
    else:
        interval = shortest = int(mode)
    close = np.flatnonzero(steps < shortest * _MINUTE_NS) + 1
    if len(close):
        return interval, (f"column 'timestamp' is closer to the previous row's than the {interval_text(interval)} "
                          f"interval of most bars at {row_list(close if rows is None else rows[close])}; one file "
                          "holds bars of one interval")
    return interval, ""


def _local(index: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
    """Exchange-time minute of day and date of each stamp."""
    minute = (index.hour * 60 + index.minute).to_numpy(np.int64)
    date = index.tz_localize(None).to_numpy().astype("datetime64[D]")
    return minute, date


def choose_schedule(index: pd.DatetimeIndex, spec: ContractSpec, interval: int) -> Schedule:
    """Daily bars: one per session. Intraday: the regular hours when every bar starts inside them, else the full
    session."""
    full = Schedule("full", minutes_of(spec.session_open), minutes_of(spec.session_close) or 1440)
    if interval == DAILY:
        return Schedule("daily", full.open, full.close)
    if spec.rth_open:
        regular = Schedule("regular", minutes_of(spec.rth_open), minutes_of(spec.rth_close) or 1440)
        minute, _ = _local(index)
        if ((minute - regular.open) % 1440 < regular.minutes).all():
            return regular
    return full


def _labels(index: pd.DatetimeIndex, spec: ContractSpec, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Per bar: its trading day (the date its session closes on) and whether it lies inside a session."""
    minute, date = _local(index)
    if schedule.hours == "daily":
        day = date
        inside = np.ones(len(index), bool)
    else:
        day = date + (minute >= schedule.close).astype("timedelta64[D]")
        inside = (minute - schedule.open) % 1440 < schedule.minutes
    if not spec.weekends:
        weekday = (day.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday: Monday = 0
        inside &= weekday < 5
    return day, inside


def outside_sessions(index: pd.DatetimeIndex, spec: ContractSpec, interval: int) -> tuple[np.ndarray, Schedule]:
    """Bars that fall outside every session of the instrument (in its break, or on a weekend), and the schedule."""
    schedule = choose_schedule(index, spec, interval)
    _, inside = _labels(index, spec, schedule)
    return ~inside, schedule


def outside_schedule(index: pd.DatetimeIndex, spec: ContractSpec, schedule: Schedule) -> np.ndarray:
    """Bars outside `schedule`'s sessions (in the break, or on a weekend)."""
    return ~_labels(index, spec, schedule)[1]


@dataclass
class ZoneFit:
    """Naive stamps read as wall-clock times in `zone`, placed on an instrument's calendar."""

    zone: str
    index: pd.DatetimeIndex  # exchange time; NaT where a wall time is no time in the zone
    outside: np.ndarray  # bool: outside every session, or no time in the zone (a daylight-saving gap or overlap)
    off_hours: int  # bars outside the regular hours: a file of regular hours has none in its own zone
    schedule: Schedule

    @property
    def rank(self) -> tuple[int, int]:
        return int(self.outside.sum()), self.off_hours


def fit_zone(wall: pd.DatetimeIndex, zone: str, spec: ContractSpec, interval: int) -> ZoneFit:
    """`wall` (naive) read in `zone`: where its bars fall on `spec`'s calendar."""
    index = wall.tz_localize(zone, ambiguous="NaT", nonexistent="NaT").tz_convert(spec.timezone)
    placed = ~np.asarray(index.isna())
    outside = ~placed
    outside[placed], schedule = outside_sessions(index[placed], spec, interval)
    off_hours = 0
    if spec.rth_open and interval != DAILY:
        regular = Schedule("regular", minutes_of(spec.rth_open), minutes_of(spec.rth_close) or 1440)
        minute, _ = _local(index[placed])
        off_hours = int(((minute - regular.open) % 1440 >= regular.minutes).sum())
    return ZoneFit(zone, index, outside, off_hours, schedule)


def zone_fits(wall: pd.DatetimeIndex, spec: ContractSpec, interval: int, zones: tuple[str, ...]) -> list[ZoneFit]:
    """`wall` read in each of `zones`, the best fit first: the fewest bars outside the sessions, then outside the
    regular hours. A zone that reads every stamp as the same instant as an earlier one (UTC and London in winter) is
    the same fit and left out."""
    fits: list[ZoneFit] = []
    for zone in dict.fromkeys(zones):
        fit = fit_zone(wall, zone, spec, interval)
        if not any(np.array_equal(fit.index.asi8, other.index.asi8) for other in fits):
            fits.append(fit)
    return sorted(fits, key=lambda fit: fit.rank)


def session_info(index: pd.DatetimeIndex, spec: ContractSpec, interval: int,
                 schedule: Schedule | None = None) -> SessionInfo:
    """Sessions of bars stamped in exchange time (`index`, tz-aware, every bar inside a session), on `schedule`
    (default: choose_schedule's for these bars)."""
    schedule = schedule or choose_schedule(index, spec, interval)
    day, inside = _labels(index, spec, schedule)
    assert inside.all(), "session_info needs every bar inside a session (see outside_sessions)"
    minute, _ = _local(index)
    change = np.concatenate([[False], day[1:] != day[:-1]])
    session_id = np.cumsum(change).astype(np.int32)
    if schedule.hours == "daily":
        into = np.zeros(len(index), np.int32)
        weekday = (day.astype(np.int64) + 3) % 7
        week = day.astype(np.int64) - weekday
        period_id = np.cumsum(np.concatenate([[False], week[1:] != week[:-1]])).astype(np.int32)
        time_of_day = weekday / 5.0
    else:
        into = ((minute - schedule.open) % 1440).astype(np.int32)
        period_id = session_id
        time_of_day = into / float(schedule.minutes)
    return SessionInfo(session_id, minute.astype(np.int32), into, day, period_id, time_of_day, interval, schedule)


def _instants(wall: np.ndarray, timezone: str) -> np.ndarray:
    """Wall-clock datetimes (naive, datetime64[ns]) in `timezone` -> UTC nanoseconds."""
    stamps = pd.DatetimeIndex(wall).tz_localize(timezone, ambiguous=np.zeros(len(wall), bool),
                                                 nonexistent="shift_forward")
    return stamps.as_unit("ns").asi8


def decision_times(index: pd.DatetimeIndex, sessions: SessionInfo, timezone: str) -> np.ndarray:
    """When each bar's decision is taken, at its close, in UTC nanoseconds: intraday bars are stamped at their open,
    so at the stamp + the interval; a daily bar (a trading day) at its session's close in the exchange's zone."""
    if sessions.interval_minutes == DAILY:
        return _instants(sessions.day.astype("datetime64[ns]") + np.timedelta64(sessions.schedule.close, "m"), timezone)
    return index.as_unit("ns").asi8 + np.int64(sessions.interval_minutes) * _MINUTE_NS


def flat_rules(
    index: pd.DatetimeIndex,
    sessions: SessionInfo,
    spec: ContractSpec,
    flat_by: str | None,
    flat_by_timezone: str,
    no_entry_minutes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per bar: may a new entry be placed at its close, and must an open position be closed at its close.

    From the calendar and the bar's own stamp only. A session's cutoff is its close when the instrument must be flat
    at the close, and the first `flat_by` (a time of day in `flat_by_timezone`) after the session opens, or the close
    when that falls in the break; without either rule positions may be held across sessions. A position is closed
    on the last bar that ends by the cutoff (and on any bar past it); entries need the next bar to end by the cutoff
    and at least `no_entry_minutes` left. Daily bars: a rule closes every position at the session's close, and
    entries (filled at the next session's open) are always allowed."""
    n = len(index)
    if flat_by is None and not spec.flat_at_close:
        return np.ones(n, bool), np.zeros(n, bool)
    if sessions.interval_minutes == DAILY:
        return np.ones(n, bool), np.ones(n, bool)
    schedule = sessions.schedule
    first = np.flatnonzero(np.concatenate([[True], np.diff(sessions.session_id) != 0]))
    day = sessions.day[first].astype("datetime64[ns]")
    close_wall = day + np.timedelta64(schedule.close, "m")
    open_wall = close_wall - np.timedelta64(schedule.minutes, "m")
    close_ns = _instants(close_wall, spec.timezone)
    cutoff = close_ns.copy() if spec.flat_at_close else np.full(len(first), _NEVER)
    if flat_by is not None:
        opens = pd.DatetimeIndex(_instants(open_wall, spec.timezone)).tz_localize("UTC").tz_convert(flat_by_timezone)
        open_there = opens.tz_localize(None).to_numpy()
        midnight = open_there.astype("datetime64[D]").astype("datetime64[ns]")
        candidate = midnight + np.timedelta64(minutes_of(flat_by), "m")
        candidate = np.where(candidate < open_there, candidate + np.timedelta64(1, "D"), candidate)
        by_rule = np.minimum(_instants(candidate, flat_by_timezone), close_ns)  # in the break: flat at the close
        cutoff = np.minimum(cutoff, by_rule)
    sid = sessions.session_id
    interval = np.int64(sessions.interval_minutes) * _MINUTE_NS
    bar_end = np.minimum(index.as_unit("ns").asi8 + interval, close_ns[sid])
    cut = cutoff[sid]
    flatten = (bar_end >= cut) | ((bar_end + interval > cut) & (cut < close_ns[sid]))
    can_enter = cut - bar_end >= max(no_entry_minutes, sessions.interval_minutes) * np.int64(_MINUTE_NS)
    return can_enter, flatten
