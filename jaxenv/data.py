"""Loading OHLCV bars from CSV or Parquet, as common tools export them, with their stamps in the exchange's time
zone, and validating them.

Bad input fails with a `DataValidationError` that names the file, the row and the column: a file that is not bars
(empty, binary, a truncated Parquet file) as well as a bad value or a daylight-saving gap in naive stamps. Nothing is
fixed silently: `drop_invalid_rows=True` drops the offending rows and reports how many. Stamps that start with a day
and a month are read in the order the file proves (a field above 12), never by a guess.
"""

from __future__ import annotations

import gzip
import io
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

PRICE_COLUMNS = ("open", "high", "low", "close")
REQUIRED_COLUMNS = (*PRICE_COLUMNS, "volume")
TIMESTAMP_NAMES = ("datetime", "timestamp", "date_time", "time", "date")
TEXT_NAMES = ("headline", "headlines", "news", "text")
_SHOWN_ROWS = 5  # offending rows listed in one error message
_GUESSED_ROWS = 100  # leading stamps tried for the format of a column with bad rows
# the fix for stamps of a file that no format option reads (a news file)
ISO_STAMPS = "write the stamps in ISO 8601 (2024-03-04 14:30:00+00:00, or naive 2024-03-04 09:30:00)"


class DataValidationError(ValueError):
    """Bad market data; the message names the file, the rows and the column."""


class Refusal:
    """The problems one load finds, refused together in one line, so that one run shows every fix the data needs."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def raise_any(self) -> None:
        if len(self.problems) == 1:
            raise DataValidationError(f"{self.source}: {self.problems[0]}")
        if self.problems:
            listed = "; ".join(f"({i}) {problem}" for i, problem in enumerate(self.problems, 1))
            raise DataValidationError(f"{self.source}: {len(self.problems)} problems, all to fix before it loads: "
                                      f"{listed}")


@dataclass
class LoadedBars:
    frame: pd.DataFrame  # index: tz-aware timestamps; columns open, high, low, close, volume (+ text)
    source: str
    dropped_rows: int  # rows removed by drop_invalid_rows


class RawBars(NamedTuple):
    """A file's bars with their stamps as parsed: naive, or tz-aware where the text carries offsets."""

    frame: pd.DataFrame  # lower-case OHLCV columns (+ headline), indexed by the stamps
    wall: pd.DatetimeIndex  # the stamps' wall-clock times as written, naive
    column: str  # the timestamp column's name
    note: str  # how the stamps' text was read, for the load report ("" when nothing was decided)


def read_bars(
    path: str | Path,
    timezone: str = "America/New_York",
    date_format: str | None = None,
    text_column: str | None = None,
    source_timezone: str | None = None,
) -> pd.DataFrame:
    """Reads a CSV or Parquet file into a frame with lower-case OHLCV columns and a tz-aware index in `timezone`
    (the exchange's zone). Does not validate values; see `validate_bars`. Naive stamps are taken as
    `source_timezone` (default: `timezone`)."""
    return read_bars_noted(path, timezone, date_format, text_column, source_timezone)[0]


def read_bars_noted(
    path: str | Path,
    timezone: str = "America/New_York",
    date_format: str | None = None,
    text_column: str | None = None,
    source_timezone: str | None = None,
) -> tuple[pd.DataFrame, str]:
    """`read_bars`, and a note of how the stamps' zone was read (for the load report)."""
    frame, wall, column, note = read_raw_bars(path, date_format, text_column)
    stamps, zone_note = to_exchange_time(pd.DatetimeIndex(frame.index), wall, timezone, source_timezone, str(path),
                                         column)
    return frame.set_axis(stamps, axis=0), "; ".join(filter(None, [note, zone_note]))


def read_raw_bars(path: str | Path, date_format: str | None = None, text_column: str | None = None) -> RawBars:
    """A CSV or Parquet file's bars with their stamps as parsed, before any time zone is applied."""
    path = Path(path)
    return raw_bars(path, read_table(path), date_format, text_column)[0]


