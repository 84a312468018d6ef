"""A trained agent on bars as they arrive (agents.trading, scripts/trade.py): every feature equals the batch
pipeline's, decisions and P&L are evaluation's on the same file (a policy alone, and the mock advisor under strict
latency), a replay killed (SIGKILL, or stopped twice between a bar's two writes) and resumed writes the same outputs,
one trader holds a folder, and bad rows get one line each."""

from __future__ import annotations

import json
import os
import shutil
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
        "mock": ["llm=mock", "hybrid.link.latency=strict", "hybrid.link.budget=128", "data.source=synthetic:headlines",
                 *(f"{k}={v}" for k, v in NEWS_SETTINGS.items())]}  # what a news file of the market needs
STORE = "store"  # the mock run's advice store, in its run folder: a replay reads the answers an earlier one kept
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
        store = [f"hybrid.store={path / STORE}"] if name == "mock" else []
        train(load_config(None, TINY + extra + store), path)
        split_file(load_run(path, "latest").market, "val", FILE_BARS, path / "F.csv", headlines=name == "mock")
        out[name] = path
    return out


def split_file(market, split: str, bars: int, path: Path, headlines: bool = False) -> None:
    """The first `bars` bars of the market's `split` as a CSV file to trade (with each bar's headline)."""
    a = market.splits[split][0]
    rows = slice(a, a + bars)
    frame = pd.DataFrame({"timestamp": [t.isoformat() for t in market.timestamps[rows]],
                          "open": market.open[rows], "high": market.high[rows], "low": market.low[rows],
                          "close": market.close[rows], "volume": market.volume[rows]})
    if headlines:
        frame["headline"] = [market.text_table[i] if i >= 0 else "" for i in market.text_index[rows]]
    frame.to_csv(path, index=False)


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
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    evaluated = evaluation["agent"]
    walked = load_run(run, "latest", data=str(run / "F.csv"))
    trace = agent_walk(walked)(walked.market.split_range((0, walked.market.num_bars)), jax.random.PRNGKey(0))
    walked.close()

    summary = json.loads((replays[name] / "summary.json").read_text())
    taken = decisions(replays[name])
    assert taken[0]["bar"] == FIRST_DECISION_BAR and len(taken) == FILE_BARS - FIRST_DECISION_BAR
    assert [d["action"] for d in taken[:-1]] == [ACTIONS[a] for a in trace["action"]]  # the last bar is never walked
    assert summary["pnl_ungated"] == pytest.approx(evaluated["net_pnl"], abs=1e-3)
    assert summary["trades_ungated"] == evaluated["trades"] > 0
    # the gate: what reached the broker is evaluation's gated walk (here all paper: no out-of-sample record before F)
    assert summary["pnl"] == pytest.approx(evaluation["gated"]["net_pnl"], abs=1e-3)
    assert {d["mode"] for d in taken} == {"paper"} and summary["gate"]["mode"] == evaluation["gate"][0]["mode"]
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

        agent = Agent.load(run, "latest", end=FILE_BARS, capacity=256)
        agent.open_advisor()
        frame = pd.read_csv(run / "F.csv")
        actions = []
        for row in frame.itertuples():
            decision = agent.on_bar(Bar(pd.Timestamp(row.timestamp), row.open, row.high, row.low, row.close,
                                        row.volume, row.headline if isinstance(row.headline, str) else ""))
            if decision is not None:
                actions.append(decision.action)
        agent.advisor.close()
        assert actions == [d["action"] for d in taken]


def without_latency(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("latency")} for row in rows]


