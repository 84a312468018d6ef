"""The on-device advice table, keyed by market context, and the choice of keys to ask at a query step.

All envs walk the same bars, so what the advisor can say about a bar is the same for every env at that bar with
the same position side. The unit it answers is a key: a block of the data's bars (bars [b·k, b·k + k), k the query
interval) and a position side (short, flat, long). A key's prompt is rendered at the block's last bar; its answer is
in force for every env with that side during block b + 1, so advice used at bar t was rendered from a bar before t
(one query step of latency, whatever the advisor's speed). Where block b's answer is missing, the newest answered
block before it is in force while it is younger than `max_age` bars.

The table holds, per key, the answer's probabilities over the 6 actions, its confidence, its status and the
version of the advisor that gave it (the number of LoRA rounds it had finished). Every env reads it with a gather.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agents.config import QueryConfig
from bridge.protocol import NUM_ACTIONS, STATUS_NO_VIEW, STATUS_OK

SIDES = 3  # a key's side index is side + 1: 0 short, 1 flat, 2 long
STATUS_NONE = -1  # never answered (the others are the bridge's, bridge.protocol.STATUS_NAMES)
STATUS_ASKED = -2  # asked, its answer not back yet


def num_blocks(num_bars: int, interval: int) -> int:
    return -(-num_bars // interval)


# The key layout, defined here once: key = block · SIDES + side + 1 (side −1 short, 0 flat, +1 long).
def key_of(block, side):
    return block * SIDES + side + 1


def key_block(keys):
    return keys // SIDES


def key_side(keys):
    """−1 short, 0 flat, +1 long."""
    return keys % SIDES - 1


def block_last_bar(block, interval: int, num_bars: int):
    """The bar a block's prompt is rendered from: its last (the data's last, for a short final block)."""
    return np.minimum(np.asarray(block) * interval + interval - 1, num_bars - 1)


def answered(status: jax.Array) -> jax.Array:
    """A real answer: a view (OK) or the advisor's "no view" (PASS). Errors and timeouts are asked again."""
    return (status == STATUS_OK) | (status == STATUS_NO_VIEW)


@struct.dataclass
class AdviceTable:
    probs: jax.Array  # [K·3, 6] per key (block-major: key = block · 3 + side + 1)
    confidence: jax.Array  # [K·3] as answered
    status: jax.Array  # [K·3] int32: STATUS_NONE, STATUS_ASKED or the answer's status
    version: jax.Array  # [K·3] int32: the advisor version that answered (-1: none)
    current: jax.Array  # [] int32: the advisor's version now

    @classmethod
    def create(cls, num_keys: int, num_actions: int = NUM_ACTIONS) -> AdviceTable:
        return cls(
            probs=jnp.full((num_keys, num_actions), 1.0 / num_actions),
            confidence=jnp.zeros(num_keys),
            status=jnp.full(num_keys, STATUS_NONE, jnp.int32),
            version=jnp.full(num_keys, -1, jnp.int32),
            current=jnp.zeros((), jnp.int32),
        )

    @property
    def num_keys(self) -> int:
        return self.status.shape[0]

    def write(self, keys: jax.Array, probs: jax.Array, confidence: jax.Array, status: jax.Array,
              version: jax.Array, valid: jax.Array) -> AdviceTable:
        """Stores answers for `keys` [M] (rows with valid=False are padding and are dropped)."""
        ids = jnp.where(valid, keys, self.num_keys)  # out of range → dropped by the scatter
        return self.replace(
            probs=self.probs.at[ids].set(probs, mode="drop"),
            confidence=self.confidence.at[ids].set(confidence, mode="drop"),
            status=self.status.at[ids].set(status, mode="drop"),
            version=self.version.at[ids].set(version, mode="drop"),
        )

    def holding(self, known) -> AdviceTable:
        """This table with every key's answer, status and version as the host's copy `known` has them
        (agents.advisor.store.KnownAdvice: a key it lacks is STATUS_NONE there)."""
        return self.replace(probs=jnp.asarray(known.probs), confidence=jnp.asarray(known.confidence),
                            status=jnp.asarray(known.status), version=jnp.asarray(known.version))

    def mark_asked(self, keys: jax.Array, valid: jax.Array) -> AdviceTable:
        ids = jnp.where(valid, keys, self.num_keys)
        return self.replace(status=self.status.at[ids].set(STATUS_ASKED, mode="drop"))


