"""Constants both sides of the process boundary agree on: the action vocabulary, answer statuses and prompt fields.
The environment (jaxenv), the agents and the sidecar all take the actions from here; this module imports nothing."""

from __future__ import annotations

# The trading actions: ids, names and count (docs/design.md, "Contracts").
ACTIONS: tuple[str, ...] = ("HOLD", "BUY", "SELL", "MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL")
HOLD, BUY, SELL, MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL = range(len(ACTIONS))
NUM_ACTIONS = len(ACTIONS)


def action_flags(actions: tuple[int, ...]) -> tuple[bool, ...]:
    """One flag per action id, set for `actions`: a row to AND with or out of an action mask."""
    return tuple(a in actions for a in range(NUM_ACTIONS))

# Answer statuses. Anything but STATUS_OK carries uniform probabilities and confidence 0.
STATUS_OK = 0
STATUS_PARSE_ERROR = 1  # the model answered, but no action could be read from it
STATUS_TIMEOUT = 2  # no answer within collect()'s timeout
STATUS_BACKEND_ERROR = 3  # the sidecar died, hung or raised
# The advisor answered PASS: it has no view on this prompt. Not a failure: the agent acts as without advice (the
# trust gate is 0, the policy alone), where a HOLD answer would pull the agent out of the market.
STATUS_NO_VIEW = 4
STATUS_NAMES: tuple[str, ...] = ("ok", "parse_error", "timeout", "backend_error", "no_view")
NO_VIEW_ANSWER = "PASS"  # the answer's first field that says "no view"

# The mock advisor's answer modes (llm_sidecar.backends.MockBackend), chosen by the agent's config.
MOCK_ANSWERS: tuple[str, ...] = ("rules", "news", "news_pass", "random")

# The columns of the float32 prompt-field array, one row per env, in this order.
# Categorical fields are stored as floats holding small integers.
PROMPT_FIELDS: tuple[str, ...] = (
    "market",  # index into the template's `markets` list (0 = first symbol)
    "minute_of_day",  # exchange time, minutes since midnight (0..1439), rendered HH:MM
    "price",  # last close
    "adx",  # ADX(14), 0..100
    "rsi",  # RSI(14), 0..100
    "vwap_dist",  # distance of price from session VWAP, percent
    "momentum",  # price change over the momentum window, percent
    "position",  # signed contracts: >0 long, <0 short, 0 flat
    "unrealized_pnl",  # open-trade P&L in account currency
    "win_rate",  # fraction of winning closed trades, 0..1
    "consecutive_losses",  # losing trades in a row
    "balance",  # account balance in account currency
    "headline",  # index into the text table of headlines; <0 or NaN = no headline
)
FIELD_INDEX: dict[str, int] = {name: i for i, name in enumerate(PROMPT_FIELDS)}
NUM_PROMPT_FIELDS = len(PROMPT_FIELDS)
