"""Typed configuration of the environment and its data. Every field has a default; YAML sets override them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PropFirmRules:
    """Prop-firm account rules. `version` names the rule set so a run records which one it used."""

    version: str = "apex-50k-2025"
    starting_balance: float = 50_000.0
    trailing_drawdown: float = 2_500.0
    # The threshold trails the peak until it reaches starting_balance + trail_stop_offset, then freezes.
    trail_stop_offset: float = 100.0
    profit_target: float = 3_000.0  # an evaluation passes when equity reaches starting_balance + this (reports only)
    max_contracts: int = 10
    flat_by: str = "16:59"  # exchange time; any position is closed on the last bar at or before this
    no_entry_minutes_before_close: int = 15  # no new entries this close to the session's last bar


@dataclass
class EnvConfig:
    window: int = 20  # bars in the observation's market window
    extended_features: bool = True  # 261-float observation; False gives the 228 form
    contracts_per_trade: int = 1
    slippage_ticks: float = 1.0  # market and stop orders fill this many ticks worse
    stop_atr_mult: float = 1.5
    target_atr_mult: float = 3.0
    trail_atr_mult: float = 1.0
    breakeven_trigger_atr: float = 1.0  # MOVE_TO_BE is valid once unrealised profit reaches this many ATRs
    max_steps_in_episode: int = 1_950  # five regular sessions of minute bars
    reward_scale: float = 0.01  # reward = change of equity in dollars × this
    breach_penalty: float = 0.0  # extra dollars subtracted on a drawdown breach (before scaling)
    prop_firm: PropFirmRules = field(default_factory=PropFirmRules)


@dataclass
class DataConfig:
    source: str = "synthetic:default"  # a CSV/Parquet path or synthetic:PRESET
    contract: str = "NQ"  # the instrument the bars are of: tick size, tick value, commission, sessions
    timezone: str = "America/New_York"
    date_format: str | None = None  # strptime format for unusual timestamp strings
    drop_invalid_rows: bool = False  # drop rows that fail validation (and report how many) instead of failing
    text_column: str | None = None  # e.g. "headline"; None = use a column named headline/news/text if present
    synthetic_days: int = 120
    synthetic_seed: int = 0
    train_frac: float = 0.70
    val_frac: float = 0.15  # the rest is the test split