@struct.dataclass
class AdviceView:
    """What acting reads, per env: the advice in force for its bar and side, its decayed confidence and age."""

    probs: jax.Array  # [N, 6]
    confidence: jax.Array  # [N] decayed with age; 0 where not valid
    valid: jax.Array  # [N] bool: a view (status OK) is in force
    age_frac: jax.Array  # [N] age / max_age where valid, else 1
    age: jax.Array  # [N] int32 bars since the bar its prompt was rendered from (where answered)
    passed: jax.Array  # [N] bool: the answer in force is "no view" (PASS)
    asked: jax.Array  # [N] bool: no answer is in force and the env's key for now is in flight
    current: jax.Array  # [N] bool: valid, and given by the advisor's current version
    key: jax.Array  # [N] int32 the key whose answer is in force (-1: none)


def view(table: AdviceTable, cfg: QueryConfig, bar: jax.Array, side: jax.Array) -> AdviceView:
    """The advice in force for envs at decision bar `bar` [N] with position side `side` [N]: the answer for the
    key of block bar // k − 1, else the newest answered older block within max_age bars."""
    k = cfg.interval
    block = bar // k
    side_idx = side.astype(jnp.int32) + 1
    found = jnp.zeros(bar.shape, bool)
    key = jnp.zeros(bar.shape, jnp.int32)
    age = jnp.zeros(bar.shape, jnp.int32)
    for back in range(1, cfg.max_age_intervals + 1):  # newest first; a static few gathers
        b = block - back
        cand = jnp.maximum(b, 0) * SIDES + side_idx
        a = bar - (b * k + k - 1)
        take = ~found & (b >= 0) & (a <= cfg.max_age) & answered(table.status[cand])
        key, age, found = jnp.where(take, cand, key), jnp.where(take, a, age), found | take
    status = table.status[key]
    valid = found & (status == STATUS_OK)
    now = jnp.maximum(block - 1, 0) * SIDES + side_idx
    decayed = table.confidence[key] * jnp.power(cfg.decay, age / k)
    return AdviceView(
        probs=table.probs[key],
        confidence=jnp.where(valid, decayed, 0.0),
        valid=valid,
        age_frac=jnp.where(valid, age / cfg.max_age, 1.0),
        age=age,
        passed=found & (status == STATUS_NO_VIEW),
        asked=~found & (table.status[now] == STATUS_ASKED),
        current=valid & (table.version[key] == table.current),
        key=jnp.where(found, key, -1),
    )


# A walk (one account, strict latency, a query step every k bars) asks for the block it reads now and the next two,
# for every side: each key it reads is then answered before it is read, whatever earlier walks asked, so a walk's
# figures do not depend on its history.
WALK_AHEAD = (-1, 3)  # (first block relative to the env's now, how many blocks)


