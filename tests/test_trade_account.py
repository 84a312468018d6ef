"""trade.py on a run of several instruments traded in one account (issue 77): a replay of two files decides as
evaluate.py walks them (gate off: every P&L and trade; the evidence gate: its sessions, evidence and changes), two
followed files killed (SIGKILL) and resumed decide as a replay, a late instrument is absent once the wait is over, each
instrument's prompts read the joint timeline as training's advisor did, and a wrong set of files is one line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.config import load_config
from agents.trading.feed import BarFile
from agents.trading.joint_feed import JointFeed
from agents.training.loop import train

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "configs" / "quick.yaml")
TRADED_ROWS = 800  # each file's last rows, traded: 336 decisions after the history, in the run's test sessions
ZONE = "America/New_York"


@pytest.fixture(scope="module")
def account(tmp_path_factory) -> dict:
    """An account run on the synthetic pair's NQ and ES (2 updates of 16 envs), and the last TRADED_ROWS rows of
    each file as the files to trade."""
    out = tmp_path_factory.mktemp("account")
    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "20", "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True)
    run = out / "run"
    overrides = ["llm=none", "num_envs=16", "total_steps=1024", "data.synthetic_days=20", "log.tensorboard=false",
                 "log.progress=false", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=1",
                 "env.max_steps_in_episode=400", f'data.instruments=["NQ={out / "NQ.csv"}", "ES={out / "ES.csv"}"]']
    train(load_config(QUICK, overrides), run)
    traded = {}
    for symbol in ("NQ", "ES"):
        lines = (out / f"{symbol}.csv").read_text().splitlines(keepends=True)
        traded[symbol] = out / f"{symbol}-traded.csv"
        traded[symbol].write_text(lines[0] + "".join(lines[-TRADED_ROWS:]))
    return {"run": run, "files": traded}


def data_flags(files: dict[str, Path]) -> list[str]:
    return [arg for symbol, path in files.items() for arg in ("--data", f"{symbol}={path}")]


def trade_cmd(account: dict, out: Path, *extra: str, files: dict | None = None) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "trade.py"), "--run-dir", str(account["run"]),
            *data_flags(files or account["files"]), "--out", str(out), "--no-progress", *extra]


@pytest.fixture(scope="module")
def replays(account, tmp_path_factory) -> dict[str, Path]:
    """The traded files replayed with the gate off and with the evidence gate."""
    out = tmp_path_factory.mktemp("replays")
    for gate in ("off", "evidence"):
        done = subprocess.run(trade_cmd(account, out / gate, "--gate", gate), cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    return {gate: out / gate for gate in ("off", "evidence")}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def decisions(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "latency_ms"}
            for line in (out / "decisions.jsonl").read_text().splitlines()]


def test_a_replay_decides_as_evaluate_py_walks_the_same_files(account, replays, tmp_path):
    from agents.evaluation.cli import main as evaluate_main

    assert evaluate_main(["--run-dir", str(account["run"]), *data_flags(account["files"]), "--json",
                          str(tmp_path / "eval.json"), "--out", str(tmp_path / "eval")]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    off = summary(replays["off"])
    assert off["decisions"] == TRADED_ROWS - 464
    assert off["pnl"] == off["pnl_ungated"] == pytest.approx(evaluated["agent"]["net_pnl"], abs=1e-3)
    assert off["trades"] == evaluated["agent"]["trades"] > 0
    for symbol, figures in off["instruments"].items():
        assert figures["net_pnl"] == pytest.approx(evaluated["instruments"][symbol]["net_pnl"], abs=1e-3)
        assert figures["trades"] == evaluated["instruments"][symbol]["trades"]
    traded = pd.read_csv(replays["off"] / "fills.csv")
    assert set(traded["symbol"]) == {"NQ", "ES"}
    gated, walked = summary(replays["evidence"])["gate"], evaluated["gate"][0]
    assert gated["sessions"] == walked["sessions"] > 0
    assert gated["log_e"] == pytest.approx(walked["log_e"], abs=1e-4)
    assert gated["changes"] == walked["changes"]
    assert summary(replays["evidence"])["pnl"] == pytest.approx(evaluated["gated"]["net_pnl"], abs=1e-3)


@pytest.mark.parametrize("gate", ["off", "evidence"])
def test_the_state_saved_after_each_bar_does_not_grow_with_the_run(replays, gate):
    """The state is saved after every bar, so it must not grow with the run (a long replay slowed bar after bar
    while every book kept every order it was given): each book keeps only the last decision's orders, the only ones
    a restart could place again (orders.csv keeps every order), and no list holds an entry per decision (the
    latencies are read back from decisions.jsonl)."""
    out = replays[gate]
    state = json.loads((out / "state" / "state.json").read_text())
    with open(out / "orders.csv") as f:
        ordered = {row["id"] for row in csv.DictReader(f)}
    lines = (out / "decisions.jsonl").read_text().splitlines()
    assert not [key for key, value in state.items() if isinstance(value, list) and len(value) >= len(lines)]
    last = set(json.loads(lines[-1])["orders"].values())
    assert len(ordered) > len(last) + 10
    kept = {o["id"] for books in (state["brokers"], state["paper"]) for book in books.values() for o in book["placed"]}
    assert kept <= last


def test_two_followed_files_killed_and_resumed_decide_as_a_replay(account, replays, tmp_path):
    """Rows appended to both files while the trader follows them; SIGKILL after some decisions, then the same command
    again: it resumes at the next bar time, and every decision but the last two (a replay knows where the files end:
    entries stop a bar before) and the account's every move are the replay's."""
    sources = {s: p.read_text().splitlines(keepends=True) for s, p in account["files"].items()}
    files = {s: tmp_path / f"{s}.csv" for s in sources}
    first = 500
    for s, lines in sources.items():
        files[s].write_text("".join(lines[: first + 1]))

    def append_the_rest():
        for k in range(first + 1, len(sources["NQ"]), 25):
            time.sleep(0.2)
            for s, lines in sources.items():
                with open(files[s], "a") as f:
                    f.write("".join(lines[k: k + 25]))

    out = tmp_path / "followed"
    cmd = trade_cmd(account, out, "--gate", "off", "--follow", "--poll", "0.05", "--idle-exit", "4", files=files)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = out / "decisions.jsonl"
    while proc.poll() is None and (not path.exists() or path.read_bytes().count(b"\n") < 20):
        time.sleep(0.01)
    writer = threading.Thread(target=append_the_rest)
    writer.start()
    while proc.poll() is None and path.read_bytes().count(b"\n") < 60:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    writer.join()
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed after" in resumed.stderr
    followed, replayed = decisions(out), decisions(replays["off"])
    assert len(followed) == len(replayed)
    assert followed[:-2] == replayed[:-2]
    trace = lambda d: (d / "trace.csv").read_text().splitlines()  # noqa: E731
    assert trace(out)[:-1] == trace(replays["off"])[:-1]


def write_bars(path: Path, stamps: list[str], close: float = 100.0) -> None:
    rows = [f"{t},{close},{close + 1},{close - 1},{close},10\n" for t in stamps]
    path.write_text("timestamp,open,high,low,close,volume\n" + "".join(rows))


def test_a_late_instrument_is_absent_after_the_wait_and_its_late_row_refused(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    stamps = [f"2024-01-02 09:{m:02d}:00" for m in range(30, 36)]
    write_bars(a, stamps)
    write_bars(b, stamps[:3])  # b's 09:33 is late
    feed = JointFeed([BarFile(a, ZONE), BarFile(b, ZONE)])
    events = []

    def late_row():
        time.sleep(1.5)
        with open(b, "a") as f:
            f.write(f"{stamps[3]},100,101,99,100,10\n{stamps[4]},100,101,99,100,10\n")

    writer = threading.Thread(target=late_row)
    writer.start()
    for event in feed.events([0, 0], None, follow=True, poll_s=0.02, idle_s=1.5, wait_s=1.0):
        events.append(event)
    writer.join()
    joint = [e for e in events if e.kind == "joint"]
    assert [str(e.stamp.time()) for e in joint][:4] == ["09:30:00", "09:31:00", "09:32:00", "09:33:00"]
    assert joint[3].bars[1] is None and joint[3].bars[0] is not None  # decided without b after the wait
    refused = [e for e in events if e.kind == "refused"]
    assert refused and refused[0].file == 1 and "taken without it" in refused[0].why
    assert joint[4].bars[1] is not None  # b's next row is on time again


def test_a_replay_joins_as_the_market_set_does(tmp_path):
    """The timeline starts at the latest first bar (earlier rows are history only) and a replay ends where the first
    file ends; a bar time missing in one file is that instrument's absence."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_bars(a, [f"2024-01-02 09:{m:02d}:00" for m in (30, 31, 32, 33, 35, 36)])
    write_bars(b, [f"2024-01-02 09:{m:02d}:00" for m in (31, 32, 34, 35)])
    events = list(JointFeed([BarFile(a, ZONE), BarFile(b, ZONE)]).events([0, 0], None, follow=False))
    assert [(e.kind, e.file) for e in events if e.kind == "own"] == [("own", 0)]
    joint = [(str(e.stamp.time())[:5], [x is not None for x in e.bars]) for e in events if e.kind == "joint"]
    assert joint == [("09:31", [True, True]), ("09:32", [True, True]), ("09:33", [True, False]),
                     ("09:34", [False, True]), ("09:35", [True, True])]


