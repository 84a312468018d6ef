"""Several bars files read as one timeline (trade.py on a run of several instruments): each file's rows in order,
joined at bar times as jaxenv.market_set joins files.

The timeline starts at the latest first bar of the files (rows before it are their instrument's history only) and
a replay ends where the first file ends. At each bar time T (the earliest unread stamp) the joint bar is taken once
every file has a row at or after T: the files with a row at T are present, the others absent (their last close
carried). With `follow`, a file with no row yet at or after T is waited for `wait_s` seconds, then taken as absent;
a row that arrives for a bar time already taken is refused.

    feed = JointFeed([BarFile("nq.csv", ...), BarFile("es.csv", ...)])
    for event in feed.events(consumed, last_stamp, follow=False):
        event.kind                  # "own" (history before the timeline), "joint" or "refused"
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

from agents.trading.bars import Bar
from agents.trading.feed import BarFile


@dataclass
class FeedEvent:
    kind: str  # "own": a file's bar before the timeline starts; "joint": a bar time; "refused": a row not taken
    file: int = -1  # own, refused: the file's index
    line: int = 0  # own, refused: the row's line in its file
    bar: Bar | None = None  # own: the bar
    why: str = ""  # refused: why
    stamp: pd.Timestamp | None = None  # joint: the bar time
    bars: list[Bar | None] | None = None  # joint: each file's bar at it, None where absent
    lines: list[int | None] | None = None  # joint: each present bar's line


class JointFeed:
    def __init__(self, files: list[BarFile]):
        self.files = files
        self.consumed = [0] * len(files)  # each file's rows taken (of its read's list), as a state saves them

    def events(self, consumed: list[int], last_stamp: pd.Timestamp | None, follow: bool, poll_s: float = 1.0,
               idle_s: float | None = None, wait_s: float = 30.0) -> Iterator[FeedEvent]:
        """The events from each file's `consumed`-th row on, the timeline's last bar time being `last_stamp` (None:
        it has not started). `self.consumed` counts each file's rows taken, event by event."""
        self.consumed = list(consumed)
        queues: list[deque] = [deque() for _ in self.files]
        read = list(consumed)
        started = last_stamp is not None
        last = last_stamp
        waiting_since: float | None = None
        quiet_since = time.monotonic()
        while True:
            new = False
            for i, f in enumerate(self.files):
                rows = f.read(follow)
                if len(rows) > read[i]:
                    queues[i].extend(rows[read[i]:])
                    read[i] = len(rows)
                    new = True
            while True:
                event = self._next(queues, started, last, follow, waiting_since, wait_s)
                if event is None:
                    break
                if event == "wait":
                    waiting_since = waiting_since or time.monotonic()
                    break
                waiting_since = None
                if event.kind == "joint":
                    started, last = True, event.stamp
                yield event
            if new:  # quiet from when the new rows were taken, not while they were being traded
                quiet_since = time.monotonic()
            if event is None and not follow:
                return
            if follow and idle_s is not None and time.monotonic() - quiet_since > idle_s:
                return
            time.sleep(poll_s)

    def _next(self, queues: list[deque], started: bool, last, follow: bool, waiting_since, wait_s: float):
        """The next event from the queues; "wait" (follow: a file has no row yet at or after the next bar time) or
        None (nothing more to take now)."""
        for i, q in enumerate(queues):  # rows that cannot be read, and bars for a time already taken
            while q and (isinstance(q[0][1], str) or (last is not None and q[0][1].time <= last)):
                line, item = q.popleft()
                self.consumed[i] += 1
                why = item if isinstance(item, str) else (f"its bar time {item.time} was taken without it (it came "
                                                          "late or out of order)")
                return FeedEvent("refused", file=i, line=line, why=why)
        heads = [q[0][1] if q else None for q in queues]
        if not started:
            if any(h is None for h in heads):
                return "wait" if follow else None  # the timeline starts once every file has a bar
            start = max(h.time for h in heads)
            for i, q in enumerate(queues):
                if q[0][1].time < start:
                    line, bar = q.popleft()
                    self.consumed[i] += 1
                    return FeedEvent("own", file=i, line=line, bar=bar)
        known = [h.time for h in heads if h is not None]
        if not known:
            return None
        stamp = min(known)
        if any(h is None for h in heads):
            if not follow:
                return None  # a replay ends where the first file ends
            if waiting_since is None or time.monotonic() - waiting_since < wait_s:
                return "wait"
        bars: list[Bar | None] = []
        lines: list[int | None] = []
        for i, q in enumerate(queues):
            if q and q[0][1].time == stamp:
                line, bar = q.popleft()
                self.consumed[i] += 1
                bars.append(bar)
                lines.append(line)
            else:
                bars.append(None)
                lines.append(None)
        return FeedEvent("joint", stamp=stamp, bars=bars, lines=lines)


def joint_bars(files: list[BarFile]) -> int:
    """The bar times a replay of `files` takes (the timeline's length)."""
    return sum(e.kind == "joint" for e in JointFeed(files).events([0] * len(files), None, follow=False))


__all__ = ["FeedEvent", "JointFeed", "joint_bars"]
