"""A trading run's folder: its outputs, written a line at a time, and its state, saved atomically after every bar so
that a restart (after Ctrl-C, a crash or SIGKILL) resumes at the next bar without repeating or missing a decision.

    decisions.jsonl   one line per decision bar
    orders.csv        one row per order a decision placed
    fills.csv         one row per fill the broker reported (prices at the instrument's tick precision)
    trace.csv         one row per bar the account moved over (jaxenv.walk_split's columns: the summary's input)
    summary.json      the figures so far (written at the end, and on Ctrl-C)
    state/            bars.bin (every placed bar, appended), arrays.<n>.npz (the agent's account as named arrays,
                      n its decisions) and state.json (everything else, naming its arrays file; replaced atomically)

The state names how long each output was when it was saved; a resumed run cuts them back to those lengths, so lines
written for a bar whose state was never saved are written again, once. It holds arrays and JSON only, with its
format's number: a state of another format is refused with one line.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from agents.runs.storage import fsync_dir
from agents.trading.bars import BarBook
from jaxenv.contracts import price_decimals
from jaxenv.sessions import Schedule

OUTPUTS = ("decisions.jsonl", "orders.csv", "fills.csv", "trace.csv")
SUMMARY_FILE = "summary.json"
STATE_DIR = "state"
STATE_FILE = "state.json"
ARRAYS_FILE = "arrays.{}.npz"  # the agent's arrays, numbered by the decisions they follow
BARS_FILE = "bars.bin"
FORMAT = 3  # 3: arrays and JSON, with the checkpoint traded and the gate mode (2: without them; 1: a pickle)
FORMAT_1_FILE = "state.pkl"  # format 1's state, recognised only to be refused
# fills.csv's money, in cents: the account computes in float32 (NQ's commission of 2.14 reads 2.140000104904175)
FILL_MONEY = ("commission", "trade_pnl")

# One placed bar of a BarBook, as bars.bin stores it.
BAR_RECORD = np.dtype([
    ("stamp", "i8"), ("raw", "f8", 5), ("bar_features", "f4", 11), ("context_features", "f4", 28), ("atr", "f4"),
    ("indicators", "f4", 4), ("session_id", "i4"), ("minute_of_day", "i4"), ("day", "i8"), ("can_enter", "?"),
    ("flatten", "?"), ("text_index", "i4"),
])


class Journal:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.state_dir = self.out / STATE_DIR
        self.files: dict[str, Any] = {}
        self.logged = 0  # bars of the book in bars.bin
        # fills.csv's price decimals: the traded instrument's, from the book `save` or `load` is given (a fill is
        # written after the decision before it was saved)
        self.price_decimals: int | None = None

    @property
    def has_state(self) -> bool:
        """A state is saved here (of any format: `load` refuses another)."""
        return (self.state_dir / STATE_FILE).exists() or (self.state_dir / FORMAT_1_FILE).exists()

    def open(self, sizes: dict[str, int] | None = None) -> None:
        """Opens the outputs for appending, cut back to `sizes` (a resumed run's) or empty."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(exist_ok=True)
        for name in OUTPUTS:
            path = self.out / name
            f = open(path, "a+b")
            f.truncate(sizes.get(name, 0) if sizes else 0)
            f.seek(0, os.SEEK_END)
            self.files[name] = f
        if sizes is None:
            (self.state_dir / BARS_FILE).write_bytes(b"")

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files = {}

    # ---------------------------------------------------------------------------------------------- outputs
    def decision(self, line: dict) -> None:
        self.files["decisions.jsonl"].write((json.dumps(line) + "\n").encode())

    def latencies(self) -> list[float]:
        """Each decision's `latency_ms` in decisions.jsonl as `open` left it: a resumed run reads them back here
        rather than from its state, which is saved after every bar and would grow with the run."""
        f = self.files["decisions.jsonl"]
        f.seek(0)
        lines = f.read().splitlines()
        f.seek(0, os.SEEK_END)
        return [json.loads(line)["latency_ms"] for line in lines]

    def row(self, name: str, row: dict, price_decimals: int | None = None) -> None:
        """A CSV row; the header comes with the first. A fill's price is written at the instrument's tick precision
        (float32's 1.1871299743652344 as EURUSD's 1.18713; `price_decimals`: its instrument's, where an account
        trades several), its money in cents."""
        if name == "fills.csv":
            price = self.price_decimals if price_decimals is None else price_decimals
            decimals = {"price": price, **dict.fromkeys(FILL_MONEY, 2)}
            row = {k: f"{v:.{decimals[k]}f}" if k in decimals and v is not None else v for k, v in row.items()}
        f = self.files[name]
        text = _csv_line(row.values())
        if f.tell() == 0:
            text = _csv_line(row.keys()) + text
        f.write(text.encode())

    # ------------------------------------------------------------------------------------------------ state
    def save(self, book: BarBook, state: dict, arrays: dict[str, np.ndarray]) -> None:
        """After a bar: the book's new bars appended, the outputs flushed, the arrays written under a new name, then
        the state (JSON, naming them) replaced atomically and the arrays it no longer names removed. A stop before
        the state's replacement leaves the last state whole: `load` cuts bars.bin back to it."""
        self.price_decimals = price_decimals(book.contract)
        self._append_bars(book)
        self.save_state({**state, "logged": self.logged, "texts": list(book.text_table),
                         "schedule": dataclasses.asdict(book.schedule), "interval": book.interval}, arrays)

    def save_state(self, state: dict, arrays: dict[str, np.ndarray]) -> None:
        """`save`'s state without a book (an account's, whose bars are rebuilt from its files): the outputs flushed,
        the arrays written under a new name, then the state replaced atomically and the old arrays removed."""
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
        name = ARRAYS_FILE.format(state["decisions"])
        with open(self.state_dir / name, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        self._replace_state({**state, "format": FORMAT, "arrays": name,
                             "sizes": {n: f.tell() for n, f in self.files.items()}})
        for old in self.state_dir.glob(ARRAYS_FILE.format("*")):
            if old.name != name:
                old.unlink()

    def _append_bars(self, book: BarBook) -> None:
        if book.schedule is None or self.logged >= book.n:
            return
        with open(self.state_dir / BARS_FILE, "ab") as f:
            f.write(_records(book, self.logged, book.n).tobytes())
            f.flush()
            os.fsync(f.fileno())
        self.logged = book.n

    def _replace_state(self, state: dict) -> None:
        tmp = self.state_dir / f"{STATE_FILE}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_dir / STATE_FILE)
        fsync_dir(self.state_dir)

    def load(self, book: BarBook) -> tuple[dict, dict[str, np.ndarray]]:
        """(the saved state, the agent's arrays), with `book` holding the bars it had (bars.bin's first `logged`
        records). Records after those (appended for a bar whose state was never saved) are cut off, so the next bar is
        appended in their place. A ValueError names a state of another format."""
        self.price_decimals = price_decimals(book.contract)
        state, arrays = self.load_state()
        n = state["logged"]
        bars = self.state_dir / BARS_FILE
        records = np.fromfile(bars, BAR_RECORD, count=n)
        if len(records) < n:
            raise ValueError(f"{bars}: {len(records)} bars, the state names {n}")
        with open(bars, "r+b") as f:
            f.truncate(n * BAR_RECORD.itemsize)
            os.fsync(f.fileno())
        book.restore({"stamps": records["stamp"], "raw": records["raw"], "indicators": records["indicators"],
                      **{name: records[name] for name in BarBook.ROW_COLUMNS}},
                     Schedule(**state["schedule"]), state["interval"], state["texts"])
        self.logged = n
        return state, arrays

    def load_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """`load` without a book: (the saved state, its arrays). A ValueError names a state of another format."""
        path = self.state_dir / STATE_FILE
        if not path.exists():
            raise ValueError(f"{self.state_dir}: a trading state of format 1 ({FORMAT_1_FILE}, a pickle), this version "
                             f"reads {FORMAT}; start in a new --out folder")
        state = json.loads(path.read_text())
        if state.get("format") != FORMAT:
            raise ValueError(f"{self.state_dir}: a trading state of format {state.get('format')}, this version "
                             f"reads {FORMAT}; start in a new --out folder")
        with np.load(self.state_dir / state["arrays"]) as saved:
            arrays = {k: saved[k] for k in saved.files}
        return state, arrays


def check_resumed(out: Path, state: dict, run: str, data, identity: dict, gate: str) -> None:
    """A saved trading state is the one this command continues: the same run and data (a file, or an account's files),
    and the same checkpoint's weights under the same gate mode (the gate's record is one checkpoint's under one mode:
    another would trade on it). A ValueError names what differs and how to go on."""
    if state["run"] != run or state["data"] != data:
        given = " ".join(state["data"]) if isinstance(state["data"], list) else state["data"]
        raise ValueError(f"{out}: its state is of --run-dir {state['run']} --data {given}; resume with those, or give "
                         "another --out")
    asked = {**identity, "gate": gate}
    saved = {**state["checkpoint"], "gate": state["gate_mode"]}
    if saved != asked:
        raise ValueError(f"{out}: its state traded checkpoint {saved['label']} (weights {saved['digest']}) with --gate "
                         f"{saved['gate']}; asked: checkpoint {asked['label']} (weights {asked['digest']}) with --gate "
                         f"{asked['gate']}; resume with those (--checkpoint STEP names one), or give another --out")


def _csv_line(values) -> str:
    from io import StringIO

    buf = StringIO()
    csv.writer(buf, lineterminator="\n").writerow(list(values))
    return buf.getvalue()


def _records(book: BarBook, start: int, end: int) -> np.ndarray:
    out = np.zeros(end - start, BAR_RECORD)
    out["stamp"], out["raw"] = book.stamps[start:end], book.raw[start:end]
    out["bar_features"], out["context_features"] = book.bar_features[start:end], book.context_features[start:end]
    out["atr"] = book.atr[start:end]
    out["indicators"] = np.stack([v[start:end] for v in book.indicators.values()], axis=1)
    for name in ("session_id", "minute_of_day", "day", "can_enter", "flatten", "text_index"):
        out[name] = getattr(book, name)[start:end]
    return out
