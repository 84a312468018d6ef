"""The outcome of each answered key, for the sidecar's LoRA learner (llm_sidecar.learning): the market's move after
the bar its prompt was rendered from."""

from __future__ import annotations

from typing import Callable

import numpy as np

from bridge.transport import OUTCOME_FIELDS
from jaxenv.market import Market


def outcome_rows(written: list[tuple[int, np.ndarray, np.ndarray]], rendered_bar: Callable[[np.ndarray], np.ndarray],
                 market: Market, split: tuple[int, int], move_bars: int) -> dict[str, np.ndarray]:
    """Outcome rows (bridge.transport.OUTCOME_FIELDS) of answers written into the advice table.

    `written`: (submission seq, answer rows, keys) per submission; `rendered_bar(keys)`: the bar each key's prompt
    shows. Every answer gets a row: its seq and row, and the market's move after the rendered bar e in ATRs, from the
    next bar's open (where an order placed at e fills) to the close `move_bars` bars on; NaN where that window leaves
    the training `split` [start, end): the advisor learns from the bars the agent trains on, never from the held-out
    splits after them.
    """
    out = {name: np.zeros(sum(len(k) for _, _, k in written), dtype) for name, dtype in OUTCOME_FIELDS}
    if not written:
        return out
    seq = np.concatenate([np.full(len(keys), s, np.int64) for s, _, keys in written])
    row = np.concatenate([rows for _, rows, _ in written])
    bar = rendered_bar(np.concatenate([keys for _, _, keys in written])).astype(np.int64)
    inside = (bar >= split[0]) & (bar + move_bars < split[1])
    move = np.full(len(seq), np.nan)
    b = bar[inside]
    move[inside] = (market.close[b + move_bars] - market.open[b + 1]) / np.maximum(market.atr[b], 1e-9)
    out.update(seq=seq, row=row.astype(np.int32), move=move.astype(np.float32))
    return out


def permuted_across_sessions(move: np.ndarray, session: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The placebo's moves (hybrid.learning.placebo): every row with a known move gets the known move of a row of
    another session. The sessions present are put in a random cycle, each taking the next one's moves (in a random
    order, repeated where it has fewer rows), so no row keeps its own session's move and what the prompt said no
    longer tells which way the market went; NaN stays NaN. With one session, nothing can be learned: all NaN."""
    out = np.full(len(move), np.nan, np.float32)
    known = np.flatnonzero(np.isfinite(move))
    sessions = np.unique(session[known])
    if len(sessions) < 2:
        return out
    cycle = rng.permutation(sessions)
    rows = {s: known[session[known] == s] for s in sessions}
    for s, source in zip(cycle, np.roll(cycle, -1)):
        donors = rng.permutation(rows[source])
        out[rows[s]] = move[donors[np.arange(len(rows[s])) % len(donors)]]
    return out
