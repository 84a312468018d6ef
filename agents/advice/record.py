"""The advice's record (hybrid.query.bind_on=record): whether its calls have earned on paper, counted once per market
fact, and whether that binds the envs to the advice (agents.advice.rules reads `bound`).

A call is a key's answer, not an env's decision: the answer of a flat key (block b, flat side) with status OK whose
most probable action is BUY or SELL. Every env at block b + 1 reads that one answer, so the call is counted once,
however many envs read it. It is held on paper from the close of bar d = (b + 1)·k, the first bar it is in force, to
the close of bar d + H (H = query.max_age, the answer's lifetime) or of the session's last bar before that, less a
round trip's costs: its P&L is a function of the table and the prices alone. Calls at bars where no entry is allowed
do not count.

Calls of neighbouring blocks overlap on one price path (H spans several blocks), so they are not independent. The
record's independent unit is the session: a call's cluster is the session of its decision bar, and its statistic is
the cluster-robust one, S = Σ s_c over V = Σ s_c² (s_c a session's summed P&L; t = S / √V), which is t-distributed
under no information whatever the dependence inside a session (docs/findings.md says why sessions, not runs of keys).

The record is looked at once per query step, every one of them, so the bar to bind is a sequential test that stays
valid under any number of looks: a one-sided normal-mixture e-value E(S, V) (Robbins' mixture of exp(λS − λ²V/2) over
λ > 0), binding where E ≥ 1/RECORD_ALPHA. By Ville's inequality, advice without information (mean paper P&L ≤ 0)
binds with probability at most RECORD_ALPHA over a whole run, however often it is looked at; the placebo battery
(agents.advice.placebo, tests/test_record_evidence.py) measures it on a price path.

Where it counts: training's envs stand everywhere on their split, so training's record counts every call settled
inside the split; a walk's one account stands at one bar, so its record counts the calls settled by that bar (no
look-ahead), starting from the trained agent's record (`carried`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct
from jax.scipy.stats import norm

from agents.advice.table import SIDES, AdviceTable, key_of
from bridge.protocol import BUY, SELL, STATUS_OK
from jaxenv.env import CAN_ENTER, CLOSE, SESSION

RECORD_ALPHA = 0.05  # the most the record may bind to advice without information, over a whole run's looks
RECORD_MIN_CLUSTERS = 10  # no binding on calls from fewer sessions than this
# The mixture's scale, in sessions: the e-value is most sensitive (its bar lowest relative to later ones) near this
# many sessions with calls.
RECORD_PRIOR_CLUSTERS = 20
RECORD_RELEASE = 1.0  # a bound record lets go once its e-value falls below this: no evidence left either way


@struct.dataclass
class Tally:
    """Calls counted, the sessions they fall in, and the statistic's sums (S, V), as scalars."""

    calls: jax.Array
    clusters: jax.Array
    total: jax.Array  # S: the calls' paper P&L
    squares: jax.Array  # V: the sum over sessions of the square of each session's P&L

    @classmethod
    def zero(cls) -> Tally:
        return cls(*(jnp.zeros(()) for _ in range(4)))

    def __add__(self, other: Tally) -> Tally:
        return jax.tree.map(jnp.add, self, other)

    def t_statistic(self) -> jax.Array:
        """[] S / √V, the cluster-robust t (0 without calls)."""
        return jnp.where(self.squares > 0, self.total / jnp.sqrt(jnp.maximum(self.squares, 1e-30)), 0.0)

    def log_evidence(self) -> jax.Array:
        """[] log E: the one-sided normal-mixture e-value of S over V, the mixture scaled to RECORD_PRIOR_CLUSTERS
        sessions' worth of V (so it is free of the P&L's units)."""
        return log_evidence(self.t_statistic(), self.clusters)


def log_evidence(t, clusters):
    """log E at cluster-robust t over `clusters` sessions (jnp or numpy scalars): with r = RECORD_PRIOR_CLUSTERS /
    clusters, E = 2 √(r / (1 + r)) · exp(t² / (2(1 + r))) · Φ(t / √(1 + r))."""
    r = RECORD_PRIOR_CLUSTERS / jnp.maximum(clusters, 1.0)
    return (math.log(2.0) + 0.5 * jnp.log(r / (1.0 + r)) + t**2 / (2.0 * (1.0 + r))
            + norm.logcdf(t / jnp.sqrt(1.0 + r)))


def t_bar(clusters: float) -> float:
    """The t at which the record binds with this many sessions of calls (for reports; bisection on log_evidence)."""
    if clusters < RECORD_MIN_CLUSTERS:
        return math.nan
    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if float(log_evidence(mid, float(clusters))) >= math.log(1 / RECORD_ALPHA):
            hi = mid
        else:
            lo = mid
    return hi


