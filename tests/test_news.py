"""News files (data.news): items joined to the bars whose close comes after them, without look-ahead; their zones,
symbols, the load report's line, bad files, and synthetic markets written as files."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.config import ConfigError, load_config
from jaxenv.config import DataConfig
from jaxenv.data import DataValidationError
from jaxenv.load_report import load_report
from jaxenv.market import Market, load_market, market_from_frame
from jaxenv.news import context_texts, context_windows
from tests.conftest import bar_at, flat_frame

ROOT = Path(__file__).resolve().parents[1]
MINUTE = 60_000_000_000


def news_csv(path: Path, rows: list[tuple], columns: tuple[str, ...] = ("timestamp", "headline")) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=list(columns)).to_csv(path, index=False)
    return path


def with_news(path: Path, frame: pd.DataFrame | None = None, **settings) -> Market:
    """Two regular-hours sessions of NQ minute bars (Monday 4 and Tuesday 5 March 2024, New York) and `path`."""
    frame = flat_frame(2) if frame is None else frame
    return market_from_frame(frame, "bars.csv", DataConfig(news=str(path), **settings))


def texts(market: Market) -> list[str | None]:
    """Each bar's text, None where it has none."""
    return [market.text_table[i] if i >= 0 else None for i in market.text_index]


def contexts(stamps: np.ndarray, items: np.ndarray, decisions: np.ndarray, max_age: int, keep: int) -> list[str]:
    """Each bar's context from items in any order, sorted as read_news sorts them."""
    order = np.lexsort((items.astype(str), stamps))
    first, end = context_windows(stamps[order], decisions, max_age, keep)
    joined, which = context_texts(items[order], first, end)
    return list(joined[which])


# ------------------------------------------------------------------------------------------ the join
@pytest.mark.nojit
def test_an_item_belongs_to_the_bar_whose_close_is_after_it_and_one_at_the_next_open_to_the_next(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 10:00:00.000", "on the open"),
                                            ("2024-03-04 10:30:59.999", "just before the close")])
    got = texts(with_news(path))
    assert got[bar_at(0, 9, 59)] is None  # decided at 10:00: the item stamped 10:00 is not known yet
    assert got[bar_at(0, 10, 0)] == "on the open"
    assert got[bar_at(0, 10, 29)] == "on the open"
    assert got[bar_at(0, 10, 30)] == "just before the close | on the open"
    assert got[: bar_at(0, 10, 0)] == [None] * bar_at(0, 10, 0)


