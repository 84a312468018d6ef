"""Loading OHLCV minute bars from CSV or Parquet, as common tools export them, and validating them.

Bad input fails with a `DataValidationError` that names the file, the row and the column. Nothing is fixed
silently: `drop_invalid_rows=True` drops the offending rows and reports how many.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

PRICE_COLUMNS = ("open", "high", "low", "close")
REQUIRED_COLUMNS = (*PRICE_COLUMNS, "volume")
TIMESTAMP_NAMES = ("datetime", "timestamp", "date_time", "time", "date")
TEXT_NAMES = ("headline", "headlines", "news", "text")
_SHOWN_ROWS = 5  # offending rows listed in one error message


class DataValidationError(ValueError):
    """Bad market data; the message names the file, the rows and the column."""


@dataclass
class LoadedBars:
    frame: pd.DataFrame  # index: tz-aware timestamps; columns open, high, low, close, volume (+ text)
    source: str
    dropped_rows: int  # rows removed by drop_invalid_rows


def read_bars(
    path: str | Path,
    timezone: str = "America/New_York",
    date_format: str | None = None,
    text_column: str | None = None,
) -> pd.DataFrame:
    """Reads a CSV or Parquet file into a frame with a tz-aware index and lower-case OHLCV columns.
    Does not validate values; see `validate_bars`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"market data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        raw = pd.read_parquet(path)
        if isinstance(raw.index, pd.DatetimeIndex) or raw.index.name is not None:
            raw = raw.reset_index()
    elif suffix in (".csv", ".txt", ".gz"):
        raw = pd.read_csv(path)
    else:
        raise DataValidationError(f"{path}: unsupported file type {suffix!r}; use .csv or .parquet")

    by_lower: dict[str, str] = {}
    for col in raw.columns:
        by_lower.setdefault(str(col).strip().lower(), col)

    missing = [c for c in REQUIRED_COLUMNS if c not in by_lower]
    if missing:
        raise DataValidationError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(map(str, raw.columns))}"
        )

    stamps = _parse_timestamps(path, raw, by_lower, timezone, date_format)
    frame = pd.DataFrame({c: pd.to_numeric(raw[by_lower[c]], errors="coerce") for c in REQUIRED_COLUMNS})
    non_numeric = frame.isna() & raw[[by_lower[c] for c in REQUIRED_COLUMNS]].notna().values
    if non_numeric.values.any():
        col = non_numeric.columns[non_numeric.any()].tolist()[0]
        rows = np.flatnonzero(non_numeric[col].values)
        raise DataValidationError(f"{path}: column '{col}' has non-numeric values at {_rows(rows)}")
    frame.index = stamps
    frame.index.name = "timestamp"

    text_key = text_column.lower() if text_column else next((t for t in TEXT_NAMES if t in by_lower), None)
    if text_key is not None:
        if text_key not in by_lower:
            raise DataValidationError(f"{path}: text column {text_column!r} not found")
        frame["headline"] = raw[by_lower[text_key]].fillna("").astype(str).values
    return frame


def _parse_timestamps(
    path: Path, raw: pd.DataFrame, by_lower: dict[str, str], timezone: str, date_format: str | None
) -> pd.DatetimeIndex:
    names = [n for n in TIMESTAMP_NAMES if n in by_lower]
    if "date" in by_lower and "time" in by_lower and not any(n in by_lower for n in TIMESTAMP_NAMES[:3]):
        text = raw[by_lower["date"]].astype(str) + " " + raw[by_lower["time"]].astype(str)
        column = "date+time"
    elif names:
        text = raw[by_lower[names[0]]]
        column = str(by_lower[names[0]])
    else:
        first = str(raw.columns[0])
        if first.startswith("Unnamed") or first.strip() == "" or first == "index":
            text = raw[raw.columns[0]]
            column = first
        else:
            raise DataValidationError(
                f"{path}: no timestamp column; expected one of {', '.join(TIMESTAMP_NAMES)} "
                "(any case), separate date and time columns, or an unnamed first index column"
            )
    try:
        if pd.api.types.is_numeric_dtype(text):
            # Epoch numbers: seconds, milliseconds or nanoseconds by magnitude.
            values = np.asarray(text, dtype=np.float64)
            unit = "s" if np.nanmax(values) < 1e11 else ("ms" if np.nanmax(values) < 1e14 else "ns")
            stamps = pd.to_datetime(values, unit=unit, utc=True)
        else:
            stamps = pd.to_datetime(text, format=date_format, errors="coerce")
    except (ValueError, TypeError) as err:
        raise DataValidationError(f"{path}: column '{column}' could not be parsed as timestamps: {err}") from None
    stamps = pd.DatetimeIndex(stamps)
    bad = np.flatnonzero(stamps.isna())
    if len(bad):
        hint = "" if date_format else "; pass --date-format for unusual formats"
        raise DataValidationError(f"{path}: column '{column}' has unparseable timestamps at {_rows(bad)}{hint}")
    if stamps.tz is None:
        stamps = stamps.tz_localize(timezone, ambiguous="NaT", nonexistent="NaT")  # naive = exchange time
        bad = np.flatnonzero(stamps.isna())
        if len(bad):
            raise DataValidationError(
                f"{path}: column '{column}' has times that do not exist or are ambiguous in {timezone} "
                f"(daylight-saving change) at {_rows(bad)}"
            )
    else:
        stamps = stamps.tz_convert(timezone)
    return stamps


