"""Flax actor-critic: separate actor and critic MLPs (sizes from config), masked categorical helpers,
and the layer-shape FLOP count the `train` benchmark reports."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from agents.config import NetworkConfig

# Invalid actions get this logit: exp() of it underflows to exactly 0, and unlike -inf it never makes 0·(-inf)=nan
# in the entropy.
MASKED_LOGIT = -1e9

_ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}


class MLP(nn.Module):
    hidden: Sequence[int]
    out: int
    activation: str
    out_scale: float  # orthogonal init gain of the last layer: small for the policy so it starts near uniform

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = _ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class ActorCritic(nn.Module):
    num_actions: int
    actor_hidden: Sequence[int] = (256, 256)
    critic_hidden: Sequence[int] = (256, 256)
    activation: str = "tanh"
    # The learned-fusion trust gate (a module mapping [..., F] fusion features to g in (0, 1)), supplied by the
    # advice side so the RL core does not depend on it; its parameters live beside the policy's under "gate".
    gate: nn.Module | None = None
    gate_features: int = 0

    def setup(self):
        self.actor = MLP(self.actor_hidden, self.num_actions, self.activation, out_scale=0.01)
        self.critic = MLP(self.critic_hidden, 1, self.activation, out_scale=1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs [..., D] (normalised) → (logits [..., A], value [...])."""
        if self.gate is not None and self.is_initializing():
            self.gate(jnp.zeros((1, self.gate_features)))
        return self.actor(obs), self.critic(obs)[..., 0]

    def trust(self, features: jax.Array) -> jax.Array:
        """Fusion features [..., F] → trust gate g [...] in (0, 1)."""
        return self.gate(features)

    def logits(self, obs: jax.Array) -> jax.Array:
        return self.actor(obs)

    def value(self, obs: jax.Array) -> jax.Array:
        return self.critic(obs)[..., 0]


def make_network(cfg: NetworkConfig, num_actions: int, gate: nn.Module | None = None,
                 gate_features: int = 0) -> ActorCritic:
    """`gate`: the trust gate over `gate_features` fusion features, for learned fusion; None for the policy alone."""
    return ActorCritic(num_actions, tuple(cfg.actor_hidden), tuple(cfg.critic_hidden), cfg.activation, gate,
                       gate_features)


class PooledCritic(nn.Module):
    """V of a set of rows [..., I, D]: a Deep Sets critic. Its first hidden layer embeds each row, the embeddings are
    averaged over the rows (permutation-invariant, any I), the rest of the MLP reads the average. With one row it is
    the plain MLP of that row."""

    hidden: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, rows: jax.Array) -> jax.Array:
        act = _ACTIVATIONS[self.activation]
        x, rest = rows, tuple(self.hidden)
        if rest:
            x, rest = act(nn.Dense(rest[0], kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x)), rest[1:]
        x = x.mean(axis=-2)
        for width in rest:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(x)


class AccountActorCritic(nn.Module):
    """One account over I instruments (jaxenv.account_env.AccountObs: `instruments` [..., I, F], `account` [..., 5]),
    with weights shared across instruments: the parameter shapes depend on F and the account block, never on I.

    - actor: one MLP applied to each instrument's input [row_i, mean_j row_j, account] gives that instrument's
      logits (head i); the mean of the rows lets each head see the other instruments (a lead-lag signal, say).
    - critic: PooledCritic over the rows [row_i, account] (an embedding per instrument, averaged, then the MLP)."""

    num_actions: int
    actor_hidden: Sequence[int] = (256, 256)
    critic_hidden: Sequence[int] = (256, 256)
    activation: str = "tanh"
    gate: nn.Module | None = None  # as ActorCritic's: one trust gate, shared by every head
    gate_features: int = 0

    def setup(self):
        self.actor = MLP(self.actor_hidden, self.num_actions, self.activation, out_scale=0.01)
        self.critic = PooledCritic(self.critic_hidden, self.activation)

    @staticmethod
    def _account(obs, rows: jax.Array) -> jax.Array:
        return jnp.broadcast_to(obs.account[..., None, :], (*rows.shape[:-1], obs.account.shape[-1]))

    def __call__(self, obs) -> tuple[jax.Array, jax.Array]:
        """obs: AccountObs (normalised), leaves [..., I, F] and [..., 5] → (logits [..., I, A], value [...])."""
        if self.gate is not None and self.is_initializing():
            self.gate(jnp.zeros((1, self.gate_features)))
        return self.logits(obs), self.value(obs)

    def trust(self, features: jax.Array) -> jax.Array:
        """Fusion features [..., F] → trust gate g [...] in (0, 1)."""
        return self.gate(features)

    def logits(self, obs) -> jax.Array:
        rows = obs.instruments
        pooled = jnp.broadcast_to(rows.mean(axis=-2, keepdims=True), rows.shape)
        return self.actor(jnp.concatenate([rows, pooled, self._account(obs, rows)], axis=-1))

    def value(self, obs) -> jax.Array:
        rows = obs.instruments
        return self.critic(jnp.concatenate([rows, self._account(obs, rows)], axis=-1))[..., 0]


def make_account_network(cfg: NetworkConfig, num_actions: int, gate: nn.Module | None = None,
                         gate_features: int = 0) -> AccountActorCritic:
    """The multi-instrument actor-critic (one head of `num_actions` per instrument) of `cfg`'s sizes; `gate` as
    make_network's."""
    return AccountActorCritic(num_actions, tuple(cfg.actor_hidden), tuple(cfg.critic_hidden), cfg.activation, gate,
                              gate_features)


def masked_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.where(mask, logits, MASKED_LOGIT)


def log_probs_and_entropy(logits: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-probability of `actions` and entropy, both of the (already masked) categorical distribution."""
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, actions[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def forward_flops(cfg: NetworkConfig, obs_dim: int, num_actions: int) -> int:
    """FLOPs of one forward pass for one observation: 2 per multiply-add over every Dense layer."""

    def mlp(hidden: Sequence[int], out: int) -> int:
        sizes = [obs_dim, *hidden, out]
        return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:]))

    return mlp(cfg.actor_hidden, num_actions) + mlp(cfg.critic_hidden, 1)


def update_flops_per_step(cfg: NetworkConfig, obs_dim: int, num_actions: int, update_epochs: int) -> int:
    """Network FLOPs per env step over one whole update: the rollout's forward pass, then in every epoch a
    forward and a backward pass. Backward is 2× forward (weight and input gradients) except for each net's
    first layer, whose input (the observation) needs no gradient: 1× there."""
    fwd = forward_flops(cfg, obs_dim, num_actions)
    first = sum(2 * obs_dim * (hidden[0] if hidden else out)
                for hidden, out in ((cfg.actor_hidden, num_actions), (cfg.critic_hidden, 1)))
    return fwd + update_epochs * (3 * fwd - first)
