"""Instruments: what one traded unit is worth, what it costs and when it trades. The built-in table and the
resolution of `data.contract` (a built-in name or a full specification) live here and nowhere else.

Every money field is per traded unit and per side: one contract (futures), one lot of `lot_size` currency units
(spot FX), one block of `lot_size` shares (cash equities). Session hours are exchange time in `timezone`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

KINDS = ("future", "spot_fx", "equity")
KIND_WORDS = {"future": "futures", "spot_fx": "spot FX", "equity": "stock"}  # a kind in prose (the advisor's prompt)
LOT_SIZES = {"future": 1.0, "spot_fx": 100_000.0, "equity": 100.0}  # a traded unit when lot_size is not given
_HHMM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


class InstrumentError(ValueError):
    """A bad instrument: an unknown name (field "") or a bad field of a specification."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}" if field else message)

    def keyed(self, key: str) -> str:
        """The message under a config key, e.g. data.contract.tick_size: must be > 0."""
        return f"{key}.{self.field}: {self.message}" if self.field else f"{key}: {self.message}"


@dataclass(frozen=True)
class ContractSpec:
    """One instrument. Give `tick_value` or `point_value` (the other follows from `tick_size`); spot FX and equities
    may give neither: a 1.0 move of the price is then worth `lot_size` in the instrument's currency."""

    symbol: str = ""
    name: str = ""  # a description; defaults to the symbol
    kind: str = "future"  # future | spot_fx | equity
    tick_size: float = 0.0  # smallest price increment: stops, targets and slippage use it
    tick_value: float = 0.0  # money per tick per traded unit
    point_value: float = 0.0  # money per 1.0 of price per traded unit
    # What one traded unit holds; 0 = the kind's usual: 1 contract, 100,000 currency units, 100 shares.
    lot_size: float = 0.0
    commission_per_side: float = 0.0  # money per traded unit per side (spreads of spot FX included here)
    currency: str = "USD"  # of every money figure: P&L, commissions, the account
    timezone: str = "America/New_York"  # the exchange's zone: session hours are in it, market stamps converted to it
    # The full trading session, "HH:MM" exchange time. Open later than close: it opens the evening before the day it
    # closes on (18:00-17:00); open equal to close: 24 hours (17:00-17:00 for spot FX).
    session_open: str = "18:00"
    session_close: str = "17:00"
    rth_open: str = ""  # regular trading hours inside the session; "" = the session itself
    rth_close: str = ""
    weekends: bool = False  # sessions also close on Saturdays and Sundays (24x7 markets); else Monday to Friday
    flat_at_close: bool = False  # positions must be flat at each session's end (else they may be held across)


def _future(symbol: str, name: str, tick: float, tick_value: float, commission: float,
            rth: tuple[str, str] = ("09:30", "16:00")) -> ContractSpec:
    """A CME Globex future: 18:00-17:00 New York time, Sunday evening to Friday."""
    return ContractSpec(symbol, name, "future", tick, tick_value, tick_value / tick, 1.0, commission,
                        rth_open=rth[0], rth_close=rth[1])


# Commissions are typical prop-firm (Rithmic/Tradovate) round-number rates per side; spot FX's is a 0.5 pip cost of
# spread and commission per side, an equity's $0.005 a share.
CONTRACTS: dict[str, ContractSpec] = {
    c.symbol: c
    for c in [
        _future("NQ", "E-mini Nasdaq-100", 0.25, 5.00, 2.14),
        _future("ES", "E-mini S&P 500", 0.25, 12.50, 2.14),
        _future("MNQ", "Micro E-mini Nasdaq-100", 0.25, 0.50, 0.52),
        _future("MES", "Micro E-mini S&P 500", 0.25, 1.25, 0.52),
        _future("YM", "E-mini Dow", 1.00, 5.00, 2.14),
        _future("RTY", "E-mini Russell 2000", 0.10, 5.00, 2.14),
        _future("CL", "Crude Oil", 0.01, 10.00, 2.24, ("09:00", "14:30")),
        _future("GC", "Gold", 0.10, 10.00, 2.24, ("08:20", "13:30")),
        _future("6E", "Euro FX", 0.00005, 6.25, 2.24, ("08:20", "15:00")),
        _future("ZN", "10-Year T-Note", 1 / 64, 15.625, 1.92, ("08:20", "15:00")),
        _future("MBT", "Micro Bitcoin (0.1 BTC)", 5.0, 0.50, 2.02, ("", "")),
        ContractSpec("EURUSD", "Euro / US dollar, spot, 100,000 lot", "spot_fx", 0.00001, 1.0, 100_000.0, 100_000.0,
                     5.00, session_open="17:00", session_close="17:00"),
        ContractSpec("GBPUSD", "British pound / US dollar, spot, 100,000 lot", "spot_fx", 0.00001, 1.0, 100_000.0,
                     100_000.0, 5.00, session_open="17:00", session_close="17:00"),
        ContractSpec("EQUITY", "US cash equity, 100 shares", "equity", 0.01, 1.0, 100.0, 100.0, 0.50,
                     session_open="09:30", session_close="16:00"),
    ]
}