def assert_same_outputs(resumed: Path, whole: Path) -> None:
    """A resumed replay wrote what the uninterrupted one wrote: decisions, orders, fills, trace and summary (the
    latencies aside)."""
    assert without_latency(decisions(resumed)) == without_latency(decisions(whole))
    for name in ("orders.csv", "fills.csv", "trace.csv"):
        assert (resumed / name).read_bytes() == (whole / name).read_bytes(), name
    # the advisor's counters (prompts asked, their latency) depend on what the store held when each ran, not the trading
    summaries = [{k: v for k, v in json.loads((d / "summary.json").read_text()).items() if not k.startswith("llm_")}
                 for d in (whole, resumed)]
    assert without_latency(summaries[1:]) == without_latency(summaries[:1])
    # the latency figures are over every decision, those before the stop read back from decisions.jsonl
    latencies = [row["latency_ms"] for row in decisions(resumed)]
    assert summaries[1]["latency_p50_ms"] == pytest.approx(float(np.percentile(latencies, 50)))
    assert summaries[1]["latency_p99_ms"] == pytest.approx(float(np.percentile(latencies, 99)))


# slow (the suite's time): a stop and resume at a block's close (below) and two followed files killed and resumed
# (tests/test_trade_account.py) are default tests
@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_a_replay_killed_at_a_random_bar_and_resumed_writes_the_same_outputs(runs, replays, name, tmp_path):
    run = runs[name]
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
    assert_same_outputs(killed, replays[name])


class Killed(BaseException):
    """Where SIGKILL would stop a trader: nothing after it runs (not caught as an error)."""


