"""Walking a split with a run's agent as it acts: its policy alone (a run without an advisor), or its policy with its
advisor, and its ablations; scored like `jaxenv.walk_split`. One decision step and one advance (`advised_decision`,
`advised_advance`) serve every walk, training's validation and `agents.trading` alike.

One account walks the split bar by bar (after a drawdown breach a fresh account continues from the next bar). With
advice, every key (bar block, position side) the walk reads is asked ahead of it in full batches, and every k bars a
query step asks for what got no answer, exactly as in training: keys asked at one query step are answered into the
advice table at the next, waiting for them (strict), so a walk with the mock advisor is reproducible. The walk starts
from every answer the walks' advisor has (the advice store's, earlier walks'), so keys answered once are not asked
again. Acting is greedy by default: the most probable action of the distribution the agent acts from.

    walker = AdvisedWalker(cfg.hybrid, cfg.llm, cfg.data, ppo, env, market, normalize_obs=True, greedy=True)
    trace = walker.walk(params, obs_norm, "val", key)                          # the agent as trained
    trace = walker.walk(params, obs_norm, "val", key, **ABLATIONS[LLM_ONLY])    # the advisor alone
    walker.close()                                                              # stops the sidecar
"""

from __future__ import annotations

import dataclasses
import sys
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from tqdm import tqdm

from agents.advice.acting import HybridActing, HybridCarry, acting_of
from agents.advice.record import record_metrics
from agents.advice.table import view, walk_keys
from agents.advice.usage import STAT_PREFIX, walk_advice_metrics
from agents.advisor.pacer import QueryPacer, walk_pacer
from agents.config import HybridConfig, VetoConfig
from agents.rl.networks import ActorCritic
from agents.runs.adapters import starting_adapter
from jaxenv.config import DataConfig
from jaxenv.env import EnvState
from jaxenv.evaluate import continue_after_breach, trace_step
from jaxenv.metrics import walk_metrics