def is_hhmm(text: str) -> bool:
    return bool(_HHMM.match(text))


def known_zone(name: str) -> bool:
    """An IANA time zone name zoneinfo knows."""
    try:
        ZoneInfo(name)
        return True
    except (ZoneInfoNotFoundError, ValueError):
        return False


def known_instruments() -> str:
    return ", ".join(sorted(CONTRACTS))


def get_contract(symbol: str) -> ContractSpec:
    try:
        return CONTRACTS[symbol.strip().upper()]
    except KeyError:
        raise InstrumentError("", f"unknown instrument {symbol!r}; built-in: {known_instruments()}; or give a mapping "
                                  "with symbol, kind, tick_size, tick_value or point_value, commission_per_side, "
                                  "timezone and session hours (docs/environment.md)") from None


def minutes_of(hhmm: str) -> int:
    """'HH:MM' -> minutes after midnight."""
    hh, mm = hhmm.split(":")
    return int(hh) * 60 + int(mm)


def expand_base(value: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping that names a `base` instrument (a built-in name or a ContractSpec) and changes some of its fields ->
    all the fields: the base's, with the given ones changed. Money that follows from a changed field follows it: a new
    tick_size or point_value recomputes tick_value, a new tick_value recomputes point_value, and a new lot_size of
    spot FX or an equity whose 1.0 move was worth one lot recomputes both. So a finer tick (adjusted prices) keeps
    what a 1.0 move of the price is worth."""
    base = value["base"]
    if isinstance(base, str):
        try:
            base = get_contract(base)
        except InstrumentError as error:
            raise InstrumentError("base", error.message) from None
    elif not isinstance(base, ContractSpec):
        raise InstrumentError("base", f"expected the name of a built-in instrument, got {base!r}")
    changed = {key: item for key, item in value.items() if key != "base"}
    fields = dataclasses.asdict(base)
    if "tick_value" not in changed and ("tick_size" in changed or "point_value" in changed):
        fields["tick_value"] = 0.0
    elif "tick_value" in changed and "point_value" not in changed:
        fields["point_value"] = 0.0
    money_given = "tick_value" in changed or "point_value" in changed
    if "lot_size" in changed and base.kind != "future" and base.point_value == base.lot_size and not money_given:
        fields["tick_value"] = fields["point_value"] = 0.0
    return {**fields, **changed}


def resolve_contract(value: str | ContractSpec | Mapping[str, Any]) -> ContractSpec:
    """A built-in name, a ContractSpec or a mapping of its fields (or of a `base` instrument's fields to change) -> a
    complete, checked ContractSpec. Raises an InstrumentError naming the field ("tick_size: must be > 0")."""
    if isinstance(value, str):
        return get_contract(value)
    if isinstance(value, Mapping) and "base" in value:
        value = expand_base(value)
    if isinstance(value, Mapping):
        types = {f.name: f.type for f in dataclasses.fields(ContractSpec)}  # "float", "str", "bool"
        unknown = [k for k in value if k not in types]
        if unknown:
            raise InstrumentError(unknown[0], f"not a field of an instrument (fields: {', '.join(types)})")
        fields = {}
        for key, item in value.items():
            number = isinstance(item, (int, float)) and not isinstance(item, bool)
            if types[key] == "float" and number:
                item = float(item)
            elif not isinstance(item, {"float": float, "str": str, "bool": bool}[types[key]]):
                raise InstrumentError(key, f"expected {types[key]}, got {type(item).__name__} {item!r}")
            fields[key] = item
        value = ContractSpec(**fields)
    return _complete(value)


def _complete(spec: ContractSpec) -> ContractSpec:
    def fail(field: str, message: str):
        raise InstrumentError(field, message)

    if not spec.symbol.strip():
        fail("symbol", "an instrument needs a symbol")
    if spec.kind not in KINDS:
        fail("kind", f"must be one of {', '.join(KINDS)}, got {spec.kind!r}")
    if not (math.isfinite(spec.tick_size) and spec.tick_size > 0):
        fail("tick_size", f"must be > 0, got {spec.tick_size}")
    lot_size = spec.lot_size or LOT_SIZES[spec.kind]
    if not (math.isfinite(lot_size) and lot_size > 0):
        fail("lot_size", f"must be > 0, got {lot_size}")
    if spec.kind == "future" and lot_size != 1:
        fail("lot_size", "a future trades whole contracts (lot_size 1); env.contracts_per_trade sets how many")
    for field in ("tick_value", "point_value", "commission_per_side"):
        value = getattr(spec, field)
        if not (math.isfinite(value) and value >= 0):
            fail(field, f"must be >= 0, got {value}")
    tick_value, point_value = spec.tick_value, spec.point_value
    if tick_value == 0 and point_value == 0:
        if spec.kind == "future":
            fail("tick_value", "give tick_value or point_value (money per tick or per 1.0 of price, per contract)")
        point_value = lot_size
    if tick_value == 0:
        tick_value = point_value * spec.tick_size
    elif point_value == 0:
        point_value = tick_value / spec.tick_size
    elif not math.isclose(tick_value, point_value * spec.tick_size, rel_tol=1e-6):
        fail("tick_value", f"{tick_value} is not point_value × tick_size = {point_value * spec.tick_size:g}; "
                           "give one of them")
    if not known_zone(spec.timezone):
        fail("timezone", f"unknown time zone {spec.timezone!r} (an IANA name such as America/Chicago or UTC)")
    for field in ("session_open", "session_close", "rth_open", "rth_close"):
        value = getattr(spec, field)
        if (value or not field.startswith("rth")) and not is_hhmm(value):
            fail(field, f"expected HH:MM (24-hour exchange time), got {value!r}")
    if bool(spec.rth_open) != bool(spec.rth_close):
        fail("rth_open", "give both rth_open and rth_close, or neither")
    if spec.rth_open:
        start, end = minutes_of(spec.rth_open), minutes_of(spec.rth_close)
        length = (minutes_of(spec.session_close) - minutes_of(spec.session_open)) % 1440 or 1440
        into = (start - minutes_of(spec.session_open)) % 1440
        if not (start < end and into + (end - start) <= length):
            fail("rth_open", f"regular hours {spec.rth_open}-{spec.rth_close} must lie inside the session "
                             f"{spec.session_open}-{spec.session_close}")
    return dataclasses.replace(spec, name=spec.name or spec.symbol, tick_value=tick_value, point_value=point_value,
                               lot_size=lot_size)


def price_text(x: float) -> str:
    """A price or tick without float noise or exponents: 0.00005, 0.015625, 0.25."""
    return f"{x:.10f}".rstrip("0").rstrip(".")


def price_decimals(spec: ContractSpec) -> int:
    """The decimals the instrument's prices are quoted with: its tick's (0.25: 2, 0.00001: 5, 1/64: 6)."""
    return len(price_text(spec.tick_size).partition(".")[2])


def describe(spec: ContractSpec) -> str:
    """One line for reports: symbol, name, tick and point value, costs."""
    money = f"{spec.currency} " if spec.currency != "USD" else "$"
    unit = {"future": "contract", "spot_fx": f"lot of {spec.lot_size:,.0f}", "equity": f"{spec.lot_size:,.0f} shares"}
    cost = f"{money}{spec.commission_per_side:,.2f} per side"
    if spec.kind == "spot_fx":
        cost += f" ({spec.commission_per_side / (spec.tick_value * 10):.2g} pip)"  # a pip: 10 ticks
    elif spec.kind == "equity":
        cost += f" ({money}{spec.commission_per_side / spec.lot_size:.4g} a share)"
    tick = f"tick {price_text(spec.tick_size)} = {money}{spec.tick_value:,.4g}"
    return (f"{spec.symbol} ({spec.name}, {spec.kind}): {tick}, "
            f"point {money}{spec.point_value:,.6g} per {unit[spec.kind]}; {cost}")
