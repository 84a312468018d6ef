"""A trained agent on bars as they arrive (agents.trading, scripts/trade.py): every feature equals the batch
pipeline's, decisions and P&L are evaluation's on the same file (a policy alone, and the mock advisor under strict
latency), a replay killed with SIGKILL and resumed writes the same outputs, and bad rows get one line each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from agents.config import load_config
from agents.evaluation.saved_run import agent_walk, load_run
from agents.trading import Bar, BarBook
from agents.trading.bars import FIRST_DECISION_BAR
from agents.training.loop import train
from bridge.protocol import ACTIONS
from jaxenv import load_market
from jaxenv.config import DataConfig, PropFirmRules
from jaxenv.env import session_rules
from jaxenv.market_files import NEWS_SETTINGS, write_market

REPO = Path(__file__).resolve().parents[1]
TINY = ["num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "data.synthetic_days=30", "env.max_steps_in_episode=400",
        "checkpoint.every_updates=1", "checkpoint.eval_every_updates=0", "total_steps=256"]
RUNS = {"rl": ["llm=none", "data.source=synthetic:signal"],
        "mock": ["llm=mock", "hybrid.latency=strict", "hybrid.budget=128", "data.source=synthetic:headlines",
                 *(f"{k}={v}" for k, v in NEWS_SETTINGS.items())]}  # what a news file of the market needs
FILE_BARS = 1000  # bars of the validation split written as the file to trade: 536 decisions after the history


def feed(book: BarBook, market) -> None:
    for i in range(market.num_bars):
        book.add(Bar(market.timestamps[i], market.open[i], market.high[i], market.low[i], market.close[i],
                     market.volume[i]))


def assert_features_equal(days: int) -> None:
    market = load_market(DataConfig(synthetic_days=days))
    rules = PropFirmRules()
    book = BarBook(market.contract, rules, capacity=1024)  # grows on the way
    feed(book, market)
    n = market.num_bars
    can_enter, flatten = session_rules(market, rules)
    assert book.n == n and book.interval == market.interval_minutes
    np.testing.assert_allclose(book.bar_features[:n], market.bar_features, atol=1e-6, rtol=0)
    np.testing.assert_allclose(book.context_features[:n], market.context_features, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(book.atr[:n], market.atr)
    for name, values in market.indicators.items():
        np.testing.assert_allclose(book.indicators[name][:n], values, atol=1e-6, rtol=0, err_msg=name)
    np.testing.assert_array_equal(book.session_id[:n], market.sessions.session_id)
    np.testing.assert_array_equal(book.minute_of_day[:n], market.sessions.minute_of_day)
    np.testing.assert_array_equal(book.days, market.sessions.day)
    np.testing.assert_array_equal(book.can_enter[:n], can_enter)
    np.testing.assert_array_equal(book.flatten[:n], flatten)


def test_every_feature_of_every_bar_equals_the_batch_pipeline():
    assert_features_equal(days=4)  # shorter than the rolling window: the window is the whole history


@pytest.mark.slow
def test_every_feature_equals_the_batch_pipeline_past_the_rolling_window():
    assert_features_equal(days=12)  # 4,680 bars: the last 584 from a window that starts after the data


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny runs (a policy alone; the mock advisor reading headlines, strict latency), each with the first
    FILE_BARS bars of its validation split written as a CSV file (F.csv) to trade."""
    out = {}
    for name, extra in RUNS.items():
        path = tmp_path_factory.mktemp("trade") / name
        train(load_config(None, TINY + extra), path)
        market = load_run(path, "latest").market
        a = market.splits["val"][0]
        rows = slice(a, a + FILE_BARS)
        frame = pd.DataFrame({"timestamp": [t.isoformat() for t in market.timestamps[rows]],
                              "open": market.open[rows], "high": market.high[rows], "low": market.low[rows],
                              "close": market.close[rows], "volume": market.volume[rows]})
        if name == "mock":
            frame["headline"] = [market.text_table[i] if i >= 0 else "" for i in market.text_index[rows]]
        frame.to_csv(path / "F.csv", index=False)
        out[name] = path
    return out


def trade(run: Path, out: Path, *extra: str) -> int:
    from agents.trading.cli import main

    return main(["--run-dir", str(run), "--data", str(run / "F.csv"), "--checkpoint", "latest", "--out", str(out),
                 "--no-progress", *extra])


