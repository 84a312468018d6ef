"""Transfer: a new run starts from another run's networks (`train.py --init-from RUN`), e.g. the seeds' Phase 2 →
Phase 3, a 261-feature policy from a 228-feature one.

Every layer is copied. An input layer whose kernel has more rows here than in the source (the extended
observation appends 33 features after the 228 it shares with the short form) gets the source's rows for the
shared features and zeros for the new ones, so the new network acts exactly as the old one did until it learns
to use them. Layers the source lacks (the trust gate, when a hybrid run starts from an RL-only one) keep their
fresh init. The observation normaliser's statistics of the shared features are copied too.

`transfer.freeze_steps` keeps the copied weights frozen for a warm-up (agents.rl.freeze); this module marks
which weights learn during it and how many optimiser steps it lasts (`frozen_steps`). A warm-up that would last
the whole run is refused by the config check (a 100K-step warm-up in an 82K-step run would freeze the policy
throughout).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp

from agents.config import NetworkConfig, PPOConfig, TransferConfig, freeze_updates
from agents.rl.freeze import with_trainable
from agents.rl.normalization import RunningMeanStd
from agents.runs.saved_runs import (
    CheckpointMismatch,
    SavedPolicy,
    load_run_config,
    refuse_instrument_set,
    restore_policy,
)


def frozen_steps(ppo: PPOConfig, transfer: TransferConfig, steps_per_update: int) -> int:
    """Optimiser steps of the transfer warm-up (make_train's frozen_steps); 0 without one."""
    return freeze_updates(transfer, steps_per_update) * ppo.update_epochs * ppo.num_minibatches


def load_source(transfer: TransferConfig, network: NetworkConfig, env_name: str, window: int, env: Any,
                env_params: Any) -> SavedPolicy:
    """The run transfer.init_from names, checked to be a source this run can start from (before anything is
    written): the same network sizes, and for the trading env the same observation window (this run's env.window
    `window`), so the shared input columns mean the same features."""
    refuse_instrument_set(load_run_config(transfer.init_from), transfer.init_from,
                          "--init-from does not start from it yet")
    source = restore_policy(transfer.init_from, transfer.checkpoint)
    obs_dim = math.prod(jax.eval_shape(env.reset, jax.random.PRNGKey(0), env_params)[0].shape)
    problems = [f"network.{f.name} {getattr(source.cfg.network, f.name)} there, {getattr(network, f.name)} here"
                for f in dataclasses.fields(network)
                if getattr(source.cfg.network, f.name) != getattr(network, f.name)]
    if source.obs_dim > obs_dim:
        problems.append(f"its observation has {source.obs_dim} features, more than this run's {obs_dim}")
    if env_name == "trading" and source.cfg.env.window != window:
        problems.append(f"env.window {source.cfg.env.window} there, {window} here")
    if source.cfg.env_name != env_name:
        problems.append(f"env_name {source.cfg.env_name!r} there, {env_name!r} here")
    if problems:
        raise CheckpointMismatch(f"--init-from {source.run_dir} ({source.label}) cannot start this run: "
                                 + "; ".join(problems))
    return source


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def copy_params(source: Any, target: Any, shared_inputs: int) -> tuple[Any, Any, list[str], list[str]]:
    """(params, trainable mask, target weights kept fresh, source weights unused): the source's weights in the
    target's tree, with zero rows for input columns past `shared_inputs`; the mask is 1 for what the source did
    not provide."""
    old = {_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(source)[0]}
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    params, trainable, fresh = [], [], []
    for path, new in leaves:
        name = _path(path)
        was = old.get(name)
        if was is None:
            weights, learns = new, jnp.ones_like(new)
            fresh.append(name)
        elif was.shape == new.shape:
            weights, learns = jnp.asarray(was, new.dtype), jnp.zeros_like(new)
        elif was.shape[1:] == new.shape[1:] and was.shape[0] == shared_inputs < new.shape[0]:  # an input layer
            weights = jnp.zeros_like(new).at[:shared_inputs].set(was)
            learns = jnp.zeros_like(new).at[shared_inputs:].set(1.0)
        else:
            raise CheckpointMismatch(f"{name}: shape {tuple(was.shape)} in the source, {tuple(new.shape)} here")
        params.append(weights)
        trainable.append(learns)
    unused = sorted(set(old) - {_path(path) for path, _ in leaves})  # e.g. a trust gate this run does not have
    return treedef.unflatten(params), treedef.unflatten(trainable), fresh, unused


def copy_obs_norm(source: RunningMeanStd, target: RunningMeanStd, max_count: float) -> RunningMeanStd:
    """The source's statistics for the shared features, the fresh ones (mean 0, var 1) for the new. The sample
    count is capped at one update's worth so the new features' statistics catch up within a few updates (the
    shared ones see the same data and stay put)."""
    n = source.mean.shape[0]
    return RunningMeanStd(target.mean.at[:n].set(source.mean), target.var.at[:n].set(source.var),
                          jnp.minimum(source.count, max_count).astype(target.count.dtype))


def start_from(state: Any, source: SavedPolicy, transfer: TransferConfig, steps_per_update: int) -> Any:
    """A freshly initialised RunnerState with the source's networks and normaliser (and the warm-up's mask)."""
    params, trainable, fresh, unused = copy_params(source.params, state.params, source.obs_dim)
    obs_norm = copy_obs_norm(source.obs_norm, state.obs_norm, float(steps_per_update))
    new_inputs = state.obs_norm.mean.shape[0] - source.obs_dim
    frozen = freeze_updates(transfer, steps_per_update)
    warmup = f", copied layers frozen for {frozen} updates" if transfer.freeze_steps else ""
    print(f"initialised from {source.run_dir} ({source.label}): {source.obs_dim} inputs + {new_inputs} new "
          f"(zero weights){', fresh: ' + ', '.join(fresh) if fresh else ''}"
          f"{', unused: ' + ', '.join(unused) if unused else ''}{warmup}", file=sys.stderr)
    return state.replace(params=params, obs_norm=obs_norm, opt_state=with_trainable(state.opt_state, trainable))
