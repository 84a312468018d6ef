"""Does the data live on its instrument's price scale? Bars that move less than a few ticks, or prices mostly off the
tick grid, mean the file holds another instrument: stops, targets and slippage in ticks would be nonsense, so loading
stops with an error naming the file, the instrument, the measured range and the fix. Nothing is rounded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxenv.contracts import CONTRACTS, ContractSpec, price_text
from jaxenv.data import DataValidationError, row_list

PRICE_COLUMNS = ("open", "high", "low", "close")
MAX_OFF_GRID_SHARE = 0.5  # more prices than this off the tick grid: the file is not priced in this instrument's ticks


@dataclass(frozen=True)
class Scale:
    median_range_ticks: float  # median of (high - low) / tick size over all bars
    off_grid_share: float  # share of open/high/low/close prices that are not a whole number of ticks
    first_off_grid_row: int  # 0-based row of the first such price, -1 if none
    median_price: float


def off_grid(prices: np.ndarray, tick: float) -> np.ndarray:
    ticks = prices / tick
    return np.abs(ticks - np.round(ticks)) > 1e-3


def measure_scale(open_: np.ndarray, high: np.ndarray, low: np.ndarray, close: np.ndarray, tick: float) -> Scale:
    prices = np.stack([open_, high, low, close], axis=1)
    off = off_grid(prices, tick)
    rows = np.flatnonzero(off.any(axis=1))
    return Scale(
        median_range_ticks=float(np.median((high - low) / tick)),
        off_grid_share=float(off.mean()),
        first_off_grid_row=int(rows[0]) if len(rows) else -1,
        median_price=float(np.median(close)),
    )


def fits(scale: Scale, min_range_ticks: float) -> bool:
    return scale.median_range_ticks >= min_range_ticks and scale.off_grid_share <= MAX_OFF_GRID_SHARE


def check_scale(
    bars: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], spec: ContractSpec, source: str, min_range_ticks: float
) -> Scale:
    """The bars' scale in the instrument's ticks; raises DataValidationError when they do not fit its tick size."""
    scale = measure_scale(*bars, spec.tick_size)
    if fits(scale, min_range_ticks):
        return scale
    where = (f"{source}: prices around {scale.median_price:.6g} with a median bar range of "
             f"{scale.median_range_ticks:.3g} ticks of {spec.symbol} (tick {price_text(spec.tick_size)})")
    fitting = [symbol for symbol, other in CONTRACTS.items()
               if fits(measure_scale(*bars, other.tick_size), min_range_ticks)]
    if fitting:
        fix = f"--set data.contract=NAME (built-in instruments whose tick fits these prices: {', '.join(fitting)})"
    else:
        fix = "--set data.contract=NAME or a mapping with the file's tick_size and point_value (docs/environment.md)"
    problems, hints = [], []
    if scale.median_range_ticks < min_range_ticks:
        problems.append(f"bars move less than {min_range_ticks:g} ticks")
        hints.append("if these bars really are this quiet, lower data.min_range_ticks")
    if scale.off_grid_share > MAX_OFF_GRID_SHARE:
        first = row_list(np.array([scale.first_off_grid_row]))
        problems.append(f"{scale.off_grid_share:.0%} of prices are off its tick grid (first at {first})")
        hints.append("for adjusted prices, a mapping with a finer tick_size and the point_value")
    raise DataValidationError(
        f"{where}: {' and '.join(problems)}, so the file does not hold {spec.symbol}: slippage, stops and targets in "
        f"its ticks would be nonsense, and nothing is rounded to a grid the data does not live on. Declare the "
        f"instrument the file holds: {fix}; {'; '.join(hints)}"
    )
