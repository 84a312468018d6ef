"""Typed configuration of the environment and its data. Every field has a default; YAML sets override them."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from jaxenv.contracts import ContractSpec, InstrumentError, get_contract, is_hhmm, known_zone, resolve_contract


@dataclass
class PropFirmRules:
    """An account's rules. `version` names the rule set so a run records which one it used; ACCOUNT_RULES holds the
    sets a config may name."""

    version: str = "apex-50k-2025"  # names the rule set, so a run records which one it used
    starting_balance: float = 50_000.0  # the account's balance at the start of each episode
    # The account is breached when equity falls this far below its peak (.inf = no trailing drawdown: never breached).
    trailing_drawdown: float = 2_500.0
    # The threshold trails the peak until it reaches starting_balance + trail_stop_offset, then freezes.
    trail_stop_offset: float = 100.0
    profit_target: float = 3_000.0  # an evaluation passes when equity reaches starting_balance + this (reports only)
    # The most contracts held at once across every instrument, in mini-equivalents: a built-in micro (MNQ, MES, MBT)
    # counts 0.1, any other contract 1 (.inf = no cap). One instrument: contracts_per_trade may not exceed it.
    max_contracts: float = 10.0
    # Several instruments: entries may use only half of max_contracts until the trailing threshold locks (stops
    # trailing); an account without a trailing drawdown never binds it.
    half_size_until_threshold: bool = False
    # Several instruments: pairs of symbols never held (or entered) on opposite sides at once, e.g. [[NQ, ES]]; a pair
    # naming an instrument not traded does not bind.
    correlated: list[list[str]] = field(default_factory=list)
    # Futures positions are closed on the last bar that ends by this time of day in `timezone` ("" = no such rule).
    # It binds futures only: spot FX and equities follow their instrument's flat_at_close.
    flat_by: str = "16:59"
    timezone: str = "America/New_York"  # the zone of flat_by
    no_entry_minutes_before_close: int = 15  # no new entries this close to the session's last bar


# The rule sets env.prop_firm may name (--set env.prop_firm=plain); the default account's comes first.
ACCOUNT_RULES = {rules.version: rules for rules in (
    PropFirmRules(),
    # A plain brokerage account: never breached, no flat-by time (the instrument's flat_at_close still binds), entries
    # until the close.
    PropFirmRules(version="plain", trailing_drawdown=math.inf, flat_by="", no_entry_minutes_before_close=0),
)}


@dataclass
class EnvConfig:
    window: int = 20  # bars in the observation's market window
    extended_features: bool = True  # 261-float observation; False gives the 228 form
    contracts_per_trade: int = 1  # contracts each entry buys or sells
    slippage_ticks: float = 1.0  # market and stop orders fill this many ticks worse
    stop_atr_mult: float = 1.5  # an entry's stop, this many ATRs from the fill
    target_atr_mult: float = 3.0  # an entry's target, this many ATRs from the fill
    trail_atr_mult: float = 1.0  # ENABLE_TRAIL: the stop trails the best price by this many ATRs
    breakeven_trigger_atr: float = 1.0  # MOVE_TO_BE is valid once unrealised profit reaches this many ATRs
    # Bars per episode; 0 = the data's default: five sessions of intraday bars (1,950 for regular-hours minute bars),
    # 252 daily bars (a trading year)
    max_steps_in_episode: int = 0
    reward_scale: float = 0.01  # reward = change of equity in dollars × this
    breach_penalty: float = 0.0  # extra dollars subtracted on a drawdown breach (before scaling)
    # The account's rules: the name of a set (apex-50k-2025, plain: jaxenv.config.ACCOUNT_RULES), or a mapping of
    # their fields (with `base: NAME`, that set's fields with the given ones changed; without, the default set's).
    prop_firm: PropFirmRules = field(default_factory=PropFirmRules)


@dataclass
class InstrumentSource:
    """One instrument of a set traded in one account (DataConfig.instruments): its contract and its bars."""

    contract: str | ContractSpec = ""  # a built-in name or a full ContractSpec (a mapping in YAML)
    source: str = ""  # a CSV/Parquet path or synthetic:PRESET


# How data.instruments' items are written, for its error lines
INSTRUMENT_FORMS = "SYMBOL=PATH, or a mapping {contract: SYMBOL or a full spec, source: PATH}"


@dataclass
class DataConfig:
    source: str = "synthetic:default"  # a CSV/Parquet path or synthetic:PRESET
    # The instrument the bars are of: a built-in name (jaxenv.contracts.CONTRACTS) or a full ContractSpec (a mapping
    # in YAML): tick size and value, costs, currency, session hours and the exchange's time zone.
    contract: str | ContractSpec = field(default_factory=lambda: get_contract("NQ"))
    # the zone of the file's naive stamps; "" = the instrument's exchange zone; auto = the likely zone that fits the
    # instrument's sessions best (a tie is an error; the load report names the choice)
    source_timezone: str = ""
    min_range_ticks: float = 2.0  # a median bar range below this many ticks means the file is another instrument
    date_format: str | None = None  # strptime format for unusual timestamp strings
    drop_invalid_rows: bool = False  # drop rows that fail validation (and report how many) instead of failing
    text_column: str | None = None  # e.g. "headline"; None = use a column named headline/news/text if present
    # A news file (CSV/Parquet: a timestamp, a headline and an optional symbol column) joined to the bars without
    # look-ahead (docs/environment.md, News files): a bar's context holds items stamped before its close; it replaces
    # the bars' own text. "" = none
    news: str = ""
    news_max_age: str = "1D"  # items older than this at a bar's close are not in its context (a pandas Timedelta)
    news_items: int = 3  # the newest items a bar's context holds, newest first, joined with " | "
    synthetic_days: int = 120  # trading days of a synthetic market
    synthetic_seed: int = 0  # the seed a synthetic market is drawn with
    train_frac: float = 0.70  # the first share of the bars: the training split; then validation
    val_frac: float = 0.15  # the rest is the test split
    # the splits by whole sessions instead ("train=0:60,val=60:72,test=74:86": sessions [a, b) counted from 0; the
    # sessions between splits are in none): a walk-forward's fold (jaxenv.folds). "" = the fractions above
    splits: str = ""
    # Several instruments traded in one account, in order (docs/training.md, Several instruments): each item SYMBOL=PATH
    # or a mapping {contract: SYMBOL or a full spec, source: PATH}; the other data keys apply to each. [] = the one
    # instrument of source and contract above
    instruments: list[str | InstrumentSource] = field(default_factory=list)


def resolve_instruments(items: list) -> list[InstrumentSource]:
    """data.instruments' items, each an InstrumentSource whose contract is a complete ContractSpec. A ValueError lists
    every bad item, one line each, under its key: an item of neither form, a contract that does not resolve, a symbol
    given twice."""
    errors, out, seen = [], [], {}
    for i, item in enumerate(items):
        key = f"data.instruments[{i}]"
        if isinstance(item, str):
            symbol, _, source = item.partition("=")
            item = InstrumentSource(symbol.strip(), source.strip()) if symbol.strip() and source.strip() else None
        if isinstance(item, InstrumentSource) and not (item.contract and item.source):
            errors.append(f"{key}: no {'source' if item.contract else 'contract'} (expected {INSTRUMENT_FORMS})")
            continue
        if not isinstance(item, InstrumentSource):
            errors.append(f"{key}: expected {INSTRUMENT_FORMS}, got {items[i]!r}")
            continue
        try:
            contract = resolve_contract(item.contract)
        except InstrumentError as error:
            errors.append(error.keyed(f"{key}.contract"))
            continue
        symbol = contract.symbol.upper()
        if symbol in seen:
            errors.append(f"{key}: {contract.symbol} is given twice (also data.instruments[{seen[symbol]}]); each "
                          "instrument once")
            continue
        seen[symbol] = i
        out.append(InstrumentSource(contract, item.source))
    if errors:
        raise ValueError("\n".join(errors))
    return out


def resolve_data_config(cfg: DataConfig) -> DataConfig:
    """`cfg` with its instrument resolved to a complete ContractSpec and its time zones checked; a ValueError names
    the key (data.contract.tick_size: must be > 0)."""
    try:
        contract = resolve_contract(cfg.contract)
    except InstrumentError as error:
        raise ValueError(error.keyed("data.contract")) from None
    if cfg.source_timezone not in ("", "auto") and not known_zone(cfg.source_timezone):
        raise ValueError(f"data.source_timezone: unknown time zone {cfg.source_timezone!r} (an IANA name such as UTC, "
                         "Europe/London or America/Chicago)")
    news_max_age(cfg)
    if cfg.splits:
        from jaxenv.folds import parse_splits

        parse_splits(cfg.splits)
    if isinstance(cfg.news_items, bool) or not isinstance(cfg.news_items, int) or cfg.news_items < 1:
        raise ValueError(f"data.news_items: the newest items a bar's context holds, a whole number >= 1; got "
                         f"{cfg.news_items!r}")
    return dataclasses.replace(cfg, contract=contract)


def news_max_age(cfg: DataConfig) -> pd.Timedelta:
    """data.news_max_age as a positive duration; a ValueError names the key."""
    text, reason = cfg.news_max_age, ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a spelling pandas deprecates (1d for 1D) is refused now, not later
            age = pd.Timedelta(text) if isinstance(text, str) else pd.NaT
    except (ValueError, Warning) as error:
        age, reason = pd.NaT, f": {error}"
    if pd.isna(age) or age <= pd.Timedelta(0):
        raise ValueError(f"data.news_max_age: expected a positive duration (a pandas Timedelta such as 1D, 12h or "
                         f"90min), got {text!r}{reason}")
    return age


def rules_fields(value: str | Mapping[str, Any]) -> dict[str, Any]:
    """Every field of the rule set a config names: ACCOUNT_RULES[value], or for a mapping that names a `base` set, its
    fields with the mapping's others changed. A ValueError names the known sets."""
    base = value if isinstance(value, str) else value["base"]
    if not isinstance(base, str) or base not in ACCOUNT_RULES:
        raise ValueError(f"unknown account rules {base!r} (known: {', '.join(ACCOUNT_RULES)})")
    changed = {} if isinstance(value, str) else {key: item for key, item in value.items() if key != "base"}
    return {**dataclasses.asdict(ACCOUNT_RULES[base]), **changed}