@pytest.fixture(scope="module")
def replays(runs, tmp_path_factory) -> dict[str, Path]:
    """Each run's file traded once, uninterrupted: the outputs the other tests compare with."""
    out = {}
    for name, run in runs.items():
        out[name] = tmp_path_factory.mktemp("replay") / name
        assert trade(run, out[name]) == 0
    return out


def decisions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", list(RUNS))
def test_trading_a_file_decides_and_earns_exactly_as_evaluating_it(runs, replays, name, tmp_path):
    from agents.evaluation.cli import main as evaluate_main

    run = runs[name]
    assert evaluate_main(["--run-dir", str(run), "--data", str(run / "F.csv"), "--checkpoint", "latest",
                          "--json", str(tmp_path / "eval.json"), "--out", str(tmp_path / "eval"),
                          "--no-progress"]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())["agent"]
    walked = load_run(run, "latest", data=str(run / "F.csv"))
    trace = agent_walk(walked)(walked.market.split_range((0, walked.market.num_bars)), jax.random.PRNGKey(0))
    walked.close()

    summary = json.loads((replays[name] / "summary.json").read_text())
    taken = decisions(replays[name])
    assert taken[0]["bar"] == FIRST_DECISION_BAR and len(taken) == FILE_BARS - FIRST_DECISION_BAR
    assert [d["action"] for d in taken[:-1]] == [ACTIONS[a] for a in trace["action"]]  # the last bar is never walked
    assert summary["pnl"] == pytest.approx(evaluated["net_pnl"], abs=1e-3)
    assert summary["trades"] == evaluated["trades"] > 0
    assert summary["latency_p99_ms"] > 0
    fills = pd.read_csv(replays[name] / "fills.csv")
    assert fills["trade_pnl"].sum() == pytest.approx(
        sum(t for t in trace["trade_pnl"]), abs=1e-2)  # every closed trade is a fill with its P&L
    if name == "mock":
        advised = [d for d in taken if d["advice"]]
        assert len(advised) > len(taken) // 4
        assert summary["advice_on_time"] == 1.0  # the mock answers in microseconds

        # the API on arrays that double twice on the way (256 -> 1024 bars: the table grows, the steps recompile)
        from agents.trading import Agent
        from agents.trading.advice import LiveAdvisor

        agent = Agent.load(run, "latest", end=FILE_BARS, capacity=256)
        agent.advisor = LiveAdvisor(agent.cfg, agent.book)
        frame = pd.read_csv(run / "F.csv")
        actions = []
        for row in frame.itertuples():
            decision = agent.on_bar(Bar(pd.Timestamp(row.timestamp), row.open, row.high, row.low, row.close,
                                        row.volume, row.headline if isinstance(row.headline, str) else ""))
            if decision is not None:
                actions.append(decision.action)
        agent.advisor.close()
        assert actions == [d["action"] for d in taken]


