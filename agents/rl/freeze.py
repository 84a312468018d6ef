"""A warm-up stage for the optimiser that keeps chosen weights frozen for its first steps (a transfer warm-up):
their gradients are zeroed, so only what the mask lets learn does. What may learn is optimiser state
(`FreezeState`), so it is checkpointed and a resumed run keeps it."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class FreezeState(NamedTuple):
    count: jax.Array  # optimiser steps taken
    trainable: Any  # like params: 1.0 where a weight learns during the warm-up, 0.0 where it stays frozen


def warmup_freeze(frozen_steps: int) -> optax.GradientTransformation:
    """Zeroes the gradients of frozen weights for the first `frozen_steps` optimiser steps. Everything is
    trainable until `with_trainable` puts a mask in the state. Placed before gradient clipping, so frozen
    gradients do not use up the clipping norm."""

    def init(params):
        return FreezeState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.ones_like, params))

    def update(grads, state: FreezeState, params=None):
        warm = state.count < frozen_steps
        grads = jax.tree.map(lambda g, m: jnp.where(warm, g * m, g), grads, state.trainable)
        return grads, FreezeState(state.count + 1, state.trainable)

    return optax.GradientTransformation(init, update)


def with_trainable(opt_state: Any, trainable: Any) -> Any:
    """opt_state with the warm-up's mask replaced (a no-op without a warm-up stage)."""
    is_freeze = lambda s: isinstance(s, FreezeState)  # noqa: E731
    return jax.tree.map(lambda s: s._replace(trainable=trainable) if is_freeze(s) else s, opt_state, is_leaf=is_freeze)
