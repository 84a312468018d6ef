"""Bars from a file, as `scripts/trade.py` reads them: a replay of every row, or (`follow`) the rows appended to it
as a broker's export or a recorder writes them. Columns and stamps are read as `--data` reads them
(jaxenv.data.read_raw_bars); naive stamps are taken in the zone the caller names (trade.py: the one training read the
run's data in). A news file gives each bar its context as `data.news` does (jaxenv.news: the items published before
the bar's close).
A row that cannot be read (a stamp or a value that is none, another number of fields than the header, a quote that
opens a field and never closes it) is refused by itself, with its line in the file; the other rows are read as before.
A quoted field may span lines (a headline of two lines): its row is one, read once its closing quote is written."""

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
        self.naive = True  # the last read's stamps had no UTC offsets: they were taken in source_timezone

    def read(self, follow: bool = False) -> list[tuple[int, Bar | str]]:
        """Every complete row so far: (its line in the file, the bar, or why the row is refused). A last line
        without its newline is being written: left for the next read. With `follow`, so is a row whose quoted field
        is still open where the file ends; a replay refuses it (see `_by_fields`)."""
        refused: dict[int, str] = {}
        try:
            table, lines, refused = self._table(follow)
            bars, problems = raw_bars(self.path, table, self.date_format, self.text_column, refuse_rows=True)
        except DataValidationError as error:
            if "no rows" in str(error) or "is empty" in str(error):
                return list(refused.items())
            raise
        frame = bars.frame
        stamps = pd.DatetimeIndex(frame.index)
        self.naive = stamps.tz is None
        local = stamps if not self.naive else stamps.tz_localize(self.source_timezone, ambiguous="NaT",
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

    def _table(self, follow: bool = False) -> tuple[pd.DataFrame, list[int], dict[int, str]]:
        """The file's table from one read of it, each of its rows' line in the file, and {line: why} for the rows
        left out of it (see `_by_fields`)."""
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".txt") or not self.path.is_file():  # Parquet, .gz, no file: as --data reads them
            table = read_table(self.path)
            return table, list(range(2, len(table) + 2)), {}
        data = self.path.read_bytes()
        if suffix == ".csv":  # the bytes after the last newline are a row being written
            data = data[: data.rfind(b"\n") + 1]
        data, lines, refused = _by_fields(data, follow)
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
            rows = self.read(follow)
            for row in rows[seen:]:
                yield row
            if len(rows) > seen:
                seen = len(rows)
                quiet_since = time.monotonic()
            if not follow or (idle_s is not None and time.monotonic() - quiet_since > idle_s):
                return
            time.sleep(poll_s)


def _by_fields(data: bytes, follow: bool = False) -> tuple[bytes, list[int], dict[int, str]]:
    """A CSV file's bytes less its rows of more fields than its header (pandas fails the file on one), too few to
    reach the bars' columns or with a quoted field not closed (pandas reads it to the end of the file and fails the
    file: see `_Lines`), the line each row kept starts at, and {line: why} for those left out. A row whose quoted
    field is still open where the bytes end is being written with `follow` (it and all after it are left for the
    next read); a replay refuses its line, as any other not closed, and reads on from the next line. Bytes that
    are not text are returned as they are: read_table refuses them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data, [], {}
    file_lines = list(io.StringIO(text, newline=""))
    header: list[str] = []
    needed, end = 0, len(file_lines)
    starts: list[int] = []
    refused: dict[int, str] = {}
    left_out: set[int] = set()  # the file's lines (from 0) of the rows refused

    def a_row(line: str) -> bool:  # a line that is a whole row by itself
        try:
            return bool(header) and needed <= len(next(csv.reader([line]), [])) <= len(header)
        except csv.Error:
            return False

    source = _Lines(file_lines, a_row)
    reader = csv.reader(source)
    while source.at < end:
        first = source.next_record()
        try:
            record = next(reader, [])
            if source.at - first > 1 and not source.open:  # strict: the quote closing a field of lines must end it
                next(csv.reader(file_lines[first: source.at], strict=True))
        except csv.Error:  # not closed (strict), or a field past csv's size limit
            source.open = source.open or "not closed"
        start = first + 1
        if source.open:
            reader = csv.reader(source)  # csv's reading of the lines taken is dropped: a new one from the next line
            if source.open == "at the end" and (follow or not header):
                if not header and not follow:  # a header not closed: the file is no table (read_table says so)
                    return data, [], {}
                end = first  # being written: read once its field is closed
                break
            # a quote typed in a text field: this line alone is refused, and the next is read as a row again
            refused[start] = "a quote in it opens a field that is not closed"
            left_out.add(first)
            source.at = start
            continue
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
            left_out.update(range(first, source.at))
    if refused or end < len(file_lines):
        data = "".join(line for i, line in enumerate(file_lines[:end]) if i not in left_out).encode()
    return data, starts, refused


class _Lines:
    """A file's lines as csv.reader asks for them, one record at a time: it asks for a next line only while a
    quoted field is open. A quoted field may span lines (a headline of two lines); `open` says where one does not
    close: it runs on through a line that is a row by itself (`a_row`: a quote typed in a text field, not a line
    break in one) or to the end of the lines. A quote that closes a field spanning lines without ending it (a later
    row's opening quote) is found by the caller."""

    def __init__(self, lines: list[str], a_row):
        self.lines, self.a_row = lines, a_row
        self.at = self.first = 0  # the next line to give; the first of the record being read
        self.open = ""

    def next_record(self) -> int:
        """The line (from 0) the next record starts at."""
        self.first, self.open = self.at, ""
        return self.first

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.at > self.first + 1 and self.a_row(self.lines[self.at - 1]):
            self.open = "through a row"
        elif self.at == len(self.lines):
            self.open = "at the end"
        if self.open:
            raise StopIteration
        self.at += 1
        return self.lines[self.at - 1]
