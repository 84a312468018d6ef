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
    invalid_rows,
    read_bars_noted,
    row_list,
    to_exchange_time,
    too_few_bars,
)
from jaxenv.features import WARMUP_BARS, compute_features
from jaxenv.scale import Scale, check_scale, same_calendar
from jaxenv.sessions import Schedule, SessionInfo, measure_interval, outside_sessions, session_info
from jaxenv.synthetic import generate_bars

SPLITS = ("train", "val", "test")
MAX_WINDOW = 64  # the observation window may not exceed this; it sets the minimum data length


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
    text_table: list[str]  # distinct headlines; the policy never sees them, prompts do
    text_index: np.ndarray  # int32 [n] into text_table; -1 where a bar has no text
    splits: dict[str, tuple[int, int]]  # name -> [start, end) bar indices
    dropped_rows: int = 0
    dropped_note: str = ""  # which rows data.drop_invalid_rows dropped, and why
    stamps_note: str = ""  # how the file's stamps were read: their zone, or dates
    scale: Scale | None = None  # the bars in the instrument's ticks

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
        return WARMUP_BARS + MAX_WINDOW

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

    def walk_forward_folds(self, n_folds: int) -> list[dict[str, tuple[int, int]]]:
        """Expanding-window folds over whole sessions: fold k trains on chunks 0..k and tests on chunk k+1."""
        if n_folds < 1:
            raise ValueError("n_folds must be at least 1")
        bounds = _session_aligned_bounds(self.sessions.session_id, np.linspace(0, 1, n_folds + 2)[1:-1])
        edges = [0, *bounds, self.num_bars]
        return [{"train": (edges[0], edges[k + 1]), "test": (edges[k + 1], edges[k + 2])} for k in range(n_folds)]


def _session_aligned_bounds(session_id: np.ndarray, fractions: np.ndarray) -> list[int]:
    """Split points moved to the first bar of the session nearest to each fraction of the data."""
    starts = np.flatnonzero(np.diff(session_id, prepend=-1))
    n = len(session_id)
    out = []
    for f in fractions:
        target = f * n
        out.append(int(starts[np.argmin(np.abs(starts - target))]))
    return out


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
    597 (Friday 17:00)"."""
    at = np.flatnonzero(outside)
    days = "" if spec.weekends else ", Monday to Friday"
    return (f"{len(at)} of {len(index)} bars fall outside {spec.symbol}'s sessions ({schedule.text()} {spec.timezone}"
            f"{days}) at {row_list(rows[at])} ({_when(index[at])})")


OTHER_HOURS = ("If the file's naive stamps are in another zone, name it: --set data.source_timezone=UTC (or its "
               "zone); if the instrument trades other hours, declare them in data.contract (session_open, "
               "session_close, weekends); --set data.drop_invalid_rows=true drops these bars")


def market_from_frame(
    frame: pd.DataFrame, source: str, cfg: DataConfig, stamps_note: str | None = None
) -> Market:
    """A Market of `frame` (OHLCV columns, a DatetimeIndex) traded as `cfg.contract`: stamps in the exchange's zone,
    then every check, and one refusal names every problem found: rows that fail validation, the price scale against
    the instrument's tick, the bar interval and the bars outside the instrument's sessions (under the built-in whose
    tick fits, where the instrument's does not)."""
    try:
        cfg = resolve_data_config(cfg)
    except ValueError as error:
        raise DataValidationError(f"{source}: {error}") from None
    contract: ContractSpec = cfg.contract
    refusal = Refusal(source)
    index, note = to_exchange_time(pd.DatetimeIndex(frame.index), None, contract.timezone, cfg.source_timezone or None,
                                   source)
    dropped: list[str] = []  # what drop_invalid_rows dropped, for the load report
    bad, texts = invalid_rows(frame.set_axis(index, axis=0))
    if texts and not cfg.drop_invalid_rows:
        refusal.add(f"{'; '.join(texts)} ({ROW_FIX})")
    elif texts:
        dropped.append(f"{bad.sum()} failing validation ({row_list(np.flatnonzero(bad))})")
    rows = np.flatnonzero(~bad)  # the file's row of each bar still in
    frame, index = frame.iloc[rows], index[rows]

    # The calendar the stamps are checked on: the instrument's, or where its tick does not fit the prices, that of
    # the built-ins whose tick fits (when they share one), so the one refusal names the sessions as well
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
        outside, schedule = outside_sessions(index, calendar, interval)
        if outside.any():
            where = _outside(calendar, index, outside, rows, schedule)
            if cfg.drop_invalid_rows:
                dropped.append(where)
            else:
                refusal.add(f"{as_other}{where}; the stamps are {stamps_note or note}. {OTHER_HOURS}")
            keep = np.flatnonzero(~outside)
            frame, index, rows = frame.iloc[keep], index[keep], rows[keep]
    min_bars = WARMUP_BARS + MAX_WINDOW + 2
    if len(frame) < min_bars:
        refusal.add(too_few_bars(len(frame), min_bars))
    refusal.raise_any()
    frame = frame.set_axis(index, axis=0)
    bars = tuple(frame[c].to_numpy(np.float64) for c in ("open", "high", "low", "close"))
    sessions = session_info(frame.index, contract, interval)
    bar_features, context_features, atr, indicators = compute_features(frame, sessions)
    if "headline" in frame:
        text_table, text_index = np.unique(frame["headline"].to_numpy(dtype=str), return_inverse=True)
        text_table, text_index = list(text_table), text_index.astype(np.int32)
    else:
        text_table, text_index = [], np.full(len(frame), -1, dtype=np.int32)
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
        text_table=text_table,
        text_index=text_index,
        splits=time_splits(sessions.session_id, cfg.train_frac, cfg.val_frac),
        dropped_rows=len(bad) - len(frame),
        dropped_note="; ".join(dropped),
        stamps_note=stamps_note or note,
        scale=scale,
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
    frame, note = read_bars_noted(cfg.source, contract.timezone, cfg.date_format, cfg.text_column,
                                  cfg.source_timezone or None)
    return market_from_frame(frame, cfg.source, cfg, stamps_note=note)
