"""PPO's side of one account trading several instruments (jaxenv.account_env.AccountEnv, issue 77): one categorical
head per instrument, sampled head by head in the env's fixed instrument order.

agents.rl.ppo.make_train dispatches here when the env is an account env (`is_account_env`); the rest of PPO (GAE,
truncation values, epochs, minibatches, the clipped loss) is the single-instrument code, run on pytrees.

- Observation: jaxenv.account_env.AccountObs (`instruments` [N, I, F], `account` [N, 5]) kept as it is; the network
  is agents.rl.networks.AccountActorCritic, whose weights are shared across instruments.
- Normalisation: one RunningMeanStd per instrument feature (shape [F]) merged over envs, steps AND instruments, and
  one for the account block ([5]): `create_norm` gives them as an AccountObs of normalisers, which
  agents.rl.normalization.normalize_obs / update_obs map over the observation.
- Sampling: head i's mask is env.sequential_mask(state, params, i, actions of heads < i), so no sampled action is
  outside what the env allows. The transition stores every head's mask [I, 6]; the joint log-probability is the sum
  over heads of each head's log-probability under its stored mask, and the loss recomputes it from the same stored
  masks and actions with the same function (`log_prob_entropy`), so the ratio is exact. The entropy is the sum of the
  heads' entropies under their masks: each later head's is conditional on the earlier heads' sampled actions, whose
  expectation is the joint entropy (the chain rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from agents.rl.networks import log_probs_and_entropy, masked_logits
from agents.rl.normalization import RunningMeanStd
from bridge.protocol import HOLD
from jaxenv.account_env import AccountObs

# info's per-instrument entries summed over a rollout's steps and envs (the metrics of the same name, arrays [I])
INSTRUMENT_METRICS = ("instrument_trades", "instrument_pnl")


def is_account_env(env) -> bool:
    """Does `env` trade several instruments in one account: it has `num_instruments(params)` and sequential masks."""
    return callable(getattr(env, "num_instruments", None)) and callable(getattr(env, "sequential_mask", None))


@dataclass(frozen=True)
class AccountHeads:
    """The account env's observation, normaliser, sampling and log-probability (the module's docstring)."""

    env: Any  # jaxenv.account_env.AccountEnv

    @property
    def row_size(self) -> int:
        return self.env.instrument_obs_size

    def as_obs(self, obs):
        """The env's AccountObs, float32."""
        return obs.replace(instruments=obs.instruments.astype(jnp.float32), account=obs.account.astype(jnp.float32))

    def example_obs(self):
        """A batch of one observation of one instrument (the network's parameters do not depend on I)."""
        return AccountObs(instruments=jnp.zeros((1, 1, self.row_size)),
                          account=jnp.zeros((1, self.env.account_obs_size)))

    def create_norm(self):
        """Normalisers shaped as the observation: per instrument feature [F] and per account feature [5]."""
        return AccountObs(instruments=RunningMeanStd.create((self.row_size,)),
                          account=RunningMeanStd.create((self.env.account_obs_size,)))

    def sample(self, logits: jax.Array, env_state, env_params, key: jax.Array):
        """logits [N, I, A] → (actions [N, I], masks [N, I, A] each head's sequential mask, log_prob [N])."""
        env = self.env

        def one(logits, state, key):
            n = logits.shape[0]
            own = env.instrument_masks(state, env_params)
            taken = jnp.full((n,), HOLD, jnp.int32)
            rows = []
            for i, k in enumerate(jax.random.split(key, n)):  # the env's fixed order: head i after heads < i
                mask = env.sequential_mask(state, env_params, i, taken, own)
                taken = taken.at[i].set(jax.random.categorical(k, masked_logits(logits[i], mask)).astype(jnp.int32))
                rows.append(mask)
            return taken, jnp.stack(rows)

        actions, masks = jax.vmap(one)(logits, env_state, jax.random.split(key, logits.shape[0]))
        log_prob, _ = self.log_prob_entropy(logits, masks, actions)
        return actions, masks, log_prob

    @staticmethod
    def log_prob_entropy(logits: jax.Array, mask: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The joint log-probability of `action` [..., I] and the entropy, both summed over the heads, each head's
        distribution its logits under its stored mask [..., I, A]."""
        logp, entropy = log_probs_and_entropy(masked_logits(logits, mask), action)
        return logp.sum(axis=-1), entropy.sum(axis=-1)

    @staticmethod
    def choose(logits: jax.Array, mask: jax.Array, key: jax.Array, deterministic: bool) -> jax.Array:
        """Actions [..., I] from logits under masks given up front ([..., I, A], e.g. the env's action_mask), every
        head on its own: what the sequential rules then forbid the env takes as HOLD (exact sampling needs the env's
        state: `sample`)."""
        logits = masked_logits(logits, mask)
        if deterministic:
            return jnp.argmax(logits, -1)
        # sampled as rows [..·I, A]: XLA on CPU samples over a middle instrument axis several times slower
        return jax.random.categorical(key, logits.reshape(-1, logits.shape[-1])).reshape(logits.shape[:-1])

    @staticmethod
    def instrument_stats(info: dict) -> dict[str, jax.Array]:
        """Per instrument [I], summed over the envs of one step: the trades closed and their P&L."""
        return {"instrument_trades": (info["exit_reason"] > 0).sum(axis=0).astype(jnp.float32),
                "instrument_pnl": info["trade_pnl"].astype(jnp.float32).sum(axis=0)}
