"""Acting with advice, inside the jitted rollout step: masks → entry rules → fusion → sample, and the matching
log-probabilities for the PPO loss. `make_train(..., acting=HybridActing(...))` uses it; without it PPO samples from
the policy alone. Everything the advice changes in training reaches PPO through this interface: the acting step,
the loss's log-probabilities, the per-env carry, and the trust gate with its learning-rate scale.

The log-probability stored for PPO is that of the distribution actually sampled from: the learned mixture for
`learned`; for `rules` and `switch`, the policy's own sample, with weight 0 in the policy loss where the advice
replaced it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from agents.advice.fusion import TrustGate, fusion_features, masked_advice_probs, mix, rules_action
from agents.advice.risk_veto import RULES, VetoState, apply_veto
from agents.advice.record import AdviceRecord
from agents.advice.rules import ENTRIES, STOP_MOVES, EntryRules, RuleState
from agents.advice.table import SIDES, AdviceTable, AdviceView, num_blocks, view
from agents.config import GATED_FUSIONS, HybridConfig, QueryConfig, VetoConfig
from agents.rl.account import is_account_env
from agents.rl.networks import log_probs_and_entropy, masked_logits
from bridge.protocol import NUM_ACTIONS, action_flags

# The trust gate's market and account context, by observation feature (jaxenv.env.TradingEnv.observation_column):
# regime, volatility, time of day, position, then (extended observations only, else 0) win rate and losing streak
CONTEXT_FEATURES = ("adx14", "atr_pct", "time_of_day", "side", "win_rate_last10", "consecutive_losses")
# The trust gate only matters where advice is valid, often a few envs of thousands; while at most this share of a
# batch has advice, the gate runs on those rows alone.
GATE_ROWS_SHARE = 1 / 16


@struct.dataclass
class HybridCarry:
    advice: AdviceTable  # per key of the market's blocks × sides, shared by every env
    veto: VetoState
    trust: jax.Array  # [N] running mean of the trust gate over the env's advised decisions (1 before the first)
    advised_trade: jax.Array  # [N] bool: the open trade was entered by a bound env with advice in force
    record: AdviceRecord | None = None  # bind_on=record only (None: no leaves)

    def rule_state(self) -> RuleState:
        return RuleState(self.trust, self.advised_trade, self.record)


class StepExtras(NamedTuple):
    """What the loss needs to rebuild the acting distribution of a stored step."""

    advice: AdviceView  # leaves [N, ...]
    context: jax.Array  # [N, len(CONTEXT_FEATURES)]
    pg_weight: jax.Array  # [N] 1 where the policy chose the action, 0 where the advice overrode it
    stats: dict[str, jax.Array]  # per-step sums over envs, for metrics


class Decision(NamedTuple):
    """One step's fused choice (leaves [N])."""

    action: jax.Array  # executed
    learn_action: jax.Array  # the action PPO learns from
    log_prob: jax.Array  # of learn_action under the distribution sampled from
    pi_rl: jax.Array  # [N, A] the masked policy
    gate: jax.Array  # the trust gate (0 without it or without valid advice)
    pg_weight: jax.Array
    changed_by_advice: jax.Array  # bool


