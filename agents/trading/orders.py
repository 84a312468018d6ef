"""What a trading decision says and what a broker does with it, defined once: the `Order` a decision places, the
`Decision` itself, the `Fill` a broker reports, and the `Broker` protocol with every method scripts/trade.py calls."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol


@dataclass
class Order:
    """What a decision asks of the broker. `id` is the decision's own ("<bar>-<action>"): a broker that sees an id
    again ignores it, so a restart never places a second order for one decision."""

    id: str
    bar: int  # the decision bar; a market order fills at the next bar's open
    kind: str  # "market" (an entry with its bracket) or "stop" (move the protective stop)
    side: int  # +1 buy, -1 sell (for a stop move: the position's side)
    quantity: float
    stop_distance: float | None = None  # an entry's stop, in price units from its fill (the env's ATR rule)
    target_distance: float | None = None
    stop: float | None = None  # a stop move's new level; None while the stop trails the close
    trailing: bool | None = None  # a stop move: trail the close from the next bar (True) or stop trailing (False)


@dataclass
class Decision:
    bar: int  # the bar's index in the feed
    time: str  # its stamp
    action: str  # bridge.protocol.ACTIONS
    order: Order | None
    position: int  # the side held when deciding (-1, 0, +1)
    equity: float  # at the bar's close
    drawdown_left: float  # dollars above the trailing-drawdown threshold
    advice: dict | None = None  # the advice in force: action, confidence, key; None without any
    trust: float | None = None  # the trust gate's weight on the advice (learned fusion, advice in force)
    veto: list[str] = field(default_factory=list)  # the risk veto's rules that held an action back
    bound: bool | None = None  # the advice's record binds the account to it (bind_on=record)
    latency_ms: float = 0.0  # from on_bar's call to the decision


@dataclass
class Fill:
    order_id: str
    bar: int  # the bar it filled on
    time: str
    side: int  # +1 bought, -1 sold
    quantity: float
    price: float
    reason: str  # "entry", or the exit's (jaxenv.env.EXIT_REASONS: stop_loss, take_profit, session_close, ...)
    commission: float
    trade_pnl: float | None = None  # an exit's: the round trip's P&L after both commissions

    def row(self) -> dict:
        return asdict(self)


class Broker(Protocol):
    """Where orders go. scripts/trade.py calls these, and nothing else, of the broker it trades with."""

    def place(self, order: Order) -> None:
        """Sends `order`; an id already placed is ignored (a restart repeats the decision, not the order)."""

    def cancel(self, order_id: str) -> None:
        """Cancels a working order (a stop or target still open)."""

    def settle(self, bar: int, time: str, row: dict, decided: Order | None) -> None:
        """Bar `bar` closed (`row`: the agent's account over it, jaxenv.walk_split's columns; `decided`: the entry
        order the decision before it placed, if any). A venue's broker learns its fills from the venue and may ignore
        this; the paper broker fills from it."""

    def fills(self) -> list[Fill]:
        """The fills since the last call, oldest first."""

    def position(self) -> float:
        """Signed contracts held now."""

    def state(self) -> dict:
        """What a restart needs, as JSON (the paper broker's book; a venue's broker may return {} and ask the venue)."""

    def restore(self, state: dict) -> None:
        """The broker as `state` left it."""