def walk_keys(start: int, end: int, interval: int, entries_only: bool = False) -> np.ndarray:
    """The keys a walk of bars [start, end) reads, for every side (flat only with `entries_only`): block b's key is in
    force during block b + 1, so the blocks from the one before the walk's first bar to the one before its last."""
    blocks = np.arange(max(start // interval - 1, 0), max((end - 1) // interval, 0))
    sides = np.array([0] if entries_only else [-1, 0, 1])
    return key_of(blocks[:, None], sides[None, :]).reshape(-1)


def update_ahead(num_steps: int, interval: int) -> tuple[int, int]:
    """Training (one query step per update of T = num_steps steps): (first block, how many) relative to an env's block
    now that it reads during the next update, when keys asked now have been answered under strict latency: blocks
    (t + T) // k − 1 to (t + 2T − 1) // k − 1. An advisor whose answers take `lag` more updates is asked lag × T // k
    blocks further on (QueryPacer measures the lag)."""
    return num_steps // interval - 1, (2 * num_steps - 1) // interval - num_steps // interval + 2


def key_demand(table: AdviceTable, cfg: QueryConfig, bar: jax.Array, side: jax.Array, first: jax.Array, count: int,
               all_sides: bool = False) -> jax.Array:
    """[K·3] how many envs will read each key: an env at bar t counts for blocks t // k + first + i, i < count (the
    blocks it reads once the keys asked now are answered; `first` may be traced), for its side (every side with
    `all_sides`). Flat only with `entries_only`."""
    k = cfg.interval
    side = side.astype(jnp.int32)
    sides = [jnp.full_like(side, s) for s in (-1, 0, 1)] if all_sides else [side]  # one scatter per side read
    demand = jnp.zeros(table.num_keys, jnp.float32)
    for i in range(count):
        block = bar // k + first + i
        for s in sides:
            reads = (s == 0) if cfg.entries_only else jnp.ones(s.shape, bool)
            keys = jnp.where(block >= 0, block * SIDES + s + 1, table.num_keys)
            demand = demand.at[keys].add(reads.astype(jnp.float32), mode="drop")
    return demand


RECORD_SHARE = 0.25  # of a training query step's budget, at least one key: the keys the advice's record lacks first


def select_keys(table: AdviceTable, cfg: QueryConfig, cap: int, bar: jax.Array, side: jax.Array, first: jax.Array,
                count: int, all_sides: bool = False, wanted: jax.Array | None = None, budget: jax.Array | None = None):
    """The at most `cap` keys most in demand (`key_demand`) that have no answer from the advisor's current version
    and are not in flight: missing keys before stale ones. `wanted` [2]: the blocks [b0, b1) whose flat keys the
    advice's record lacks; the first RECORD_SHARE of `budget` (the keys this step will ask, at least one) goes to
    the earliest of them, ahead of every other key, so the record's count moves on however small the budget; the rest
    are wanted as if one env read them. Returns (keys [cap], valid [cap]) in priority order."""
    demand = key_demand(table, cfg, bar, side, first, count, all_sides)
    n = bar.shape[0]
    has = answered(table.status)
    askable = (~has | (table.version < table.current)) & (table.status != STATUS_ASKED)
    reserved = jnp.zeros(table.num_keys, bool)
    if wanted is not None:
        block = key_block(jnp.arange(table.num_keys))
        record_keys = (key_side(jnp.arange(table.num_keys)) == 0) & (block >= wanted[0]) & (block < wanted[1])
        demand += record_keys
        share = jnp.maximum(jnp.floor(RECORD_SHARE * (cap if budget is None else budget)), 1)
        reserved = record_keys & askable & (jnp.cumsum(record_keys & askable) <= share)  # the earliest blocks
    # a reserved key outranks the rest, a missing key any stale one; within each, the envs that will read it
    missing_first = jnp.where(has, 0.0, n + 1.0)  # above any key's demand (at most one per env)
    priority = demand + missing_first + jnp.where(reserved, 2.0 * n + 4.0, 0.0)
    priority = jnp.where((demand > 0) & askable, priority, -1.0)
    score, keys = jax.lax.top_k(priority, min(cap, table.num_keys))
    return keys.astype(jnp.int32), score > 0.0


def query_program(cfg: QueryConfig, cap: int, processes: int, count: int, all_sides: bool = False,
                  record_asks: bool = False):
    """The device side of a query step, one donated jitted program: `(carry, rows, budgets, version, first) ->
    (carry, keys, valid)` writes the collected answers `rows` (AdviceTable.write's arguments) into the carry's advice
    table and the advisor's `version`, then picks and marks as asked at most budgets[p] keys for each process p
    (select_keys over `count` blocks from `first`, and with `record_asks` the keys the advice's record lacks; traced
    counts: one compiled program for every B). Process p asks picks p, p + P, ... of the at most cap · P."""

    def step(carry, rows, budgets, version, first):
        hy = carry.hybrid
        table = hy.advice.write(*rows).replace(current=version)
        state = carry.env_state
        wanted = hy.record.wanted if record_asks and hy.record is not None else None
        keys, valid = select_keys(table, cfg, cap * processes, state.t, state.side, first, count, all_sides, wanted,
                                  budgets.sum())
        rank = jnp.arange(keys.shape[0])
        valid &= rank // processes < budgets[rank % processes]
        table = table.mark_asked(keys, valid)
        return carry.replace(hybrid=hy.replace(advice=table)), keys, valid

    return jax.jit(step, donate_argnums=0)


Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # keys, probs, confidence, status, version


def table_rows(collected: list[Rows], size: int) -> tuple[np.ndarray, ...]:
    """AdviceTable.write's arguments from collected rows, padded to `size` (fixed shapes: one compiled write for every
    answer count): a key whose answer did not come is missing again (asked again)."""
    parts = list(zip(*collected)) if collected else [[np.zeros(0, np.int32)], [np.zeros((0, NUM_ACTIONS), np.float32)],
                                                     [np.zeros(0, np.float32)], [np.zeros(0, np.int32)],
                                                     [np.zeros(0, np.int32)]]
    keys, probs, conf, status, version = (np.concatenate(p) for p in parts)
    n, pad = len(keys), size - len(keys)
    status = np.where(np.asarray(answered(status)), status, STATUS_NONE)
    return (np.concatenate([keys, np.zeros(pad, np.int32)]).astype(np.int32),
            np.concatenate([probs, np.full((pad, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32)]).astype(np.float32),
            np.concatenate([conf, np.zeros(pad, np.float32)]).astype(np.float32),
            np.concatenate([status, np.zeros(pad, np.int32)]).astype(np.int32),
            np.concatenate([version, np.zeros(pad, np.int32)]).astype(np.int32),
            np.arange(size) < n)
