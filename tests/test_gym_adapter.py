"""The gymnasium adapter: it steps, its masks are the env's, it auto-resets in the same step with the ended
episode's last observation in infos, the single env passes gymnasium's env checker, and MaskablePPO trains on
it through the SB3 VecEnv wrapper."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from jaxenv import DataConfig, EnvConfig, TradingEnv, load_market
from jaxenv.gym_adapter import TradingGymEnv, TradingVectorEnv

N_ENVS = 6
EPISODE_STEPS = 4  # short episodes so that every test sees resets


@pytest.fixture(scope="module")
def env_and_params():
    env = TradingEnv(EnvConfig(max_steps_in_episode=EPISODE_STEPS))
    params = env.make_params(load_market(DataConfig(source="synthetic:default", synthetic_days=10)), "train")
    # A $5 drawdown allowance: any losing trade breaches, so episodes also terminate (not only truncate).
    return env, params.replace(trailing_drawdown=np.float32(5.0))


def random_valid_actions(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.choice(np.flatnonzero(m)) for m in masks])


def test_vector_env_steps_with_the_envs_masks_and_observations(env_and_params):
    env, params = env_and_params
    envs = TradingVectorEnv(env, params, N_ENVS)
    obs, infos = envs.reset(seed=0)
    assert obs.shape == (N_ENVS, env.obs_size) and obs.dtype == np.float32
    assert envs.observation_space.contains(obs)
    np.testing.assert_array_equal(obs, envs.reset(seed=0)[0])  # seeded resets repeat
    rng = np.random.default_rng(0)
    v_mask = jax.jit(jax.vmap(env.action_mask, in_axes=(0, None)))
    v_obs = jax.jit(jax.vmap(env.get_obs, in_axes=(0, None)))
    for _ in range(3 * EPISODE_STEPS):
        masks = envs.action_masks()
        assert masks.shape == (N_ENVS, env.num_actions) and masks.dtype == bool
        np.testing.assert_array_equal(masks, np.asarray(v_mask(envs._state, params)))
        obs, reward, terminated, truncated, infos = envs.step(random_valid_actions(masks, rng))
        assert reward.shape == terminated.shape == truncated.shape == (N_ENVS,)
        np.testing.assert_array_equal(obs, np.asarray(v_obs(envs._state, params)))
        assert not infos["invalid_action"].any()


def test_vector_env_resets_in_the_same_step_with_final_observations(env_and_params):
    env, params = env_and_params
    envs = TradingVectorEnv(env, params, N_ENVS)
    envs.reset(seed=1)
    rng = np.random.default_rng(1)
    transition = jax.jit(jax.vmap(env.transition, in_axes=(0, 0, None)))
    v_obs = jax.jit(jax.vmap(env.get_obs, in_axes=(0, None)))
    seen_terminated = seen_truncated = False
    for _ in range(6 * EPISODE_STEPS):
        before = envs._state
        actions = random_valid_actions(envs.action_masks(), rng)
        obs, _, terminated, truncated, infos = envs.step(actions)
        done = terminated | truncated
        np.testing.assert_array_equal(infos["_final_obs"], done)
        # The ended episode's last observation is that of the state the transition led to, before any reset.
        ended_state, *_ = transition(before, jax.numpy.asarray(actions), params)
        np.testing.assert_allclose(infos["final_obs"][done], np.asarray(v_obs(ended_state, params))[done], rtol=1e-6)
        # ... and the returned observation is the first of a fresh episode.
        assert (np.asarray(envs._state.time)[done] == 0).all()
        np.testing.assert_array_equal(obs[~done], infos["final_obs"][~done])
        seen_terminated |= bool(terminated.any())
        seen_truncated |= bool((truncated & ~terminated).any())
    assert seen_terminated and seen_truncated


def test_single_env_passes_gymnasium_env_checker(env_and_params):
    env, params = env_and_params
    gym_env = TradingGymEnv(env, params)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Box observation space (minimum|maximum) value is.*infinity")
        check_env(gym_env, skip_render_check=True)
    obs, info = gym_env.reset(seed=3)
    np.testing.assert_array_equal(gym_env.action_masks(), info["action_mask"])
    for _ in range(EPISODE_STEPS):
        obs, _, terminated, truncated, _ = gym_env.step(int(np.flatnonzero(gym_env.action_masks())[0]))
        if terminated or truncated:
            break
    assert terminated or truncated  # no auto-reset: the episode's end is reported, its last obs returned
    assert obs.shape == (env.obs_size,)


def test_maskable_ppo_trains_through_the_sb3_wrapper(env_and_params):
    pytest.importorskip("sb3_contrib")
    from sb3_contrib.common.maskable.utils import get_action_masks

    from agents.config import load_config
    from benchmarks.sb3 import SB3VecEnv, make_maskable_ppo

    env, params = env_and_params
    vec_env = SB3VecEnv(TradingVectorEnv(env, params, N_ENVS))
    vec_env.seed(0)
    vec_env.reset()
    np.testing.assert_array_equal(get_action_masks(vec_env), vec_env.venv.action_masks())
    rng, ended = np.random.default_rng(0), 0
    for _ in range(2 * EPISODE_STEPS):
        _, _, dones, infos = vec_env.step(random_valid_actions(get_action_masks(vec_env), rng))
        for done, info in zip(dones, infos):
            assert bool(info) == done  # SB3 reads the ended episode's last observation from the info dict
            if done:
                assert info["terminal_observation"].shape == (env.obs_size,)
                assert isinstance(info["TimeLimit.truncated"], bool)
        ended += int(dones.sum())
    assert ended >= N_ENVS

    cfg = load_config(None, [f"num_envs={N_ENVS}", "ppo.num_steps=8", "ppo.num_minibatches=2", "total_steps=96"])
    model = make_maskable_ppo(vec_env, cfg.ppo, cfg.network, steps_per_update=cfg.steps_per_update, seed=cfg.seed)
    model.learn(2 * cfg.steps_per_update)
    assert model.num_timesteps == 2 * cfg.steps_per_update
