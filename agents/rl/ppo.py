"""PPO for any gymnax 1.0 environment, PureJaxRL style: `make_train` closes over the config's sections and the env and
returns pure functions; an update is rollout (`lax.scan`) → GAE → epochs × shuffled minibatches, built in one place
(agents.training.update.Update).

The market is an argument of every function that reads it (`init`, `rollout_chunk`: the env's params), never a
constant of the compiled program: a market of any length compiles the same program and XLA folds none of it. The
rollout is `rollout_chunk(state, k, env_params)`, a scan of k steps whose carry (`RunnerState`) holds everything
needed to continue: a caller may run T steps as T/k chunks with host work in between and hand the concatenated
chunks to `learn`.

Per step only one network forward pass runs over the batch; its logits, log-probs and values are stored, so
learning never recomputes them. The value of `info["final_observation"]` is needed only where an episode was
truncated; it is computed for those rows alone (see `truncation_values`).

An account env (jaxenv.account_env.AccountEnv: several instruments in one account, `agents.rl.account.is_account_env`)
runs the same code with one categorical head per instrument (agents.rl.account.AccountHeads): its observation is a
pytree (AccountObs), the network agents.rl.networks.AccountActorCritic, the actions [N, I] sampled head by head
under the env's sequential masks, which the transition stores ([N, I, A]); log-probabilities and entropies are
summed over the heads. Any other env (TradingEnv, a gymnax env) takes the one-head path, unchanged.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from agents.config import NetworkConfig, PPOConfig
from agents.rl.account import INSTRUMENT_METRICS, AccountHeads, is_account_env
from agents.rl.freeze import warmup_freeze
from agents.rl.networks import ActorCritic, log_probs_and_entropy, make_account_network, make_network, masked_logits
from agents.rl.normalization import RunningMeanStd, normalize_obs, update_obs
from agents.rl.sharding import constrain, constrain_steps


@struct.dataclass
class RunnerState:
    """Everything an update reads and writes; checkpointing this (plus the host's counters) resumes exactly."""

    params: Any
    opt_state: Any
    obs_norm: RunningMeanStd  # frozen within an update, merged with its observations at the end
    ret_norm: RunningMeanStd  # running std of the discounted return, for optional reward scaling
    env_state: Any
    obs: jax.Array  # [N, D] raw observation the next action is chosen from (an account env: AccountObs, [N, I, F])
    mask: jax.Array  # [N, A] bool, valid actions in env_state (an account env: [N, I, A], env.action_mask's)
    ep_return: jax.Array  # [N] undiscounted return of the running episode (raw reward)
    ep_length: jax.Array  # [N] int32
    disc_return: jax.Array  # [N] discounted return, whose std scales rewards
    key: jax.Array
    update: jax.Array  # int32 updates completed
    hybrid: Any = None  # the acting interface's per-env carry (advice table, veto, rules); None for RL only


class Transition(NamedTuple):
    """One step of N envs; `rollout_chunk` stacks them to leaves of shape [k, N, ...]."""

    obs: jax.Array  # raw, the input the action was chosen from
    mask: jax.Array  # an account env: [I, A] per env, each head's sequential mask as sampled
    action: jax.Array
    log_prob: jax.Array  # of the masked distribution actually sampled from (an account env: summed over heads)
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_value: jax.Array  # V(final_observation) where truncated and not terminated, else 0
    disc_return: jax.Array
    episode: dict[str, jax.Array]  # sums over envs whose episode ended at this step (scalars)
    extras: Any = None  # what the acting interface's loss needs to rebuild its distribution; None for RL only


class Batch(NamedTuple):
    """What the loss reads of each sample; the rows of [T·N] that epochs shuffle into minibatches."""

    obs: jax.Array
    mask: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array  # the value target (GAE return)
    extras: Any = None


class PPO(NamedTuple):
    """The pure functions `make_train` returns. All take and return a RunnerState; jit them as needed."""

    init: Any  # (key, env_params) -> RunnerState
    rollout_chunk: Any  # (state, k: static int, env_params) -> (state, Transition[k, N])
    learn: Any  # (state, Transition[T, N]) -> (state, metrics)
    policy: Any  # (params, obs_norm, obs, mask, key, deterministic) -> action; obs/mask of any batch shape
    network: ActorCritic  # an account env: AccountActorCritic
    obs_dim: int  # an account env: the features of one instrument's row (the parameters do not depend on I)
    num_actions: int  # an account env: per head


def action_mask_fn(env) -> Any:
    """The env's `action_mask(state, params)`, or all actions valid for envs that have none."""
    if hasattr(env, "action_mask"):
        return env.action_mask
    return lambda state, params: jnp.ones((env.num_actions,), bool)


def truncation_values(value_fn, final_inputs: Any, need: jax.Array, max_rows: int) -> jax.Array:
    """V(final_inputs[i]) where need[i], else 0 (`final_inputs`: what value_fn takes, any pytree whose leaves have
    rows [N, ...]). Only truncated rows need a value, and usually there are none or a few: those rows are gathered
    (a full critic pass would cost half of the rollout's forward pass); when more than max_rows need one, the
    whole batch is evaluated instead."""
    n = need.shape[0]

    def few():
        idx = jnp.nonzero(need, size=max_rows, fill_value=n)[0]  # the fill index is out of range ...
        v = value_fn(jax.tree.map(lambda x: x[jnp.minimum(idx, n - 1)], final_inputs))
        return jnp.zeros(n).at[idx].set(v, mode="drop")  # ... so its scatter is dropped

    def all_rows():
        return jnp.where(need, value_fn(final_inputs), 0.0)

    count = need.sum()
    return jax.lax.cond(count == 0, lambda: jnp.zeros(n), lambda: jax.lax.cond(count <= max_rows, few, all_rows))


def gae_targets(reward, value, last_value, terminated, truncated, final_value, gamma: float, lam: float):
    """Generalised advantage estimates and value targets over [T, N] arrays.

    After a reset the next row belongs to a new episode, so a step that ends an episode bootstraps from
    V(final_observation) (`final_value`) if it was truncated, and from nothing if it terminated."""
    next_value = jnp.concatenate([value[1:], last_value[None]], axis=0)
    done = terminated | truncated
    bootstrap = jnp.where(done, jnp.where(terminated, 0.0, final_value), next_value)
    delta = reward + gamma * bootstrap - value
    discount = gamma * lam * (1.0 - done)

    def back(adv, x):
        d, c = x
        adv = d + c * adv
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(last_value), (delta, discount), reverse=True)
    return adv, adv + value


