"""The entry rules that bind an env to its advice, behind one interface: `EntryRules`.

Which envs are bound is defined once (`EntryRules.bound`, by `hybrid.query.bind_on`):
- `always`: every env;
- `trust`: an env while its running trust in its advice is above `hybrid.query.min_trust` (the running mean of the
  trust gate over the env's advised decisions, starting at 1; a fusion without a gate keeps it at 1);
- `record`: every env while the advice's record binds (agents.advice.record: its calls, one per key, have earned on
  paper by a sequential test over sessions).

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

from agents.advice.record import AdviceRecord
from agents.advice.risk_veto import near_the_limit
from agents.advice.table import AdviceView
from agents.config import ADVISED_FUSIONS, GATED_FUSIONS, QueryConfig, VetoConfig
from bridge.protocol import BUY, DISABLE_TRAIL, ENABLE_TRAIL, MOVE_TO_BE, SELL, action_flags

ENTRIES = (BUY, SELL)
STOP_MOVES = (MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL)  # what the kept bracket holds back in an advised trade
TRUST_STEP = 0.5  # an advised decision moves the env's running trust this share of the way to its gate


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

    def create_record(self) -> AdviceRecord | None:
        return AdviceRecord.create() if self.keeps_record else None

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

    def update(self, state: RuleState, view: AdviceView, bound: jax.Array, gate: jax.Array, env_state) -> RuleState:
        """The rules' state after a decision: the running trust and the advised trade's flag (the advice's record is
        looked at once per query step: AdviceRecord.look)."""
        trust, advised_trade = state.trust, state.advised_trade
        flat = env_state.side == 0  # entries need a flat env, so a trade's flag is that of its entry decision
        if self.keeps_trust:
            trust = jnp.where(view.valid, trust + TRUST_STEP * (gate - trust), trust)
        if self.query.keep_advised_bracket and self.binding != "none":
            advised_trade = jnp.where(flat, view.valid & bound, advised_trade)
        return state._replace(trust=trust, advised_trade=advised_trade)