def raw_bars(path: Path, raw: pd.DataFrame, date_format: str | None = None, text_column: str | None = None,
             refuse_rows: bool = False) -> tuple[RawBars, dict[int, str]]:
    """`read_raw_bars` of the file's table as read (`read_table`). With `refuse_rows`, a stamp that cannot be read
    (NaT) or a value that is not a number (NaN) fails its row, not the file: {the row's position: why}."""
    by_lower = columns_by_name(raw)

    missing = [c for c in REQUIRED_COLUMNS if c not in by_lower]
    if missing:
        raise DataValidationError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(map(str, raw.columns))}"
        )
    if not len(raw):
        raise DataValidationError(f"{path}: has columns but no rows of bars")

    stamps, wall, column, note = parse_timestamps(path, raw, by_lower, date_format, refuse_rows=refuse_rows)
    frame = pd.DataFrame({c: pd.to_numeric(raw[by_lower[c]], errors="coerce") for c in REQUIRED_COLUMNS})
    non_numeric = frame.isna() & raw[[by_lower[c] for c in REQUIRED_COLUMNS]].notna().values
    refused: dict[int, list[str]] = {}
    if refuse_rows:
        unread = np.flatnonzero(stamps.isna())
        written = _stamp_text(path, raw, by_lower)[0].iloc[unread] if len(unread) else []
        for i, text in zip(unread, written):
            refused[int(i)] = [f"its stamp {str(text)!r} cannot be read" if pd.notna(text) else "its stamp is missing"]
        for col in non_numeric.columns[non_numeric.any()]:
            for i in np.flatnonzero(non_numeric[col].values):
                refused.setdefault(int(i), []).append(f"column '{col}' is not a number "
                                                      f"({str(raw[by_lower[col]].iloc[i])!r})")
    elif non_numeric.values.any():
        col = non_numeric.columns[non_numeric.any()].tolist()[0]
        rows = np.flatnonzero(non_numeric[col].values)
        raise DataValidationError(f"{path}: column '{col}' has non-numeric values at {row_list(rows)}")
    frame.index = stamps
    frame.index.name = "timestamp"

    text_key = text_column.lower() if text_column else next((t for t in TEXT_NAMES if t in by_lower), None)
    if text_key is not None:
        if text_key not in by_lower:
            raise DataValidationError(f"{path}: text column {text_column!r} not found")
        frame["headline"] = raw[by_lower[text_key]].fillna("").astype(str).values
    return RawBars(frame, wall, column, note), {i: "; ".join(why) for i, why in sorted(refused.items())}


def columns_by_name(raw: pd.DataFrame) -> dict[str, str]:
    """{a column's name stripped and lower-case: the column}; the first of names that differ only in case."""
    by_lower: dict[str, str] = {}
    for col in raw.columns:
        by_lower.setdefault(str(col).strip().lower(), col)
    return by_lower


def read_table(path: Path, setting: str = "--data", data: bytes | None = None) -> pd.DataFrame:
    """The file as a raw frame; a file that cannot be read as a table fails with one line naming it (and the
    `setting` that names the file, where it is a folder). `data`: a CSV file's bytes as read already, parsed
    instead of the file."""
    if data is None and not path.exists():
        raise FileNotFoundError(f"market data file not found: {path}")
    if data is None and path.is_dir():
        raise DataValidationError(f"{path}: is a folder; {setting} takes a CSV or Parquet file")
    if (path.stat().st_size if data is None else len(data)) == 0:
        raise DataValidationError(f"{path}: the file is empty")
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            raw = pd.read_parquet(path)
        except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid (a ValueError) for truncated or foreign files
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataValidationError(
                f"{path}: not a readable Parquet file (truncated, or another format named .parquet): {reason}"
            ) from None
        if isinstance(raw.index, pd.DatetimeIndex) or raw.index.name is not None:
            raw = raw.reset_index()
        return raw
    if suffix not in (".csv", ".txt", ".gz"):
        raise DataValidationError(f"{path}: unsupported file type {suffix!r}; use .csv or .parquet")
    not_text = DataValidationError(
        f"{path}: not a UTF-8 text CSV file (binary content or another encoding; Parquet files need the .parquet "
        "suffix)")
    if not _is_text(path, data):
        raise not_text
    try:
        return pd.read_csv(path if data is None else io.BytesIO(data))
    except pd.errors.EmptyDataError:
        raise DataValidationError(f"{path}: has no columns (an empty or blank CSV file)") from None
    except (UnicodeDecodeError, EOFError, OSError, zlib.error):
        raise not_text from None
    except pd.errors.ParserError as error:
        reason = str(error).strip().splitlines()[-1]
        raise DataValidationError(f"{path}: could not be read as CSV: {reason}") from None


