"""The paper broker: it fills a decision's orders as the environment does (the Broker protocol: agents.trading.orders).

A broker takes orders (`place`, idempotent by the order's id), cancels them, reports fills and the position. The
agent's account is the environment's: its fills are jaxenv.env's rules (a market order at the next bar's open plus
slippage, its stop and target from the decision bar's ATR, stops before targets, positions closed at the session's
end, the trailing drawdown), with the run's commission, slippage and contract. The paper broker reports exactly
those fills, so a paper run is evaluation's walk. A real broker fills on its own; the runner compares its position
with the agent's after every bar and stops on a difference (docs/trading.md shows how to plug one in).
"""

from __future__ import annotations

import dataclasses

from agents.trading.orders import Fill, Order
from jaxenv.env import EXIT_REASONS, NO_EXIT


class PaperBroker:
    """Fills as jaxenv.env does, from the account's move over each bar (`settle`)."""

    def __init__(self):
        # The orders placed since the last bar settled: only those could be placed again (a decision's orders are
        # placed after the bar before it settles, and a restart repeats at most the decision after the saved state).
        # Older ones are dropped, so the state saved after every bar does not grow with the run.
        self.placed: dict[str, Order] = {}
        self.entry: Order | None = None  # the order whose position is open
        self._fills: list[Fill] = []
        self._position = 0.0

    def place(self, order: Order) -> None:
        if order.id not in self.placed:
            self.placed[order.id] = order

    def cancel(self, order_id: str) -> None:
        self.placed.pop(order_id, None)

    def fills(self) -> list[Fill]:
        out, self._fills = self._fills, []
        return out

    def position(self) -> float:
        return self._position

    def settle(self, bar: int, time: str, row: dict, decided: Order | None) -> None:
        """Bar `bar` happened to the account (`row`: the trace's row of the decision before it, whose order was
        `decided`): the entry and exit it filled."""
        self.placed.clear()
        commission = float(row["commission"])
        exited = int(row["exit_reason"]) != NO_EXIT
        entered = int(row["entry_side"]) != 0 and decided is not None
        per_side = commission / (int(entered) + int(exited)) if (entered or exited) else 0.0
        if entered:  # at the bar's open; its stop or target may close it on the same bar
            self._fills.append(Fill(decided.id, bar, time, decided.side, decided.quantity, float(row["entry_price"]),
                                    "entry", per_side))
            self.entry = decided
        if exited and self.entry is not None:
            held, reason = self.entry, EXIT_REASONS[int(row["exit_reason"])]
            self._fills.append(Fill(f"{held.id}:{reason}", bar, time, -held.side, held.quantity,
                                    float(row["exit_price"]), reason, per_side, float(row["trade_pnl"])))
            self.entry = None
        self._position = float(row["position"]) * (self.entry.quantity if self.entry is not None else 0.0)

    def state(self) -> dict:
        """Its book as JSON: the orders placed since the last bar settled, the one whose position is open, fills not
        yet reported, the position."""
        return {"placed": [dataclasses.asdict(o) for o in self.placed.values()],
                "entry": self.entry and dataclasses.asdict(self.entry),
                "fills": [f.row() for f in self._fills], "position": self._position}

    def restore(self, state: dict) -> None:
        self.placed = {o["id"]: Order(**o) for o in state["placed"]}
        self.entry = Order(**state["entry"]) if state["entry"] else None
        self._fills = [Fill(**f) for f in state["fills"]]
        self._position = float(state["position"])