def settles(t: Tally, bound: jax.Array) -> jax.Array:
    """Whether a record with tally t binds: it binds once E ≥ 1/RECORD_ALPHA on at least RECORD_MIN_CLUSTERS
    sessions, and, once bound, stays bound while E ≥ RECORD_RELEASE."""
    log_e = t.log_evidence()
    binds = (t.clusters >= RECORD_MIN_CLUSTERS) & (log_e >= math.log(1 / RECORD_ALPHA))
    return jnp.where(bound, log_e >= math.log(RECORD_RELEASE), binds)


class Calls(struct.PyTreeNode):
    """Every block's call on a market: [K] arrays, K the table's blocks."""

    pnl: jax.Array  # paper P&L of the block's call (0 where it made none)
    made: jax.Array  # bool: a call that counts
    session: jax.Array  # int32: the session of its decision bar (its cluster)
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
    inside = (decided < n) & (d >= params.start_bar) & (s < params.end_bar) & (s > d) & (bars[d, CAN_ENTER] > 0)
    flat = key_of(jnp.arange(blocks), 0)
    named = jnp.argmax(table.probs[flat], -1)
    side = (named == BUY).astype(jnp.float32) - (named == SELL).astype(jnp.float32)
    made = inside & (table.status[flat] == STATUS_OK) & (side != 0)
    value = params.point_value * params.contracts
    cost = 2.0 * (params.commission_per_side * params.contracts + params.slippage * value)
    pnl = jnp.where(made, side * (bars[s, CLOSE] - bars[d, CLOSE]) * value - cost, 0.0)
    return Calls(pnl, made, session[d], s.astype(jnp.int32))


def tally_of(calls: Calls, upto: jax.Array) -> Tally:
    """The tally of the calls settled by bar `upto` (their settling bar's close is known there)."""
    made = calls.made & (calls.settled_at <= upto)
    n = calls.pnl.shape[0]
    # sessions rise block by block: numbered from 0 in block order, they are fewer than the blocks
    cluster = jnp.cumsum(jnp.concatenate([jnp.zeros(1, jnp.int32), (jnp.diff(calls.session) != 0).astype(jnp.int32)]))
    sums = jax.ops.segment_sum(jnp.where(made, calls.pnl, 0.0), cluster, num_segments=n)
    counts = jax.ops.segment_sum(made.astype(jnp.float32), cluster, num_segments=n)
    return Tally(made.sum().astype(jnp.float32), (counts > 0).sum().astype(jnp.float32), sums.sum(), (sums**2).sum())


@struct.dataclass
class AdviceRecord:
    """What the advice's calls have earned and whether that binds. Part of the trained agent: a checkpoint keeps it,
    and a walk from it starts from its tally (`carried`)."""

    carried: Tally  # the trained agent's tally a walk starts from (zero in training)
    tally: Tally  # carried + the calls on this market settled so far
    bound: jax.Array  # [] bool

    @classmethod
    def create(cls) -> AdviceRecord:
        return cls(Tally.zero(), Tally.zero(), jnp.zeros((), bool))

    def for_walk(self) -> AdviceRecord:
        """This record (a training state's, or a checkpoint's) as a walk's start: its tally carried, still bound."""
        tally = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), self.tally)
        return AdviceRecord(tally, tally, jnp.asarray(self.bound, bool))

    @classmethod
    def restored(cls, saved: dict) -> AdviceRecord | None:
        """A checkpoint's record (restored as dicts); None for one saved before the record counted keys."""
        if "tally" not in saved:
            return None
        return cls(Tally(**saved["carried"]), Tally(**saved["tally"]), saved["bound"])

    def look(self, table: AdviceTable, params, interval: int, horizon: int, now: jax.Array) -> AdviceRecord:
        """The record after counting the calls of `table` settled by the bar the account stands at: `now` in a walk
        (params.sequential), every call of the split in training."""
        upto = jnp.where(params.sequential, now, params.end_bar - 1)
        tally = self.carried + tally_of(market_calls(table, params, interval, horizon), upto)
        return self.replace(tally=tally, bound=settles(tally, self.bound))


def record_metrics(record: AdviceRecord) -> dict[str, float]:
    """The record's figures for metrics.jsonl and reports (host values)."""
    t = jax.device_get(record.tally)
    clusters = float(t.clusters)
    return {
        "record_t": float(t.t_statistic()),
        "record_t_bar": t_bar(clusters),
        "record_clusters": clusters,
        "record_calls": float(t.calls),
        "record_log_e": float(t.log_evidence()),
        "record_bound": float(jax.device_get(record.bound)),
    }