def _is_text(path: Path, data: bytes | None = None, size: int = 8192) -> bool:
    """The file's first bytes (decompressed for .gz; of `data` where given) are UTF-8 text without NUL bytes."""
    try:
        with (io.BytesIO(data) if data is not None else gzip.open(path, "rb") if path.suffix.lower() == ".gz"
              else path.open("rb")) as file:
            head = file.read(size)
    except (OSError, EOFError, zlib.error):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # not merely a character cut at the end of the sample
            return False
    return b"\x00" not in head


def _stamp_text(path: Path, raw: pd.DataFrame, by_lower: dict[str, str]) -> tuple[pd.Series, str]:
    """The stamps as written (a date and a time column joined) and the column's name."""
    names = [n for n in TIMESTAMP_NAMES if n in by_lower]
    if "date" in by_lower and "time" in by_lower and not any(n in by_lower for n in TIMESTAMP_NAMES[:3]):
        return raw[by_lower["date"]].astype(str) + " " + raw[by_lower["time"]].astype(str), "date+time"
    if names:
        return raw[by_lower[names[0]]], str(by_lower[names[0]])
    first = str(raw.columns[0])
    if first.startswith("Unnamed") or first.strip() == "" or first == "index":
        return raw[raw.columns[0]], first
    raise DataValidationError(
        f"{path}: no timestamp column; expected one of {', '.join(TIMESTAMP_NAMES)} "
        "(any case), separate date and time columns, or an unnamed first index column"
    )


def parse_timestamps(
    path: Path, raw: pd.DataFrame, by_lower: dict[str, str], date_format: str | None,
    date_option: str | None = "--date-format", refuse_rows: bool = False,
) -> tuple[pd.DatetimeIndex, pd.DatetimeIndex, str, str]:
    """(stamps as parsed: naive, or tz-aware where the text carries offsets; their wall-clock times as written,
    naive; the column's name; a note of the day and month order where the file decided it). `date_option` is the
    flag that gives the file a format, named in errors; None where it has none (ISO 8601 stamps are then the fix).
    With `refuse_rows`, stamps that cannot be read are NaT, not an error, and the rest are read as without them."""
    text, column = _stamp_text(path, raw, by_lower)
    wall, note, fmt = None, "", date_format
    if refuse_rows and fmt is None and not pd.api.types.is_numeric_dtype(text):
        text = _readable(text)
    if fmt is None and not pd.api.types.is_numeric_dtype(text):
        fmt, note = _day_and_month_order(path, column, text, date_option, refuse_rows)
    try:
        if pd.api.types.is_numeric_dtype(text):
            # Epoch numbers: seconds, milliseconds or nanoseconds by magnitude.
            values = np.asarray(text, dtype=np.float64)
            unit = "s" if np.nanmax(values) < 1e11 else ("ms" if np.nanmax(values) < 1e14 else "ns")
            stamps = pd.to_datetime(values, unit=unit, utc=True)
        else:
            # pandas warns in its own words where it cannot infer a format; the error below names the rows instead
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                try:
                    stamps = pd.to_datetime(text, format=fmt, errors="coerce")
                except ValueError:  # offsets that differ between rows (a daylight-saving change): one common zone
                    stamps = pd.to_datetime(text, format=fmt, errors="coerce", utc=True)
                    written = text.astype(str).str.replace(r"(Z|[+-]\d\d:?\d\d)$", "", regex=True)
                    wall = pd.DatetimeIndex(pd.to_datetime(written, errors="coerce"))
    except (ValueError, TypeError) as err:
        raise DataValidationError(f"{path}: column '{column}' could not be parsed as timestamps: {err}") from None
    stamps = pd.DatetimeIndex(stamps)
    bad = np.flatnonzero(stamps.isna())
    if len(bad) and not refuse_rows:
        if date_format:
            hint = ""
        elif not date_option:
            hint = f"{f' as {fmt}' if fmt else ''}; {ISO_STAMPS}"
        elif fmt:
            hint = f" as {fmt}; pass {date_option} for another format"
        else:
            hint = f"; pass {date_option} for unusual formats"
        raise DataValidationError(f"{path}: column '{column}' has unparseable timestamps at {row_list(bad)}{hint}")
    if wall is None or (wall.isna() & stamps.notna()).any():
        wall = stamps if stamps.tz is None else stamps.tz_localize(None)
    return stamps, wall, column, note