def _rows(positions: np.ndarray) -> str:
    """Data rows, 1-based, as a person counts them below the header."""
    shown = ", ".join(str(int(p) + 1) for p in positions[:_SHOWN_ROWS])
    more = f" and {len(positions) - _SHOWN_ROWS} more" if len(positions) > _SHOWN_ROWS else ""
    return f"row{'s' if len(positions) > 1 else ''} {shown}{more}"


def row_problems(frame: pd.DataFrame) -> list[tuple[str, str, np.ndarray]]:
    """Every per-row rule that fails: (rule, column, bad-row mask)."""
    problems: list[tuple[str, str, np.ndarray]] = []
    values = {c: frame[c].to_numpy(dtype=np.float64) for c in REQUIRED_COLUMNS}
    for c in REQUIRED_COLUMNS:
        bad = ~np.isfinite(values[c])
        if bad.any():
            problems.append(("is NaN or infinite", c, bad))
    with np.errstate(invalid="ignore"):
        for c in PRICE_COLUMNS:
            bad = values[c] <= 0
            if bad.any():
                problems.append(("is not positive", c, bad))
        bad = values["volume"] < 0
        if bad.any():
            problems.append(("is negative", "volume", bad))
        o, h, lo, cl = (values[c] for c in PRICE_COLUMNS)
        bad = h < lo
        if bad.any():
            problems.append(("is below low", "high", bad))
        bad = (h < np.maximum(o, cl)) & ~(h < lo)
        if bad.any():
            problems.append(("is below open or close", "high", bad))
        bad = (lo > np.minimum(o, cl)) & ~(h < lo)
        if bad.any():
            problems.append(("is above open or close", "low", bad))
    ts = frame.index.asi8
    step = np.diff(ts)
    dup = np.zeros(len(frame), dtype=bool)
    dup[1:] = step == 0
    if dup.any():
        problems.append(("is a duplicate of the previous row's", "timestamp", dup))
    dec = np.zeros(len(frame), dtype=bool)
    dec[1:] = step < 0
    if dec.any():
        problems.append(("is earlier than the previous row's", "timestamp", dec))
    return problems


def validate_bars(
    frame: pd.DataFrame, source: str, min_bars: int, drop_invalid_rows: bool = False
) -> LoadedBars:
    """Checks every rule; raises on the first failing one unless drop_invalid_rows, which drops the bad rows
    (repeating until clean, since dropping a row can expose a new timestamp order problem) and reports."""
    dropped = 0
    while True:
        problems = row_problems(frame)
        if not problems:
            break
        if not drop_invalid_rows:
            rule, column, bad = problems[0]
            raise DataValidationError(
                f"{source}: column '{column}' {rule} at {_rows(np.flatnonzero(bad))} "
                "(set drop_invalid_rows / --drop-invalid-rows to drop such rows instead)"
            )
        any_bad = np.zeros(len(frame), dtype=bool)
        for _, _, bad in problems:
            any_bad |= bad
        dropped += int(any_bad.sum())
        frame = frame.loc[~any_bad]
    if dropped:
        warnings.warn(f"{source}: dropped {dropped} invalid row(s) as drop_invalid_rows asked", stacklevel=2)
    if len(frame) < min_bars:
        raise DataValidationError(
            f"{source}: {len(frame)} bars is fewer than the {min_bars} that one observation window "
            "and the feature warm-up need"
        )
    return LoadedBars(frame=frame, source=source, dropped_rows=dropped)
