"""The prompt-field rows for the envs chosen at a query step, built on the host from the market's arrays and
a few scalars of each env's state (gathered on device, so only [B] values cross to the host)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bridge.protocol import FIELD_INDEX, NUM_PROMPT_FIELDS
from jaxenv.env import EnvState, recent_win_rate
from jaxenv.market import Market

STATE_FIELDS = ("t", "side", "entry_price", "balance", "equity", "recent_count", "consecutive_losses")


def gather_state(state: EnvState, env_ids: jax.Array) -> dict[str, jax.Array]:
    """The state scalars prompts need, for env_ids [B] only (jit this with the selection)."""
    out = {k: jnp.take(getattr(state, k), env_ids, axis=0) for k in STATE_FIELDS}
    out["win_rate"] = jnp.take(recent_win_rate(state), env_ids, axis=0)
    return out


class PromptFieldBuilder:
    def __init__(self, market: Market, market_symbols: list[str], contracts: int):
        self.market = market
        self.contracts = contracts
        symbol = market.contract.symbol
        self.market_index = float(market_symbols.index(symbol)) if symbol in market_symbols else np.nan
        self.minute = market.sessions.minute_of_day.astype(np.float32)
        self.point_value = market.contract.point_value

    def build(self, scalars: dict[str, np.ndarray]) -> np.ndarray:
        """[B, len(PROMPT_FIELDS)] float32 from the gathered state scalars (numpy)."""
        t = np.asarray(scalars["t"], np.int64)
        side = np.asarray(scalars["side"], np.float64)
        price = self.market.close[t]
        out = np.zeros((len(t), NUM_PROMPT_FIELDS), np.float32)
        out[:, FIELD_INDEX["market"]] = self.market_index
        out[:, FIELD_INDEX["minute_of_day"]] = self.minute[t]
        out[:, FIELD_INDEX["price"]] = price
        indicators = self.market.indicators  # raw values (jaxenv.features.INDICATORS), not the network's scaling
        out[:, FIELD_INDEX["adx"]] = indicators["adx14"][t]
        out[:, FIELD_INDEX["rsi"]] = indicators["rsi14"][t]
        out[:, FIELD_INDEX["vwap_dist"]] = indicators["vwap_dist_pct"][t]
        out[:, FIELD_INDEX["momentum"]] = indicators["ret15_pct"][t]
        out[:, FIELD_INDEX["position"]] = side * self.contracts
        out[:, FIELD_INDEX["unrealized_pnl"]] = np.asarray(scalars["equity"]) - np.asarray(scalars["balance"])
        out[:, FIELD_INDEX["win_rate"]] = np.where(np.asarray(scalars["recent_count"]) > 0, scalars["win_rate"], np.nan)
        out[:, FIELD_INDEX["consecutive_losses"]] = np.asarray(scalars["consecutive_losses"])
        out[:, FIELD_INDEX["balance"]] = np.asarray(scalars["balance"])
        out[:, FIELD_INDEX["headline"]] = np.where(self.market.text_index[t] >= 0, self.market.text_index[t], -1)
        return out