def stop_at_call(monkeypatch, target, name: str, call: int, after: bool = False) -> None:
    """`target.name`'s `call`-th call (counted from 1) raises Killed: before it runs, or `after` it returned."""
    original = getattr(target, name)
    calls = [0]

    def stopping(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call and not after:
            raise Killed
        out = original(*args, **kwargs)
        if calls[0] == call:
            raise Killed
        return out

    monkeypatch.setattr(target, name, stopping)


@pytest.mark.slow  # (the suite's time: one stop and resume is a default test above)
def test_two_stops_between_a_bars_two_writes_and_two_resumes_write_the_same_outputs(runs, replays, tmp_path,
                                                                                     monkeypatch):
    """A stop after a bar's record is appended to bars.bin and before its state replaces the last one, twice: each
    resume reads the bars the state names (the orphan record is cut off), not one record off; and keeps its gate (each
    decision's line and the summary show the gate's evidence)."""
    from agents.trading.journal import Journal

    out = tmp_path / "twice"
    for call in (40, 90):
        with monkeypatch.context() as m:
            stop_at_call(m, Journal, "_replace_state", call)
            with pytest.raises(Killed):
                trade(runs["rl"], out)
    assert trade(runs["rl"], out) == 0
    assert_same_outputs(out, replays["rl"])


def test_an_advised_replay_stopped_as_a_block_closes_resumes_with_the_stores_answers(runs, replays, tmp_path,
                                                                                      monkeypatch):
    """The answers a block's close read from the advice store (written into the table at the next bar) are part of
    the state: a resume from the bar that read them decides with them, as the uninterrupted replay did."""
    from agents.trading.journal import Journal

    k = load_config(runs["mock"] / "config.yaml").hybrid.query.interval
    closing = next(j for j in range(30, 60) if (FIRST_DECISION_BAR + j) % k == 0)  # decision j's bar closes a block
    out = tmp_path / "stopped"
    with monkeypatch.context() as m:
        stop_at_call(m, Journal, "save", closing, after=True)
        with pytest.raises(Killed):
            trade(runs["mock"], out)
    assert trade(runs["mock"], out) == 0
    assert_same_outputs(out, replays["mock"])


def test_the_gate_sends_orders_to_the_broker_only_while_the_agents_out_of_sample_record_passes(runs, replays,
                                                                                                 tmp_path):
    """--gate evidence: the agent's evidence starts from its out-of-sample record (RUN/evidence/<checkpoint>.json)
    before the bars it trades. A record that passes: every order reaches the broker; one that does not: paper only,
    with the reason; one just short of the bar: the file's sessions decide, as evaluation's gated walk decides them.
    --gate off: every order reaches the broker, and the P&L is the ungated walk's."""
    from agents.evaluation.cli import main as evaluate_main
    from agents.evaluation.saved_run import EVIDENCE_DIR, load_run
    from agents.evidence.gate import OutOfSample

    run = tmp_path / "run"
    shutil.copytree(runs["rl"], run)
    bars = tmp_path / "bars.csv"  # 236 decisions: the test split's first two sessions and a half (out of sample)
    walked = load_run(run, "latest")
    split_file(walked.market, "test", 700, bars)
    label = walked.saved.label
    walked.close()
    scale = load_config(run / "config.yaml").env.prop_firm.trailing_drawdown
    days = [f"2001-01-{d:02d}" for d in range(1, 13)]  # sessions before the file's

    def traded(name: str, session_pnl: list[float], *extra: str) -> tuple[list[dict], dict, pd.DataFrame]:
        OutOfSample(days[: len(session_pnl)], session_pnl, "test").save(run / EVIDENCE_DIR / f"{label}.json")
        out = tmp_path / name
        assert main(["--run-dir", str(run), "--data", str(bars), "--checkpoint", "latest", "--out", str(out),
                     "--no-progress", *extra]) == 0
        return decisions(out), json.loads((out / "summary.json").read_text()), pd.read_csv(out / "orders.csv")

    from agents.trading.cli import main

    taken, summary, orders = traded("passed", [2.0 * scale] * 12)
    assert {d["mode"] for d in taken} == {"live"} and set(orders["mode"]) == {"live"}
    assert summary["pnl"] == summary["pnl_ungated"] and summary["gate"]["mode"] == "live"
    taken, summary, orders = traded("failed", [-0.1 * scale] * 12)
    assert {d["mode"] for d in taken} == {"paper"} and set(orders["mode"]) == {"paper"} and summary["pnl"] == 0
    assert taken[-1]["gate"].startswith("no edge shown out of sample") and summary["gate"]["mode"] == "paper"
    paper = taken
    taken, summary, _ = traded("off", [-0.1 * scale] * 12, "--gate", "off")
    assert {d["mode"] for d in taken} == {"live"} and summary["pnl"] == pytest.approx(summary["pnl_ungated"])
    assert [d["action"] for d in paper] == [d["action"] for d in taken]  # the gate changes where orders go, not them
    taken, summary, _ = traded("short", [scale] * 10)  # E = 14.7, the bar is 20
    assert evaluate_main(["--run-dir", str(run), "--data", str(bars), "--checkpoint", "latest", "--json",
                          str(tmp_path / "eval.json"), "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert summary["pnl"] == pytest.approx(evaluation["gated"]["net_pnl"], abs=1e-3)
    assert summary["gate"]["changes"] == evaluation["gate"][0]["changes"]


@pytest.mark.slow  # 80 s; the flat gate's replay = evaluate (above) runs in the default suite
def test_against_buy_and_hold_trading_and_evaluating_a_file_count_the_same_evidence(runs, tmp_path):
    """A run whose gate_against is buy_and_hold: trade.py's gate and evaluate.py's gated walk of the same file count
    each session less buy-and-hold's move, to the same evidence; the same file against flat gives other evidence."""
    import yaml

    from agents.evaluation.cli import main as evaluate_main
    from agents.evaluation.saved_run import EVIDENCE_DIR, load_run
    from agents.evidence.gate import OutOfSample
    from agents.trading.cli import main

    gates = {}
    for bar in ("flat", "buy_and_hold"):
        run = tmp_path / bar / "run"
        shutil.copytree(runs["rl"], run)
        config = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**config, "gate_against": bar}))
        walked = load_run(run, "latest")
        split_file(walked.market, "test", 1200, run / "bars.csv")  # two whole sessions after the history
        label = walked.saved.label
        walked.close()
        scale = load_config(run / "config.yaml").env.prop_firm.trailing_drawdown
        OutOfSample([f"1990-01-{d:02d}" for d in range(1, 11)], [scale] * 10, "test").save(run / EVIDENCE_DIR
                                                                                           / f"{label}.json")
        out = tmp_path / bar / "traded"
        assert main(["--run-dir", str(run), "--data", str(run / "bars.csv"), "--checkpoint", "latest", "--out",
                     str(out), "--no-progress"]) == 0
        traded = json.loads((out / "summary.json").read_text())["gate"]
        assert evaluate_main(["--run-dir", str(run), "--data", str(run / "bars.csv"), "--checkpoint", "latest",
                              "--json", str(tmp_path / bar / "eval.json"), "--out", str(tmp_path / bar / "eval"),
                              "--no-progress"]) == 0
        evaluated = json.loads((tmp_path / bar / "eval.json").read_text())["gate"][0]
        assert traded["sessions"] == evaluated["sessions"] == 12
        assert traded["log_e"] == pytest.approx(evaluated["log_e"], abs=1e-4)
        assert traded["changes"] == evaluated["changes"]
        assert f"against {bar.replace('_', '-')}" in traded["reason"]
        gates[bar] = traded
    assert abs(gates["flat"]["log_e"] - gates["buy_and_hold"]["log_e"]) > 1e-3


