"""The advice alone on an account of several instruments (issue 77): does the advisor, trading each instrument by its
own answers under the account's rules, do better than the agent?

Each instrument's advisor (agents.advisor.instrument_set: its own keys, prompts naming it, a store whose identity holds
the set) is first asked every key the walk reads, in full batches, one instrument after the other. The account then
walks the split as every walk does (jaxenv.account_evaluate.walk_account): at bar t each instrument, in the set's
order, takes the advice in force for its block and side (agents.advice.table.view: block b's answer, rendered at
block b's last bar, is read from block b + 1 on) as its action: the advice's most probable action among those its
sequential mask allows, HOLD where no view is in force (no answer, a "no view" answer, or one older than
hybrid.query.max_age bars). It is the single instrument's `llm_only` ablation, head by head; a key the advisor did
not answer (an error) is not asked again, its blocks walk with no advice.

    tables = advice_tables(hybrid, "mock", env_cfg, data, market_set, start, end)    # AdviceTable, leaves [I, ...]
    trace = walk_account(env, market_set, (start, end), advice_alone_act(env, hybrid.query), key, tables)
"""

from __future__ import annotations

import dataclasses
from contextlib import closing

import jax
import jax.numpy as jnp
from tqdm import tqdm

from agents.advice.account_acting import instrument
from agents.advice.table import AdviceTable, view, walk_keys
from agents.advisor.advisor import ask_every
from agents.advisor.instrument_set import each_advisor
from agents.advisor.sidecar import at_full_rate
from agents.config import ConfigError, HybridConfig, QueryConfig, TrainConfig, validate
from agents.rl.account import AccountHeads
from agents.rl.normalization import normalize_obs as normalized_obs
from bridge.protocol import HOLD, NUM_ACTIONS
from jaxenv.config import DataConfig, EnvConfig

NO_PROBABILITY = 1e-30  # the log of a probability 0 stays finite, below any action the masks allow


def check_advisor(cfg: TrainConfig, advisor: str) -> None:
    """`advisor` as the llm of the run of `cfg` passes the config's own checks (a model folder that exists, ...): a
    ConfigError, one line each, before anything walks."""
    if advisor.strip() in ("", "none"):
        raise ConfigError(f"--advisor {advisor}: no advisor to walk; name one (mock, smollm2, a model path or hub id)")
    validate(dataclasses.replace(cfg, llm=advisor))


def advice_tables(hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market_set, start: int, end: int,
                  progress: bool = True) -> AdviceTable:
    """Every instrument's advice for a walk of joint bars [start, end): its advisor `llm` asked every key the walk
    reads that its store lacks, at its full rate; the tables stacked, leaves [I, ...]."""
    hybrid = at_full_rate(hybrid)  # nothing else runs beside an evaluation's advisor
    keys = walk_keys(start, end, hybrid.query.interval, hybrid.query.entries_only)
    batch = hybrid.link.max_budget
    tables = []
    with closing(each_advisor(hybrid, llm, env, data, market_set, batch, start=False)) as advisors:
        for i, advisor in advisors:
            missing = keys[~advisor.known.filled()[keys]]
            if len(missing):
                with tqdm(total=len(missing), desc=f"advisor: {market_set.symbols[i]}'s keys", unit="key", leave=False,
                          disable=not progress, mininterval=2.0) as bar:
                    ask_every(advisor, missing, batch, on_progress=lambda done: bar.update(done - bar.n))
            tables.append(AdviceTable.create(advisor.known.num_keys).holding(advisor.known))
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *tables)


def advice_alone_act(env, query: QueryConfig):
    """An act for jaxenv.account_evaluate.walk_account, its policy state the stacked tables (advice_tables): each
    instrument's advice in force as its action (the module's docstring). Deterministic: the key is not used."""
    hold = jnp.log(jnp.maximum(jnp.eye(NUM_ACTIONS)[HOLD], NO_PROBABILITY))

    def act(tables: AdviceTable, obs, state, params, key):
        advice = jax.vmap(lambda table, side: view(table, query, state.t[None], side[None]))(tables, state.legs.side)
        logits = jnp.where(advice.valid[:, :1], jnp.log(jnp.maximum(advice.probs[:, 0], NO_PROBABILITY)), hold)
        return env.sample_actions(key, state, params, logits, deterministic=True)[0]

    return act


def advised_act(acting, network, normalize_obs: bool, head_stats: bool = False):
    """An act with a carry for walk_account: the run's agent acting as it trained (agents.advice.account_acting.
    AccountActing on a batch of one account: the policy, each head's advice in force, veto, entry rules and fusion,
    head by head under the sequential masks). Its policy state is (network params, observation normaliser); its carry
    is `advised_carry`'s. At each query step (a bar that starts a block of hybrid.query.interval) the advice's record
    counts what has settled, as a training rollout's start does. With `head_stats` it also returns each head's stats
    of the step ({name: [I]}: trust, the veto's rules, ...; a live decision's), after the carry."""
    if head_stats:
        acting = dataclasses.replace(acting, head_stats=True)
    logits_of = type(network).logits
    interval = acting.single.query.interval
    as_obs = AccountHeads(acting.env).as_obs

    def act(policy_state, carry, obs, state, params, key):
        net_params, obs_norm = policy_state
        one = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
        obs1 = one(as_obs(obs))
        state1 = one(state)
        logits = network.apply(net_params, normalized_obs(obs_norm, obs1) if normalize_obs else obs1,
                               method=logits_of)
        carry = jax.lax.cond(state.t % interval == 0, lambda c: acting.look(c, state1, params), lambda c: c, carry)
        actions, _, _, _, extras, carry = acting.act(network, net_params, carry, logits, None, obs1, state1, params,
                                                     key)
        if head_stats:
            stats = {k: jnp.stack([h.stats[k] for h in extras.heads]) for k in extras.heads[0].stats}
            return actions[0], carry, stats
        return actions[0], carry

    return act


def advised_carry(acting, env_params, tables: AdviceTable, records=None) -> tuple:
    """advised_act's carry at a walk's first bar: each instrument's one-account carry (from the trained agent's advice
    record where `records`, one per instrument, has one) holding its advice table (advice_tables' row i)."""
    carries = []
    for i in range(env_params.num_instruments):
        carry = acting.single.carry_for_walk(instrument(env_params.inst, i), None if records is None else records[i])
        carries.append(carry.replace(advice=instrument(tables, i)))
    return tuple(carries)
