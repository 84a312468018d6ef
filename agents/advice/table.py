"""The on-device advice table and the selection of envs to ask at a query step.

The table holds, per env, the last LLM answer: probabilities over the 6 actions, the confidence it came
with, its age in env steps and its status. Confidence decays by `decay` per query interval of age and the
advice expires after `max_age_intervals` intervals. Answers arrive one query step after their prompts, and an
answer holds only while the env's position side (flat, long, short) is the one it was asked about: advice to
BUY given for a flat account says nothing about the long position opened meanwhile, and "hold" given for a
long position is no reason to stay out of the market once flat.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from agents.config import QueryConfig
from bridge.protocol import NUM_ACTIONS, STATUS_NO_VIEW, STATUS_OK

STATUS_NONE = -1  # no answer yet; the others are the bridge's (bridge.protocol.STATUS_NAMES)


@struct.dataclass
class AdviceTable:
    probs: jax.Array  # [N, 6]
    confidence: jax.Array  # [N] as answered
    age: jax.Array  # [N] int32 env steps since the answer arrived
    status: jax.Array  # [N] int32, STATUS_NONE before the first answer
    since_query: jax.Array  # [N] int32 env steps since the env was last asked
    asked_side: jax.Array  # [N] int32 the env's side (-1, 0, 1) when it was last asked
    side: jax.Array  # [N] int32 the side the stored advice was asked about

    @classmethod
    def create(cls, n_envs: int, num_actions: int = NUM_ACTIONS) -> "AdviceTable":
        big = jnp.full(n_envs, 1 << 20, jnp.int32)
        return cls(
            probs=jnp.full((n_envs, num_actions), 1.0 / num_actions),
            confidence=jnp.zeros(n_envs),
            age=big,
            status=jnp.full(n_envs, STATUS_NONE, jnp.int32),
            since_query=big,
            asked_side=jnp.zeros(n_envs, jnp.int32),
            side=jnp.zeros(n_envs, jnp.int32),
        )

    def tick(self) -> "AdviceTable":
        """One env step passes."""
        return self.replace(age=self.age + 1, since_query=self.since_query + 1)

    def write(self, env_ids: jax.Array, probs: jax.Array, confidence: jax.Array, status: jax.Array, valid: jax.Array) -> "AdviceTable":
        """Stores answers for env_ids [M] (rows with valid=False are padding and are dropped)."""
        n = self.age.shape[0]
        ids = jnp.where(valid, env_ids, n)  # out of range → dropped by the scatter
        return self.replace(
            probs=self.probs.at[ids].set(probs, mode="drop"),
            confidence=self.confidence.at[ids].set(confidence, mode="drop"),
            age=self.age.at[ids].set(0, mode="drop"),
            status=self.status.at[ids].set(status, mode="drop"),
            side=self.side.at[ids].set(self.asked_side[jnp.minimum(ids, n - 1)], mode="drop"),
        )

    def mark_queried(self, env_ids: jax.Array, valid: jax.Array, side: jax.Array) -> "AdviceTable":
        """env_ids [M] were asked now; `side` [N]: every env's position side now."""
        n = self.age.shape[0]
        ids = jnp.where(valid, env_ids, n)
        return self.replace(since_query=self.since_query.at[ids].set(0, mode="drop"),
                            asked_side=self.asked_side.at[ids].set(side[jnp.minimum(ids, n - 1)], mode="drop"))


@struct.dataclass
class AdviceView:
    """What acting reads: the advice valid now, its decayed confidence and its age as a fraction of the
    expiry."""

    probs: jax.Array
    confidence: jax.Array
    valid: jax.Array
    age_frac: jax.Array


def in_force(table: AdviceTable, cfg: QueryConfig, side: jax.Array) -> jax.Array:
    """[N] bool: the env's latest answer is about its side `side` [N] now and has not expired."""
    return (table.age <= cfg.max_age) & (table.side == side)


def view(table: AdviceTable, cfg: QueryConfig, side: jax.Array) -> AdviceView:
    """The advice in force for envs whose position side is `side` [N] now."""
    valid = (table.status == STATUS_OK) & in_force(table, cfg, side)
    decayed = table.confidence * jnp.power(cfg.decay, table.age / cfg.interval)
    return AdviceView(
        probs=table.probs,
        confidence=jnp.where(valid, decayed, 0.0),
        valid=valid,
        age_frac=jnp.where(valid, table.age / cfg.max_age, 1.0),
    )


def passed(table: AdviceTable, cfg: QueryConfig, side: jax.Array) -> jax.Array:
    """[N] bool: the env's latest answer, for its side `side` [N] now and not expired, was "no view" (PASS): the
    advisor said it has nothing to say here, so there is nothing to wait for until it says otherwise."""
    return (table.status == STATUS_NO_VIEW) & in_force(table, cfg, side)


def pending(table: AdviceTable, cfg: QueryConfig) -> jax.Array:
    """[N] bool: the env was asked and its answer has not arrived yet. Answers come one query step (`interval`
    steps) after their prompts, later under async latency; one that has not come in two intervals is given up on."""
    return (table.since_query < table.age) & (table.since_query < 2 * cfg.interval)


def select_queries(
    table: AdviceTable, cfg: QueryConfig, budget: int, pi_rl: jax.Array, side: jax.Array, changed: jax.Array,
    blocks: int = 1,
):
    """Picks at most `budget` envs to ask (`side` [N]: their position sides now): candidates have advice older
    than the interval (or none, or about another side),
    are past their cooldown, and either the policy is uncertain, the env is flat (an entry decision) or its
    state changed (a fill, an exit, a new loss). Most uncertain first. With `blocks` > 1 the envs are that many
    equal contiguous blocks (one per process, each asking its own advisor) and at most `budget` are picked in each.
    Returns (env_ids [blocks × B], valid [blocks × B]), block by block."""
    top = pi_rl.max(-1)
    flat = side == 0
    stale = (table.age >= cfg.interval) | (table.status != STATUS_OK) | (table.side != side)
    candidate = stale & (table.since_query >= cfg.cooldown) & ((top < cfg.uncertainty_threshold) | flat | changed)
    if cfg.entries_only:
        candidate &= flat
    priority = jnp.where(candidate, 1.0 - top, -1.0).reshape(blocks, -1)
    block = priority.shape[1]
    score, env_ids = jax.lax.top_k(priority, min(budget, block))
    env_ids = env_ids + block * jnp.arange(blocks)[:, None]
    return env_ids.reshape(-1).astype(jnp.int32), score.reshape(-1) >= 0.0