def test_sessions_the_agent_trained_or_was_chosen_on_are_never_evidence(runs, tmp_path, capsys):
    """F.csv holds validation sessions (the checkpoint was chosen on them): trade.py trades them as ever but its gate
    counts none of them, says so once, and names them in summary.json; evaluate.py's gated walk of the file counts
    none either. Before the fix both counted them after the record."""
    from agents.evaluation.cli import main as evaluate_main
    from agents.evaluation.saved_run import EVIDENCE_DIR, in_sample_end, load_run
    from agents.evidence.gate import OutOfSample
    from agents.trading.cli import main

    run = tmp_path / "run"
    shutil.copytree(runs["rl"], run)
    walked = load_run(run, "latest")
    label, end = walked.saved.label, in_sample_end(walked.market)
    walked.close()
    scale = load_config(run / "config.yaml").env.prop_firm.trailing_drawdown
    OutOfSample([f"2001-01-{d:02d}" for d in range(1, 11)], [scale] * 10, "test").save(run / EVIDENCE_DIR
                                                                                       / f"{label}.json")
    out = tmp_path / "in-sample"
    capsys.readouterr()
    assert main(["--run-dir", str(run), "--data", str(run / "F.csv"), "--checkpoint", "latest", "--out", str(out),
                 "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "never counted as out-of-sample" in line]
    assert len(said) == 1 and end in said[0]
    gate = json.loads((out / "summary.json").read_text())["gate"]
    assert gate["sessions"] == 10 and gate["in_sample_sessions"] >= 1 and gate["in_sample_end"] == end
    assert "not counted" in gate["reason"]
    assert evaluate_main(["--run-dir", str(run), "--data", str(run / "F.csv"), "--checkpoint", "latest", "--json",
                          str(tmp_path / "eval.json"), "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())["gate"][0]
    assert evaluated["sessions"] == 10 and evaluated["in_sample_sessions"] == gate["in_sample_sessions"]


def test_a_resume_with_another_checkpoint_or_gate_mode_is_refused_with_one_line(runs, tmp_path, capsys):
    """The gate's record is one checkpoint's, under one mode: resuming a folder with another checkpoint (update 1 where
    it traded update 2, `latest`) or another --gate stops with one line naming the folder, what it traded and what
    was asked, and leaves the folder as it was. Before the fix both resumed, on the old checkpoint's record."""
    from agents.trading.cli import main
    from agents.trading.journal import STATE_DIR

    out = tmp_path / "traded"
    args = ["--run-dir", str(runs["rl"]), "--data", str(runs["rl"] / "F.csv"), "--out", str(out), "--no-progress"]
    assert main([*args, "--checkpoint", "latest"]) == 0
    before = {p: p.read_bytes() for p in (out / STATE_DIR).rglob("*") if p.is_file()}
    capsys.readouterr()
    for extra, says in ((["--checkpoint", "1"], "asked: checkpoint latest-1"),
                        (["--checkpoint", "latest", "--gate", "off"], "with --gate off")):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(out) in err[0] and "traded checkpoint latest-2" in err[0] and says in err[0], err
        assert {p: p.read_bytes() for p in (out / STATE_DIR).rglob("*") if p.is_file()} == before
    assert main([*args, "--checkpoint", "latest"]) == 0  # the same checkpoint and mode resume


def test_a_second_trader_on_a_folder_in_use_exits_with_one_line_naming_the_holder(runs, tmp_path, capsys):
    from agents.runs.lock import RunLock

    out = tmp_path / "held"
    holder = RunLock.acquire(out)  # another trader's (flock: a second open file description conflicts)
    try:
        assert trade(runs["rl"], out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {out} is in use by PID {os.getpid()}")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written beside the holder's lock
    finally:
        holder.release()


def test_a_state_of_another_format_is_refused_with_one_line_and_left_as_it_was(runs, replays, tmp_path, capsys):
    """Trading's restart state is JSON and named arrays with a format number: a pickle of the earlier format, or a
    state of a format this version does not read, stops the resume with one line naming the folder, and nothing in
    the folder is touched."""
    import shutil

    from agents.trading.journal import FORMAT, FORMAT_1_FILE, STATE_DIR, STATE_FILE

    old = tmp_path / "pickled"
    shutil.copytree(replays["rl"], old)
    (old / STATE_DIR / STATE_FILE).unlink()
    (old / STATE_DIR / FORMAT_1_FILE).write_bytes(b"\x80\x04N.")  # a pickle, as format 1 wrote
    newer = tmp_path / "newer"
    shutil.copytree(replays["rl"], newer)
    path = newer / STATE_DIR / STATE_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": FORMAT + 1}))
    for out, says in ((old, "of format 1"), (newer, f"of format {FORMAT + 1}")):
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
        assert trade(runs["rl"], out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and str(out / STATE_DIR) in err[0], err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


@pytest.mark.slow  # (the suite's time)
def test_a_resume_exactly_at_capacity_keeps_every_key_of_the_grown_table(runs, tmp_path):
    """A state saved when the book is full (n = capacity) resumes on arrays twice the size: the advice table grows with
    them, so keys past the old size are written and read, and decisions equal an uninterrupted agent's."""
    from agents.advice.table import SIDES, num_blocks
    from agents.trading import Agent
    from agents.trading.journal import Journal

    run, capacity = runs["mock"], 512
    frame = pd.read_csv(run / "F.csv").iloc[:640]
    bars = [Bar(pd.Timestamp(r.timestamp), r.open, r.high, r.low, r.close, r.volume,
                r.headline if isinstance(r.headline, str) else "") for r in frame.itertuples()]

    def agent():
        a = Agent.load(run, "latest", end=len(bars), capacity=capacity)
        a.open_advisor()
        return a

    def taken(a, rows):
        out = [a.on_bar(bar) for bar in rows]
        return [(d.action, d.advice) for d in out if d is not None]

    whole = agent()
    expected = taken(whole, bars)
    whole.advisor.close()
    first = agent()
    before = taken(first, bars[:capacity])
    assert first.book.n == first.book.capacity == capacity
    journal = Journal(tmp_path / "j")
    journal.open()
    journal.save(first.book, {"decisions": len(before), "advisor": first.advisor.state()}, first.state())
    journal.close()
    first.advisor.close()
    resumed = agent()
    state, arrays = Journal(tmp_path / "j").load(resumed.book)
    resumed.restore(arrays)
    resumed.advisor.restore(state["advisor"])
    assert resumed.carry.hybrid.advice.num_keys == num_blocks(resumed.book.capacity, resumed.k) * SIDES
    after = taken(resumed, bars[capacity:])
    resumed.advisor.close()
    assert before + after == expected


def test_realtime_trading_marks_the_keys_it_asks_as_in_flight(runs):
    """Keys asked of the advisor as a block closes are in flight in the table until answered, as in training (the
    wait rule reads it); keys the advisor failed to answer are missing again."""
    from agents.advice.table import STATUS_ASKED, STATUS_NONE, key_of
    from bridge import Answers
    from bridge.protocol import STATUS_BACKEND_ERROR
    from agents.trading import Agent

    run = runs["mock"]
    frame = pd.read_csv(run / "F.csv").iloc[:FIRST_DECISION_BAR + 20]
    agent = Agent.load(run, "latest", advice="realtime", end=len(frame))
    advisor = agent.open_advisor()

    class Silent:
        """An advisor that takes prompts and answers none of them until told (then, as a dead worker's rows: errors)."""

        reads_fields, alive, oldest_done = True, True, False

        def submit(self, ids, prompts, think=None):
            submitted.append(ids)

        def collect(self, timeout_s=None):
            ids = submitted.pop(0)
            n = len(ids)
            return Answers(0, ids.astype(np.int32), np.full((n, 6), 1 / 6, np.float32), np.full(n, -1, np.int8),
                           np.zeros(n, np.float32), np.full(n, STATUS_BACKEND_ERROR, np.int8), np.zeros(n, "S1"))

        def close(self):
            pass

    submitted = []
    advisor.advisor.workers = Silent()
    try:
        for r in frame.itertuples():
            agent.on_bar(Bar(pd.Timestamp(r.timestamp), r.open, r.high, r.low, r.close, r.volume,
                             r.headline if isinstance(r.headline, str) else ""))
            if submitted:
                break
        read = key_of(agent.book.n // agent.k - 2, 0)  # the key the first decision read, asked before it
        closed = key_of(agent.book.n // agent.k - 1, 0)  # the block its bar closed, asked after it
        assert np.concatenate(submitted).tolist() == [read, closed]
        table = agent.choice.hybrid.advice
        assert int(table.status[read]) == int(table.status[closed]) == STATUS_ASKED
        assert agent.choice.columns["advice_key"] == -1  # nothing in force: the wait rule sees the key in flight
        Silent.oldest_done = True  # their answers come back as errors (a dead worker): not in flight any more
        for rows in advisor.answers(None, wait=False):
            table = agent._write(table, *rows)
        assert int(table.status[closed]) == STATUS_NONE
    finally:
        advisor.close()


def test_trading_and_evaluation_advise_with_the_checkpoints_adapter(runs, tmp_path, monkeypatch):
    """A run whose advisor learned is traded, as it is evaluated, with the LoRA adapter saved beside its checkpoint,
    not the one it started from."""
    from agents.evaluation.saved_run import advised_walk, load_run
    from agents.runs.adapters import adapter_dir
    from agents.advisor import advisor as opened

    run = runs["mock"]
    step = load_run(run, "latest").saved.step
    learned = adapter_dir(run, step)
    learned.mkdir(parents=True)
    (learned / "adapter_config.json").write_text("{}")
    started = []
    monkeypatch.setattr(opened, "start_advisor",
                        lambda hybrid, llm, renderer, texts, rows, adapter, log, learning: started.append(adapter))
    try:
        walked = load_run(run, "latest")
        asked = {}
        walked.walker.walk = lambda *a, **changes: asked.update(changes)
        advised_walk(walked)(None, None)
        from agents.trading.cli import Session, parse_args

        session = Session.open(parse_args(["--run-dir", str(run), "--data", str(run / "F.csv"), "--checkpoint",
                                           "latest", "--out", str(tmp_path / "t"), "--no-progress"]))
        session.lock.release(discard=True)
    finally:
        shutil.rmtree(learned.parent)
    assert asked["adapter"] == str(learned) and started == [str(learned)]


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
