"""A market: validated bars of one instrument, their sessions on its calendar, causal features and non-overlapping
time splits."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from jaxenv.config import DataConfig, resolve_data_config
from jaxenv.contracts import ContractSpec
from jaxenv.data import DataValidationError, LoadedBars, read_bars_noted, row_list, to_exchange_time, validate_bars
from jaxenv.features import WARMUP_BARS, compute_features
from jaxenv.scale import Scale, check_scale
from jaxenv.sessions import SessionInfo, detect_interval, outside_sessions, session_info
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


def market_from_frame(
    frame: pd.DataFrame, source: str, cfg: DataConfig, dropped_rows: int = 0, stamps_note: str | None = None
) -> Market:
    """A Market of `frame` (OHLCV columns, a DatetimeIndex) traded as `cfg.contract`: stamps in the exchange's zone,
    the interval detected, sessions from the instrument's calendar, the price scale checked against its tick."""
    try:
        cfg = resolve_data_config(cfg)
    except ValueError as error:
        raise DataValidationError(f"{source}: {error}") from None
    contract: ContractSpec = cfg.contract
    index, note = to_exchange_time(pd.DatetimeIndex(frame.index), None, contract.timezone, cfg.source_timezone or None,
                                   source)
    frame = frame.set_axis(index, axis=0)
    min_bars = WARMUP_BARS + MAX_WINDOW + 2
    frame = validate_bars(frame, source, min_bars=min_bars).frame
    bars = tuple(frame[c].to_numpy(np.float64) for c in ("open", "high", "low", "close"))
    scale = check_scale(bars, contract, source, cfg.min_range_ticks)  # first: another instrument is the likeliest
    interval = detect_interval(frame.index, source)
    outside, schedule = outside_sessions(frame.index, contract, interval)
    if outside.any():
        rows = np.flatnonzero(outside)
        if not cfg.drop_invalid_rows:
            days = "" if contract.weekends else ", Monday to Friday"
            raise DataValidationError(
                f"{source}: {len(rows)} of {len(frame)} bars fall outside {contract.symbol}'s sessions "
                f"({schedule.text()} {contract.timezone}{days}) at {row_list(rows)} (first {frame.index[rows[0]]}); "
                f"the stamps are {stamps_note or note}. If the file's naive stamps are in another zone, name it: "
                "--set data.source_timezone=UTC (or its zone); if the instrument trades other hours, declare them in "
                "data.contract (session_open, session_close, weekends); --set data.drop_invalid_rows=true drops these "
                "bars"
            )
        warnings.warn(f"{source}: dropped {len(rows)} bar(s) outside {contract.symbol}'s sessions as "
                      "drop_invalid_rows asked", stacklevel=2)
        frame = validate_bars(frame.loc[~outside], source, min_bars=min_bars).frame
        bars = tuple(frame[c].to_numpy(np.float64) for c in ("open", "high", "low", "close"))
        dropped_rows += len(rows)
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
        dropped_rows=dropped_rows,
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
    loaded: LoadedBars = validate_bars(
        frame, cfg.source, min_bars=WARMUP_BARS + MAX_WINDOW + 2, drop_invalid_rows=cfg.drop_invalid_rows
    )
    return market_from_frame(loaded.frame, cfg.source, cfg, dropped_rows=loaded.dropped_rows, stamps_note=note)

