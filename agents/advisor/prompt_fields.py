"""The prompt-field rows of advice keys (agents.advice.table), built on the host from the market's arrays: a key's
prompt is the market at its block's last bar and the key's position side, nothing of any one account."""

from __future__ import annotations

import numpy as np

from agents.advice.table import block_last_bar, key_block, key_side, num_blocks
from bridge.prompts import PromptInstrument
from bridge.protocol import FIELD_INDEX, NUM_ACTIONS, NUM_PROMPT_FIELDS, STATUS_NO_VIEW
from jaxenv.contracts import KIND_WORDS, ContractSpec, price_decimals
from jaxenv.market import Market

# Prompt fields of one account (bridge.PROMPT_FIELDS): a key's answer is shared by every env with its side, so its
# prompt cannot hold them.
ACCOUNT_FIELDS = ("unrealized_pnl", "win_rate", "consecutive_losses", "balance")


def prompt_instrument(spec: ContractSpec) -> PromptInstrument:
    """What the advisor's prompts say of the run's instrument: its symbol, its kind in words, its tick's decimals."""
    return PromptInstrument(spec.symbol, KIND_WORDS[spec.kind], price_decimals(spec))


class PromptFieldBuilder:
    def __init__(self, market: Market, market_symbols: list[str], contracts: int, interval: int,
                 shuffled: bool = False):
        """`shuffled` (hybrid.shuffled, a control): a key's prompt is the market of the block one session earlier in
        the key's own split (`shift` blocks back): from its past, never its future nor another split's. A key with no
        such block (in its split's first session) has no prompt: the control has no view there (`without_past`)."""
        self.market = market
        self.contracts = contracts
        self.interval = interval
        blocks = num_blocks(market.num_bars, interval)
        session_bars = max(market.session_minutes // max(market.interval_minutes, 1), 1)
        self.shift = -(-session_bars // interval) if shuffled else 0
        self.blocks = blocks
        # per block, the first bar of the split its last bar lies in (0 outside every split)
        last = block_last_bar(np.arange(blocks), interval, market.num_bars)
        self.split_start = np.zeros(blocks, np.int64)
        for start, end in market.splits.values():
            self.split_start[(last >= start) & (last < end)] = start
        symbol = market.contract.symbol
        self.market_index = float(market_symbols.index(symbol)) if symbol in market_symbols else np.nan
        self.minute = market.sessions.minute_of_day.astype(np.float32)

    def rendered_bar(self, keys: np.ndarray) -> np.ndarray:
        """The bar each key's prompt is rendered from: its block's last bar (the data's last, for a short block); for
        the shuffled control, the last bar of the block `shift` blocks earlier (-1: none in the key's split)."""
        own = key_block(np.asarray(keys, np.int64))
        bar = block_last_bar(own - self.shift, self.interval, self.market.num_bars)
        return np.where(bar >= self.split_start[own], bar, -1)

    def without_past(self, answers) -> None:
        """The shuffled control's keys with no block to read (rendered_bar -1) answered PASS (no view) in `answers`
        (an agents.advisor.store.KnownAdvice), so that nobody asks for them."""
        keys = np.flatnonzero(self.rendered_bar(np.arange(answers.num_keys)) < 0)
        keys = keys[~answers.filled()[keys]]
        answers.put(keys, np.full((len(keys), NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32), np.zeros(len(keys), np.float32),
                    np.full(len(keys), STATUS_NO_VIEW, np.int32), 0)

    def build(self, keys: np.ndarray) -> np.ndarray:
        """[B, len(PROMPT_FIELDS)] float32 for keys [B]; the account fields are NaN."""
        t = self.rendered_bar(keys)
        side = key_side(np.asarray(keys, np.int64))
        out = np.full((len(t), NUM_PROMPT_FIELDS), np.nan, np.float32)
        out[:, FIELD_INDEX["market"]] = self.market_index
        out[:, FIELD_INDEX["minute_of_day"]] = self.minute[t]
        out[:, FIELD_INDEX["price"]] = self.market.close[t]
        indicators = self.market.indicators  # raw values (jaxenv.features.INDICATORS), not the network's scaling
        out[:, FIELD_INDEX["adx"]] = indicators["adx14"][t]
        out[:, FIELD_INDEX["rsi"]] = indicators["rsi14"][t]
        out[:, FIELD_INDEX["vwap_dist"]] = indicators["vwap_dist_pct"][t]
        out[:, FIELD_INDEX["momentum"]] = indicators["ret15_pct"][t]
        out[:, FIELD_INDEX["position"]] = side * self.contracts
        out[:, FIELD_INDEX["headline"]] = np.where(self.market.text_index[t] >= 0, self.market.text_index[t], -1)
        return out
