"""Bars from a file, as `scripts/trade.py` reads them: a replay of every row, or (`follow`) the rows appended to it
as a broker's export or a recorder writes them. Columns and stamps are read as `--data` reads them
(jaxenv.data.read_raw_bars); naive stamps are taken in the run's data.source_timezone (the exchange's by default). A
news file gives each bar its context as `data.news` does (jaxenv.news: the items published before the bar's close).
A row that cannot be read (a stamp or a value that is none, another number of fields than the header) is refused by
itself, with its line in the file; the other rows are read as before."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from agents.trading.bars import Bar
from jaxenv.data import REQUIRED_COLUMNS, DataValidationError, raw_bars, read_table


class BarFile:
    def __init__(self, path: str | Path, timezone: str, source_timezone: str = "", date_format: str | None = None,
                 text_column: str | None = None, news=None):
        """`timezone`: the exchange's (bars are placed in it); `source_timezone`: the zone of naive stamps; `news`: a
        DataConfig whose `news` names the news file (and its settings), read again with each read of the bars."""
        self.path = Path(path)
        self.news = news
        self.timezone, self.source_timezone = timezone, source_timezone or timezone
        self.date_format, self.text_column = date_format, text_column

    def read(self) -> list[tuple[int, Bar | str]]:
        """Every complete row so far: (its line in the file, the bar, or why the row is refused). A last line
        without its newline is being written: left for the next read."""
        refused: dict[int, str] = {}
        try:
            table, lines, refused = self._table()
            bars, problems = raw_bars(self.path, table, self.date_format, self.text_column, refuse_rows=True)
        except DataValidationError as error:
            if "no rows" in str(error) or "is empty" in str(error):
                return list(refused.items())
            raise
        frame = bars.frame
        stamps = pd.DatetimeIndex(frame.index)
        local = stamps if stamps.tz is not None else stamps.tz_localize(self.source_timezone, ambiguous="NaT",
                                                                         nonexistent="NaT")
        texts = frame["headline"].tolist() if "headline" in frame else [""] * len(frame)
        if self.news is not None and len(frame) > 1:
            texts = self._news_texts(local)
        values = frame[["open", "high", "low", "close", "volume"]].to_numpy(np.float64).tolist()
        out: list[tuple[int, Bar | str]] = []
        for i, (time_, row, text) in enumerate(zip(local.tz_convert(self.timezone), values, texts)):
            if i in problems:
                out.append((lines[i], problems[i]))
            elif time_ is pd.NaT:
                out.append((lines[i], f"{stamps[i]} is no single time in {self.source_timezone} (a daylight-saving "
                                      "change): give stamps with their UTC offset"))
            else:
                out.append((lines[i], Bar(time_, *row, str(text or ""))))
        return sorted(out + list(refused.items()), key=lambda r: r[0]) if refused else out

    def _table(self) -> tuple[pd.DataFrame, list[int], dict[int, str]]:
        """The file's table from one read of it, each of its rows' line in the file, and {line: why} for the rows
        left out of it (see `_by_fields`)."""
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".txt") or not self.path.is_file():  # Parquet, .gz, no file: as --data reads them
            table = read_table(self.path)
            return table, list(range(2, len(table) + 2)), {}
        data = self.path.read_bytes()
        if suffix == ".csv":  # the bytes after the last newline are a row being written
            data = data[: data.rfind(b"\n") + 1]
        data, lines, refused = _by_fields(data)
        return read_table(self.path, data=data), lines, refused

    def _news_texts(self, local: pd.DatetimeIndex) -> list[str]:
        """Each bar's news context: the items published before its close (its stamp + the bar interval); "" for a
        bar whose stamp is no time (its row is refused)."""
        from jaxenv.news import news_context
        from jaxenv.sessions import measure_interval

        timed = np.flatnonzero(local.notna())
        interval, problem = measure_interval(local[timed])
        if problem or interval is None or interval >= 1440:
            raise DataValidationError(f"{self.path}: --news needs intraday bars of one interval ({problem or 'daily'})")
        decisions = local[timed].as_unit("ns").asi8 + interval * 60 * 10**9
        context = news_context(self.news, decisions, self.source_timezone)
        texts = [""] * len(local)
        for i, which in zip(timed, context.which):
            texts[i] = str(context.texts[which])
        return texts

    def rows(self, start: int, follow: bool, poll_s: float = 1.0, idle_s: float | None = None
             ) -> Iterator[tuple[int, Bar | str]]:
        """Rows from the `start`-th on; with `follow`, waits for appended ones (until `idle_s` without any)."""
        seen = start
        quiet_since = time.monotonic()
        while True:
            rows = self.read()
            for row in rows[seen:]:
                yield row
            if len(rows) > seen:
                seen = len(rows)
                quiet_since = time.monotonic()
            if not follow or (idle_s is not None and time.monotonic() - quiet_since > idle_s):
                return
            time.sleep(poll_s)


def _by_fields(data: bytes) -> tuple[bytes, list[int], dict[int, str]]:
    """A CSV file's bytes less its rows of more fields than its header (pandas fails the file on one) or too few to
    reach the bars' columns, the line each row kept starts at, and {line: why} for those left out. Bytes that are
    not text are returned as they are: read_table refuses them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data, [], {}
    file_lines = list(io.StringIO(text, newline=""))
    reader = csv.reader(file_lines)
    header: list[str] = []
    needed, end = 0, 0
    starts: list[int] = []
    refused: dict[int, str] = {}
    left_out: set[int] = set()  # the file's lines (from 0) of the rows refused
    for record in reader:
        start, end = end + 1, reader.line_num  # a quoted field may hold line breaks
        if len(record) <= 1 and not "".join(record).strip():  # a blank line: pandas skips it too
            continue
        if not header:
            header = record
            names = [name.strip().lower() for name in header]
            needed = max(names.index(c) + 1 if c in names else len(names) for c in REQUIRED_COLUMNS)
        elif needed <= len(record) <= len(header):
            starts.append(start)
        else:
            refused[start] = f"it has {len(record)} field{'s' if len(record) != 1 else ''}, the header {len(header)}"
            left_out.update(range(start - 1, end))
    if refused:
        data = "".join(line for i, line in enumerate(file_lines) if i not in left_out).encode()
    return data, starts, refused
