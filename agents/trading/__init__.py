"""A trained agent on bars as they arrive: the decision API (Agent, Decision, Order), bars and their features (Bar,
BarBook), the advisor in real time, brokers (Broker, PaperBroker) and scripts/trade.py's run (cli, journal, feed)."""

from agents.trading.agent import Agent, Decision, Order
from agents.trading.bars import Bar, BarBook, BarRefused
from agents.trading.broker import Broker, Fill, PaperBroker

__all__ = ["Agent", "Bar", "BarBook", "BarRefused", "Broker", "Decision", "Fill", "Order", "PaperBroker"]
