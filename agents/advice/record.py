"""The advice's record (hybrid.query.bind_on=record): whether its calls have earned on paper, counted once per market
fact, and whether that binds the envs to the advice (agents.advice.rules reads `bound`).

A call is a key's answer, not an env's decision: the answer of a flat key (block b, flat side) with status OK whose
most probable action is BUY or SELL. Every env at block b + 1 reads that one answer, so the call is counted once,
however many envs read it. It is held on paper from the close of bar d = (b + 1)·k, the first bar it is in force, to
the close of bar d + H (H = query.max_age, the answer's lifetime) or of the session's last bar before that, less a
round trip's costs: its P&L is a function of the table and the prices alone. Calls at bars where no entry is allowed
do not count.

Calls of neighbouring blocks overlap on one price path (H spans several blocks), so they are not independent; a
call never outlives its session, so sessions are. The record's unit is the session: its calls' paper P&L summed, fed
in time order to the betting e-process (agents.evidence.eprocess), which binds at E ≥ 1/ALPHA and lets go below
RELEASE. A session is counted once it is complete: every block in it whose call would count has its flat key
answered and every call settled; the record counts the complete sessions up to the first that is not, so a session's
sum is final when counted (answers of a fixed advisor do not change) and keys answered in any order give the same
evidence as answered in time order. The null, in one line: the advice's paper P&L per session after costs has mean
≤ 0, its gains counted up to the account's trailing drawdown times the calls open at once (H / k, `record_scale`) and
its losses in full (exact while no session loses more than twice that: agents.evidence.eprocess). Advice without
information on a market whose drift beats the costs (an always-BUY advisor on a rising market) does not fit it: its
paper does earn, and it binds. Training asks the advisor for the keys the first incomplete session lacks where no env
reads them (`wanted`), so the count moves on.

The record is looked at once per query step, every one of them: by Ville's inequality the test holds however often it
is looked at (the placebo battery, experiments/evidence_battery.py and tests/test_evidence.py, measures it).

Where it counts: training's envs stand everywhere on their split, so training's record counts every complete session
of the split; a walk's one account stands at one bar, so its record counts the sessions complete by that bar (no
look-ahead), starting from the trained agent's record (`carried`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from agents.advice.table import SIDES, AdviceTable, answered, key_of
from agents.evidence.eprocess import Evidence, evidence_metrics, passes, scale_of
from bridge.protocol import BUY, SELL, STATUS_OK
from jaxenv.env import CAN_ENTER, CLOSE, SESSION


class Calls(struct.PyTreeNode):
    """Every block's call on a market: [K] arrays, K the table's blocks."""

    pnl: jax.Array  # paper P&L of the block's call (0 where it made none)
    made: jax.Array  # bool: a call that counts
    counts: jax.Array  # bool: a call here would count (its flat key's answer decides whether it makes one)
    asked: jax.Array  # bool: its flat key is answered
    session: jax.Array  # int32: the session of its decision bar
    settled_at: jax.Array  # int32: the bar whose close settles it


def market_calls(table: AdviceTable, params, interval: int, horizon: int) -> Calls:
    """The calls of the flat keys answered in `table` on the market of `params` (EnvParams: its bars, costs and
    split), held `horizon` bars from the first bar of the block after theirs, inside the split."""
    bars = params.bars
    n = bars.shape[0]
    blocks = table.num_keys // SIDES
    session = bars[:, SESSION].astype(jnp.int32)
    index = jnp.arange(n)
    last = jnp.concatenate([session[1:] != session[:-1], jnp.ones(1, bool)])
    session_end = jax.lax.cummin(jnp.where(last, index, n - 1), reverse=True)  # its session's last bar, per bar
    decided = (jnp.arange(blocks) + 1) * interval
    d = jnp.minimum(decided, n - 1)
    s = jnp.minimum(d + horizon, session_end[d])
    counts = (decided < n) & (d >= params.start_bar) & (s < params.end_bar) & (s > d) & (bars[d, CAN_ENTER] > 0)
    flat = key_of(jnp.arange(blocks), 0)
    named = jnp.argmax(table.probs[flat], -1)
    side = (named == BUY).astype(jnp.float32) - (named == SELL).astype(jnp.float32)
    made = counts & (table.status[flat] == STATUS_OK) & (side != 0)
    value = params.point_value * params.contracts
    cost = 2.0 * (params.commission_per_side * params.contracts + params.slippage * value)
    pnl = jnp.where(made, side * (bars[s, CLOSE] - bars[d, CLOSE]) * value - cost, 0.0)
    return Calls(pnl, made, counts, answered(table.status[flat]), session[d], s.astype(jnp.int32))


def record_scale(params, interval: int, horizon: int) -> jax.Array:
    """The scale of the record's session P&L: a call is a contract held `horizon` bars and one starts every `interval`,
    so up to horizon / interval are open at once; each gets the account's scale (scale_of)."""
    return scale_of(params) * (horizon / interval)


