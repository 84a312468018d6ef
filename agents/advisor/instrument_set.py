"""The advisor on a set of instruments traded in one account (issue 77): one `Advisor` per instrument.

Instrument i's advisor is the one-market advisor on `market_set.markets[i]`, the instrument's bars on the set's joint
timeline (a bar where it has none carries its close and features forward, never a later bar's). Its keys are that
market's (bar block of the joint timeline, position side), so a key of the set is (instrument, block, side): each
instrument has its own key space and its own table. Its prompts name the instrument (its contract: symbol, kind, price
decimals), and its store's identity holds the whole set in order besides the instrument's own bars, so an answer
about NQ in the set NQ + ES is never read in another set nor on NQ's own file.

    with closing(each_advisor(hybrid, llm, env, data, market_set, capacity)) as advisors:  # one open at a time
        for i, advisor in advisors:
            ...                                                                    # closed (store saved) after
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from agents.advisor.advisor import Advisor
from agents.config import HybridConfig
from jaxenv.config import DataConfig, EnvConfig


def instrument_data(data: DataConfig, contract) -> DataConfig:
    """`data` as one instrument of a set: its contract is the instrument's (what its prompts name)."""
    return dataclasses.replace(data, contract=contract, instruments=[])


def each_advisor(hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market_set, capacity: int,
                 stop: Callable[[], bool] | None = None, **open_kw) -> Iterator[tuple[int, Advisor]]:
    """Each instrument's advisor in the set's order, opened as `Advisor.open(..., **open_kw)` opens one and closed
    (its store saved) before the next opens: one model in memory at a time. None opens once `stop()` holds; a caller
    that may leave early closes the iterator (contextlib.closing), which closes the advisor it holds."""
    for i, market in enumerate(market_set.markets):
        if stop is not None and stop():
            return
        advisor = Advisor.open(hybrid, llm, env, instrument_data(data, market.contract), market, capacity, None,
                               instruments=tuple(market_set.symbols), **open_kw)
        try:
            yield i, advisor
        finally:
            advisor.close()