def make_train(ppo: PPOConfig, network: NetworkConfig, env, env_params, acting=None, mesh=None, *, num_envs: int,
               num_updates: int, frozen_steps: int = 0) -> PPO:
    """PPO's pure functions for `num_envs` envs over a run of `num_updates` updates (the learning rate anneals over
    them), with `ppo`'s hyperparameters and `network`'s actor and critic. `env_params`: the env's params of the
    market it trains on, for the shapes (observation size); the functions take the params they run on as an
    argument. `acting` (an agents.advice.acting.HybridActing, or anything with its interface) chooses the actions:
    masks, rules and fusion with LLM advice, its own carry, its loss's log-probabilities, a trust gate beside the
    networks; None samples from the policy alone. `mesh` (agents.rl.sharding.env_mesh) splits the envs over its devices:
    every function keeps the RunnerState laid out as agents.rl.sharding.state_shardings says; None: one device.
    `frozen_steps`: optimiser steps during which the weights a mask marks stay frozen (a transfer warm-up, whose
    mask agents.rl.freeze.with_trainable sets); 0: none.

    An account env (several instruments in one account) trains one head per instrument (the module's docstring);
    its `acting` is then agents.advice.account_acting.AccountActing, or None."""
    p = ppo
    n_envs = num_envs
    num_actions = env.num_actions
    heads = AccountHeads(env) if is_account_env(env) else None  # None: one head, the single-instrument path
    gate = acting.trust_gate() if acting else (None, 0)
    # config → module
    network = make_network(network, num_actions, *gate) if heads is None else make_account_network(
        network, num_actions, *gate)
    logits_of, value_of = type(network).logits, type(network).value
    get_mask = action_mask_fn(env)

    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    v_mask = jax.vmap(get_mask, in_axes=(0, None))

    if heads is None:
        obs_shape = jax.eval_shape(env.reset, jax.random.PRNGKey(0), env_params)[0].shape
        obs_dim = math.prod(obs_shape)
        flat = lambda o: o.reshape((o.shape[0], obs_dim)).astype(jnp.float32)  # noqa: E731
    else:
        obs_dim, flat = heads.row_size, heads.as_obs

    num_grad_steps = num_updates * p.update_epochs * p.num_minibatches
    lr = optax.linear_schedule(p.lr, 0.0, num_grad_steps) if p.anneal_lr else p.lr
    # A warm-up stage only where there is one, so other runs' optimiser state keeps its layout.
    tx = optax.chain(*([warmup_freeze(frozen_steps)] if frozen_steps else []),
                     optax.clip_by_global_norm(p.max_grad_norm), optax.adam(lr, eps=1e-5),
                     *(acting.optimizer_scaling() if acting else []))

    def normalize(obs_norm: RunningMeanStd, obs: jax.Array) -> jax.Array:
        return normalize_obs(obs_norm, obs) if p.normalize_obs else obs

    # More truncations than this in one step (e.g. synchronised time limits) fall back to a full critic pass.
    trunc_rows = max(8, n_envs // 64)

    def value_fn(params, obs_norm):
        return lambda obs: network.apply(params, normalize(obs_norm, obs), method=value_of)

    def policy(params, obs_norm, obs, mask, key, deterministic: bool = False):
        if heads is not None:  # every head under its given mask (AccountHeads.choose)
            logits = network.apply(params, normalize(obs_norm, obs), method=logits_of)
            return heads.choose(logits, mask, key, deterministic)
        logits = masked_logits(network.apply(params, normalize(obs_norm, obs), method=logits_of), mask)
        return jnp.argmax(logits, -1) if deterministic else jax.random.categorical(key, logits)

    def shard(rs: RunnerState) -> RunnerState:
        return constrain(rs, mesh, n_envs)

    def init(key: jax.Array, env_params) -> RunnerState:
        key, k_net, k_env = jax.random.split(key, 3)
        obs, env_state = v_reset(jax.random.split(k_env, n_envs), env_params)
        obs = flat(obs)
        params = network.init(k_net, jnp.zeros((1, obs_dim)) if heads is None else heads.example_obs())
        return shard(RunnerState(
            params=params,
            opt_state=tx.init(params),
            obs_norm=RunningMeanStd.create((obs_dim,)) if heads is None else heads.create_norm(),
            ret_norm=RunningMeanStd.create(()),
            env_state=env_state,
            obs=obs,
            mask=v_mask(env_state, env_params),
            ep_return=jnp.zeros(n_envs),
            ep_length=jnp.zeros(n_envs, jnp.int32),
            disc_return=jnp.zeros(n_envs),
            key=key,
            update=jnp.zeros((), jnp.int32),
            hybrid=acting.init_carry(n_envs, env_params) if acting else None,
        ))

    def _step(env_params, rs: RunnerState, _) -> tuple[RunnerState, Transition]:
        key, k_act, k_env = jax.random.split(rs.key, 3)
        logits, value = network.apply(rs.params, normalize(rs.obs_norm, rs.obs))
        hybrid, extras, mask = rs.hybrid, None, rs.mask
        if acting is not None:  # an account's acting goes head by head under the sequential masks too
            action, learn_action, log_prob, mask, extras, hybrid = acting.act(
                network, rs.params, rs.hybrid, logits, rs.mask, rs.obs, rs.env_state, env_params, k_act
            )
        elif heads is not None:  # head by head under the sequential masks, which the transition keeps
            action, mask, log_prob = heads.sample(logits, rs.env_state, env_params, k_act)
            learn_action = action
        else:
            logits = masked_logits(logits, rs.mask)
            action = learn_action = jax.random.categorical(k_act, logits)
            log_prob, _ = log_probs_and_entropy(logits, action)

        obs, env_state, reward, terminated, truncated, info = v_step(
            jax.random.split(k_env, n_envs), rs.env_state, action, env_params
        )
        obs = flat(obs)
        reward = reward.astype(jnp.float32)
        terminated, truncated = terminated.astype(bool), truncated.astype(bool)
        done = terminated | truncated
        final_obs = flat(info["final_observation"])  # a truncated episode's last state
        final_value = truncation_values(value_fn(rs.params, rs.obs_norm), final_obs, truncated & ~terminated,
                                        trunc_rows)

        ep_return = rs.ep_return + reward
        ep_length = rs.ep_length + 1
        disc_return = rs.disc_return * p.gamma + reward
        ended = lambda x: jnp.where(done, x, 0).sum()  # noqa: E731
        episode = {"episodes": done.sum(), "episode_return": ended(ep_return), "episode_length": ended(ep_length)}
        # The env's own end-of-episode totals (episode_pnl, episode_trades, ...), valid where done.
        episode.update({k: ended(v.astype(jnp.float32)) for k, v in info.items() if k.startswith("episode_")})
        if heads is not None:  # per instrument [I], over every step (not only where an episode ended)
            episode.update(heads.instrument_stats(info))

        transition = Transition(
            obs=rs.obs, mask=mask, action=learn_action, log_prob=log_prob, value=value, reward=reward,
            terminated=terminated, truncated=truncated, final_value=final_value, disc_return=disc_return,
            episode=episode, extras=extras,
        )
        rs = rs.replace(
            env_state=env_state,
            obs=obs,
            # Envs that report the new state's mask in info (jaxenv does) spare computing it again.
            mask=info["action_mask"] if "action_mask" in info else v_mask(env_state, env_params),
            ep_return=jnp.where(done, 0.0, ep_return),
            ep_length=jnp.where(done, 0, ep_length),
            disc_return=jnp.where(done, 0.0, disc_return),
            key=key,
            hybrid=hybrid,
        )
        return shard(rs), transition

    def rollout_chunk(rs: RunnerState, k: int, env_params) -> tuple[RunnerState, Transition]:
        rs = shard(rs)
        if acting is not None:  # a query step came before the chunk: what the acting carry keeps of it
            rs = rs.replace(hybrid=acting.look(rs.hybrid, rs.env_state, env_params))
        rs, traj = jax.lax.scan(partial(_step, env_params), rs, None, length=k)
        return shard(rs), constrain_steps(traj, mesh, n_envs)

    def _gae(rs: RunnerState, traj: Transition) -> tuple[jax.Array, jax.Array]:
        last_value = value_fn(rs.params, rs.obs_norm)(rs.obs)
        reward = traj.reward / rs.ret_norm.std if p.scale_rewards else traj.reward
        return gae_targets(
            reward, traj.value, last_value, traj.terminated, traj.truncated, traj.final_value, p.gamma, p.gae_lambda
        )

    def _loss(params, obs_norm, mb: Batch):
        logits, value = network.apply(params, normalize(obs_norm, mb.obs))
        if acting is not None:
            log_prob, entropy, pg_weight = acting.log_prob_entropy(network, params, logits, mb.mask, mb.extras, mb.action)
        elif heads is not None:
            log_prob, entropy = heads.log_prob_entropy(logits, mb.mask, mb.action)
            pg_weight = 1.0
        else:
            log_prob, entropy = log_probs_and_entropy(masked_logits(logits, mb.mask), mb.action)
            pg_weight = 1.0
        log_ratio = log_prob - mb.log_prob
        ratio = jnp.exp(log_ratio)
        adv, ret = mb.advantage, mb.target
        if p.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        clipped = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - p.clip_eps, 1 + p.clip_eps))
        # Steps whose action the advice chose instead of the policy carry no policy gradient.
        policy_loss = (pg_weight * clipped).mean()
        if p.clip_value:
            v_clipped = mb.value + jnp.clip(value - mb.value, -p.clip_eps, p.clip_eps)
            value_loss = 0.5 * jnp.maximum((value - ret) ** 2, (v_clipped - ret) ** 2).mean()
        else:
            value_loss = 0.5 * ((value - ret) ** 2).mean()
        entropy = entropy.mean()
        loss = policy_loss + p.vf_coef * value_loss - p.ent_coef * entropy
        stats = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_frac": (jnp.abs(ratio - 1.0) > p.clip_eps).mean(),
        }
        return loss, stats

    def learn(rs: RunnerState, traj: Transition) -> tuple[RunnerState, dict]:
        adv, ret = _gae(rs, traj)
        batch_size = adv.size
        extras = acting.loss_extras(traj.extras) if acting is not None else None
        data = Batch(traj.obs, traj.mask, traj.action, traj.log_prob, traj.value, adv, ret, extras)
        data = jax.tree.map(lambda x: x.reshape((batch_size, *x.shape[2:])), data)

        def epoch(carry, _):
            params, opt_state, key = carry
            key, k_perm = jax.random.split(key)
            perm = jax.random.permutation(k_perm, batch_size)
            shuffled = jax.tree.map(
                lambda x: jnp.take(x, perm, axis=0).reshape((p.num_minibatches, -1, *x.shape[1:])), data
            )

            def minibatch(carry, mb):
                params, opt_state = carry
                grads, stats = jax.grad(_loss, has_aux=True)(params, rs.obs_norm, mb)
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), stats

            (params, opt_state), stats = jax.lax.scan(minibatch, (params, opt_state), shuffled)
            return (params, opt_state, key), stats

        key, k_learn = jax.random.split(rs.key)
        (params, opt_state, _), stats = jax.lax.scan(
            epoch, (rs.params, rs.opt_state, k_learn), None, length=p.update_epochs
        )
        metrics = jax.tree.map(jnp.mean, stats)
        metrics["explained_variance"] = 1.0 - jnp.var(ret - traj.value) / (jnp.var(ret) + 1e-8)

        episode = jax.tree.map(jnp.sum, {k: v for k, v in traj.episode.items() if k not in INSTRUMENT_METRICS})
        # an account env's per-instrument figures [I]: totals over the rollout's steps and envs
        metrics.update({k: v.sum(axis=0) for k, v in traj.episode.items() if k in INSTRUMENT_METRICS})
        count = episode.pop("episodes")
        metrics["episodes"] = count
        for k, v in episode.items():
            metrics[k] = v / jnp.maximum(count, 1)  # mean over the episodes that ended in this rollout
        if "episode_wins" in episode and "episode_trades" in episode:
            metrics["win_rate"] = episode["episode_wins"] / jnp.maximum(episode["episode_trades"], 1.0)

        rs = rs.replace(
            params=params,
            opt_state=opt_state,
            obs_norm=update_obs(rs.obs_norm, traj.obs) if p.normalize_obs else rs.obs_norm,
            ret_norm=rs.ret_norm.update(traj.disc_return) if p.scale_rewards else rs.ret_norm,
            key=key,
            update=rs.update + 1,
        )
        return shard(rs), metrics

    return PPO(init, rollout_chunk, learn, policy, network, obs_dim, num_actions)
