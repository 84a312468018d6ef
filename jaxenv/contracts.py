"""Futures contract specifications and their trading sessions (exchange time, America/New_York)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContractSpec:
    symbol: str
    name: str
    tick_size: float  # price increment
    tick_value: float  # dollars per tick per contract
    commission_per_side: float  # dollars per contract per side, exchange + clearing + broker
    rth_open: str  # regular trading hours, exchange time zone "HH:MM"
    rth_close: str
    eth_open: str  # electronic session open (previous evening) "HH:MM"
    eth_close: str

    @property
    def point_value(self) -> float:
        """Dollars per full point of price per contract."""
        return self.tick_value / self.tick_size


# Commissions are typical prop-firm (Rithmic/Tradovate) round-number rates per side.
CONTRACTS: dict[str, ContractSpec] = {
    c.symbol: c
    for c in [
        ContractSpec("NQ", "E-mini Nasdaq-100", 0.25, 5.00, 2.14, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("ES", "E-mini S&P 500", 0.25, 12.50, 2.14, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("MNQ", "Micro E-mini Nasdaq-100", 0.25, 0.50, 0.52, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("MES", "Micro E-mini S&P 500", 0.25, 1.25, 0.52, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("YM", "E-mini Dow", 1.00, 5.00, 2.14, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("RTY", "E-mini Russell 2000", 0.10, 5.00, 2.14, "09:30", "16:00", "18:00", "17:00"),
        ContractSpec("CL", "Crude Oil", 0.01, 10.00, 2.24, "09:00", "14:30", "18:00", "17:00"),
        ContractSpec("GC", "Gold", 0.10, 10.00, 2.24, "08:20", "13:30", "18:00", "17:00"),
    ]
}


def get_contract(symbol: str) -> ContractSpec:
    try:
        return CONTRACTS[symbol.upper()]
    except KeyError:
        raise ValueError(f"unknown contract {symbol!r}; known: {', '.join(sorted(CONTRACTS))}") from None
