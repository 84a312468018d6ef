"""Prices in the files a user reads are the instrument's (EURUSD's five decimals), money is in cents: evaluate.py's
trades.csv and trade.py's fills.csv, on a tiny run trained on hourly EURUSD bars."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from agents.config import load_config
from agents.training.loop import train
from jaxenv.contracts import get_contract
from jaxenv.market import FIRST_DECISION_BAR
from tests.market_shapes import hourly_fx, to_utc, write_csv

TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "data.contract=EURUSD", "env.max_steps_in_episode=200",
        "checkpoint.every_updates=1", "checkpoint.eval_every_updates=0", "total_steps=128"]


def decimals(text: str) -> int:
    return len(text.partition(".")[2])


@pytest.fixture(scope="module")
def fx_run(tmp_path_factory) -> Path:
    """A folder holding bars.csv (80 days of hourly EURUSD bars) and run/ (one update trained on them)."""
    root = tmp_path_factory.mktemp("fx")
    bars = write_csv(to_utc(hourly_fx(days=80)), root / "bars.csv")
    train(load_config(None, TINY + [f"data.source={bars}"]), root / "run")
    return root


def test_trades_csv_gives_eurusd_prices_with_five_decimals_and_their_pnl(fx_run, tmp_path):
    from agents.evaluation.cli import main

    out = tmp_path / "eval"
    assert main(["--run-dir", str(fx_run / "run"), "--checkpoint", "latest", "--split", "val", "--sample",
                 "--out", str(out), "--no-progress"]) == 0
    trades = pd.read_csv(out / "trades.csv", dtype={"entry_price": str, "exit_price": str, "pnl": str})
    prices = [*trades["entry_price"], *trades["exit_price"]]
    assert len(trades) > 1 and len(set(prices)) > 1
    assert all(decimals(p) == 5 for p in prices) and all(decimals(p) == 2 for p in trades["pnl"])
    fx = get_contract("EURUSD")
    side = trades["side"].map({"long": 1, "short": -1})
    moved = side * (trades["exit_price"].astype(float) - trades["entry_price"].astype(float))
    expected = (moved * fx.point_value - 2 * fx.commission_per_side) * trades["contracts"]
    assert trades["pnl"].astype(float).to_numpy() == pytest.approx(expected.to_numpy(), abs=0.05)


def test_fills_csv_has_no_float_noise(fx_run, tmp_path):
    from agents.trading.cli import main

    bars = pd.read_csv(fx_run / "bars.csv", dtype=str)
    bars.iloc[-(FIRST_DECISION_BAR + 240):].to_csv(tmp_path / "F.csv", index=False)  # ten sessions after a history
    out = tmp_path / "trade"
    assert main(["--run-dir", str(fx_run / "run"), "--data", str(tmp_path / "F.csv"), "--checkpoint", "latest",
                 "--gate", "off", "--out", str(out), "--no-progress"]) == 0
    fills = pd.read_csv(out / "fills.csv", dtype=str, keep_default_na=False)
    assert len(fills) > 1
    assert all(decimals(p) <= 5 for p in fills["price"]) and len(set(fills["price"])) > 1
    assert all(decimals(m) == 2 for m in [*fills["commission"], *filter(None, fills["trade_pnl"])])