def chunk_lengths(steps: int, k: int) -> list[int]:
    """Steps per chunk when `steps` env steps run k at a time, e.g. 64 steps, k=5: 12×5 + 4."""
    return [k] * (steps // k) + ([steps % k] if steps % k else [])


# the ablations an account walks too (agents.evaluation.account_run)
RL_ONLY = "rl_only"  # the policy alone
LLM_ONLY = "llm_only"  # the advice alone
# name -> the acting changes of that ablation (fusion None = the run's own fusion)
ABLATIONS: dict[str, dict] = {
    RL_ONLY: {"fusion": "none", "veto": False},  # the policy alone: no advice, no veto
    LLM_ONLY: {"fusion": "advice_only", "veto": False},  # the advice alone; HOLD where there is none
    "fused_no_veto": {"fusion": None, "veto": False},
    "fused_veto": {"fusion": None, "veto": True},
}
# A run whose advisor learned (hybrid.learning) is also scored with the advice alone from the advisor as it
# started (frozen): LLM-only before and after learning.
FROZEN_ABLATION = "llm_only_frozen"


def run_ablations(hybrid: HybridConfig) -> dict[str, dict]:
    """The ablations a hybrid run is scored with: ABLATIONS, and FROZEN_ABLATION when its advisor learned."""
    if not hybrid.learning.enabled:
        return dict(ABLATIONS)
    return {**ABLATIONS, FROZEN_ABLATION: {**ABLATIONS[LLM_ONLY], "adapter": starting_adapter(hybrid)}}


def advised_summary(trace: dict, timestamps, rules, days=None) -> dict:
    """A walk's figures (jaxenv.metrics.walk_metrics), how the advice was used (ADVICE_METRICS) and the advisor's
    counters (prompts, answers per status, latency)."""
    out = walk_metrics(trace, timestamps, rules, days)
    out.update(walk_advice_metrics(trace))
    out.update({k: float(v) for k, v in trace.get("llm", {}).items()})
    out.update(trace.get("record", {}))
    return out


@struct.dataclass
class WalkCarry:
    env_state: EnvState  # leaves [1, ...]: one account, batched so the hybrid machinery applies unchanged
    hybrid: HybridCarry
    key: jax.Array


class AdvisedWalker:
    """Walks splits with a hybrid run's network and the run's advisor (one sidecar, started on first use)."""

    def __init__(self, hybrid: HybridConfig, llm: str, data: DataConfig, ppo, env, market, client=None,
                 log_dir: Path | None = None, progress: bool = False, *, normalize_obs: bool, greedy: bool):
        """The run's config sections and `ppo` (agents.rl.ppo.PPO) walking the trading env `env` (whose config,
        env.config, its advisor's prompts read) on `market`; `normalize_obs`: ppo.normalize_obs; `greedy`:
        checkpoint.eval_deterministic, the walks act greedily. The walker starts a sidecar of its own at its first
        advised walk and keeps it, asleep, between walks: at every core and normal priority, never at training's
        niceness (training waits for its walks, and a niced advisor would crawl beside any other work on the
        machine). `log_dir`: the sidecar's log lines go to log_dir/advisor_eval_w0.log (a run folder during training:
        they would break the progress bar) instead of stderr. `progress`: an advised walk shows its own progress line
        (the keys it asks ahead, blocks walked, ETA) under the training bar: a walk whose keys the advisor must answer
        first takes minutes on a CPU."""
        self.hybrid, self.llm, self.data = hybrid, llm, data
        self.ppo, self.env, self.market = ppo, env, market
        self.normalize_obs = normalize_obs
        self.log_dir = log_dir
        self.progress = progress
        self.acting = dataclasses.replace(acting_of(hybrid, llm, env), greedy=greedy)
        self._client = client
        self._pacer: QueryPacer | None = None
        self.k = hybrid.query.interval
        self._compiled: dict[tuple, Any] = {}
        self._adapter = starting_adapter(hybrid)  # the adapter the sidecar answers with

    def _chunk_fn(self, acting: HybridActing, k: int):
        """The jitted k-bar walk for this acting variant (the configs inside are not hashable: cache by key; the veto
        by all of its settings, which a walk may change)."""
        key = (acting.fusion, dataclasses.astuple(acting.veto), acting.greedy, k)
        if key not in self._compiled:
            self._compiled[key] = jax.jit(partial(_chunk, self.env, acting, self.ppo.network,
                                                  self.normalize_obs, k=k))
        return self._compiled[key]

    @property
    def pacer(self) -> QueryPacer:
        """The walks' query steps and their advisor (agents.advisor.pacer.walk_pacer), opened at the first walk."""
        if self._pacer is None:
            self._pacer = walk_pacer(self.hybrid, self.llm, self.env.config, self.data, self.market, self._client,
                                     self.log_dir)
        return self._pacer

    def close(self) -> None:
        if self._pacer is not None:
            self._pacer.close()
            self._pacer = None
        self._adapter = starting_adapter(self.hybrid)

    def use_adapter(self, path: str | None) -> None:
        """The advisor answers the next walks with LoRA adapter `path` (None: the base model). A run whose
        advisor learned has one per checkpoint; other runs keep the adapter they started with."""
        if self.llm in ("none", "mock") or path == self._adapter:
            return
        self.pacer.advisor.use_adapter(path)
        self._adapter = path

    def acting_for(self, fusion: str | None = None, veto: bool | VetoConfig | None = None,
                   greedy: bool | None = None) -> HybridActing:
        """The run's acting with these changed; `veto`: on or off with the run's settings, or settings of its own."""
        a = self.acting
        if isinstance(veto, bool):
            veto = dataclasses.replace(a.veto, enabled=veto)
        return dataclasses.replace(
            a,
            fusion=a.fusion if fusion is None else fusion,
            veto=a.veto if veto is None else veto,
            greedy=a.greedy if greedy is None else greedy,
        )

    def walk(self, params: Any, obs_norm: Any, split: str | tuple[int, int], key: jax.Array, *,
             fusion: str | None = None, veto: bool | VetoConfig | None = None, greedy: bool | None = None,
             adapter: Any = ..., record: Any = None) -> dict[str, Any]:
        """Per-bar trace with `jaxenv.walk_split`'s columns plus the advice in force at each bar
        (`advice_action`, `advice_confidence` (decayed), `advice_valid`), the acting step's stats (`stat_*`) and
        `reasons`: {key: the advisor's reason text}; `advice_from` gives the key in force per step (-1: none).
        `adapter`: the advisor's LoRA adapter for this walk (a path, or None for the base model; `...` keeps the
        current one). `record`: the trained agent's advice record (hybrid.query.bind_on=record), which the walk starts
        from and keeps up; None: a fresh one."""
        acting = self.acting_for(fusion, veto, greedy)
        uses_advice = acting.fusion != "none"  # False for a run without an advisor, and its rl_only ablation
        if uses_advice and adapter is not ...:
            self.use_adapter(adapter)
        env_params = self.env.make_params(self.market, split, sequential=True)
        num_steps = int(env_params.max_steps_in_episode)
        k_init, key = jax.random.split(key)
        state = jax.vmap(self.env.initial_state, in_axes=(0, None))(k_init[None], env_params)
        carry = WalkCarry(env_state=state, hybrid=acting.carry_for_walk(env_params, record), key=key)

        if uses_advice:
            pacer = self.pacer
            pacer.reset_counters()  # and its reasons: this walk's
            # every key the walk reads, asked ahead in full batches (a handful a query step would leave the advisor's
            # batches nearly empty); the walk's query steps then ask only what got no answer
            start, end = int(env_params.start_bar), int(env_params.end_bar)
            pacer.ask_all(walk_keys(start, end, self.k, self.acting.query.entries_only), progress=self.progress)
            carry = pacer.query_step(pacer.sync(carry))  # the keys the first chunk reads, answered before it
            pacer.send()
        chunks = chunk_lengths(num_steps, self.k) if uses_advice else [num_steps]  # no query step: one scan
        pieces = []
        name = split if isinstance(split, str) else "bars"
        bar = tqdm(total=len(chunks), desc=f"{name} walk with advice", unit="block", leave=False, position=1,
                   disable=not (self.progress and uses_advice), mininterval=2.0, file=sys.stderr)
        try:
            for k in chunks:
                if uses_advice:
                    carry = pacer.query_step(carry)
                carry, trace = self._chunk_fn(acting, k)(carry, params, obs_norm, env_params)
                if uses_advice:
                    pacer.send()
                    bar.update(1)
                    bar.set_postfix_str(f"{pacer.counts.prompts} keys asked", refresh=False)
                pieces.append(trace)
            if uses_advice:
                pacer.drain(carry)  # nothing pending is left for the next walk
                pacer.advisor.save_store()
        finally:
            bar.close()
        out = {name: np.concatenate([np.asarray(p[name]) for p in pieces]) for name in pieces[0]}
        out["advice_from"] = out.pop("advice_key")
        out["reasons"] = dict(self.pacer.reasons) if uses_advice else {}
        if uses_advice:
            out["llm"] = pacer.metrics()
        if carry.hybrid.record is not None:  # the record at the walk's end (the trained agent's, and the walk's calls)
            out["record"] = record_metrics(carry.hybrid.record)
        return out


@struct.dataclass
class Choice:
    """One decision of an advised walk (`advised_decision`), before the bar after it is known."""

    action: jax.Array  # [1] executed
    hybrid: HybridCarry  # the carry after acting (veto, trust, advised trade)
    columns: dict  # the trace's advice columns for this bar
    key: jax.Array  # the walk's key after this step
    reset_key: jax.Array  # a fresh account's, should the next bar breach this one


def advised_decision(env, acting: HybridActing, network: ActorCritic, normalize_obs: bool, carry: WalkCarry, params,
                     obs_norm, env_params) -> Choice:
    """The account's action at its bar (bars <= t only): policy, advice in force, masks, entry rules, fusion. A walk
    is this and `advised_advance`, bar after bar; `agents.trading` runs the same two on bars as they arrive."""
    key, k_act, k_reset = jax.random.split(carry.key, 3)
    state = carry.env_state
    obs = jax.vmap(env.get_obs, in_axes=(0, None))(state, env_params).astype(jnp.float32)
    mask = jax.vmap(env.action_mask, in_axes=(0, None))(state, env_params)
    net_in = obs_norm.normalize(obs) if normalize_obs else obs
    logits = network.apply(params, net_in, method=ActorCritic.logits)
    advice = view(carry.hybrid.advice, acting.query, state.t, state.side)
    action, _, _, _, extras, hybrid = acting.act(network, params, carry.hybrid, logits, mask, obs, state, env_params,
                                                 k_act)
    columns = {
        "advice_action": jnp.argmax(advice.probs[0]).astype(jnp.int32),
        "advice_confidence": advice.confidence[0],
        "advice_valid": advice.valid[0],
        "advice_key": jnp.where(advice.valid[0], advice.key[0], -1),
        **{STAT_PREFIX + k: v for k, v in extras.stats.items()},  # one decision's sums: advice_metrics' input
    }
    return Choice(action=action, hybrid=hybrid, columns=columns, key=key, reset_key=k_reset)


def advised_advance(env, carry: WalkCarry, choice: Choice, env_params) -> tuple[WalkCarry, dict]:
    """The bar after `choice` (t + 1): fill, stops, targets, drawdown; a breached account is replaced. Returns the
    walk at t + 1 and the trace's row for bar t."""
    state = carry.env_state
    next_state, _, terminated, info = jax.vmap(env.transition, in_axes=(0, 0, None))(state, choice.action, env_params)
    step = jax.tree.map(lambda x: x[0], jax.vmap(trace_step, in_axes=(0, 0, 0, 0, 0, None))(
        state, choice.action, next_state, terminated, info, env_params))
    step.update(choice.columns)
    next_state = jax.vmap(continue_after_breach, in_axes=(None, 0, 0, 0, None))(
        env, next_state, terminated, choice.reset_key[None], env_params)
    return WalkCarry(env_state=next_state, hybrid=choice.hybrid, key=choice.key), step


def _chunk(env, acting: HybridActing, network: ActorCritic, normalize_obs: bool, carry: WalkCarry, params, obs_norm,
           env_params, *, k: int):
    def body(carry: WalkCarry, _):
        choice = advised_decision(env, acting, network, normalize_obs, carry, params, obs_norm, env_params)
        return advised_advance(env, carry, choice, env_params)

    # a query step came before the chunk: the advice's record counts the calls settled by the account's bar
    carry = carry.replace(hybrid=acting.look(carry.hybrid, carry.env_state, env_params))
    return jax.lax.scan(body, carry, None, length=k)