@pytest.mark.nojit
def test_no_item_at_or_after_a_bars_close_changes_the_context_of_that_bar_or_any_before():
    """For random bars (gaps between them) and items: rewriting the items stamped at or after bar t's close, and
    adding more, changes no context of the bars up to t."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        decisions = np.cumsum(rng.integers(1, 6, n)) * MINUTE
        stamps = rng.integers(-5, decisions[-1] // MINUTE + 5, int(rng.integers(0, 60))) * MINUTE
        items = np.array([f"item {i}" for i in range(len(stamps))], dtype=object)
        max_age, keep = int(rng.integers(1, 20)) * MINUTE, int(rng.integers(1, 4))
        t = int(rng.integers(0, n))
        before = contexts(stamps, items, decisions, max_age, keep)

        later = stamps >= decisions[t]
        moved = stamps.copy()
        moved[later] = decisions[t] + rng.integers(0, 30, later.sum()) * MINUTE
        rewritten = np.where(later, "rewritten", items).astype(object)
        added = decisions[t] + rng.integers(0, 30, 5) * MINUTE
        after = contexts(np.concatenate([moved, added]), np.concatenate([rewritten, ["new"] * 5]).astype(object),
                         decisions, max_age, keep)
        assert after[: t + 1] == before[: t + 1]


def test_items_between_bars_reach_the_next_bar_and_a_burst_inside_one_bar_shows_its_newest(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 20:00:00", "overnight"),
                                            ("2024-03-05 09:30:10", "a"), ("2024-03-05 09:30:20", "b"),
                                            ("2024-03-05 09:30:30", "c")])
    got = texts(with_news(path))
    assert got[bar_at(0, 15, 59)] is None
    assert got[bar_at(1, 9, 30)] == "c | b | a"
    two = texts(with_news(path, news_items=2))
    assert two[bar_at(1, 9, 30)] == two[bar_at(1, 15, 59)] == "c | b"
    only = news_csv(tmp_path / "overnight.csv", [("2024-03-04 20:00:00", "overnight")])
    assert texts(with_news(only))[bar_at(1, 9, 30)] == "overnight"


def test_an_item_older_than_news_max_age_at_a_bars_close_leaves_its_context(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 12:00:00", "noon")])
    got = texts(with_news(path, news_max_age="1h"))
    shown = [i for i, text in enumerate(got) if text == "noon"]
    assert shown == list(range(bar_at(0, 12, 0), bar_at(0, 12, 59) + 1))  # decided 12:01 to 13:00
    assert texts(with_news(path))[bar_at(1, 11, 59)] == "noon"  # 1D: up to a day after it
    assert texts(with_news(path))[bar_at(1, 12, 0)] is None


@pytest.mark.nojit
def test_a_file_written_newest_first_loads_the_same(tmp_path):
    rows = [("2024-03-04 09:45:00", "first"), ("2024-03-04 11:00:00", "second"), ("2024-03-04 11:00:00", "tied"),
            ("2024-03-05 10:15:00", "third")]
    oldest_first = with_news(news_csv(tmp_path / "a" / "news.csv", rows))
    newest_first = with_news(news_csv(tmp_path / "b" / "news.csv", rows[::-1]))
    assert oldest_first.text_table == newest_first.text_table
    np.testing.assert_array_equal(oldest_first.text_index, newest_first.text_index)
    assert texts(oldest_first)[bar_at(0, 11, 0)] == "tied | second | first"


def test_daily_bars_decide_at_the_sessions_close_in_exchange_time(tmp_path):
    days = pd.bdate_range("2022-01-03", periods=480)
    frame = pd.DataFrame({"open": 15_000.0, "high": 15_010.0, "low": 14_990.0, "close": 15_000.0, "volume": 1e5},
                         index=days.tz_localize("America/New_York"))
    path = news_csv(tmp_path / "news.csv", [("2023-06-14 16:59:00", "before the close"),
                                            ("2023-06-16 17:00:00", "at Friday's close")])
    got = texts(with_news(path, frame, news_max_age="3D"))
    day = {stamp.strftime("%Y-%m-%d"): i for i, stamp in enumerate(days)}
    assert got[day["2023-06-13"]] is None and got[day["2023-06-14"]] == "before the close"
    assert got[day["2023-06-16"]] == "before the close"  # 17:00 NQ's session closes; the item is not in Friday's
    assert got[day["2023-06-19"]] == "at Friday's close"  # Monday's


def test_dates_without_a_time_are_known_at_the_end_of_their_day(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04", "Monday's"), ("2024-03-05", "Tuesday's")])
    market = with_news(path)
    got = texts(market)
    assert got[bar_at(0, 15, 59)] is None and got[bar_at(1, 9, 30)] == "Monday's" and got[-1] == "Monday's"
    assert "1 after the last bar's close" in market.news_note
    assert market.news_note.endswith("stamps dates, each known at the end of its day in exchange time")


# ----------------------------------------------------------------------------------------- time zones
def test_stamps_with_offsets_and_naive_ones_in_their_zone_are_the_same_instant(tmp_path):
    zoned = with_news(news_csv(tmp_path / "z.csv", [("2024-03-04T14:30:00Z", "open")]))
    exchange = with_news(news_csv(tmp_path / "ny.csv", [("2024-03-04 09:30:00", "open")]))
    utc = with_news(news_csv(tmp_path / "utc.csv", [("2024-03-04 14:30:00", "open")]), source_timezone="UTC")
    assert texts(zoned) == texts(exchange) == texts(utc)
    assert texts(zoned)[0] == "open"  # 14:30Z is 09:30 in New York in winter: the first bar's
    assert "stamps with UTC offsets, converted to America/New_York" in zoned.news_note


def test_auto_reads_naive_news_in_the_zone_it_found_for_the_bars(tmp_path):
    frame = flat_frame(2)
    frame.index = frame.index.tz_convert("UTC").tz_localize(None)  # naive UTC bars
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 14:30:00", "open")])
    market = with_news(path, frame, source_timezone="auto")
    assert texts(market)[0] == "open" and "taken as UTC" in market.news_note
    with pytest.raises(DataValidationError, match=r"news\.csv: column 'timestamp' has naive stamps and "
                                                  r"data.source_timezone=auto found no zone"):
        with_news(path, flat_frame(2), source_timezone="auto")  # the bars carry their zone: auto finds none


def test_a_naive_stamp_in_a_daylight_saving_gap_is_an_error_naming_the_row(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 10:00:00", "fine"), ("2024-03-10 02:30:00", "no such time")])
    with pytest.raises(DataValidationError) as error:
        with_news(path)
    message = str(error.value)
    assert message.startswith(f"{path}: column 'timestamp' has times that do not exist in America/New_York")
    assert "at row 2 (2024-03-10 02:30:00)" in message and "\n" not in message


# --------------------------------------------------------------------------------------------- symbols
def test_the_instruments_and_market_wide_items_are_kept_and_other_symbols_dropped_and_counted(tmp_path):
    rows = [("2024-03-04 10:00:00", "NQ", "mine"), ("2024-03-04 10:01:00", " nq ", "lower"),
            ("2024-03-04 10:02:00", "", "everyone's"), ("2024-03-04 10:03:00", "ES", "not mine")]
    path = news_csv(tmp_path / "news.csv", rows, columns=("timestamp", "Ticker", "Title"))
    market = with_news(path)
    assert texts(market)[bar_at(0, 10, 3)] == "everyone's | lower | mine"
    assert market.news_note.startswith(f"{path}: 4 items read, 1 of other symbols dropped; 3 shown to a bar, 0 never")


def test_a_symbol_column_that_never_names_the_instrument_is_an_error(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 10:00:00", "ES", "a"), ("2024-03-04 10:01:00", "YM", "b")],
                    columns=("timestamp", "symbol", "headline"))
    message = rf"^{re.escape(str(path))}: column 'symbol' never names NQ \(data.contract\) and has no blank, market"
    with pytest.raises(DataValidationError, match=message + r"-wide rows; found (ES, YM|YM, ES)$"):
        with_news(path)


# ----------------------------------------------------------------------------------------- the report
def test_the_load_report_counts_items_shown_and_why_others_never_were(tmp_path):
    path = news_csv(tmp_path / "news.csv", [
        ("2024-03-01 09:00:00", "NQ", "last week"),  # older than a day at the first bar's close
        ("2024-03-04 10:00:10", "NQ", "superseded"), ("2024-03-04 10:00:20", "NQ", "b"),
        ("2024-03-04 10:00:30", "NQ", "c"),
        ("2024-03-04 17:00:00", "NQ", "evening"),  # more than 12 hours before Tuesday's first close
        ("2024-03-05 16:00:00", "NQ", "after the last bar"), ("2024-03-04 12:00:00", "ES", "other")],
        columns=("timestamp", "symbol", "headline"))
    market = with_news(path, news_items=2, news_max_age="12h")
    with_news_bars = sum(text is not None for text in texts(market))
    assert with_news_bars == bar_at(0, 15, 59) + 1 - bar_at(0, 10, 0)
    assert market.news_note == (
        f"{path}: 7 items read, 1 of other symbols dropped; 2 shown to a bar, 4 never: 1 before the first bar's "
        "window, 1 after the last bar's close, 1 older than data.news_max_age 12h at the next bar's close, 1 "
        f"superseded within a bar (data.news_items 2); {with_news_bars} of 780 bars with news "
        f"({with_news_bars / 780:.1%}); stamps naive, taken as America/New_York (the instrument's exchange zone)")
    assert f"\nnews        {market.news_note}" in load_report(market)


def test_news_replaces_the_bars_own_text_and_a_blank_text_is_no_text(tmp_path):
    frame = flat_frame(2)
    frame["headline"] = ""
    frame.iloc[:3, frame.columns.get_loc("headline")] = ["bars' own", " ", "bars' own"]
    own = market_from_frame(frame, "bars.csv", DataConfig())
    assert own.text_table == ["bars' own"] and list(own.text_index[:4]) == [0, -1, 0, -1]
    market = with_news(news_csv(tmp_path / "news.csv", [("2024-03-04 10:00:00", "news")]), frame)
    assert market.text_table == ["news"] and market.news_note.endswith(
        "; the bars' own text column ignored (data.news replaces it)")
    assert load_report(own).splitlines()[-1].startswith("dropped")  # no news line without a news file


# ------------------------------------------------------------------------------------------ bad files
def binary(path: Path) -> Path:
    path.write_bytes(b"\x00\x01\x02timestamp,headline\xff\xfe")
    return path


def with_rows(rows: list[tuple], columns=("timestamp", "headline")):
    return lambda path: news_csv(path, rows, columns)


@pytest.mark.parametrize("name, write, message", [
    ("missing.csv", None, "news file not found (data.news)"),
    ("folder", lambda path: path.mkdir(), "is a folder; data.news takes a CSV or Parquet file"),
    ("news.csv", lambda path: path.write_text(""), "the file is empty"),
    ("news.csv", binary, "not a UTF-8 text CSV file"),
    ("news.parquet", lambda path: path.write_bytes(b"PAR1 truncated"), "not a readable Parquet file"),
    ("news.csv", with_rows([]), "has columns but no rows of news"),
    ("news.csv", with_rows([("x", "a")], ("when", "headline")), "no timestamp column; expected one of datetime"),
    ("news.csv", with_rows([("2024-03-04 10:00", "a"), ("soon", "b")]),
     "column 'timestamp' has unparseable timestamps at row 2; write the stamps in ISO 8601"),
    ("news.csv", with_rows([("2024-03-04 10:00", "a")], ("timestamp", "body")),
     "no text column; expected one of headline, headlines, news, text, title (any case); found timestamp, body"),
    ("news.csv", with_rows([("2024-03-04 10:00", "a"), ("2024-03-04 10:01", " "), ("2024-03-04 10:02", None)]),
     "column 'headline' has no text at rows 2, 3 (--set data.drop_invalid_rows=true drops such rows instead)"),
])
def test_a_bad_news_file_is_one_line_that_starts_with_its_path(tmp_path, name, write, message):
    path = tmp_path / name
    if write is not None:
        write(path)
    with pytest.raises(DataValidationError) as error:
        with_news(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value) and "\n" not in str(error.value)


def test_items_without_text_are_dropped_and_counted_with_drop_invalid_rows(tmp_path):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 10:00", "a"), ("2024-03-04 10:01", None)])
    market = with_news(path, drop_invalid_rows=True)
    assert market.text_table == ["a"]
    assert market.news_note.startswith(f"{path}: 2 items read, 1 without text (data.drop_invalid_rows) dropped; ")


@pytest.mark.parametrize("setting, message", [
    ({"news_max_age": "a week"}, "data.news_max_age: expected a positive duration (a pandas Timedelta such as 1D"),
    ({"news_max_age": "-1h"}, "data.news_max_age: expected a positive duration"),
    ({"news_items": 0}, "data.news_items: the newest items a bar's context holds, a whole number >= 1; got 0"),
])
def test_bad_news_settings_name_their_key(tmp_path, setting, message):
    path = news_csv(tmp_path / "news.csv", [("2024-03-04 10:00", "a")])
    with pytest.raises(DataValidationError, match=f"^bars.csv: {re.escape(message)}"):
        with_news(path, **setting)
    key, value = next(iter(setting.items()))
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        load_config(None, [f"data.{key}={value}"])


def test_train_exits_2_with_one_line_for_a_bad_news_file(tmp_path, capsys):
    from agents.training.cli import main

    run_dir, missing = tmp_path / "run", tmp_path / "missing.csv"
    assert main(["--llm", "none", "--run-dir", str(run_dir), "--data", "synthetic:default", "--set",
                 "data.synthetic_days=2", "--set", f"data.news={missing}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {missing}: news file not found (data.news)\n" and not run_dir.exists()


# ---------------------------------------------------------------------------- synthetic markets as files
def write_market():
    """scripts/write_market.py's main(), in-process."""
    spec = importlib.util.spec_from_file_location("write_market", ROOT / "scripts" / "write_market.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_a_headlines_market_written_as_files_loads_as_the_synthetic_one(tmp_path, capsys):
    out = tmp_path / "market"
    assert write_market()(["--preset", "headlines", "--days", "6", "--seed", "3", "--out", str(out)]) == 0
    assert f"--set data.news={out / 'news.csv'} --set data.news_items=1" in capsys.readouterr().out
    assert "headline" not in pd.read_csv(out / "bars.csv").columns and sorted(p.name for p in out.iterdir()) == [
        "bars.csv", "market.json", "news.csv"]
    files = load_market(DataConfig(source=str(out / "bars.csv"), news=str(out / "news.csv"), news_items=1,
                                   news_max_age="4D"))
    synthetic = load_market(DataConfig(source="synthetic:headlines", synthetic_days=6, synthetic_seed=3))
    assert files.timestamps.equals(synthetic.timestamps)
    for prices in ("open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(files, prices), getattr(synthetic, prices))
    assert files.text_table == synthetic.text_table
    np.testing.assert_array_equal(files.text_index, synthetic.text_index)


def test_write_market_refuses_an_unknown_preset_in_one_line(tmp_path, capsys):
    assert write_market()(["--preset", "nope", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown synthetic preset 'nope'") and err.count("\n") == 1
    assert not (tmp_path / "m").exists()