def test_a_replay_killed_at_a_random_bar_and_resumed_writes_the_same_outputs(runs, replays, tmp_path):
    run, whole = runs["rl"], replays["rl"]
    killed = tmp_path / "killed"
    stop_at = np.random.default_rng().integers(20, FILE_BARS - FIRST_DECISION_BAR - 20)
    cmd = [sys.executable, str(REPO / "scripts" / "trade.py"), "--run-dir", str(run), "--data", str(run / "F.csv"),
           "--checkpoint", "latest", "--out", str(killed), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = killed / "decisions.jsonl"
    while proc.poll() is None and (not path.exists() or path.read_bytes().count(b"\n") < stop_at):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert subprocess.run(cmd, cwd=REPO, capture_output=True).returncode == 0

    def without_latency(rows):
        return [{k: v for k, v in row.items() if not k.startswith("latency")} for row in rows]

    assert without_latency(decisions(killed)) == without_latency(decisions(whole))
    for name in ("orders.csv", "fills.csv", "trace.csv"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name
    uninterrupted, resumed = (json.loads((d / "summary.json").read_text()) for d in (whole, killed))
    assert without_latency([resumed]) == without_latency([uninterrupted])


def test_bad_rows_get_one_line_each_and_the_rest_is_traded(runs, tmp_path, capsys):
    run = runs["rl"]
    frame = pd.read_csv(run / "F.csv").iloc[:600].reset_index(drop=True)
    bad = frame.copy()
    bad.loc[500, "timestamp"] = bad.loc[498, "timestamp"]  # out of order
    bad.loc[510, ["open", "high", "low", "close"]] = bad.loc[510, ["open", "high", "low", "close"]] * 3  # another's
    late = pd.Timestamp(bad.loc[520, "timestamp"]).replace(hour=18, minute=0)  # after the session's close
    bad.loc[520, "timestamp"] = late.isoformat()
    bad = bad.drop(index=[521, 522, 523]).sort_index()  # a gap of three bars
    path = tmp_path / "bad.csv"
    bad.to_csv(path, index=False)
    from agents.trading.cli import main

    assert main(["--run-dir", str(run), "--data", str(path), "--checkpoint", "latest", "--out",
                 str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"{path}: line 502: its stamp" in err and "out of order; skipped" in err
    assert f"{path}: line 512: its close" in err and "another instrument's prices" in err
    assert f"{path}: line 522: " in err and "outside NQ's sessions" in err
    assert "3 1-minute bar(s) missing before" in err or "bar(s) missing before" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["refused_rows"] == 3 and summary["decisions"] == len(bad) - 3 - FIRST_DECISION_BAR

    # the history of another instrument: one line, exit 2, nothing traded
    scaled = frame.copy()
    scaled[["open", "high", "low", "close"]] = (scaled[["open", "high", "low", "close"]] / 1000).round(5)
    scaled.to_csv(path, index=False)
    assert main(["--run-dir", str(run), "--data", str(path), "--checkpoint", "latest", "--out",
                 str(tmp_path / "other"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {path}: the first {FIRST_DECISION_BAR} bars:")
    assert not (tmp_path / "other").exists()  # nothing traded, nothing left behind


def test_a_news_file_gives_each_bar_the_context_its_headline_column_gives(runs, replays, tmp_path):
    """The mock run's file traded with its headlines in their own file (--news, joined bar by bar as data.news joins
    them) decides exactly as with the headline column."""
    run = runs["mock"]
    _, news = write_market(tmp_path / "market", "headlines", "NQ", 30, 0)  # the run's market, as files
    bars = pd.read_csv(run / "F.csv").drop(columns="headline")
    bars.to_csv(tmp_path / "bars.csv", index=False)
    from agents.trading.cli import main

    assert main(["--run-dir", str(run), "--data", str(tmp_path / "bars.csv"), "--news", str(news), "--checkpoint",
                 "latest", "--out", str(tmp_path / "news"), "--no-progress"]) == 0
    column, joined = decisions(replays["mock"]), decisions(tmp_path / "news")
    assert [d["action"] for d in joined] == [d["action"] for d in column]
    assert [d["advice"] for d in joined] == [d["advice"] for d in column]


def test_following_a_file_trades_the_rows_appended_to_it_as_a_replay_does(runs, replays, tmp_path):
    """--follow: rows written while it runs (a last line half-written at times) are traded as they complete; the
    decisions are the replay's but at the file's last bars, where only a replay knows that the data ends."""
    run = runs["rl"]
    lines = (run / "F.csv").read_text().splitlines(keepends=True)
    live = tmp_path / "live.csv"
    live.write_text("".join(lines[: FIRST_DECISION_BAR + 50]))
    cmd = [sys.executable, str(REPO / "scripts" / "trade.py"), "--run-dir", str(run), "--data", str(live),
           "--checkpoint", "latest", "--out", str(tmp_path / "follow"), "--follow", "--poll", "0.1",
           "--idle-exit", "5", "--status-every", "100"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rest = lines[FIRST_DECISION_BAR + 50:]
    with open(live, "a") as f:
        for i in range(0, len(rest), 97):
            chunk = "".join(rest[i:i + 97])
            f.write(chunk[:-7])  # a row half-written: not read until its newline comes
            f.flush()
            time.sleep(0.3)
            f.write(chunk[-7:])
            f.flush()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "pos " in err and "drawdown left" in err  # the status line, every 100 decisions
    followed, replayed = decisions(tmp_path / "follow"), decisions(replays["rl"])
    assert len(followed) == len(replayed)
    assert [d["action"] for d in followed[:-2]] == [d["action"] for d in replayed[:-2]]