@dataclass(frozen=True)
class HybridActing:
    fusion: str  # none | rules | switch | learned; advice_only (evaluation ablation): the advice alone, HOLD without
    query: QueryConfig
    veto: VetoConfig
    llm_weight: float  # rules fusion
    context_columns: tuple[int | None, ...]  # CONTEXT_FEATURES' observation columns (None: not in this observation)
    gate_lr_scale: float = 1.0  # the trust gate learns at the policy's learning rate times this
    greedy: bool = False  # evaluation: the most probable action of the acting distribution instead of a sample

    @property
    def rules(self) -> EntryRules:
        return EntryRules(self.query, self.veto, self.fusion)

    @property
    def gated(self) -> bool:
        return self.fusion in GATED_FUSIONS

    def trust_gate(self) -> tuple[TrustGate | None, int]:
        """The network's trust gate and the width of its input (learned fusion only)."""
        if not self.gated:
            return None, 0
        return TrustGate(), 2 * NUM_ACTIONS + 5 + len(CONTEXT_FEATURES)

    def optimizer_scaling(self) -> list[optax.GradientTransformation]:
        """After the optimiser: the trust gate's updates scaled by gate_lr_scale. It sits on a policy that is
        learning too, and at the policy's step size it could barely move in a run of a few dozen updates."""
        if not self.gated or self.gate_lr_scale == 1.0:
            return []
        return [optax.masked(optax.scale(self.gate_lr_scale), gate_params)]

    def init_carry(self, n_envs: int, env_params) -> HybridCarry:
        """The carry of n_envs envs on the market of `env_params` (its advice table has a key per block and side)."""
        return HybridCarry(
            advice=AdviceTable.create(num_blocks(env_params.bars.shape[0], self.query.interval) * SIDES),
            veto=VetoState.create(n_envs),
            trust=jnp.ones(n_envs),
            advised_trade=jnp.zeros(n_envs, bool),
            record=self.rules.create_record(),
        )

    def carry_for_walk(self, env_params, record: Any = None) -> HybridCarry:
        """The carry of a one-env walk: fresh, but starting from the trained agent's advice record where it binds on
        one (a record from a checkpoint, restored as a dict, or the training state's)."""
        carry = self.init_carry(1, env_params)
        if isinstance(record, dict):
            record = AdviceRecord.restored(record)
        if carry.record is None or record is None:
            return carry
        return carry.replace(record=record.for_walk())

    def look(self, carry: HybridCarry, env_state, env_params) -> HybridCarry:
        """At a query step (the start of each rollout chunk): the advice's record counts the calls its table holds
        (agents.advice.record), and binds or lets go. A no-op for the other bindings."""
        if carry.record is None:
            return carry
        record = carry.record.look(carry.advice, env_params, self.query.interval, self.query.max_age,
                                   env_state.t.max())
        return carry.replace(record=record)

    def context(self, obs: jax.Array) -> jax.Array:
        """[N, len(CONTEXT_FEATURES)] the trust gate's context, read from the raw observation."""
        zeros = jnp.zeros_like(obs[..., 0])
        return jnp.stack([zeros if c is None else obs[..., c] for c in self.context_columns], axis=-1)

    def act(self, network, params, carry: HybridCarry, logits, env_mask, obs, env_state, env_params, key):
        """Returns (executed action, the action PPO learns from, its log-prob, the mask, extras, new carry)."""
        veto_mask, veto, fired, _ = apply_veto(self.veto, carry.veto, env_state, env_params, env_mask)
        advice = view(carry.advice, self.query, env_state.t, env_state.side)
        state = carry.rule_state()
        rules = self.rules.apply(state, advice, env_state, env_params, veto_mask)
        context = self.context(obs)
        d = self.decide(network, params, masked_logits(logits, rules.mask), advice, context, rules.mask, key)
        stats = self.step_stats(d, advice, rules, env_mask, fired)
        extras = StepExtras(advice=advice, context=context, pg_weight=d.pg_weight, stats=stats)
        state = self.rules.update(state, advice, rules.bound, d.gate, env_state)
        carry = carry.replace(veto=veto, trust=state.trust, advised_trade=state.advised_trade)
        return d.action, d.learn_action, d.log_prob, rules.mask, extras, carry

    def decide(self, network, params, logits, advice: AdviceView, context, mask, key) -> Decision:
        """Fusion and sampling over the masked policy `logits`."""
        logp_rl = jax.nn.log_softmax(logits)
        pi_rl = jnp.exp(logp_rl)
        k_rl, k_mix = jax.random.split(key)
        n = pi_rl.shape[0]
        if self.gated:
            gate = trust_where_valid(network, params, fusion_features(pi_rl, advice, context), advice.valid)
            log_p = self.fused_log_probs(pi_rl, advice, gate, mask)
            action = jnp.argmax(log_p, -1) if self.greedy else jax.random.categorical(k_mix, log_p)
            log_prob = jnp.take_along_axis(log_p, action[:, None], -1)[:, 0]
            changed = advice.valid & (jnp.argmax(log_p, -1) != jnp.argmax(pi_rl, -1))
            return Decision(action, action, log_prob, pi_rl, gate, jnp.ones(n), changed)
        if self.fusion == "advice_only":
            action = jnp.where(advice.valid, advised_action(advice, mask), 0)
            return Decision(action, action, jnp.zeros(n), pi_rl, jnp.zeros(n), jnp.ones(n),
                            action != jnp.argmax(pi_rl, -1))
        learn_action = jnp.argmax(logits, -1) if self.greedy else jax.random.categorical(k_rl, logits)
        log_prob = jnp.take_along_axis(logp_rl, learn_action[:, None], -1)[:, 0]
        if self.fusion == "rules":
            action = rules_action(learn_action, pi_rl, advice, mask, self.llm_weight)
        elif self.fusion == "switch":
            action = jnp.where(advice.valid, advised_action(advice, mask), learn_action)
        else:
            action = learn_action
        return Decision(action, learn_action, log_prob, pi_rl, jnp.zeros(n), (action == learn_action).astype(
            jnp.float32), action != learn_action)

    def step_stats(self, d: Decision, advice: AdviceView, rules, env_mask, fired) -> dict[str, jax.Array]:
        """Per-step sums over envs of how the advice was used (agents.advice.usage turns them into metrics)."""
        valid = advice.valid.astype(jnp.float32)
        sum_of = lambda flags: flags.sum().astype(jnp.float32)  # noqa: E731
        return {
            "decisions": jnp.asarray(d.pi_rl.shape[0], jnp.float32),
            "with_advice": valid.sum(),
            "with_current_advice": sum_of(advice.current),
            "advice_confidence": advice.confidence.sum(),
            "agreement": (valid * (jnp.argmax(advice.probs, -1) == jnp.argmax(d.pi_rl, -1))).sum(),
            "overrides": sum_of(d.changed_by_advice),
            "trust": d.gate.sum(),
            "vetoed": sum_of((env_mask & ~rules.veto).any(-1)),  # blocked an otherwise valid action
            "waited": sum_of(rules.waiting & (env_mask & jnp.array(action_flags(ENTRIES))[None, :]).any(-1)),
            "bracket_kept": sum_of(rules.kept & env_mask[:, jnp.array(STOP_MOVES)].any(-1)),
            "bound": sum_of(rules.bound),
            **{f"veto_fired_{r}": sum_of(fired[:, i]) for i, r in enumerate(RULES)},
        }

    def fused_log_probs(self, pi_rl, advice: AdviceView, gate, mask) -> jax.Array:
        """[N, A] log-probabilities of the learned mixture of the policy and the valid advice, with invalid actions
        at probability 0."""
        pi_llm = masked_advice_probs(advice.probs, mask)
        return jnp.log(jnp.maximum(mix(pi_rl, pi_llm, gate, mask), 1e-30))

    @staticmethod
    def loss_extras(extras: StepExtras) -> StepExtras:
        """What the loss reads of a stored step (the metrics stay out of the minibatches)."""
        return extras._replace(stats={})

    def log_prob_entropy(self, network, params, logits, mask, extras: StepExtras, action):
        """Log-prob of `action`, entropy, and policy-loss weight under the current parameters."""
        logits = masked_logits(logits, mask)
        if not self.gated:
            log_prob, entropy = log_probs_and_entropy(logits, action)
            return log_prob, entropy, extras.pg_weight
        pi_rl = jax.nn.softmax(logits)
        gate = trust_where_valid(network, params, fusion_features(pi_rl, extras.advice, extras.context),
                                 extras.advice.valid)
        logp_all = self.fused_log_probs(pi_rl, extras.advice, gate, mask)
        p = jnp.exp(logp_all)
        log_prob = jnp.take_along_axis(logp_all, action[..., None], -1)[..., 0]
        entropy = -jnp.sum(jnp.where(p > 0, p * logp_all, 0.0), -1)
        return log_prob, entropy, extras.pg_weight


