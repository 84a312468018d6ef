"""Acting with advice: risk veto → fusion → sample, inside the jitted rollout step, and the matching
log-probabilities for the PPO loss. `make_train(..., acting=HybridActing(...))` uses it; without it PPO
samples from the policy alone.

The log-probability stored for PPO is that of the distribution actually sampled from: the learned mixture
for `learned`; for `rules`, the policy's own sample, with weight 0 in the policy loss where the rules
replaced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from agents.advice.fusion import (GATE_INIT_LOGIT, TrustGate, fusion_features, masked_advice_probs, mix, pool,
                                  rules_action)
from agents.advice.risk_veto import RULES, VetoState, apply_veto, near_the_limit
from agents.advice.table import AdviceTable, AdviceView, passed, pending, view
from agents.config import ADVISED_FUSIONS, GATED_FUSIONS, QueryConfig, VetoConfig
from agents.rl.networks import ActorCritic, log_probs_and_entropy, masked_logits
from bridge.protocol import BUY, DISABLE_TRAIL, ENABLE_TRAIL, MOVE_TO_BE, NUM_ACTIONS, SELL, action_flags
from jaxenv.env import CLOSE, N_BAR_FEATURES, N_CONTEXT_FEATURES, N_POSITION, N_VALIDITY

N_FUSION_CONTEXT = 6  # regime (ADX), volatility (ATR %), win rate, consecutive losses, time of day, position
N_ADVICE_INPUT = 10  # advice probabilities (6), decayed confidence, age, valid, question pending (advice_input)
# The trust gate only matters where advice is valid, often a few envs of thousands (a model advisor on a CPU
# advises well under 1% of decisions); while at most this share of a batch has advice, the gate runs on those rows
# alone. The gate's tanh layers cost ~6% of a 4,096-env update when run on every row.
GATE_ROWS_SHARE = 1 / 16
STOP_MOVES = (MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL)  # what query.keep_advised_bracket holds back in an advised trade
TRUST_STEP = 0.5  # an advised decision moves the env's running trust (HybridCarry.trust) this share to its gate
# query.bind_on=record: the record weighs the advice's latest query.record_calls calls (exponentially) and binds once
RECORD_MIN_CALLS = 30  # it holds at least this weight of calls ...
# ... whose mean paper P&L is above 0 by this many standard errors, and lets go below RECORD_T_OFF. The record is looked
# at every step, so a bar of 2 is crossed by chance sooner or later (measured: coin flips bound after 2 updates)
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
    """query.bind_on=record: what the advice's calls would have earned, and whether that binds the envs to it.

    A call is valid advice naming BUY or SELL to a flat env. It is held on paper from the decision bar's close for as
    long as advice lasts (query.max_age bars), less a round trip's costs, whatever the agent did: the record measures
    the advice, not the policy's choice among its calls. (A record of the agent's trades on the advice's side did not:
    bound to coin flips, the policy took the flips it liked, and those trades earned.) One call per env is in flight;
    one cut short by the episode's end (a breach ends it too) is settled at the last close before it, since dropping
    it would drop the losers that breached a bound agent. Part of the trained agent: a walk from a checkpoint starts
    from it."""

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


@struct.dataclass
class HybridCarry:
    advice: AdviceTable
    veto: VetoState
    changed: jax.Array  # [N] bool: a fill or an exit since the env was last considered for a query
    top_prob: jax.Array  # [N] the policy's top probability at the latest step
    trust: jax.Array  # [N] running mean of the trust gate over the env's advised decisions (1 before the first)
    # [N] bool (query.keep_advised_bracket): set at each flat decision to "trusted advice is in force", then kept
    # through the trade that decision opens, so it says whether the open trade was entered on trusted advice
    advised_trade: jax.Array
    record: AdviceRecord | None = None  # query.bind_on=record only (None: no leaves, so older checkpoints still fit)


class StepExtras(NamedTuple):
    """What the loss needs to rebuild the acting distribution of a stored step."""

    advice: AdviceView  # leaves [N, ...]
    context: jax.Array  # [N, N_FUSION_CONTEXT]
    pg_weight: jax.Array  # [N] 1 where the policy chose the action, 0 where rules overrode it
    stats: dict[str, jax.Array]  # per-step sums over envs, for metrics
    trade: Any = None  # the step's fills ({entered, exited, trade_pnl}) and decision bar, leaves [N]: advisor outcomes
    advice_in: Any = None  # [N, N_ADVICE_INPUT] the advice state the policy and value read (hybrid.advice_input)


@dataclass(frozen=True)
class HybridActing:
    fusion: str  # none | rules | learned; advice_only (evaluation ablation): the advice alone, HOLD without it
    query: QueryConfig
    veto: VetoConfig
    llm_weight: float
    window: int  # the env's observation window, to find features in the raw observation
    extended: bool  # the observation has the extended context and risk features
    greedy: bool = False  # evaluation: the most probable action of the acting distribution instead of a sample
    advice_input: bool = False  # the policy and value read the advice state (advice_state) beside the observation
    gate_init_logit: float = GATE_INIT_LOGIT  # the learned gate's logit before training (hybrid.gate_init_logit)

    @property
    def waits_on_trust(self) -> bool:
        """Whether the wait depends on the env's running trust (HybridCarry.trust), which is kept up only then."""
        return self.query.wait_for_answer and self.query.wait_min_trust > 0 and self.fusion in GATED_FUSIONS

    @property
    def binds_on_record(self) -> bool:
        """Whether the advice's record (HybridCarry.record) decides which envs are bound to it."""
        return self.query.bind_on == "record" and self.fusion in ADVISED_FUSIONS

    @property
    def advice_features(self) -> int:
        return N_ADVICE_INPUT if self.advice_input else 0

    def advice_state(self, carry: HybridCarry, side: jax.Array) -> jax.Array | None:
        """[N, N_ADVICE_INPUT] what the policy and value read of the advice (None without `advice_input`): the
        advice in force for the env's side (probabilities, decayed confidence, age as a fraction of the expiry,
        valid) and whether a question is in flight, so the policy can learn to wait for an answer on its way and
        to follow informed advice itself; the trust gate keeps scaling the advice in the mixture. The policy alone
        (`--llm none`, the rl_only ablation) reads None: no advice."""
        if not self.advice_input:
            return None
        advice = view(carry.advice, self.query, side)
        valid = advice.valid.astype(jnp.float32)
        return jnp.concatenate([advice.probs * valid[:, None], advice.confidence[:, None], advice.age_frac[:, None],
                                valid[:, None], pending(carry.advice, self.query)[:, None].astype(jnp.float32)], -1)

    @property
    def gate_features(self) -> int:
        return (2 * NUM_ACTIONS + 5 + N_FUSION_CONTEXT) if self.fusion in GATED_FUSIONS else 0

    def trust_gate(self) -> tuple[TrustGate | None, int]:
        """The network's trust gate and the width of its input (learned and pooled fusion only)."""
        if self.fusion not in GATED_FUSIONS:
            return None, 0
        return TrustGate(init_logit=self.gate_init_logit), self.gate_features

    def init_carry(self, n_envs: int) -> HybridCarry:
        return HybridCarry(
            advice=AdviceTable.create(n_envs),
            veto=VetoState.create(n_envs),
            changed=jnp.zeros(n_envs, bool),
            top_prob=jnp.ones(n_envs),
            trust=jnp.ones(n_envs),
            advised_trade=jnp.zeros(n_envs, bool),
            record=AdviceRecord.create(n_envs) if self.binds_on_record else None,
        )

    def carry_for_walk(self, record: Any = None) -> HybridCarry:
        """The carry of a one-env walk: fresh, but with the trained agent's advice record where it binds on one (a
        record from a checkpoint, restored as a dict, or the training state's)."""
        carry = self.init_carry(1)
        if not self.binds_on_record or record is None:
            return carry
        if isinstance(record, dict):
            record = AdviceRecord.create(1).replace(calls=CallTally(**record["calls"]), bound=record["bound"])
        return carry.replace(record=record.carried(1))

    def context(self, obs: jax.Array) -> jax.Array:
        """Fusion context from the raw observation: the latest bar's ADX, ATR % and time of day, the
        position, and (extended observations only) the win rate and consecutive losses."""
        last = (self.window - 1) * N_BAR_FEATURES
        position = self.window * N_BAR_FEATURES
        cols = [obs[..., last + 5], obs[..., last + 6], obs[..., last + 10], obs[..., position]]
        if self.extended:
            risk = self.window * N_BAR_FEATURES + N_POSITION + N_VALIDITY + N_CONTEXT_FEATURES
            cols += [obs[..., risk + 2], obs[..., risk + 1]]
        else:
            cols += [jnp.zeros_like(obs[..., 0])] * 2
        return jnp.stack(cols, axis=-1)

    def waiting(self, carry: HybridCarry, side: jax.Array, advice: AdviceView) -> jax.Array:
        """[N] bool: flat envs held out of the market until advice arrives (`query.wait_for_answer`; only for an
        agent that acts on advice): their question is in flight, or they have just exited a trade, have no advice
        for being flat, and will be asked at a coming query step (an exit marks them as changed). An env whose
        latest answer for being flat was PASS does not wait: its advisor has said it has no view there, and the
        question in flight would most likely be passed on too. Only envs bound to their advice wait (`trusted`)."""
        if not self.query.wait_for_answer or self.fusion not in ADVISED_FUSIONS:
            return jnp.zeros(side.shape, bool)
        wait = (pending(carry.advice, self.query) | (carry.changed & ~advice.valid)) & (side == 0)
        wait &= ~passed(carry.advice, self.query, side)
        return wait & self.trusted(carry)

    def trusted(self, carry: HybridCarry) -> jax.Array:
        """[N] bool: the env is bound to its advice: with `query.bind_on=record`, while the advice's record binds
        (every env alike, AdviceRecord); otherwise while its running trust is above `query.wait_min_trust` (all,
        where that is not kept)."""
        if self.binds_on_record:
            return jnp.broadcast_to(carry.record.bound, carry.trust.shape)
        return carry.trust > self.query.wait_min_trust if self.waits_on_trust else jnp.ones(carry.trust.shape, bool)

    @property
    def binding_earned(self) -> bool:
        """Whether `trusted` says something: envs are bound by their advice's record or their running trust, not
        all of them always."""
        return self.binds_on_record or self.waits_on_trust

    @property
    def keeps_advised_bracket(self) -> bool:
        return self.query.keep_advised_bracket and self.fusion in ADVISED_FUSIONS

    @property
    def enters_on_advice_only(self) -> bool:
        return self.query.advised_entries_only and self.fusion in ADVISED_FUSIONS

    def act(self, network, params, carry: HybridCarry, logits, env_mask, obs, env_state, env_params, key):
        """Returns (executed action, the action PPO learns from, its log-prob, extras, new carry)."""
        veto_mask, veto, fired, _ = apply_veto(self.veto, carry.veto, env_state, env_params, env_mask)
        advice = view(carry.advice, self.query, env_state.side)
        entries = jnp.array(action_flags((BUY, SELL)))
        bound = self.trusted(carry)
        named = jax.nn.one_hot(jnp.argmax(advice.probs, -1), NUM_ACTIONS, dtype=bool)
        own_entry = entries[None, :] & ~(advice.valid[:, None] & named)  # [N, A] entries the advice does not name
        if self.binding_earned:  # near the drawdown limit, a bound env enters only on its advice (a veto rule)
            near_limit = near_the_limit(self.veto, env_state, env_params) & bound
            veto_mask = veto_mask & ~(near_limit[:, None] & own_entry)
        waiting = self.waiting(carry, env_state.side, advice)
        mask = veto_mask & ~(waiting[:, None] & entries[None, :])
        if self.enters_on_advice_only:
            # where the advisor's answer in force is PASS it has said it has no view: the policy enters alone there,
            # except after a fill or an exit, until the env is asked again. It need not wait for that answer: waiting
            # for it too cost the trained switch 13k of its 215k over 119 fresh days (docs/advisor.md)
            alone = passed(carry.advice, self.query, env_state.side) & ~carry.changed
            mask = mask & ~((bound & ~alone)[:, None] & own_entry)
        kept = jnp.zeros(env_mask.shape[0], bool)  # the env's open trade keeps its bracket
        if self.keeps_advised_bracket:
            kept = carry.advised_trade & (env_state.side != 0)
            mask = mask & ~(kept[:, None] & jnp.array(action_flags(STOP_MOVES))[None, :])
        logits = masked_logits(logits, mask)
        logp_rl = jax.nn.log_softmax(logits)
        pi_rl = jnp.exp(logp_rl)
        context = self.context(obs)
        k_rl, k_mix = jax.random.split(key)
        gate = jnp.zeros(pi_rl.shape[0])
        pg_weight = jnp.ones(pi_rl.shape[0])
        if self.fusion in GATED_FUSIONS:
            gate = trust_where_valid(network, params, fusion_features(pi_rl, advice, context), advice.valid)
            log_p = self.fused_log_probs(logits, pi_rl, advice, gate, mask)
            p = jnp.exp(log_p)
            action = jnp.argmax(log_p, -1) if self.greedy else jax.random.categorical(k_mix, log_p)
            learn_action = action
            log_prob = jnp.take_along_axis(log_p, action[:, None], -1)[:, 0]
            changed_by_advice = advice.valid & (jnp.argmax(p, -1) != jnp.argmax(pi_rl, -1))
        elif self.fusion == "advice_only":
            action = learn_action = jnp.where(advice.valid, advised_action(advice, mask), 0)
            log_prob = jnp.zeros(pi_rl.shape[0])
            changed_by_advice = action != jnp.argmax(pi_rl, -1)
        else:
            learn_action = jnp.argmax(logits, -1) if self.greedy else jax.random.categorical(k_rl, logits)
            log_prob = jnp.take_along_axis(logp_rl, learn_action[:, None], -1)[:, 0]
            if self.fusion == "rules":
                action = rules_action(learn_action, pi_rl, advice, mask, self.llm_weight)
            elif self.fusion == "switch":
                action = jnp.where(advice.valid, advised_action(advice, mask), learn_action)
            else:
                action = learn_action
            pg_weight = (action == learn_action).astype(jnp.float32)
            changed_by_advice = action != learn_action
        advice_action = jnp.argmax(advice.probs, -1)
        valid = advice.valid.astype(jnp.float32)
        stats = {
            "decisions": jnp.asarray(pi_rl.shape[0], jnp.float32),
            "with_advice": valid.sum(),
            "advice_confidence": advice.confidence.sum(),
            "agreement": (valid * (advice_action == jnp.argmax(pi_rl, -1))).sum(),
            "overrides": changed_by_advice.sum().astype(jnp.float32),
            "trust": gate.sum(),
            "vetoed": (env_mask & ~veto_mask).any(-1).sum().astype(jnp.float32),  # blocked an otherwise valid action
            "waited": (waiting & (env_mask & entries[None, :]).any(-1)).sum().astype(jnp.float32),
            "bracket_kept": (kept & env_mask[:, jnp.array(STOP_MOVES)].any(-1)).sum().astype(jnp.float32),
            "bound": jnp.asarray(bound.sum() if self.fusion in ADVISED_FUSIONS else 0, jnp.float32),
            **{f"veto_fired_{r}": fired[:, i].sum().astype(jnp.float32) for i, r in enumerate(RULES)},
        }
        extras = StepExtras(advice=advice, context=context, pg_weight=pg_weight, stats=stats)
        trust = carry.trust  # kept up only where the wait reads it (rules fusion has no gate: its envs keep 1)
        if self.waits_on_trust:
            trust = jnp.where(advice.valid, trust + TRUST_STEP * (gate - trust), trust)
        flat = env_state.side == 0  # entries need a flat env, so a trade's flag is that of its entry decision
        if self.keeps_advised_bracket:
            carry = carry.replace(advised_trade=jnp.where(flat, advice.valid & bound, carry.advised_trade))
        if self.binds_on_record:
            call = (advice.valid & flat) * (named[:, BUY].astype(jnp.int32) - named[:, SELL].astype(jnp.int32))
            p = env_params
            value = p.point_value * p.contracts
            cost = 2.0 * (p.commission_per_side * p.contracts + p.slippage * value)
            record = carry.record.step(env_state.t, p.bars[env_state.t, CLOSE], call, self.query.max_age, value, cost,
                                       self.query.record_calls)
            carry = carry.replace(record=record)
        carry = carry.replace(veto=veto, top_prob=pi_rl.max(-1), trust=trust)
        return action, learn_action, log_prob, mask, extras, carry

    def fused_log_probs(self, logits, pi_rl, advice: AdviceView, gate, mask) -> jax.Array:
        """[N, A] log-probabilities of the acting distribution of a gated fusion: the mixture (learned) or the
        log-linear pool (pooled) of the policy and the valid advice, with invalid actions at probability 0."""
        pi_llm = masked_advice_probs(advice.probs, mask)
        if self.fusion == "pooled":
            return pool(logits, pi_llm, gate, mask)
        return jnp.log(jnp.maximum(mix(pi_rl, pi_llm, gate, mask), 1e-30))

    @staticmethod
    def trade_events(info: dict) -> dict[str, jax.Array]:
        return {"entered": info["entry_side"] != 0, "exited": info["exit_reason"] > 0, "trade_pnl": info["trade_pnl"]}

    def after_step(self, carry: HybridCarry, info: dict) -> HybridCarry:
        trade = self.trade_events(info)
        event = trade["entered"] | trade["exited"]
        return carry.replace(advice=carry.advice.tick(), changed=carry.changed | event)

    def log_prob_entropy(self, network, params, logits, mask, extras: StepExtras, action):
        """Log-prob of `action`, entropy, and policy-loss weight under the current parameters."""
        logits = masked_logits(logits, mask)
        if self.fusion not in GATED_FUSIONS:
            log_prob, entropy = log_probs_and_entropy(logits, action)
            return log_prob, entropy, extras.pg_weight
        pi_rl = jax.nn.softmax(logits)
        gate = trust_where_valid(network, params, fusion_features(pi_rl, extras.advice, extras.context),
                                 extras.advice.valid)
        logp_all = self.fused_log_probs(logits, pi_rl, extras.advice, gate, mask)
        p = jnp.exp(logp_all)
        log_prob = jnp.take_along_axis(logp_all, action[..., None], -1)[..., 0]
        entropy = -jnp.sum(jnp.where(p > 0, p * logp_all, 0.0), -1)
        return log_prob, entropy, extras.pg_weight


