"""Shared fixtures: small hand-made markets whose every bar a test can set."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

from jaxenv.config import DataConfig, EnvConfig  # noqa: E402
from jaxenv.market import Market, market_from_frame  # noqa: E402

SESSION_BARS = 390


def rth_index(days: int) -> pd.DatetimeIndex:
    session_days = pd.bdate_range("2024-03-04", periods=days)
    minutes = pd.to_timedelta(np.arange(SESSION_BARS) + 9 * 60 + 30, unit="min")
    stamps = (session_days.values[:, None] + minutes.values[None, :]).reshape(-1)
    return pd.DatetimeIndex(stamps).tz_localize("America/New_York")


def flat_frame(days: int = 3, price: float = 18_000.0) -> pd.DataFrame:
    """Bars that barely move: open = close = price, high/low one point away."""
    index = rth_index(days)
    n = len(index)
    frame = pd.DataFrame(
        {"open": price, "high": price + 1.0, "low": price - 1.0, "close": price, "volume": 1000.0},
        index=index,
    )
    frame.index.name = "timestamp"
    return frame.astype({"volume": float}) if n else frame


class HandMarket:
    """A flat market with a constant ATR whose bars a test edits before building the Market."""

    def __init__(self, contract: str = "NQ", days: int = 8, price: float = 18_000.0, atr: float = 10.0):
        self.frame = flat_frame(days, price)
        self.contract = contract
        self.atr = atr

    def set_bar(self, i: int, o: float, h: float, lo: float, c: float) -> None:
        self.frame.iloc[i, self.frame.columns.get_indexer(["open", "high", "low", "close"])] = [o, h, lo, c]

    def build(self) -> Market:
        market = market_from_frame(self.frame, "hand-made", DataConfig(contract=self.contract))
        market.atr = np.full_like(market.atr, self.atr)  # stops and targets in round numbers
        return market


@pytest.fixture
def hand_market():
    return HandMarket


def bar_at(days_offset: int, hh: int, mm: int) -> int:
    """Index of the bar stamped hh:mm on the given session (0-based)."""
    return days_offset * SESSION_BARS + (hh * 60 + mm) - (9 * 60 + 30)


def account_config(config: EnvConfig | None = None, **limits) -> EnvConfig:
    """`config` (EnvConfig() by default) with its prop firm's account limits set (max_contracts,
    half_size_until_threshold, correlated): max_contracts .inf (no cap) unless given."""
    config = config or EnvConfig()
    rules = dataclasses.replace(config.prop_firm, **{"max_contracts": math.inf, **limits})
    return dataclasses.replace(config, prop_firm=rules)


@pytest.fixture(autouse=True)
def advice_store_in_tmp(tmp_path, monkeypatch):
    """A model advisor's default advice store (runs/advice_store) lives in the test's own folder: a test run never
    starts from answers another one stored."""
    monkeypatch.setattr("agents.advisor.store.DEFAULT_ROOT", tmp_path / "advice_store")
