"""scripts/trade.py's bars file (agents.trading.feed.BarFile): each row as written, a row half-written never read,
and a row that cannot be read refused by itself, with its line in the file, while the others trade on."""

from __future__ import annotations

import re
import threading
import time
from itertools import islice
from pathlib import Path

import pandas as pd
import pytest

from agents.trading.bars import Bar
from agents.trading.feed import BarFile
from jaxenv.config import DataConfig
from jaxenv.data import DataValidationError

ZONE = "America/New_York"
HEADER = "timestamp,open,high,low,close,volume\n"


def source_rows(n: int, start: str = "2024-01-02 09:30") -> list[str]:
    """`n` one-minute rows, each with a volume of 1234 (a half-written one reads 1, 12 or 123)."""
    stamps = pd.date_range(start, periods=n, freq="1min")
    return [f"{stamp:%Y-%m-%d %H:%M:%S},{100 + i},{101.25 + i},{99.5 + i},{100.75 + i},1234\n"
            for i, stamp in enumerate(stamps)]


def bar_of(row: str, zone: str = ZONE) -> Bar:
    """The bar a source row is."""
    stamp, *values = row.strip().split(",")
    return Bar(pd.Timestamp(stamp).tz_localize(zone), *map(float, values))


def test_a_followed_file_written_byte_by_byte_gives_every_row_once_as_written(tmp_path):
    """Rows read while every byte of them is being written: each row once, complete, with its values; none
    refused, none skipped (the bytes parsed are the bytes counted)."""
    rows = source_rows(80)
    path = tmp_path / "live.csv"
    path.write_text(HEADER)

    def write():
        with open(path, "a") as file:
            for char in "".join(rows):
                file.write(char)
                file.flush()
                time.sleep(0.0001)

    writer = threading.Thread(target=write)
    writer.start()
    got = list(islice(BarFile(path, ZONE).rows(0, follow=True, poll_s=0.0005, idle_s=5.0), len(rows)))
    writer.join()
    assert [line for line, _ in got] == list(range(2, len(rows) + 2))
    refused = [(line, item) for line, item in got if isinstance(item, str)]
    assert not refused
    assert [item for _, item in got] == [bar_of(row) for row in rows]


def test_the_last_line_without_its_newline_is_left_for_the_next_read(tmp_path, monkeypatch):
    """A row half-written is not read, even where it is written between the read that counts the complete lines and
    the parse: the bytes parsed are the bytes counted."""
    rows = source_rows(3)
    path = tmp_path / "live.csv"
    path.write_text(HEADER + rows[0] + rows[1] + rows[2][:25])
    assert BarFile(path, ZONE).read() == [(2, bar_of(rows[0])), (3, bar_of(rows[1]))]

    path.write_text(HEADER + rows[0] + rows[1])
    read_bytes = Path.read_bytes

    def growing(self):  # the writer appends half a row just after the file is read
        data = read_bytes(self)
        with open(path, "a") as file:
            file.write(rows[2][:-3])
        return data

    monkeypatch.setattr(Path, "read_bytes", growing)
    assert BarFile(path, ZONE).read() == [(2, bar_of(rows[0])), (3, bar_of(rows[1]))]
    monkeypatch.undo()
    with open(path, "a") as file:
        file.write(rows[2][-3:])  # the row completes: now it is read, whole
    assert BarFile(path, ZONE).read() == [(2, bar_of(rows[0])), (3, bar_of(rows[1])), (4, bar_of(rows[2]))]


def bad_file(tmp_path) -> tuple[Path, dict[int, Bar | str]]:
    """A file with bad rows among good ones, and what each of its lines reads as (the header is line 1)."""
    rows = source_rows(7)
    lines = [
        HEADER,
        rows[0],
        "2024-01-02 09:31:00,101,102.25,100.5,abc,1234\n",
        "garbage,with,extra,commas,x,y,z,w\n",
        "garbage,102,103.25,101.5,102.75,1234\n",
        "\n",  # a blank line: no row, but a line
        "2024-01-02 09:33:00,1.2.3,104.25,102.5,103.75,1234\n",
        "garbage\n",
        rows[4],
        "2024-13-02 09:35:00,x,106.25,104.5,105.75,1234\n",
        rows[6],
    ]
    path = tmp_path / "bars.csv"
    path.write_text("".join(lines))
    expected = {
        2: bar_of(rows[0]),
        3: "column 'close' is not a number ('abc')",
        4: "it has 8 fields, the header 6",
        5: "its stamp 'garbage' cannot be read",
        7: "column 'open' is not a number ('1.2.3')",
        8: "it has 1 field, the header 6",
        9: bar_of(rows[4]),
        10: "its stamp '2024-13-02 09:35:00' cannot be read; column 'open' is not a number ('x')",
        11: bar_of(rows[6]),
    }
    return path, expected