def gate_params(params: Any) -> Any:
    """True on the trust gate's parameters (`params/gate/...`), False elsewhere."""
    return jax.tree_util.tree_map_with_path(lambda path, _: any(getattr(k, "key", None) == "gate" for k in path),
                                            params)


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
        return network.apply(params, features, method="trust")

    def valid_rows() -> jax.Array:
        idx = jnp.nonzero(valid, size=rows, fill_value=n)[0]  # n: a padding row, dropped on the way back
        gate = network.apply(params, features.at[idx].get(mode="fill", fill_value=0.0), method="trust")
        return jnp.zeros(n, gate.dtype).at[idx].set(gate, mode="drop")

    gate = every_row() if rows < 1 else jax.lax.cond(valid.sum() <= rows, valid_rows, every_row)
    return jnp.where(valid, gate, 0.0)


def make_acting(hybrid: HybridConfig, env) -> HybridActing:
    """Acting with the advice of the run's advisor as `hybrid` says, in the trading env `env` (an account env: each
    head acting so on its instrument, agents.advice.account_acting)."""
    if is_account_env(env):
        from agents.advice.account_acting import AccountActing  # it builds on this module

        return AccountActing(make_acting(hybrid, env.single), env)
    h = hybrid
    columns = tuple(env.observation_column(name) for name in CONTEXT_FEATURES)
    return HybridActing(h.fusion, h.query, h.veto, h.llm_weight, columns, gate_lr_scale=h.gate_lr_scale)


def training_acting(hybrid: HybridConfig, llm: str, env) -> HybridActing | None:
    """How a run's agent acts while it trains (and what its networks are: the trust gate's): with its advisor
    (make_acting), or None for a run without one (llm: none), which samples from the policy alone."""
    return make_acting(hybrid, env) if llm != "none" else None


def acting_of(hybrid: HybridConfig, llm: str, env) -> HybridActing:
    """How a run's agent acts outside training (a walk, a trade): with its advisor (make_acting), or for a run
    without one (llm: none) the policy alone: no fusion, no veto, no record. One acting step then serves both."""
    if llm != "none":
        return make_acting(hybrid, env)
    h = hybrid
    alone = dataclasses.replace(h, fusion="none", veto=dataclasses.replace(h.veto, enabled=False),
                                query=dataclasses.replace(h.query, bind_on="always"))
    return make_acting(alone, env)