def _day_and_month_order(path: Path, column: str, text: pd.Series, date_option: str | None,
                         refuse_rows: bool = False) -> tuple[str | None, str]:
    """The format of stamps that start with a day and a month in either order (01.02.2017 22:00:00.000), as the
    file proves it: a field above 12 is the day. Returns the format and a note of the decision; (None, "") for other
    stamps (ISO dates, ...). Stamps that read every row both ways, to different dates, are an error that names both
    formats (passed with `date_option`; ISO 8601 stamps where the file has none): a guess would move most dates by
    months. With `refuse_rows`, stamps that read neither way prove nothing (their rows are refused)."""
    first = int(np.argmax(text.notna().to_numpy())) if refuse_rows else 0
    guessed = _guessed_format(str(text.iloc[first]))
    if sorted([guessed[:2], guessed[3:5]]) != ["%d", "%m"]:
        return None, ""
    rest = guessed[5:]
    day_first, month_first = f"%d{guessed[2]}%m{rest}", f"%m{guessed[2]}%d{rest}"
    readings = {fmt: pd.to_datetime(text, format=fmt, errors="coerce") for fmt in (day_first, month_first)}
    read = ((readings[day_first].notna() | readings[month_first].notna()).to_numpy() if refuse_rows
            else np.ones(len(text), bool))
    whole = [fmt for fmt, stamps in readings.items() if stamps.notna().to_numpy()[read].all()]
    if not whole:  # bad rows either way: the reading that parses most of them names them
        return max(readings, key=lambda fmt: readings[fmt].notna().sum()), ""
    if len(whole) == 2:
        if readings[day_first].equals(readings[month_first]):  # every day equals its month
            return day_first, ""
        fix = (f"pass {date_option} \"{day_first}\" (day-first) or {date_option} \"{month_first}\" (month-first)"
               if date_option else ISO_STAMPS)
        raise DataValidationError(
            f"{path}: column '{column}' reads both day-first and month-first (no field above 12 tells which), to "
            f"different dates: {fix}")
    fmt = whole[0]
    other = month_first if fmt == day_first else day_first
    proof = int(np.flatnonzero(readings[other].isna().to_numpy() & read)[0])
    order = "day-first" if fmt == day_first else "month-first"
    return fmt, f"read {order} as {fmt} (row {proof + 1}, {text.iloc[proof]}, reads no other way)"


def _readable(text: pd.Series) -> pd.Series:
    """`text` read as without its bad stamps: epoch numbers where the first stamp is one (a bad one made the column
    text), else the stamps above the first whose format can be guessed blanked (pandas reads a column in the format
    of its first stamp, and a bad first one would have every stamp read one by one)."""
    for i, value in enumerate(text.iloc[:_GUESSED_ROWS]):
        if pd.isna(value):
            continue
        if _is_number(str(value)):
            return pd.to_numeric(text, errors="coerce")
        if _guessed_format(str(value)):
            return text.where(np.arange(len(text)) >= i) if i else text
    return text


