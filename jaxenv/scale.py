"""Does the data live on its instrument's price scale? Bars that move less than a few ticks, or prices mostly off the
tick grid, mean the file holds another instrument: stops, targets and slippage in ticks would be nonsense, so loading
stops with an error naming the file, the instrument, the measured range and the fix: a built-in whose tick fits, or
the step the prices move by. Nothing is rounded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxenv.contracts import CONTRACTS, ContractSpec, price_text
from jaxenv.data import row_list

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


def same_calendar(a: ContractSpec, b: ContractSpec) -> bool:
    """Bars fall in the sessions of one exactly where they fall in the other's."""
    fields = ("timezone", "session_open", "session_close", "rth_open", "rth_close", "weekends")
    return all(getattr(a, field) == getattr(b, field) for field in fields)


def price_step(bars: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> float | None:
    """The coarsest decimal step (1, 0.1, ... 0.00000001) the prices live on, None where none fits."""
    return next((10.0**-k for k in range(9) if measure_scale(*bars, 10.0**-k).off_grid_share <= MAX_OFF_GRID_SHARE),
                None)


@dataclass(frozen=True)
class ScaleCheck:
    scale: Scale
    problem: str  # why the bars do not live on the instrument's price scale, with the fix; "" where they do
    fitting: list[ContractSpec]  # built-in instruments whose tick fits the bars, where the instrument's does not


def check_scale(
    bars: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], spec: ContractSpec, min_range_ticks: float,
    rows: np.ndarray | None = None,
) -> ScaleCheck:
    """The bars' scale in the instrument's ticks and, where they do not fit its tick size, the problem and the
    built-ins that fit; `rows` are the file's rows of the bars (default: their positions)."""
    scale = measure_scale(*bars, spec.tick_size)
    if fits(scale, min_range_ticks):
        return ScaleCheck(scale, "", [])
    where = (f"prices around {scale.median_price:.6g} with a median bar range of {scale.median_range_ticks:.3g} ticks "
             f"of {spec.symbol} (tick {price_text(spec.tick_size)})")
    fitting = [other for other in CONTRACTS.values() if fits(measure_scale(*bars, other.tick_size), min_range_ticks)]
    names = ", ".join(other.symbol for other in fitting)
    step = price_step(bars)
    if fitting and all(same_calendar(other, fitting[0]) for other in fitting):
        fix = f"--set data.contract={fitting[0].symbol} (built-in instruments whose tick fits these prices: {names})"
    elif fitting:
        fix = f"--set data.contract=NAME (built-in instruments whose tick fits these prices: {names})"
    elif step is not None:
        fix = (f"--set data.contract.tick_size={price_text(step)}, the step its prices move by (the rest of "
               f"{spec.symbol} stays; name another instrument with data.contract=NAME, or give a mapping: "
               "docs/environment.md)")
    else:
        fix = "--set data.contract=NAME or a mapping with the file's tick_size and point_value (docs/environment.md)"
    problems, hints = [], []
    if scale.median_range_ticks < min_range_ticks:
        problems.append(f"bars move less than {min_range_ticks:g} ticks")
        hints.append("if these bars really are this quiet, lower data.min_range_ticks")
    if scale.off_grid_share > MAX_OFF_GRID_SHARE:
        first = scale.first_off_grid_row if rows is None else rows[scale.first_off_grid_row]
        problems.append(f"{scale.off_grid_share:.0%} of prices are off its tick grid (first at "
                        f"{row_list(np.array([first]))})")
        if fitting and step is not None and scale.median_range_ticks >= min_range_ticks:
            hints.append(f"if they are {spec.symbol}'s prices adjusted (a continuous contract, splits, dividends), "
                         f"data.contract.tick_size={price_text(step)} keeps the rest of {spec.symbol}")
    hint = "".join(f"; {text}" for text in hints)
    problem = (f"{where}: {' and '.join(problems)}, so the file does not hold {spec.symbol}: slippage, stops and "
               f"targets in its ticks would be nonsense, and nothing is rounded to a grid the data does not live on. "
               f"Declare the instrument the file holds: {fix}{hint}")
    return ScaleCheck(scale, problem, fitting)