def session_evidence(calls: Calls, upto: jax.Array, scale: jax.Array) -> tuple[Evidence, jax.Array, jax.Array]:
    """(the evidence of the complete sessions up to the first that is not, in time order; the calls they hold; the
    blocks [b0, b1) whose flat keys that first incomplete session still lacks): a session is complete by bar `upto`
    when every block in it whose call would count is answered and settled."""
    n = calls.pnl.shape[0]
    # sessions rise block by block: numbered from 0 in block order, they are fewer than the blocks
    order = jnp.cumsum(jnp.concatenate([jnp.zeros(1, jnp.int32), (jnp.diff(calls.session) != 0).astype(jnp.int32)]))
    pnl = jax.ops.segment_sum(jnp.where(calls.made, calls.pnl, 0.0), order, num_segments=n)
    made = jax.ops.segment_sum(calls.made.astype(jnp.int32), order, num_segments=n)
    open_ = calls.counts & (~calls.asked | (calls.settled_at > upto))
    complete = jax.ops.segment_sum(open_.astype(jnp.int32), order, num_segments=n) == 0
    prefix = jnp.cumprod(complete.astype(jnp.int32)) > 0
    counted = prefix & (made > 0)
    first = jnp.argmin(prefix)  # the first incomplete session (0 where every one is complete: nothing wanted then)
    lacking = calls.counts & ~calls.asked & (order == first) & ~prefix.all()
    blocks = jnp.arange(n)
    wanted = jnp.stack([jnp.where(lacking, blocks, n).min(), jnp.where(lacking, blocks + 1, 0).max()])
    return Evidence.zero().add(pnl, scale, counted), jnp.where(counted, made, 0).sum(), wanted.astype(jnp.int32)


@struct.dataclass
class AdviceRecord:
    """What the advice's calls have earned and whether that binds. Part of the trained agent: a checkpoint keeps it,
    and a walk from it starts from its evidence (`carried`)."""

    carried: Evidence  # the trained agent's evidence a walk starts from (none in training)
    evidence: Evidence  # carried + this market's complete sessions so far
    calls: jax.Array  # [] calls in this market's sessions counted
    bound: jax.Array  # [] bool
    # [2] int32: the blocks [b0, b1) whose flat keys the first incomplete session lacks; training asks for them
    # where no env does (agents.advice.table.select_keys), so that the count moves on in time order
    wanted: jax.Array

    @classmethod
    def create(cls) -> AdviceRecord:
        return cls(Evidence.zero(), Evidence.zero(), jnp.zeros(()), jnp.zeros((), bool), jnp.zeros(2, jnp.int32))

    def for_walk(self) -> AdviceRecord:
        """This record (a training state's, or a checkpoint's) as a walk's start: its evidence carried, still bound."""
        evidence = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), self.evidence)
        return AdviceRecord(evidence, evidence, jnp.zeros(()), jnp.asarray(self.bound, bool), jnp.zeros(2, jnp.int32))

    @classmethod
    def restored(cls, saved: dict) -> AdviceRecord | None:
        """A checkpoint's record (restored as dicts); None for one of an earlier test (a tally of calls)."""
        if "evidence" not in saved:
            return None
        return cls(Evidence(**saved["carried"]), Evidence(**saved["evidence"]), saved["calls"], saved["bound"],
                   saved["wanted"])

    def look(self, table: AdviceTable, params, interval: int, horizon: int, now: jax.Array) -> AdviceRecord:
        """The record after counting the sessions of `table`'s calls complete by the bar the account stands at: `now`
        in a walk (params.sequential), every session of the split in training."""
        upto = jnp.where(params.sequential, now, params.end_bar - 1)
        found, calls, wanted = session_evidence(market_calls(table, params, interval, horizon), upto,
                                                record_scale(params, interval, horizon))
        evidence = self.carried + found
        return self.replace(evidence=evidence, calls=calls.astype(jnp.float32), bound=passes(evidence, self.bound),
                            wanted=wanted)


def record_metrics(record: AdviceRecord) -> dict[str, float]:
    """The record's figures for metrics.jsonl and reports (host values): record_log_e and the bar it must reach,
    record_sessions (complete sessions with calls), record_clipped, record_pnl, record_calls, record_bound."""
    return {**evidence_metrics(record.evidence, "record"), "record_calls": float(jax.device_get(record.calls)),
            "record_bound": float(jax.device_get(record.bound))}