def rules_text(rules: PropFirmRules) -> str:
    """The rules in words, for reports: "balance 50,000, trailing drawdown 2,500, futures flat by 16:59
    America/New_York, no entries in the last 15 minutes, at most 10 contracts (mini-equivalents)", then the half-size
    rule and the correlated pairs where they are set."""
    drawdown = (f"trailing drawdown {rules.trailing_drawdown:,.0f}" if math.isfinite(rules.trailing_drawdown)
                else "no trailing drawdown")
    flat = f"futures flat by {rules.flat_by} {rules.timezone}" if rules.flat_by else "no flat-by time"
    minutes = rules.no_entry_minutes_before_close
    entries = f"no entries in the last {minutes} minutes" if minutes else "entries until the close"
    cap = (f"at most {rules.max_contracts:g} contract{'' if rules.max_contracts == 1 else 's'} (mini-equivalents)"
           if math.isfinite(rules.max_contracts) else "no cap on contracts")
    text = f"balance {rules.starting_balance:,.0f}, {drawdown}, {flat}, {entries}, {cap}"
    if rules.half_size_until_threshold:
        text += ", half of them until the threshold locks"
    if rules.correlated:
        text += ", never opposite sides on " + ", ".join("/".join(pair) for pair in rules.correlated)
    return text


def check_rules(rules: PropFirmRules) -> None:
    """A ValueError names the key of a prop-firm rule that cannot be read."""
    if not rules.trailing_drawdown > 0:
        raise ValueError(f"env.prop_firm.trailing_drawdown: must be > 0 (.inf: none), got {rules.trailing_drawdown!r}")
    if not rules.max_contracts > 0:
        raise ValueError(f"env.prop_firm.max_contracts: must be > 0 (.inf: no cap), got {rules.max_contracts!r}")
    for i, pair in enumerate(rules.correlated):
        if (isinstance(pair, str) or len(pair) != 2 or not all(isinstance(s, str) and s.strip() for s in pair)
                or pair[0].strip().upper() == pair[1].strip().upper()):
            raise ValueError(f"env.prop_firm.correlated[{i}]: each pair names two different symbols ([[NQ, ES]]), "
                             f"got {pair!r}")
    if rules.flat_by and not is_hhmm(rules.flat_by):
        raise ValueError(f"env.prop_firm.flat_by: expected HH:MM or \"\" (no rule), got {rules.flat_by!r}")
    if not known_zone(rules.timezone):
        raise ValueError(f"env.prop_firm.timezone: unknown time zone {rules.timezone!r}")