def test_rows_that_cannot_be_read_are_refused_one_by_one_with_their_lines(tmp_path):
    """A value that is not a number, a stamp that is none and a line of another number of fields than the header
    are refused by themselves, each with its line and why; every other row is its bar, at its line."""
    path, expected = bad_file(tmp_path)
    feed = BarFile(path, ZONE)
    assert feed.read() == list(expected.items())
    assert list(feed.rows(0, follow=False)) == list(expected.items())
    assert list(feed.rows(4, follow=False)) == list(expected.items())[4:]  # a resume counts refused rows too


def test_bad_rows_appended_to_a_followed_file_are_refused_and_the_rest_read(tmp_path):
    path, expected = bad_file(tmp_path)
    written = path.read_text().splitlines(keepends=True)
    path.write_text("".join(written[:2]))

    def write():
        for line in written[2:]:
            time.sleep(0.02)
            with open(path, "a") as file:
                file.write(line)

    writer = threading.Thread(target=write)
    writer.start()
    got = list(islice(BarFile(path, ZONE).rows(0, follow=True, poll_s=0.005, idle_s=5.0), len(expected)))
    writer.join()
    assert got == list(expected.items())


def test_a_bad_first_stamp_does_not_decide_how_the_others_read(tmp_path):
    """Day-first stamps (proven by a day above 12) under a first row that is no stamp, and epoch seconds under one
    that is none: the rest read as without it."""
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + "garbage,1,2,0.5,1.5,10\n02.01.2024 09:30:00,1,2,0.5,1.5,10\n"
                    "15.01.2024 09:30:00,1,2,0.5,1.5,10\n")
    got = BarFile(path, ZONE).read()
    assert got[0] == (2, "its stamp 'garbage' cannot be read")
    assert [bar.time for _, bar in got[1:]] == [pd.Timestamp("2024-01-02 09:30", tz=ZONE),
                                                pd.Timestamp("2024-01-15 09:30", tz=ZONE)]

    path.write_text(HEADER + "1704205800,1,2,0.5,1.5,10\nnot-a-time,1,2,0.5,1.5,10\n1704205860,1,2,0.5,1.5,10\n")
    got = BarFile(path, ZONE).read()
    assert got[1] == (3, "its stamp 'not-a-time' cannot be read")
    assert [bar.time for _, bar in got[::2]] == [pd.Timestamp("2024-01-02 14:30", tz="UTC"),
                                                 pd.Timestamp("2024-01-02 14:31", tz="UTC")]


def test_a_stamp_that_is_no_single_time_keeps_its_message(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + "2024-03-10 01:59:00,1,2,0.5,1.5,10\n2024-03-10 02:30:00,1,2,0.5,1.5,10\n"
                    "2024-11-03 01:30:00,1,2,0.5,1.5,10\n2024-11-03 02:30:00,1,2,0.5,1.5,10\n")
    got = BarFile(path, ZONE).read()
    assert [line for line, item in got if isinstance(item, Bar)] == [2, 5]
    fix = f"is no single time in {ZONE} (a daylight-saving change): give stamps with their UTC offset"
    assert got[1] == (3, f"2024-03-10 02:30:00 {fix}")
    assert got[2] == (4, f"2024-11-03 01:30:00 {fix}")


def test_a_news_file_gives_the_readable_rows_their_context(tmp_path):
    """--news with a row refused: the other rows' contexts are those of the file without it."""
    rows = source_rows(6)
    news = tmp_path / "news.csv"
    news.write_text("timestamp,headline\n2024-01-02 09:30:30,Fed holds rates\n2024-01-02 09:34:30,Jobs beat\n")
    clean, bad = tmp_path / "clean.csv", tmp_path / "bad.csv"
    clean.write_text(HEADER + "".join(rows[:3] + rows[4:]))
    bad.write_text(HEADER + "".join(rows[:3]) + rows[3].replace("2024-01-02 09:33:00", "garbage") + "".join(rows[4:]))
    config = DataConfig(news=str(news))
    want = [bar for _, bar in BarFile(clean, ZONE, news=config).read()]
    got = BarFile(bad, ZONE, news=config).read()
    assert got[3] == (5, "its stamp 'garbage' cannot be read")
    assert [bar for _, bar in got[:3] + got[4:]] == want
    assert [bar.text for bar in want] == ["Fed holds rates"] * 3 + ["Jobs beat | Fed holds rates"] * 2


@pytest.mark.parametrize(("text", "problem"), [
    ("timestamp,open,high,low,volume\n2024-01-02 09:30:00,1,2,0.5,10\n", "missing column(s) close"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not a UTF-8 text CSV file"),
    ("when,open,high,low,close,volume\n2024-01-02 09:30:00,1,2,0.5,1.5,10\n", "no timestamp column"),
], ids=["missing column", "binary", "no stamps"])
def test_a_file_that_is_not_bars_is_still_refused_as_a_whole(tmp_path, text, problem):
    path = tmp_path / "bars.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataValidationError, match=re.escape(problem)):
        BarFile(path, ZONE).read()


def test_a_file_without_rows_yet_has_none(tmp_path):
    path = tmp_path / "bars.csv"
    for text in ("", "timestamp,op", HEADER, HEADER + "2024-01-02 09:3"):
        path.write_text(text)
        assert BarFile(path, ZONE).read() == []
