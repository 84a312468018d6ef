"""scripts/trade.py's bars file with a text column (issue 74, item 6): a quote that never closes refuses its own row,
not the file, and the rows after it are read; a quoted field that spans lines is one row, and with `--follow` a row
whose quoted field is still open where the file ends waits for its end."""

from __future__ import annotations

import threading
import time
from itertools import islice

import pandas as pd

from agents.trading.bars import Bar
from agents.trading.feed import BarFile

ZONE = "America/New_York"
HEADER = "timestamp,open,high,low,close,volume,headline\n"


def row(i: int, text: str) -> str:
    """The `i`-th one-minute row from 09:30, its headline written as given (quotes and all)."""
    return f"{pd.Timestamp('2024-01-02 09:30') + pd.Timedelta(minutes=i):%Y-%m-%d %H:%M:%S},{100 + i},{101 + i}," \
           f"{99 + i},{100.5 + i},10,{text}\n"


def bar(i: int, text: str) -> Bar:
    """The bar of `row(i, ...)` whose headline reads `text`."""
    return Bar(pd.Timestamp("2024-01-02 09:30", tz=ZONE) + pd.Timedelta(minutes=i), 100 + i, 101 + i, 99 + i,
               100.5 + i, 10.0, text)


def refused(got) -> dict[int, str]:
    return {line: item for line, item in got if isinstance(item, str)}


def follow(path, n: int, lines: list[str], pause: float = 0.15) -> list:
    """The first `n` rows of a followed `path` while `lines` are appended to it one by one, `pause` apart (many
    polls in between)."""

    def write():
        for line in lines:
            time.sleep(pause)
            with open(path, "a") as file:
                file.write(line)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        return list(islice(BarFile(path, ZONE).rows(0, follow=True, poll_s=0.005, idle_s=5.0), n))
    finally:
        writer.join()


def test_a_stray_quote_refuses_its_row_alone_in_a_replay(tmp_path):
    """A headline that opens a quote and never closes it: that row is refused, with its line and why; the rows
    after it are read as written, and a resume by the count of rows gives the same rest."""
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + row(0, "calm") + row(1, '"Fed hikes') + row(2, "calm") + row(3, "quiet"))
    feed = BarFile(path, ZONE)
    got = feed.read()
    assert [line for line, _ in got] == [2, 3, 4, 5]
    assert list(refused(got)) == [3] and "not closed" in got[1][1]
    assert [item for _, item in got if isinstance(item, Bar)] == [bar(0, "calm"), bar(2, "calm"), bar(3, "quiet")]
    assert list(feed.rows(0, follow=False)) == got
    assert list(feed.rows(2, follow=False)) == got[2:]


def test_a_stray_quote_on_the_last_row_of_a_replay_is_refused_alone(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + row(0, "calm") + row(1, "calm") + row(2, '"Fed hikes'))
    got = BarFile(path, ZONE).read()
    assert got[:2] == [(2, bar(0, "calm")), (3, bar(1, "calm"))]
    assert [line for line, _ in got[2:]] == [4] and "not closed" in got[2][1]


def test_a_stray_quote_takes_no_row_up_to_the_next_quote(tmp_path):
    """A stray quote and, rows later, a quoted headline: the quote of that headline does not close the stray's field
    (which would make one row of the rows between)."""
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + row(0, '"Fed hikes') + row(1, "calm") + row(2, "quiet") + row(3, '"Jobs, beat"')
                    + row(4, '""'))
    got = BarFile(path, ZONE).read()
    assert list(refused(got)) == [2]
    assert [item for _, item in got[1:]] == [bar(1, "calm"), bar(2, "quiet"), bar(3, "Jobs, beat"), bar(4, "")]
    assert [line for line, _ in got] == [2, 3, 4, 5, 6]

    path.write_text(HEADER + row(0, "calm") + row(1, '"Fed hikes') + row(2, '"Jobs beat"') + row(3, "calm"))
    got = BarFile(path, ZONE).read()
    assert list(refused(got)) == [3]
    assert [item for _, item in got if isinstance(item, Bar)] == [bar(0, "calm"), bar(2, "Jobs beat"),
                                                                  bar(3, "calm")]


def test_a_quoted_headline_of_two_lines_is_one_row(tmp_path):
    """A properly quoted headline with a line break in it: one row, at the line it starts on; the rows after it keep
    their lines. As well where the text column comes first (its second line then holds the row's other fields)."""
    path = tmp_path / "bars.csv"
    path.write_text(HEADER + row(0, "calm") + row(1, '"Fed hikes\nby 25bp, more to come"') + row(2, "calm"))
    assert BarFile(path, ZONE).read() == [(2, bar(0, "calm")), (3, bar(1, "Fed hikes\nby 25bp, more to come")),
                                          (5, bar(2, "calm"))]

    def first(i: int, text: str) -> str:  # the headline first: `headline,timestamp,...`
        return text + "," + row(i, "")[:-2] + "\n"

    path.write_text("headline," + HEADER.replace(",headline", "") + first(0, "calm") + first(1, '"Fed hikes\nby 25bp"')
                    + first(2, "calm"))
    assert BarFile(path, ZONE).read() == [(2, bar(0, "calm")), (3, bar(1, "Fed hikes\nby 25bp")), (5, bar(2, "calm"))]


def test_a_followed_headline_of_two_lines_waits_for_its_end(tmp_path):
    """--follow with only the first line of a quoted two-line headline written: the reader waits (no refusal, no
    failure); once its second line is written the row is read whole, then the rows after it."""
    path = tmp_path / "live.csv"
    path.write_text(HEADER + row(0, "calm"))
    got = follow(path, 3, [row(1, '"Fed hikes\nby 25bp"').split("\n")[0] + "\n", "by 25bp\"\n", row(2, "calm")])
    assert got == [(2, bar(0, "calm")), (3, bar(1, "Fed hikes\nby 25bp")), (5, bar(2, "calm"))]


def test_a_stray_quote_in_a_followed_file_is_refused_once_a_row_follows(tmp_path):
    """--follow with a stray quote: its row is refused when the next row is written (no wait for a quote that never
    comes), and the rows after it are read; a resume by the count of rows gives the same rest."""
    path = tmp_path / "live.csv"
    path.write_text(HEADER + row(0, "calm"))
    got = follow(path, 4, [row(1, '"Fed hikes'), row(2, "calm"), row(3, "quiet")])
    assert [line for line, _ in got] == [2, 3, 4, 5]
    assert list(refused(got)) == [3] and "not closed" in got[1][1]
    assert [item for _, item in got if isinstance(item, Bar)] == [bar(0, "calm"), bar(2, "calm"), bar(3, "quiet")]
    assert list(BarFile(path, ZONE).rows(2, follow=True, poll_s=0.005, idle_s=0.05)) == got[2:]
