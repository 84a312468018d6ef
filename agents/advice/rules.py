"""The entry rules that bind an env to its advice, behind one interface: `EntryRules`.

Which envs are bound is defined once (`EntryRules.bound`, by `hybrid.query.bind_on`):
- `always`: every env;
- `trust`: an env while its running trust in its advice is above `hybrid.query.min_trust` (the running mean of the
  trust gate over the env's advised decisions, starting at 1; a fusion without a gate keeps it at 1);
- `record`: every env while the advice's record binds (`AdviceRecord`: its calls have earned on paper).

Every rule reads that one definition, and applies only where the fusion acts on advice:
- the wait (`query.wait_for_answer`): a bound flat env with no answer in force may not enter while the key it reads
  now is in flight;
- advised entries (`query.advised_entries_only`): a bound flat env enters only on the side its valid advice names,
  alone only where the answer in force is PASS;
- the kept bracket (`query.keep_advised_bracket`): a trade entered by a bound env with advice in force keeps its
  stop to the end (no MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL);
- near the drawdown limit (`veto.advised_only_below`, a veto rule): a bound env enters only on its advice's side.
  It needs a binding that is earned (`earned`): where every env is always bound it says nothing.
Why each exists, and what each was measured to do: docs/findings.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from agents.advice.risk_veto import near_the_limit
from agents.advice.table import AdviceView
from agents.config import ADVISED_FUSIONS, GATED_FUSIONS, QueryConfig, VetoConfig
from bridge.protocol import BUY, DISABLE_TRAIL, ENABLE_TRAIL, MOVE_TO_BE, SELL, action_flags
from jaxenv.env import CLOSE

ENTRIES = (BUY, SELL)
STOP_MOVES = (MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL)  # what the kept bracket holds back in an advised trade
TRUST_STEP = 0.5  # an advised decision moves the env's running trust this share of the way to its gate
# The record binds once it holds at least this weight of calls ...
RECORD_MIN_CALLS = 30
# ... whose mean paper P&L is above 0 by this many standard errors, and lets go below RECORD_T_OFF. The record is
# looked at every step, so a low bar is crossed by chance sooner or later.
RECORD_T_ON = 4.0
RECORD_T_OFF = 2.0


@struct.dataclass
class CallTally:
    """Exponentially weighted count, sum and sum of squares of P&L figures (scalars, shared by all envs)."""

    weight: jax.Array
    total: jax.Array
    squares: jax.Array

    @classmethod
    def create(cls) -> CallTally:
        return cls(jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))

    def add(self, done: jax.Array, pnl: jax.Array, memory: int) -> CallTally:
        """Adds the figures where `done` ([N] bool) is set, each older one fading by 1 − 1/memory a figure."""
        n = done.sum()
        fade = (1.0 - 1.0 / memory) ** n
        pnl = jnp.where(done, pnl, 0.0)
        return CallTally(fade * self.weight + n, fade * self.total + pnl.sum(), fade * self.squares + (pnl**2).sum())

    def t_statistic(self) -> jax.Array:
        """[] the mean over its standard error (0 below RECORD_MIN_CALLS of weight)."""
        w = jnp.maximum(self.weight, 1.0)
        mean = self.total / w
        se = jnp.sqrt(jnp.maximum(self.squares / w - mean**2, 0.0) / w)
        return jnp.where(self.weight >= RECORD_MIN_CALLS, mean / jnp.maximum(se, 1e-6), 0.0)


@struct.dataclass
class AdviceRecord:
    """bind_on=record: what the advice's calls would have earned, and whether that binds the envs to it.

    A call is valid advice naming BUY or SELL to a flat env. It is held on paper from the decision bar's close for as
    long as advice lasts (query.max_age bars), less a round trip's costs, whatever the agent did: the record measures
    the advice, not the policy's choice among its calls. One call per env is in flight; one cut short by the
    episode's end (a breach ends it too) is settled at the last close before it, since dropping it would drop the
    losers that breached a bound agent. Part of the trained agent: a walk from a checkpoint starts from it."""

    side: jax.Array  # [N] the call in flight: +1 long, −1 short, 0 none
    start: jax.Array  # [N] its decision bar
    price: jax.Array  # [N] that bar's close
    held: jax.Array  # [N] steps since
    last: jax.Array  # [N] the close of the env's previous decision bar
    calls: CallTally
    bound: jax.Array  # [] bool

    @classmethod
    def create(cls, n_envs: int) -> AdviceRecord:
        zeros = jnp.zeros(n_envs, jnp.int32)
        return cls(zeros, zeros, jnp.zeros(n_envs), zeros, jnp.zeros(n_envs), CallTally.create(), jnp.zeros((), bool))

    def carried(self, n_envs: int) -> AdviceRecord:
        """This record (a training state's, or a checkpoint's) for a walk of n_envs with no call in flight."""
        return AdviceRecord.create(n_envs).replace(calls=jax.tree.map(jnp.asarray, self.calls),
                                                   bound=jnp.asarray(self.bound, bool))

    def step(self, t: jax.Array, close: jax.Array, call: jax.Array, horizon: int, value: jax.Array,
             cost: jax.Array, memory: int) -> AdviceRecord:
        """At decision bar t ([N]) with close ([N]): settles the calls held `horizon` steps (their P&L: side × move ×
        `value` per point − `cost`) and those whose env was reset (at the last close before it), starts `call` ([N]
        +1/−1/0) where none is in flight, and binds or lets go on the new tally (of about the last `memory` calls)."""
        open_ = self.side != 0
        held = self.held + open_
        reset = open_ & (t - self.start != held)  # the env started a new episode since the call
        due = open_ & ~reset & (held >= horizon)
        settled_at = jnp.where(reset, self.last, close)
        calls = self.calls.add(due | reset, self.side * (settled_at - self.price) * value - cost, memory)
        side = jnp.where(due | reset, 0, self.side)
        new = (side == 0) & (call != 0)
        t_stat = calls.t_statistic()
        return AdviceRecord(side=jnp.where(new, call, side), start=jnp.where(new, t, self.start),
                            price=jnp.where(new, close, self.price), held=jnp.where(new, 0, held), last=close,
                            calls=calls, bound=jnp.where(self.bound, t_stat > RECORD_T_OFF, t_stat > RECORD_T_ON))


class RuleState(NamedTuple):
    """What the rules keep per env, read from and written back to the acting carry (leaves [N])."""

    trust: jax.Array  # running mean of the trust gate over the env's advised decisions (1 before the first)
    advised_trade: jax.Array  # bool: the open trade was entered by a bound env with advice in force
    record: AdviceRecord | None  # bind_on=record only


class RuleMasks(NamedTuple):
    """One step's masks and the envs each rule held back, for the step's statistics."""

    veto: jax.Array  # [N, A] the risk veto's mask with its near-limit rule
    mask: jax.Array  # [N, A] every rule applied
    bound: jax.Array  # [N] bool
    waiting: jax.Array  # [N] bool: held out of the market for advice on its way
    kept: jax.Array  # [N] bool: inside a trade that keeps its advised bracket


@dataclass(frozen=True)
class EntryRules:
    query: QueryConfig
    veto: VetoConfig
    fusion: str

    @property
    def binding(self) -> str:
        """How envs are bound to their advice: hybrid.query.bind_on, or `none` where the fusion ignores advice."""
        return self.query.bind_on if self.fusion in ADVISED_FUSIONS else "none"

    @property
    def keeps_trust(self) -> bool:
        return self.binding == "trust" and self.fusion in GATED_FUSIONS

    @property
    def earned(self) -> bool:
        """Whether being bound says something about the advice: its record, or a trust gate's running trust."""
        return self.keeps_record or self.keeps_trust

    @property
    def keeps_record(self) -> bool:
        return self.binding == "record"

    def create_record(self, n_envs: int) -> AdviceRecord | None:
        return AdviceRecord.create(n_envs) if self.keeps_record else None

    def bound(self, state: RuleState) -> jax.Array:
        """[N] bool: the env is bound to its advice (the one definition every rule reads)."""
        if self.binding == "record":
            return jnp.broadcast_to(state.record.bound, state.trust.shape)
        if self.binding == "trust":
            return state.trust > self.query.min_trust
        return jnp.full(state.trust.shape, self.binding == "always")

    def apply(self, state: RuleState, view: AdviceView, env_state, env_params, veto_mask: jax.Array) -> RuleMasks:
        """The masks of one step: the veto's (`veto_mask`) with its near-limit rule, then the wait, advised entries
        and the kept bracket. `view`: the advice in force for the env's side."""
        side = env_state.side
        n = side.shape[0]
        off = jnp.zeros(n, bool)
        if self.binding == "none":
            return RuleMasks(veto_mask, veto_mask, off, off, off)
        entries = jnp.array(action_flags(ENTRIES))[None, :]
        bound = self.bound(state)
        named = jax.nn.one_hot(jnp.argmax(view.probs, -1), view.probs.shape[-1], dtype=bool)
        own_entry = entries & ~(view.valid[:, None] & named)  # [N, A] entries the advice does not name
        if self.earned:  # near the drawdown limit, a bound env enters only on its advice
            near_limit = near_the_limit(self.veto, env_state, env_params) & bound
            veto_mask = veto_mask & ~(near_limit[:, None] & own_entry)
        waiting = off
        if self.query.wait_for_answer:
            waiting = view.asked & (side == 0) & bound
        mask = veto_mask & ~(waiting[:, None] & entries)
        if self.query.advised_entries_only:  # the policy enters alone only where the advisor passes
            mask = mask & ~((bound & ~view.passed)[:, None] & own_entry)
        kept = off
        if self.query.keep_advised_bracket:
            kept = state.advised_trade & (side != 0)
            mask = mask & ~(kept[:, None] & jnp.array(action_flags(STOP_MOVES))[None, :])
        return RuleMasks(veto_mask, mask, bound, waiting, kept)

    def update(self, state: RuleState, view: AdviceView, bound: jax.Array, gate: jax.Array, env_state,
               env_params) -> RuleState:
        """The rules' state after a decision: the running trust, the advised trade's flag, the advice's record."""
        trust, advised_trade, record = state.trust, state.advised_trade, state.record
        flat = env_state.side == 0  # entries need a flat env, so a trade's flag is that of its entry decision
        if self.keeps_trust:
            trust = jnp.where(view.valid, trust + TRUST_STEP * (gate - trust), trust)
        if self.query.keep_advised_bracket and self.binding != "none":
            advised_trade = jnp.where(flat, view.valid & bound, advised_trade)
        if self.keeps_record:
            named = jax.nn.one_hot(jnp.argmax(view.probs, -1), view.probs.shape[-1], dtype=bool)
            call = (view.valid & flat) * (named[:, BUY].astype(jnp.int32) - named[:, SELL].astype(jnp.int32))
            p = env_params
            value = p.point_value * p.contracts
            cost = 2.0 * (p.commission_per_side * p.contracts + p.slippage * value)
            record = record.step(env_state.t, p.bars[env_state.t, CLOSE], call, self.query.max_age, value, cost,
                                 self.query.record_calls)
        return state._replace(trust=trust, advised_trade=advised_trade, record=record)
