"""The outcome of each answered prompt, measured from the rollout that followed it: what the agent did, the
reward and trade it got, its advantage, and the market's move. The sidecar's LoRA learner trains on these rows."""

from __future__ import annotations

import numpy as np

from bridge.transport import OUTCOME_FIELDS
from jaxenv.market import Market


def outcome_rows(applied: list[tuple[int, int, list]], traj: dict[str, np.ndarray], market: Market,
                 move_bars: int) -> dict[str, np.ndarray]:
    """Outcome rows (bridge.transport.OUTCOME_FIELDS) of the answers written before each chunk.

    `applied`: (first step t0 of the chunk, its length k, [(seq, answer rows, env ids)]) per chunk; `traj`: [T, N]
    numpy arrays action, reward, advantage, advice_valid, entered, exited, trade_pnl and bar (the decision's bar).
    Every answer gets a row; `in_force` says whether its advice was still in force at t0 (the env may have
    changed side meanwhile). Its outcome is the action taken at t0, its advantage, the reward over [t0, t0 + k),
    when that action opened a trade the trade's P&L at its exit (NaN when still open at the rollout's end), and
    the market's move after t0 in ATRs: from the next bar's open (where an order placed at t0 fills) to the close
    `move_bars` bars on (prices from `market`), NaN unless the env lived through all of them in this rollout (no
    look-ahead: the rollout has already played those bars).
    """
    seqs, rows, envs, starts, lengths = [], [], [], [], []
    for t0, k, written in applied:
        for seq, answer_rows, env_ids in written:
            seqs.append(np.full(len(env_ids), seq, np.int64))
            rows.append(answer_rows)
            envs.append(env_ids)
            starts.append(np.full(len(env_ids), t0))
            lengths.append(np.full(len(env_ids), k))
    if not seqs:
        return {name: np.zeros(0, dtype) for name, dtype in OUTCOME_FIELDS}
    seq, row, env, t0, k = (np.concatenate(x) for x in (seqs, rows, envs, starts, lengths))
    in_force = traj["advice_valid"][t0, env]
    steps = np.arange(traj["reward"].shape[0])[:, None]
    window = (steps >= t0) & (steps < t0 + k)  # [T, R]
    reward = (traj["reward"][:, env] * window).sum(0)
    later_exit = traj["exited"][:, env] & (steps >= t0)
    closes = later_exit.any(0)
    exit_step = later_exit.argmax(0)
    trade_pnl = np.where(traj["entered"][t0, env] & closes, traj["trade_pnl"][exit_step, env], np.nan)
    move = np.full(len(seq), np.nan)
    last = t0 + move_bars - 1  # the step whose transition plays bar (decision bar + move_bars)
    lived = last < len(steps)
    bar = traj["bar"][t0, env].astype(np.int64)
    # No reset inside the window: the env's bar advanced one per step.
    lived[lived] &= traj["bar"][last[lived], env[lived]] == bar[lived] + move_bars - 1
    b = bar[lived]
    move[lived] = (market.close[b + move_bars] - market.open[b + 1]) / np.maximum(market.atr[b], 1e-9)
    return {"seq": seq, "row": row.astype(np.int32), "in_force": in_force.astype(np.int8),
            "action": traj["action"][t0, env].astype(np.int8), "reward": reward.astype(np.float32),
            "trade_pnl": trade_pnl.astype(np.float32), "advantage": traj["advantage"][t0, env].astype(np.float32),
            "move": move.astype(np.float32)}
