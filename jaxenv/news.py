"""News files: dated headlines joined to the bars they could have been read on, without look-ahead.

A bar's decision is taken at its close (`jaxenv.sessions.decision_times`). An item is in bar t's context iff it is
stamped before that close and at most `data.news_max_age` before it; the context holds the newest
`data.news_items` of them, newest first, joined with " | ". An item stamped exactly at the next bar's open belongs
to the next bar; items between bars (overnight, gaps) reach the next one.

The file: a timestamp column as the bars' (same names, epoch numbers, day and month order, zones), a text column
and an optional symbol column. Bad files fail with one line that starts with the file's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from jaxenv.config import DataConfig, news_max_age
from jaxenv.contracts import ContractSpec
from jaxenv.data import (
    ROW_FIX,
    TEXT_NAMES,
    DataValidationError,
    columns_by_name,
    is_dates,
    parse_timestamps,
    read_table,
    row_list,
    to_exchange_time,
)

NEWS_TEXT_NAMES = (*TEXT_NAMES, "title")  # a news file's text column, any case
SYMBOL_NAMES = ("symbol", "ticker")  # its optional symbol column, any case; a blank symbol is market-wide news
SEPARATOR = " | "  # between the items of one bar's context
_SHOWN_SYMBOLS = 5  # symbols named where none is the instrument's


@dataclass(frozen=True)
class NewsItems:
    """A news file's items for one instrument, in time order (items stamped alike: by text, so that the order of
    the file's rows changes nothing)."""

    source: str
    stamps: np.ndarray  # int64 UTC nanoseconds
    texts: np.ndarray  # object: str
    read: int  # rows in the file
    other_symbols: int  # rows of other instruments, dropped
    empty: int  # rows without text, dropped (data.drop_invalid_rows)
    stamps_note: str  # how the stamps were read


def read_news(path: str | Path, contract: ContractSpec, zone: str | None, drop_invalid_rows: bool) -> NewsItems:
    """The items of `path` for `contract`. Stamps with offsets are converted to the exchange's zone; naive ones are
    taken as `zone` ("": the exchange's; None: no zone is known, an error); dates are known at the end of their day
    in the exchange's zone."""
    path = Path(path)
    if not path.exists():  # before the table reader, whose FileNotFoundError names market data
        raise DataValidationError(f"{path}: news file not found (data.news)")
    raw = read_table(path, "data.news")
    if not len(raw):
        raise DataValidationError(f"{path}: has columns but no rows of news")
    by_lower = columns_by_name(raw)
    text_key = next((name for name in NEWS_TEXT_NAMES if name in by_lower), None)
    if text_key is None:
        raise DataValidationError(f"{path}: no text column; expected one of {', '.join(NEWS_TEXT_NAMES)} (any case); "
                                  f"found {', '.join(map(str, raw.columns))}")
    stamps, wall, column, order_note = parse_timestamps(path, raw, by_lower, None, date_option=None)
    stamps, zone_note = _exchange_time(path, stamps, wall, contract.timezone, zone, column)

    texts = raw[by_lower[text_key]].fillna("").astype(str).to_numpy(dtype=object)
    empty = np.array([not text.strip() for text in texts], dtype=bool)
    if empty.any() and not drop_invalid_rows:
        raise DataValidationError(f"{path}: column '{by_lower[text_key]}' has no text at "
                                  f"{row_list(np.flatnonzero(empty))} ({ROW_FIX})")
    mine = _instrument_rows(path, raw, by_lower, contract.symbol)
    keep = mine & ~empty
    ns, texts = stamps.as_unit("ns").asi8[keep], texts[keep]
    order = np.lexsort((texts.astype(str), ns))
    return NewsItems(str(path), ns[order], texts[order], len(raw), int((~mine).sum()), int((mine & empty).sum()),
                     "; ".join(filter(None, [order_note, zone_note])))


def _exchange_time(path: Path, stamps: pd.DatetimeIndex, wall: pd.DatetimeIndex, timezone: str, zone: str | None,
                   column: str) -> tuple[pd.DatetimeIndex, str]:
    """The items' stamps in the exchange's zone, by the bars' rules, and a note of how they were read."""
    if is_dates(wall):  # a date says nothing of the hour an item came out: it is known once its day is over
        end_of_day = wall + pd.Timedelta(days=1)
        exchange, _ = to_exchange_time(end_of_day, end_of_day, timezone, None, str(path), column)
        return exchange, "dates, each known at the end of its day in exchange time"
    if stamps.tz is None and zone is None:
        raise DataValidationError(
            f"{path}: column '{column}' has naive stamps and data.source_timezone=auto found no zone for them (the "
            "bars' stamps carry UTC offsets or are dates): name the news file's zone, --set "
            "data.source_timezone=ZONE, or write its stamps with their UTC offset")
    return to_exchange_time(stamps, wall, timezone, zone or None, str(path), column)


