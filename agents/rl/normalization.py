"""Running mean and variance (observation normalisation, reward scaling) as a pure pytree.

Statistics are frozen during one update's rollout and learning phase (acting and learning see the same
normalised inputs, so the first epoch's ratio is exactly 1) and merged with that update's data at its end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

OBS_CLIP = 10.0  # normalised observations are clipped to ±this


@struct.dataclass
class RunningMeanStd:
    mean: jax.Array
    var: jax.Array
    count: jax.Array  # float32: a weight, not an index, so precision loss at large counts is harmless

    @classmethod
    def create(cls, shape: tuple[int, ...] = ()) -> RunningMeanStd:
        return cls(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.asarray(1e-4, jnp.float32))

    def update(self, batch: jax.Array) -> RunningMeanStd:
        """Merges the moments of `batch` (leading axes are samples; trailing axes match `mean`)."""
        x = batch.reshape((-1, *self.mean.shape)).astype(jnp.float32)
        b_mean = x.mean(axis=0)
        b_var = x.var(axis=0)
        b_count = jnp.asarray(x.shape[0], jnp.float32)
        # Chan et al.'s parallel combination of two sets of moments.
        total = self.count + b_count
        delta = b_mean - self.mean
        mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        return RunningMeanStd(mean, m2 / total, total)

    def normalize(self, x: jax.Array) -> jax.Array:
        return jnp.clip((x - self.mean) / jnp.sqrt(self.var + 1e-8), -OBS_CLIP, OBS_CLIP)

    @property
    def std(self) -> jax.Array:
        return jnp.sqrt(self.var + 1e-8)


def _is_norm(x) -> bool:
    return isinstance(x, RunningMeanStd)


def normalize_obs(norm, obs):
    """`obs` normalised by `norm`: a RunningMeanStd for an array observation (exactly norm.normalize(obs)), or a pytree
    of them shaped as a pytree observation (an account's AccountObs: one per leaf, over its last axis)."""
    return jax.tree.map(lambda n, x: n.normalize(x), norm, obs, is_leaf=_is_norm)


def update_obs(norm, batch):
    """`norm` (as in normalize_obs) merged with `batch`, an observation with any leading sample axes."""
    return jax.tree.map(lambda n, x: n.update(x), norm, batch, is_leaf=_is_norm)
