"""Envs sharded over a device mesh: the RunnerState's per-env leaves are split along one mesh axis ("envs"), the
rest (networks, optimiser, normalisers, RNG key, counters) is replicated on every device.

The update stays one jitted program over the global batch and XLA partitions it (GSPMD): each device steps its
share of envs, and the global minibatch shuffle, the normaliser's statistics over all envs and the gradient mean
are the same sums as on one device, combined across devices by the collectives XLA inserts. A run on D devices is
therefore the same maths as on one, up to the order of floating-point reductions.

    mesh = env_mesh(jax.local_devices()[:2])
    shardings = state_shardings(jax.eval_shape(ppo.init, key, env_params), mesh, n_envs)
    state = jax.jit(ppo.init, out_shardings=shardings)(key, env_params)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

ENV_AXIS = "envs"
# RunnerState fields that hold one row per env (agents.rl.ppo.RunnerState); the others are replicated.
PER_ENV_FIELDS = ("env_state", "obs", "mask", "ep_return", "ep_length", "disc_return", "hybrid")


def env_mesh(devices: list) -> Mesh:
    """A one-axis mesh over `devices` (in the order given: a process's devices are contiguous)."""
    return Mesh(np.asarray(devices), (ENV_AXIS,))


def _leaf_sharding(mesh: Mesh, n_envs: int, per_env: bool, env_dim: int):
    def sharding(x) -> NamedSharding:
        shape = getattr(x, "shape", ())
        if per_env and len(shape) > env_dim and shape[env_dim] == n_envs:
            return NamedSharding(mesh, PartitionSpec(*([None] * env_dim), ENV_AXIS))
        return NamedSharding(mesh, PartitionSpec())

    return sharding


def state_shardings(state: Any, mesh: Mesh, n_envs: int) -> Any:
    """The sharding of each leaf of a RunnerState (or its `jax.eval_shape`): per-env rows over the mesh, the
    rest replicated. Scalars inside per-env fields (a shared counter, say) are replicated too."""
    fields = {}
    for name in state.__dataclass_fields__:
        per_env = name in PER_ENV_FIELDS
        fields[name] = jax.tree.map(_leaf_sharding(mesh, n_envs, per_env, 0), getattr(state, name))
    return state.replace(**fields)


def constrain(state: Any, mesh: Mesh | None, n_envs: int) -> Any:
    """`state` laid out as `state_shardings` says, inside or outside jit; no-op without a mesh. Host code between
    jitted chunks (the advisor's query step) may hand back leaves laid out differently; this puts them back."""
    if mesh is None:
        return state
    return jax.lax.with_sharding_constraint(state, state_shardings(state, mesh, n_envs))


def constrain_steps(tree: Any, mesh: Mesh | None, n_envs: int) -> Any:
    """Leaves of shape [k, N, ...] (a stacked Transition) split along N; others replicated."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, jax.tree.map(_leaf_sharding(mesh, n_envs, True, 1), tree))
