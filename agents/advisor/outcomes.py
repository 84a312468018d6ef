"""The outcome of each answered prompt, measured from the rollout that followed it: the market's move after it.
The sidecar's LoRA learner trains on these rows (llm_sidecar.learning)."""

from __future__ import annotations

import numpy as np

from bridge.transport import OUTCOME_FIELDS
from jaxenv.market import Market


def outcome_rows(applied: list[tuple[int, list]], bars: np.ndarray, market: Market,
                 move_bars: int) -> dict[str, np.ndarray]:
    """Outcome rows (bridge.transport.OUTCOME_FIELDS) of the answers written before each chunk.

    `applied`: (first step t0 of the chunk, [(seq, answer rows, env ids)]) per chunk; `bars`: [T, N]
    the bar each env decided on at each step. Every answer gets a row: its submission seq and row, and the
    market's move after t0 in ATRs, from the next bar's open (where an order placed at t0 fills) to the close
    `move_bars` bars on (prices from `market`), NaN unless the env lived through all of them in this rollout (no
    look-ahead: the rollout has already played those bars).
    """
    seqs, rows, envs, starts = [], [], [], []
    for t0, written in applied:
        for seq, answer_rows, env_ids in written:
            seqs.append(np.full(len(env_ids), seq, np.int64))
            rows.append(answer_rows)
            envs.append(env_ids)
            starts.append(np.full(len(env_ids), t0))
    out = {name: np.zeros(sum(map(len, seqs)), dtype) for name, dtype in OUTCOME_FIELDS}
    if not seqs:
        return out
    seq, row, env, t0 = (np.concatenate(x) for x in (seqs, rows, envs, starts))
    move = np.full(len(seq), np.nan)
    last = t0 + move_bars - 1  # the step whose transition plays bar (decision bar + move_bars)
    lived = last < bars.shape[0]
    bar = bars[t0, env].astype(np.int64)
    # No reset inside the window: the env's bar advanced one per step.
    lived[lived] &= bars[last[lived], env[lived]] == bar[lived] + move_bars - 1
    b = bar[lived]
    move[lived] = (market.close[b + move_bars] - market.open[b + 1]) / np.maximum(market.atr[b], 1e-9)
    out.update(seq=seq, row=row.astype(np.int32), move=move.astype(np.float32))
    return out