def _guessed_format(stamp: str) -> str:
    """pandas' guess of a stamp's format ("" for none), without its warning of the day-month order it chose: the
    loader reads both orders and says which the file proves (_day_and_month_order)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return guess_datetime_format(stamp) or ""


def _is_number(text: str) -> bool:
    """`text` reads as a number (an epoch stamp)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def to_exchange_time(
    stamps: pd.DatetimeIndex,
    wall: pd.DatetimeIndex | None,
    timezone: str,
    source_timezone: str | None,
    where: str,
    column: str = "timestamp",
) -> tuple[pd.DatetimeIndex, str]:
    """Stamps in the exchange's zone `timezone`, and a note of what was assumed. Stamps with offsets are converted;
    naive ones are taken as `source_timezone` (default: the exchange's) and a daylight-saving gap or overlap in them
    is an error; stamps that are all midnight are dates, the exchange's trading days as written (no conversion)."""
    if wall is None:
        wall = stamps.tz_localize(None) if stamps.tz is not None else stamps
    if is_dates(wall):
        dates = wall.normalize().tz_localize(timezone, ambiguous=np.zeros(len(wall), bool), nonexistent="shift_forward")
        return dates, "dates without a time of day: the exchange's trading days as written, no zone conversion"
    if stamps.tz is not None:
        unused = "; data.source_timezone unused" if source_timezone else ""
        return stamps.tz_convert(timezone), f"with UTC offsets, converted to {timezone}{unused}"
    zone = source_timezone or timezone
    why = "data.source_timezone" if source_timezone else "the instrument's exchange zone"
    local = stamps.tz_localize(zone, ambiguous="NaT", nonexistent="NaT")
    if local.isna().any():
        raise DataValidationError(
            f"{where}: column '{column}' has {daylight_saving_problem(stamps, zone)}; naive stamps are taken as {zone} "
            f"({why}). If the file is in another zone, name it: --set data.source_timezone=UTC (or its zone); else "
            "export the stamps with their UTC offset"
        )
    note = f"naive, taken as {zone} ({why})"
    if zone != timezone:
        return local.tz_convert(timezone), f"{note}, converted to {timezone}"
    return local, note


def is_dates(wall: pd.DatetimeIndex) -> bool:
    """Stamps that are all midnight are dates: trading days, not instants."""
    return bool(len(wall)) and bool((wall == wall.normalize()).all())


def daylight_saving_problem(wall: pd.DatetimeIndex, zone: str, rows: np.ndarray | None = None) -> str:
    """Which naive stamps are no time in `zone` ("times that do not exist in ... at row 3 (2024-03-10 02:00:00)"), or
    "" where every one is; `rows` are the file's rows of the stamps (default: their positions)."""
    rows = np.arange(len(wall)) if rows is None else rows
    skipped = np.flatnonzero(wall.tz_localize(zone, ambiguous=np.zeros(len(wall), bool), nonexistent="NaT").isna())
    twice = np.flatnonzero(wall.tz_localize(zone, ambiguous="NaT", nonexistent="shift_forward").isna())
    found = [f"times that {what} at {row_list(rows[at])} ({wall[at[0]]})" for at, what in (
        (skipped, f"do not exist in {zone} (the clocks jump forward at a daylight-saving change)"),
        (twice, f"occur twice in {zone} (the clocks go back at a daylight-saving change)")) if len(at)]
    return " and ".join(found)


def row_list(positions: np.ndarray) -> str:
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


ROW_FIX = "--set data.drop_invalid_rows=true drops such rows instead"


def invalid_rows(frame: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Which rows fail a per-row rule, and one text per rule that fails in the frame as given ("column 'high' is below
    low at row 8"). Setting rows aside can expose a new timestamp order problem, so the rest is checked again until
    it is clean."""
    bad = np.zeros(len(frame), bool)
    texts: list[str] = []
    while True:
        kept = np.flatnonzero(~bad)
        problems = row_problems(frame.iloc[kept])
        if not problems:
            return bad, texts
        if not texts:
            texts = [f"column '{column}' {rule} at {row_list(np.flatnonzero(rows))}" for rule, column, rows in problems]
        for _, _, rows in problems:
            bad[kept[rows]] = True


def too_few_bars(bars: int, min_bars: int) -> str:
    return f"{bars} bars is fewer than the {min_bars} that one observation window and the feature warm-up need"


def validate_bars(
    frame: pd.DataFrame, source: str, min_bars: int, drop_invalid_rows: bool = False
) -> LoadedBars:
    """Checks every rule; raises naming every failing one unless drop_invalid_rows, which drops the bad rows and
    counts them."""
    bad, texts = invalid_rows(frame)
    if texts and not drop_invalid_rows:
        raise DataValidationError(f"{source}: {'; '.join(texts)} ({ROW_FIX})")
    frame = frame.iloc[np.flatnonzero(~bad)]
    if len(frame) < min_bars:
        raise DataValidationError(f"{source}: {too_few_bars(len(frame), min_bars)}")
    return LoadedBars(frame=frame, source=source, dropped_rows=int(bad.sum()))