def advised_action(advice: AdviceView, mask: jax.Array) -> jax.Array:
    """[N] the advice's most probable valid action (HOLD where none of its actions is valid)."""
    return jnp.argmax(masked_advice_probs(advice.probs, mask), -1)


def trust_where_valid(network, params, features: jax.Array, valid: jax.Array) -> jax.Array:
    """[N] the trust gate for the rows with valid advice, 0 elsewhere. While few rows have advice (at most
    GATE_ROWS_SHARE of them), the gate runs on those rows gathered into a fixed-size block (static shapes) and
    scatters back; otherwise on every row. Either way each row's value is the gate of that row's features."""
    n = valid.shape[0]
    rows = int(n * GATE_ROWS_SHARE)

    def every_row() -> jax.Array:
        return network.apply(params, features, method=ActorCritic.trust)

    def valid_rows() -> jax.Array:
        idx = jnp.nonzero(valid, size=rows, fill_value=n)[0]  # n: a padding row, dropped on the way back
        gate = network.apply(params, features.at[idx].get(mode="fill", fill_value=0.0), method=ActorCritic.trust)
        return jnp.zeros(n, gate.dtype).at[idx].set(gate, mode="drop")

    gate = every_row() if rows < 1 else jax.lax.cond(valid.sum() <= rows, valid_rows, every_row)
    return jnp.where(valid, gate, 0.0)


def make_acting(cfg, env) -> HybridActing:
    h = cfg.hybrid
    return HybridActing(h.fusion, h.query, h.veto, h.llm_weight, env.window, env.extended,
                        advice_input=h.advice_input, gate_init_logit=h.gate_init_logit)
