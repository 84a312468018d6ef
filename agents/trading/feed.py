"""Bars from a file, as `scripts/trade.py` reads them: a replay of every row, or (`follow`) the rows appended to it
as a broker's export or a recorder writes them. Columns and stamps are read as `--data` reads them
(jaxenv.data.read_raw_bars); naive stamps are taken in the run's data.source_timezone (the exchange's by default). A
news file gives each bar its context as `data.news` does (jaxenv.news: the items published before the bar's close)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from agents.trading.bars import Bar
from jaxenv.data import DataValidationError, read_raw_bars


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
        """Every complete row so far: (its line in the file, the bar, or why its stamp cannot be read). A last line
        without its newline is being written: left for the next read."""
        raw = self.path.read_bytes() if self.path.exists() else b""
        complete = raw.count(b"\n") if self.path.suffix.lower() == ".csv" else None
        try:
            frame, wall, _, _ = read_raw_bars(self.path, self.date_format, self.text_column)
        except DataValidationError as error:
            if "no rows" in str(error) or "is empty" in str(error):
                return []
            raise
        if complete is not None and not raw.endswith(b"\n"):
            frame, wall = frame.iloc[: complete - 1], wall[: complete - 1]
        stamps = pd.DatetimeIndex(frame.index)
        out: list[tuple[int, Bar | str]] = []
        texts = frame["headline"].tolist() if "headline" in frame else [""] * len(frame)
        if self.news is not None and len(frame) > 1:
            texts = self._news_texts(stamps)
        values = frame[["open", "high", "low", "close", "volume"]].to_numpy()
        for i, (stamp, row, text) in enumerate(zip(stamps, values, texts)):
            line = i + 2  # the header is line 1
            if stamp is pd.NaT or pd.isna(stamp):
                out.append((line, "its stamp cannot be read"))
                continue
            if stamp.tzinfo is None:
                try:
                    stamp = stamp.tz_localize(self.source_timezone, ambiguous="raise", nonexistent="raise")
                except Exception:  # noqa: BLE001 - pytz/zoneinfo raise several types for a daylight-saving gap
                    out.append((line, f"{stamp} is no single time in {self.source_timezone} (a daylight-saving "
                                      "change): give stamps with their UTC offset"))
                    continue
            out.append((line, Bar(stamp.tz_convert(self.timezone), *map(float, row), str(text or ""))))
        return out

    def _news_texts(self, stamps: pd.DatetimeIndex) -> list[str]:
        """Each bar's news context: the items published before its close (its stamp + the bar interval)."""
        from jaxenv.news import news_context
        from jaxenv.sessions import measure_interval

        local = stamps if stamps.tz is not None else stamps.tz_localize(self.source_timezone, ambiguous="NaT",
                                                                         nonexistent="NaT")
        interval, problem = measure_interval(local.dropna())
        if problem or interval is None or interval >= 1440:
            raise DataValidationError(f"{self.path}: --news needs intraday bars of one interval ({problem or 'daily'})")
        decisions = local.as_unit("ns").asi8 + interval * 60 * 10**9
        context = news_context(self.news, decisions, self.source_timezone)
        return [str(context.texts[i]) for i in context.which]

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
