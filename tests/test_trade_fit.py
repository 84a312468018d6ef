"""trade.py reads a file as training read the run's data, and refuses history that does not fit with one line and exit
status 2 (issue 75, item 3). Before: a run trained with data.source_timezone=auto on naive UTC stamps read them as New
York time, where the history fell outside EURUSD's sessions; that, a daily file given to an hourly run, or a file
whose bars all lie outside the sessions each ended with 0 decisions (or an hourly policy on daily bars) and exit 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.config import load_config
from agents.trading.bars import FIRST_DECISION_BAR
from agents.training.loop import train
from tests.market_shapes import daily_equity, hourly_fx, to_utc, write_csv

TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "env.max_steps_in_episode=100", "checkpoint.every_updates=1",
        "checkpoint.eval_every_updates=0", "total_steps=256"]
LATER_BARS = 600  # the training file's last bars, traded: 136 decisions after the history
SESSIONS = "EURUSD's sessions (17:00-17:00 America/New_York, Monday to Friday)"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny RL run on hourly EURUSD with naive UTC stamps, its zone found by data.source_timezone=auto; beside it,
    later.csv: the file's last LATER_BARS bars."""
    folder = tmp_path_factory.mktemp("fit")
    path = write_csv(to_utc(hourly_fx()), folder / "eurusd_h1.csv", naive=True)
    train(load_config(None, TINY + [f"data.source={path}", "data.contract=EURUSD", "data.source_timezone=auto"]),
          folder / "run")
    lines = Path(path).read_text().splitlines(keepends=True)
    (folder / "later.csv").write_text("".join(lines[:1] + lines[-LATER_BARS:]))
    return folder / "run"


def trade(run: Path, data, out: Path, *extra: str) -> int:
    from agents.trading.cli import main

    return main(["--run-dir", str(run), "--data", str(data), "--checkpoint", "latest", "--out", str(out),
                 "--gate", "off", "--no-progress", *extra])


def refusal(capsys) -> str:
    """The one line a refused file gets on stderr."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_run_trained_with_auto_trades_naive_stamps_in_the_zone_it_resolved(run, tmp_path):
    assert json.loads((run / "data.json").read_text()) == {"source_timezone": "UTC", "interval_minutes": 60}
    assert trade(run, run.parent / "later.csv", tmp_path / "out") == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["refused_rows"] == 0 and summary["decisions"] == LATER_BARS - FIRST_DECISION_BAR


def test_a_daily_file_exits_2_with_one_line_naming_both_intervals(run, tmp_path, capsys):
    daily = daily_equity(n=FIRST_DECISION_BAR + 50)
    prices = ["open", "high", "low", "close"]
    daily[prices] = (daily[prices] * (1.085 / 800)).round(5)  # EURUSD's prices, a bar a day
    path = write_csv(daily, tmp_path / "eurusd_d1.csv", dates=True)
    capsys.readouterr()
    assert trade(run, path, tmp_path / "out") == 2
    assert refusal(capsys) == (f"error: {path}: the first {FIRST_DECISION_BAR} bars: bars are 1 day apart; the run "
                               "was trained on 60-minute bars")
    assert not (tmp_path / "out").exists()  # nothing traded, nothing left behind


def test_history_outside_every_session_exits_2_with_one_line_naming_the_sessions_and_the_zone(run, tmp_path,
                                                                                              capsys):
    saturdays = pd.date_range("2024-02-17", periods=12, freq="7D")  # Saturday 00:00 to Sunday 16:00 UTC, hourly
    stamps = pd.DatetimeIndex(np.concatenate([pd.date_range(day, periods=41, freq="h").values for day in saturdays]))
    path = write_csv(hourly_fx().iloc[: len(stamps)].set_axis(stamps), tmp_path / "weekends.csv", naive=True)
    capsys.readouterr()
    assert trade(run, path, tmp_path / "out") == 2
    assert refusal(capsys) == (
        f"error: {path}: the first {FIRST_DECISION_BAR} bars: {FIRST_DECISION_BAR} of them lie outside {SESSIONS}, "
        "the first at 2024-02-16 19:00:00-05:00; its naive stamps were read as UTC (the zone training read the run's "
        "data in): --timezone ZONE reads them in the file's zone")
    assert not (tmp_path / "out").exists()


def test_a_run_trained_before_its_zone_was_recorded_reads_the_exchange_zone_and_names_the_fix(run, tmp_path, capsys):
    """An older run folder (no data.json) reads naive stamps as before, in the exchange's zone: its history falls
    outside the sessions, which now stops with one line naming the flag that reads them right."""
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "data.json").unlink()
    capsys.readouterr()
    assert trade(old, run.parent / "later.csv", tmp_path / "out") == 2
    line = refusal(capsys)
    assert f"lie outside {SESSIONS}" in line and line.endswith(
        "its naive stamps were read as America/New_York (the exchange's zone): --timezone ZONE reads them in the "
        "file's zone")
    assert trade(old, run.parent / "later.csv", tmp_path / "utc", "--timezone", "UTC") == 0
    summary = json.loads((tmp_path / "utc" / "summary.json").read_text())
    assert summary["decisions"] == LATER_BARS - FIRST_DECISION_BAR
