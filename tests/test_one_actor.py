"""One actor: a run without an advisor trains by sampling from its masked policy (agents.rl.ppo's RL-only branch, the
fastest path) and walks and trades through the acting step (agents.advice.acting.acting_of: fusion none, no veto,
no record). Both must be the same agent: on every state of a training rollout the acting step keeps the env's mask,
gives each action the policy's own log-probability and, greedy, takes the policy's most probable action."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from agents.advice.acting import acting_of
from agents.config import load_config
from agents.rl.networks import ActorCritic, masked_logits
from agents.rl.ppo import make_train
from agents.training.env_setup import make_env_setup

STEPS = 40
ENVS = 32


def test_the_acting_step_of_a_run_without_an_advisor_is_its_training_policy():
    cfg = load_config("configs/quick.yaml", ["llm=none", f"num_envs={ENVS}", "data.synthetic_days=20"])
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    env, params = setup.env, setup.params
    ppo = make_train(cfg.ppo, cfg.network, env, params, num_envs=ENVS, num_updates=cfg.num_updates)
    acting = acting_of(cfg.hybrid, cfg.llm, env)
    greedy = dataclasses.replace(acting, greedy=True)
    assert acting.trust_gate() == (None, 0)  # the same networks: nothing beside the policy

    state = jax.jit(ppo.init)(jax.random.PRNGKey(0), params)
    carry = acting.init_carry(ENVS, params)
    rollout = jax.jit(ppo.rollout_chunk, static_argnums=1)

    @jax.jit
    def both(state, carry, key):
        obs = state.obs_norm.normalize(state.obs) if cfg.ppo.normalize_obs else state.obs
        logits = ppo.network.apply(state.params, obs, method=ActorCritic.logits)
        policy = jax.nn.log_softmax(masked_logits(logits, state.mask))  # the RL-only branch's distribution
        sampled = acting.act(ppo.network, state.params, carry, logits, state.mask, state.obs, state.env_state,
                             params, key)
        chosen = greedy.act(ppo.network, state.params, carry, logits, state.mask, state.obs, state.env_state,
                            params, key)
        return policy, sampled, chosen

    positions, keys = set(), jax.random.split(jax.random.PRNGKey(1), STEPS)
    for step in range(STEPS):
        policy, (action, learn_action, log_prob, mask, _, carry), greedy_choice = both(state, carry, keys[step])
        np.testing.assert_array_equal(np.asarray(mask), np.asarray(state.mask))
        assert (np.asarray(action) == np.asarray(learn_action)).all()  # nothing overrides the policy
        np.testing.assert_allclose(np.asarray(log_prob),
                                   np.take_along_axis(np.asarray(policy), np.asarray(action)[:, None], 1)[:, 0],
                                   rtol=1e-6, atol=1e-6)
        assert np.asarray(state.mask)[np.arange(ENVS), np.asarray(action)].all()  # sampled within the mask
        np.testing.assert_array_equal(np.asarray(greedy_choice[0]), np.asarray(jnp.argmax(policy, -1)))
        positions.update(np.asarray(state.env_state.side).tolist())
        state, _ = rollout(state, 1, params)
    assert positions >= {-1, 0, 1}  # flat, long and short states were all compared