def _instrument_rows(path: Path, raw: pd.DataFrame, by_lower: dict[str, str], symbol: str) -> np.ndarray:
    """Which rows are the instrument's news: its symbol (any case) or a blank one (market-wide); all rows where the
    file has no symbol column. A symbol column that never names the instrument and has no blank row is an error."""
    key = next((name for name in SYMBOL_NAMES if name in by_lower), None)
    if key is None:
        return np.ones(len(raw), bool)
    symbols = raw[by_lower[key]].fillna("").astype(str).str.strip().str.upper().to_numpy(dtype=object)
    mine = (symbols == symbol.strip().upper()) | (symbols == "")
    if not mine.any():
        found = pd.Series(symbols).value_counts().index[:_SHOWN_SYMBOLS]
        raise DataValidationError(f"{path}: column '{by_lower[key]}' never names {symbol} (data.contract) and has no "
                                  f"blank, market-wide rows; found {', '.join(found)}")
    return mine


def context_windows(stamps: np.ndarray, decisions: np.ndarray, max_age: int, items: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each bar's context as [first, end) into the sorted item `stamps`: the items stamped before its decision
    (strictly: one stamped at it belongs to the next bar) and at most `max_age` (ns) before it, the newest `items`."""
    end = np.searchsorted(stamps, decisions, side="left")
    oldest = np.searchsorted(stamps, decisions - max_age, side="left")
    return np.maximum(oldest, end - items), end


def context_texts(texts: np.ndarray, first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct contexts' texts (newest item first; "" for none) and each bar's context among them. Each
    distinct window is joined once: bars between two items share one."""
    windows, which = np.unique(np.stack([first, end], axis=1), axis=0, return_inverse=True)
    joined = np.array([SEPARATOR.join(texts[a:b][::-1]) for a, b in windows], dtype=object)
    return joined, which.reshape(-1)


@dataclass(frozen=True)
class NewsContext:
    texts: np.ndarray  # the distinct contexts' texts; "" = no news
    which: np.ndarray  # int [n bars]: each bar's context in texts
    note: str  # the load report's line


def news_context(cfg: DataConfig, decisions: np.ndarray, zone: str | None) -> NewsContext:
    """Each bar's context from the items of cfg.news (naive stamps in `zone`, as for `read_news`), given the bars'
    decision times (UTC ns), and what was and was not shown."""
    items = read_news(cfg.news, cfg.contract, zone, cfg.drop_invalid_rows)
    first, end = context_windows(items.stamps, decisions, news_max_age(cfg).value, cfg.news_items)
    texts, which = context_texts(items.texts, first, end)
    return NewsContext(texts, which, _report(items, decisions, first, end, cfg))


def _report(items: NewsItems, decisions: np.ndarray, first: np.ndarray, end: np.ndarray, cfg: DataConfig) -> str:
    """"news.csv: 1,200 items read, 40 of other symbols dropped; 1,100 shown to a bar, 60 never: ...; 5,000 of
    7,800 bars with news (64.1%); stamps ...": why each item never shown was not."""
    stamps, m, max_age = items.stamps, len(items.stamps), news_max_age(cfg).value
    inside = np.zeros(m + 1, np.int64)  # +1 where a bar's window opens, -1 past where it ends
    np.add.at(inside, first, 1)
    np.add.at(inside, end, -1)
    shown = np.cumsum(inside)[:m] > 0
    after = stamps >= decisions[-1]
    before = stamps < decisions[0] - max_age
    next_bar = np.minimum(np.searchsorted(decisions, stamps, side="right"), len(decisions) - 1)
    too_old = ~shown & ~after & ~before & (stamps < decisions[next_bar] - max_age)
    superseded = ~shown & ~after & ~before & ~too_old
    reasons = [(before.sum(), "before the first bar's window"), (after.sum(), "after the last bar's close"),
               (too_old.sum(), f"older than data.news_max_age {cfg.news_max_age} at the next bar's close"),
               (superseded.sum(), f"superseded within a bar (data.news_items {cfg.news_items})")]
    why = ", ".join(f"{count:,} {reason}" for count, reason in reasons if count)
    dropped = [f"{count:,} {what} dropped" for count, what in ((items.other_symbols, "of other symbols"),
                                                               (items.empty, "without text (data.drop_invalid_rows)"))
               if count]
    bars = len(decisions)
    with_news = int((end > first).sum())
    return (f"{items.source}: {', '.join([f'{items.read:,} items read', *dropped])}; {shown.sum():,} shown to a bar, "
            f"{(~shown).sum():,} never{': ' + why if why else ''}; {with_news:,} of {bars:,} bars with news "
            f"({with_news / bars:.1%}); stamps {items.stamps_note}")