@pytest.mark.parametrize("items, words", [
    (["ES={NQ}", "NQ={ES}"], "the run trades NQ, ES"),
    (["NQ={NQ}"], "the run trades NQ, ES"),
    (["NQ={NQ}", "{ES}"], "--data"),
])
def test_a_wrong_set_of_files_is_one_line(account, tmp_path, items, words):
    files = {k: str(v) for k, v in account["files"].items()}
    data = [arg for item in items for arg in ("--data", item.format(**files))]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "trade.py"), "--run-dir", str(account["run"]), *data,
                           "--out", str(tmp_path / "x"), "--no-progress"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in done.stderr


def test_each_instruments_prompts_read_the_joint_timeline_as_trainings_advisor_did(tmp_path):
    """At each block's close, the prompt fields of every instrument's keys built from the bars so far (the live
    JointBook) equal those of the whole files' market set that training's advisor read: carried closes and indicators
    where an instrument is absent, and nothing of a later bar."""
    from agents.advice.table import SIDES, key_of
    from agents.advisor.prompt_fields import PromptFieldBuilder
    from bridge.protocol import FIELD_INDEX
    from agents.trading.account_agent import JointBook
    from agents.trading.advice import JointBookView
    from agents.trading.bars import FIRST_DECISION_BAR
    from jaxenv.config import DataConfig, EnvConfig
    from jaxenv.market_set import load_market_set

    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "2", "--out",
                    str(tmp_path)], cwd=REPO, check=True, capture_output=True)
    for symbol in ("NQ", "ES"):  # a headline on some bars (one text repeated), and ES absent at some bar times
        lines = (tmp_path / f"{symbol}.csv").read_text().splitlines()
        rows = [lines[0] + ",headline"] + [f"{line},{f'{symbol} news {j % 5}' if j % 9 == 0 else ''}"
                                           for j, line in enumerate(lines[1:], 1)
                                           if symbol == "NQ" or j % 7 != 3]
        (tmp_path / f"{symbol}.csv").write_text("\n".join(rows) + "\n")
    files = [("NQ", tmp_path / "NQ.csv"), ("ES", tmp_path / "ES.csv")]
    market_set = load_market_set([(s, str(p)) for s, p in files], DataConfig())
    symbols, k, HEADLINE = list(market_set.symbols), 16, FIELD_INDEX["headline"]
    batch = [PromptFieldBuilder(m, symbols, 1, k) for m in market_set.markets]
    book = JointBook(symbols, [m.contract for m in market_set.markets], EnvConfig().prop_firm, 0.0, 0)
    compared = 0
    for event in JointFeed([BarFile(p, m.contract.timezone) for (_, p), m in zip(files, market_set.markets)]).events(
            [0, 0], None, follow=False):
        if event.kind == "own":
            book.add_own(event.file, event.bar)
        elif event.kind == "joint":
            book.add(event.stamp, list(event.bars))
            t = book.n - 1
            if book.started and t >= FIRST_DECISION_BAR and (t + 1) % k == 0:  # the decisions' bars
                keys = [key_of(t // k, side) for side in range(-1, SIDES - 1)]
                for i in range(len(symbols)):
                    view = JointBookView(book, i)
                    live, whole = PromptFieldBuilder(view.market(), symbols, 1, k).build(keys), batch[i].build(keys)
                    # a headline is an index into its side's own table of texts: the texts must be the same
                    texts = [[table[int(x)] if x >= 0 else None for x in fields[:, HEADLINE]]
                             for fields, table in ((live, view.text_table), (whole, market_set.markets[i].text_table))]
                    assert texts[0] == texts[1]
                    np.testing.assert_array_equal(np.delete(live, HEADLINE, 1), np.delete(whole, HEADLINE, 1))
                    compared += 1
    assert book.n == market_set.num_bars and (market_set.coverage < 1).any() and compared > 20
    assert all(m.text_table for m in market_set.markets)  # the headlines were read


@pytest.mark.parametrize("entries_only", [False, True])
def test_a_trader_asks_the_keys_training_and_evaluation_ask(entries_only):
    """The keys a trader asks for a block, whatever the positions before and after its decision, are keys a walk of
    that block reads (agents.advice.table.walk_keys): under hybrid.query.entries_only the flat one alone, else every
    side's (a held side's advice asked there would be in force where the policy never had any)."""
    from agents.advice.table import walk_keys
    from agents.trading.agent import block_keys

    k = 4
    walked = set(walk_keys(0, 41 * k, k, entries_only).tolist())  # blocks 0-39 are read in blocks 1-40
    asked = {key for block in range(40) for side in (-1, 0, 1) for after in (-1, 0, 1)
             for key in block_keys(block, (side, after), entries_only)}
    assert asked == walked
