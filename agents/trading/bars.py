"""Bars as they arrive: each one checked, placed on the instrument's calendar and given the features the batch
pipeline (jaxenv.market) gives it.

A bar's features are `jaxenv.features.compute_features` over a rolling window of the last FEATURE_WINDOW bars, its
last row. Every feature looks back only, so the window's last row is the batch value wherever the window holds the
whole history, and elsewhere differs from it only by the start of the slowest smoothing (Wilder RSI(210)), which
has decayed to (1 − 1/210)^4096 ≈ 3e-9 of its weight. tests/test_trading.py checks every feature of every bar.

The first `first_decision_bar` bars (feature warm-up and one observation window) are history: no decision is taken
on them. The session schedule (regular or full hours) is chosen on them as the batch pipeline chooses it on a file,
and a later bar outside it is refused. History that is not the run's (another bar interval than the run trained on,
another price scale, bars outside the sessions) is refused whole (HistoryRefused).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.contracts import ContractSpec
from jaxenv.env import prop_flat_by
from jaxenv.features import INDICATORS, N_BAR_FEATURES, N_CONTEXT_FEATURES, compute_features
from jaxenv.market import FIRST_DECISION_BAR
from jaxenv.scale import check_scale
from jaxenv.sessions import (
    DAILY,
    Schedule,
    choose_schedule,
    flat_rules,
    interval_text,
    measure_interval,
    outside_schedule,
    session_info,
)

FEATURE_WINDOW = 4096  # bars the features of a new bar are computed over
MAX_JUMP = 0.5  # a close this far (as a share) from the previous one is another instrument's, not a move
ROW_FIELDS = ("open", "high", "low", "close", "volume")


@dataclass(frozen=True)
class Bar:
    time: pd.Timestamp  # the bar's stamp (its open, for intraday bars), tz-aware
    open: float
    high: float
    low: float
    close: float
    volume: float
    text: str = ""  # its news context: the headlines a prompt about it shows ("" for none)


class BarRefused(ValueError):
    """A bar that cannot be traded on (out of order, outside the sessions, another instrument's prices, invalid);
    the message says why. The bar is not added."""


class HistoryRefused(BarRefused):
    """The history (the first FIRST_DECISION_BAR bars) is not the run's: another bar interval, price scale or
    sessions. None of it is kept, and no later bar could be traded on it. `outside`: its bars lie outside the
    sessions, which the zone their stamps were read in may cause."""

    def __init__(self, problem: str, outside: bool = False):
        super().__init__(f"the first {FIRST_DECISION_BAR} bars: {problem}")
        self.outside = outside


class BarBook:
    """Every bar so far, with the arrays jaxenv.Market has (prices, features, sessions, per-bar rules), grown as bars
    are added. `add` checks a bar, places it and computes its features."""

    def __init__(self, contract: ContractSpec, rules, min_range_ticks: float = 0.0, capacity: int = 8192,
                 trained_interval: int = 0, features: bool = True):
        """`rules`: the prop firm's (jaxenv.config.PropFirmRules): when entries stop and positions close;
        `trained_interval`: the bar interval (minutes) the run trained on, which the history must have (0: any);
        `features`: compute each bar's features (False: its sessions and rules only, a joint timeline's clock)."""
        self.contract, self.rules, self.features = contract, rules, features
        self.interval = 0  # the bar interval in minutes, measured on the history
        self.trained_interval = trained_interval
        self.min_range_ticks = min_range_ticks
        self.n = 0
        self.note = ""  # add's note on the last bar ("" for none)
        self.schedule: Schedule | None = None
        self.stamps = np.zeros(capacity, np.int64)  # UTC nanoseconds
        self.raw = np.zeros((capacity, len(ROW_FIELDS)), np.float64)
        self.bar_features = np.zeros((capacity, N_BAR_FEATURES), np.float32)
        self.context_features = np.zeros((capacity, N_CONTEXT_FEATURES), np.float32)
        self.atr = np.zeros(capacity, np.float32)
        self.indicators = {name: np.zeros(capacity, np.float32) for name in INDICATORS}
        self.session_id = np.zeros(capacity, np.int32)
        self.minute_of_day = np.zeros(capacity, np.int32)
        self.day = np.zeros(capacity, np.int64)  # the trading day (days since 1970-01-01)
        self.can_enter = np.zeros(capacity, bool)
        self.flatten = np.zeros(capacity, bool)
        self.text_index = np.full(capacity, -1, np.int32)
        self.text_table: list[str] = []  # the distinct headlines so far (grown in place: prompts read it)
        self._text_ids: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------------ arrays
    @property
    def capacity(self) -> int:
        return len(self.stamps)

    def _grow(self) -> None:
        capacity = self.capacity
        for name, value in list(vars(self).items()):
            if isinstance(value, np.ndarray) and len(value) == capacity:
                fill = -1 if name == "text_index" else 0
                setattr(self, name, np.concatenate([value, np.full_like(value, fill)]))
        self.indicators = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self.indicators.items()}

    # the columns restore() takes, beside stamps, raw, indicators (one column each, in INDICATORS order)
    ROW_COLUMNS = ("bar_features", "context_features", "atr", "session_id", "minute_of_day", "day", "can_enter",
                   "flatten", "text_index")

    def restore(self, columns: dict[str, np.ndarray], schedule: Schedule, interval, texts: list[str]) -> None:
        """The book as a saved one held it: its first n bars' `columns` (stamps, raw, indicators [n, len(INDICATORS)]
        and ROW_COLUMNS), its session schedule and bar interval, and its headlines."""
        n = len(columns["stamps"])
        while self.capacity < n + 1:
            self._grow()
        self.stamps[:n], self.raw[:n] = columns["stamps"], columns["raw"]
        for j, name in enumerate(self.indicators):
            self.indicators[name][:n] = columns["indicators"][:, j]
        for name in self.ROW_COLUMNS:
            getattr(self, name)[:n] = columns[name]
        self.n = n
        self.schedule, self.interval = schedule, interval
        self.text_table[:] = texts
        self._text_ids = {t: i for i, t in enumerate(self.text_table)}

    @property
    def timestamps(self) -> pd.DatetimeIndex:
        return pd.DatetimeIndex(self.stamps[: self.n]).tz_localize("UTC").tz_convert(self.contract.timezone)

    @property
    def days(self) -> np.ndarray:
        """Each bar's trading day (jaxenv.sessions.SessionInfo.day)."""
        return self.day[: self.n].astype("datetime64[D]")

    def stamp(self, i: int) -> pd.Timestamp:
        return pd.Timestamp(int(self.stamps[i]), tz="UTC").tz_convert(self.contract.timezone)

    def column(self, name: str) -> np.ndarray:
        return self.raw[: self.n, ROW_FIELDS.index(name)]

    def env_rows(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bars [start, end) as EnvParams rows: (bars [.., 8] in jaxenv.env's columns OPEN ... SESSION, bar features,
        context features)."""
        r = self.raw[start:end]
        bars = np.stack([r[:, 0], r[:, 1], r[:, 2], r[:, 3], self.atr[start:end], self.can_enter[start:end],
                         self.flatten[start:end], self.session_id[start:end]], axis=1).astype(np.float32)
        return bars, self.bar_features[start:end], self.context_features[start:end]

    # -------------------------------------------------------------------------------------------------- add
    def check(self, bar: Bar) -> str:
        """Why `bar` cannot follow the bars so far ("" if it can), before anything is added."""
        values = np.array([getattr(bar, f) for f in ROW_FIELDS], np.float64)
        if not np.isfinite(values).all():
            return "a price or the volume is missing or not a number"
        o, h, lo, c, v = values
        if min(o, h, lo, c) <= 0 or v < 0:
            return "a price is not positive or the volume is negative"
        if h < max(o, c, lo) or lo > min(o, c):
            return f"high {h:g} and low {lo:g} do not contain open {o:g} and close {c:g}"
        stamp = pd.Timestamp(bar.time)
        if stamp.tzinfo is None:
            return "its stamp has no time zone"
        if self.n:
            last = self.stamps[self.n - 1]
            if stamp.value <= last:
                when = "the same as" if stamp.value == last else "earlier than"
                return f"its stamp {stamp} is {when} the previous bar's ({self.timestamps[-1]}): out of order"
            if abs(c / self.raw[self.n - 1, 3] - 1.0) > MAX_JUMP:
                return (f"its close {c:g} is {abs(c / self.raw[self.n - 1, 3] - 1):.0%} away from the previous bar's "
                        f"{self.raw[self.n - 1, 3]:g}: another instrument's prices, not {self.contract.symbol}'s")
        if self.schedule is not None:
            index = pd.DatetimeIndex([stamp.tz_convert(self.contract.timezone)])
            if outside_schedule(index, self.contract, self.schedule)[0]:
                return (f"{index[0]} is outside {self.contract.symbol}'s sessions ({self.schedule.text()} "
                        f"{self.contract.timezone}, {self.schedule.hours} hours) the agent trades in")
        return ""

    def add(self, bar: Bar) -> None:
        """Adds a bar that `check` passes (else raises BarRefused with its reason). `note` says what is worth a line
        about a bar that was taken (bars missing before it), else ""."""
        problem = self.check(bar)
        if problem:
            raise BarRefused(problem)
        self.note = ""
        if self.n == self.capacity:
            self._grow()
        i = self.n
        stamp = pd.Timestamp(bar.time)
        self.stamps[i] = stamp.value
        self.raw[i] = [getattr(bar, f) for f in ROW_FIELDS]
        if bar.text.strip():
            if bar.text not in self._text_ids:
                self._text_ids[bar.text] = len(self.text_table)
                self.text_table.append(bar.text)
            self.text_index[i] = self._text_ids[bar.text]
        self.n += 1
        if self.schedule is not None:
            self._place(i, i + 1)
            gap = (stamp.value - self.stamps[i - 1]) // (60 * 10**9 * self.interval) - 1
            if self.session_id[i] == self.session_id[i - 1] and gap > 0 and self.interval < 1440:
                self.note = f"{gap} {interval_text(self.interval)} bar(s) missing before {stamp}: traded on without them"
        elif self.n == FIRST_DECISION_BAR:  # the history is complete: its schedule, scale, then its features
            self._start()

    def _start(self) -> None:
        """At the first decision bar: the history's interval (the run's, where known), price scale and schedule,
        then every history bar placed; HistoryRefused where one does not fit."""
        index = self.timestamps
        interval, problem = measure_interval(index)
        if not problem and self.trained_interval and interval != self.trained_interval:
            problem = (f"bars are {_apart(interval)} apart; the run was trained on {_bars_of(self.trained_interval)} "
                       "bars")
        if problem:
            self.n = 0  # nothing is traded on history that is not the run's
            raise HistoryRefused(problem)
        self.interval = interval
        scale = check_scale(tuple(self.raw[: self.n, j] for j in range(4)), self.contract, self.min_range_ticks)
        if scale.problem:
            self.n = 0
            raise HistoryRefused(scale.problem)
        schedule = choose_schedule(index, self.contract, self.interval)
        outside = outside_schedule(index, self.contract, schedule)
        if outside.any():
            self.n = 0
            days = "" if self.contract.weekends else ", Monday to Friday"
            raise HistoryRefused(f"{int(outside.sum())} of them lie outside {self.contract.symbol}'s sessions "
                                 f"({schedule.text()} {self.contract.timezone}{days}), the first at "
                                 f"{index[outside][0]}", outside=True)
        self.schedule = schedule
        self._place(0, self.n)  # one pass: each row looks back only, so it is the row a bar-by-bar pass gives

    def _place(self, first: int, end: int) -> None:
        """Bars [first, end)'s sessions, rules and features: the last rows of the window of bars up to end."""
        start = max(0, end - FEATURE_WINDOW)
        index = pd.DatetimeIndex(self.stamps[start:end]).tz_localize("UTC").tz_convert(self.contract.timezone)
        frame = pd.DataFrame(self.raw[start:end], columns=list(ROW_FIELDS), index=index)
        sessions = session_info(index, self.contract, self.interval, self.schedule)
        rules = self.rules
        can_enter, flatten = flat_rules(index, sessions, self.contract, prop_flat_by(self.contract, rules),
                                        rules.timezone, rules.no_entry_minutes_before_close)
        rows = slice(first, end)
        take = slice(first - start, end - start)
        if start == 0:
            self.session_id[rows] = sessions.session_id[take]
        else:  # one new bar
            self.session_id[first] = self.session_id[first - 1] + int(sessions.session_id[-1] != sessions.session_id[-2])
        self.minute_of_day[rows] = sessions.minute_of_day[take]
        self.day[rows] = sessions.day[take].astype("datetime64[D]").astype(np.int64)
        self.can_enter[rows], self.flatten[rows] = can_enter[take], flatten[take]
        if not self.features:
            return
        bar_f, context_f, atr, indicators = compute_features(frame, sessions)
        self.bar_features[rows], self.context_features[rows], self.atr[rows] = bar_f[take], context_f[take], atr[take]
        for name in INDICATORS:
            self.indicators[name][rows] = indicators[name][take]

    def next_session_id(self) -> int:
        """The session the next bar belongs to, as far as the calendar says now: the last bar's, or the one after it
        where the last bar is its session's scheduled last (the record settles a session's calls on it)."""
        i = self.n - 1
        s = self.schedule
        if self.interval >= 1440:
            return int(self.session_id[i]) + 1
        into = (int(self.minute_of_day[i]) - s.open) % 1440
        return int(self.session_id[i]) + int(into + self.interval >= s.minutes)


def _apart(minutes: int) -> str:
    """A bar interval as a distance: "1 day", "60 minutes"."""
    return "1 day" if minutes == DAILY else f"{minutes} minute{'s' if minutes != 1 else ''}"


def _bars_of(minutes: int) -> str:
    """A bar interval as a kind of bar: "daily", "60-minute"."""
    return "daily" if minutes == DAILY else f"{minutes}-minute"
