"""Evaluation during training: the score that picks the best checkpoint, and the baselines it is compared to.

For the trading env the score is the validation split's net P&L after costs (`jaxenv.evaluate_policy` walks
the split bar by bar once). Any other gymnax env has no split: the score is the mean return of the first
episode of `n` fresh envs.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from agents.rl.networks import masked_logits
from agents.rl.ppo import PPO, action_mask_fn

# act(act_params, obs, mask, key) -> action for one env. The parameters are an argument, not captured, so one
# compiled evaluation serves every evaluation of a run.
ActFn = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
Evaluator = Callable[[ActFn, Any, jax.Array], dict]  # (act, act_params, key) -> {"score": ..., ...}


def flat_policy(act_params: Any, obs: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
    """Never trades: always action 0 (HOLD in the trading env)."""
    return jnp.zeros((), jnp.int32)


def random_valid_policy(act_params: Any, obs: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
    """Uniform over the valid actions."""
    return jax.random.categorical(key, masked_logits(jnp.zeros(mask.shape), mask))


def always_when_valid(action: int) -> ActFn:
    """Takes `action` whenever it is valid, else action 0: e.g. always long (BUY) in the trading env, which
    shows how much of a score a split's price drift alone pays."""

    def act(act_params: Any, obs: jax.Array, mask: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.where(mask[action], action, 0).astype(jnp.int32)

    return act


def make_episode_evaluator(env, env_params, n: int) -> Evaluator:
    """Returns evaluate(act, act_params, key) -> {"score", "mean_return", "mean_length"} over the first
    episode of n fresh envs (at most the env's step limit)."""
    limit = int(env_params.max_steps_in_episode)
    get_mask = jax.vmap(action_mask_fn(env), in_axes=(0, None))

    @partial(jax.jit, static_argnums=0)
    def run(act: ActFn, act_params: Any, key: jax.Array):
        k_reset, k_run = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, n), env_params)

        def step(carry, key):
            obs, state, ret, length, alive = carry
            k_act, k_env = jax.random.split(key)
            mask = get_mask(state, env_params)
            action = jax.vmap(act, in_axes=(None, 0, 0, 0))(act_params, obs, mask, jax.random.split(k_act, n))
            obs, state, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_env, n), state, action, env_params
            )
            ret = ret + jnp.where(alive, reward, 0.0)
            length = length + alive
            return (obs, state, ret, length, alive & ~(term | trunc)), None

        init = (obs, state, jnp.zeros(n), jnp.zeros(n, jnp.int32), jnp.ones(n, bool))
        (_, _, ret, length, _), _ = jax.lax.scan(step, init, jax.random.split(k_run, limit))
        return ret.mean(), length.mean()

    def evaluate(act: ActFn, act_params: Any, key: jax.Array) -> dict:
        ret, length = run(act, act_params, key)
        return {"score": float(ret), "mean_return": float(ret), "mean_length": float(length)}

    return evaluate


# An account of several instruments (jaxenv.account_evaluate's walk): act(policy_state, obs, state, params, key) ->
# actions [I], every head under its sequential mask (env.sample_actions); policy_state () for the baselines.


def account_flat(policy_state: Any, obs: Any, state: Any, params: Any, key: jax.Array) -> jax.Array:
    """Never trades: HOLD for every instrument."""
    return jnp.zeros((params.num_instruments,), jnp.int32)


def account_random_valid(env) -> Callable:
    """Uniform over each head's valid actions, head by head under the account's sequential masks."""

    def act(policy_state, obs, state, params, key):
        return env.sample_actions(key, state, params, jnp.zeros((params.num_instruments, env.num_actions)))[0]

    return act


def account_always(env, action: int) -> Callable:
    """`action` for every instrument whenever its sequential mask allows it, else action 0 (HOLD): e.g. always long."""
    logits = jnp.zeros(env.num_actions).at[0].set(1.0).at[action].set(2.0)

    def act(policy_state, obs, state, params, key):
        every = jnp.broadcast_to(logits, (params.num_instruments, env.num_actions))
        return env.sample_actions(key, state, params, every, deterministic=True)[0]

    return act


def make_account_act(ppo: PPO, env, normalize_obs: bool, deterministic: bool) -> Callable:
    """The trained account agent as a walk acts: act((network params, obs normaliser), obs, state, params, key), its
    heads chosen in the env's instrument order under the sequential masks (jaxenv.account_evaluate.logits_policy),
    greedy where `deterministic`. Made once per run so evaluation compiles once."""
    from agents.rl.normalization import normalize_obs as normalized
    from jaxenv.account_evaluate import logits_policy

    logits_of = type(ppo.network).logits

    def logits(policy_state, obs):
        params, obs_norm = policy_state
        obs = obs.replace(instruments=obs.instruments.astype(jnp.float32), account=obs.account.astype(jnp.float32))
        return ppo.network.apply(params, normalized(obs_norm, obs) if normalize_obs else obs, method=logits_of)

    return logits_policy(env, logits, deterministic)


def make_act(ppo: PPO, deterministic: bool) -> Callable:
    """act(act_params, obs, mask, key) for one env with act_params = (network params, obs normaliser); made once
    per run so evaluation compiles once."""

    def act(act_params, obs, mask, key):
        params, obs_norm = act_params
        return ppo.policy(params, obs_norm, obs, mask, key, deterministic)

    return act
