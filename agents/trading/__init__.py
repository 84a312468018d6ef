"""A trained agent on bars as they arrive: the decision API (Agent), what it decides and what a broker does with it
(Decision, Order, Fill, Broker), bars and their features (Bar, BarBook), the advisor in real time, the paper broker and
scripts/trade.py's run (cli, journal, feed)."""

from agents.trading.agent import Agent
from agents.trading.bars import Bar, BarBook, BarRefused
from agents.trading.broker import PaperBroker
from agents.trading.orders import Broker, Decision, Fill, Order

__all__ = ["Agent", "Bar", "BarBook", "BarRefused", "Broker", "Decision", "Fill", "Order", "PaperBroker"]
