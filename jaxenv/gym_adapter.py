"""Gymnasium views of the trading environment, for libraries built on gymnasium (Stable-Baselines3 and others).

    env = TradingEnv(EnvConfig())
    params = env.make_params(load_market(DataConfig()), "train")
    envs = TradingVectorEnv(env, params, num_envs=1024)
    obs, infos = envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(actions)  # numpy in, numpy out
    masks = envs.action_masks()  # [N, 6] bool, the name sb3-contrib's MaskablePPO looks for

`TradingVectorEnv` steps all N envs with one jitted, vmapped call; only numpy arrays cross to the caller.
It auto-resets in gymnasium's *same-step* mode (`AutoresetMode.SAME_STEP`), which is what the JAX env does
inside its step: where an episode ends, the observation returned is the first of the next episode, the ended
episode's last observation is `infos["final_obs"][i]` and `infos["_final_obs"][i]` is True. `final_obs` is one
dense [N, D] array (rows of envs that did not finish equal their returned observation). The env's own info
arrays (`trade_pnl`, `episode_pnl`, ...) come for every env at every step; where an episode ended they describe
its last step, before the reset.

`TradingGymEnv` is one env as a plain `gymnasium.Env` (no auto-reset: after an episode ends call `reset`), for
gymnasium's env checker and single-env tools.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from jaxenv.env import EnvParams, TradingEnv

MAX_SEED = 2**31  # JAX keys are made from seeds below this


def _to_numpy(tree: Any) -> Any:
    """Writable numpy copies (numpy views of JAX arrays are read-only; callers such as SB3 edit in place)."""
    return jax.tree.map(np.array, tree)


def _spaces(env: TradingEnv) -> tuple[gymnasium.spaces.Box, gymnasium.spaces.Discrete]:
    return gymnasium.spaces.Box(-np.inf, np.inf, (env.obs_size,), np.float32), gymnasium.spaces.Discrete(env.num_actions)


class TradingVectorEnv(gymnasium.vector.VectorEnv):
    """N trading envs as one `gymnasium.vector.VectorEnv`, stepped on the JAX device by one jitted call."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: TradingEnv, params: EnvParams, num_envs: int):
        self.env, self.params, self.num_envs = env, params, num_envs
        self.single_observation_space, self.single_action_space = _spaces(env)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._key: jax.Array | None = None
        self._state = None
        self._mask: np.ndarray | None = None

        def reset_all(key, params):
            obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, num_envs), params)
            return obs, state, jax.vmap(env.action_mask, in_axes=(0, None))(state, params)

        def step_all(key, state, action, params):
            keys = jax.random.split(key, num_envs)
            return jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)

        self._reset_all = jax.jit(reset_all)
        self._step_all = jax.jit(step_all)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Resets every env. An int seed restarts the JAX key stream; None continues it (a random seed the
        first time)."""
        if options:
            raise ValueError(f"TradingVectorEnv.reset takes no options (partial resets are not supported), got {options}")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed a TradingVectorEnv with one int (its envs draw from one JAX key), got {seed!r}")
        if seed is None and self._key is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0]) % MAX_SEED
        if seed is not None:
            self._key = jax.random.PRNGKey(seed)
        self._key, k_reset = jax.random.split(self._key)
        obs, self._state, mask = self._reset_all(k_reset, self.params)
        obs, self._mask = _to_numpy((obs, mask))
        return obs, {"action_mask": self._mask}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        self._key, k_step = jax.random.split(self._key)
        action = jnp.asarray(np.asarray(actions).reshape(self.num_envs), jnp.int32)
        obs, self._state, reward, terminated, truncated, info = self._step_all(k_step, self._state, action, self.params)
        obs, reward, terminated, truncated, info = _to_numpy((obs, reward, terminated, truncated, info))
        infos = dict(info)
        infos["final_obs"] = infos.pop("final_observation")
        infos["_final_obs"] = terminated | truncated
        self._mask = infos["action_mask"]
        return obs, reward, terminated, truncated, infos

    def action_masks(self) -> np.ndarray:
        """[N, num_actions] bool: the valid actions of each env's current state."""
        if self._mask is None:
            raise RuntimeError("call reset() before action_masks()")
        return self._mask


class TradingGymEnv(gymnasium.Env):
    """One trading env as a `gymnasium.Env`. No auto-reset: when an episode ends the observation returned is its
    last one; call `reset` before stepping on."""

    metadata = {"render_modes": []}

    def __init__(self, env: TradingEnv, params: EnvParams):
        self.env, self.params = env, params
        self.observation_space, self.action_space = _spaces(env)
        self._state = None
        self._mask: np.ndarray | None = None
        self._step_one = jax.jit(env.step)
        self._reset_one = jax.jit(env.reset)

    def _next_key(self) -> jax.Array:
        return jax.random.PRNGKey(int(self.np_random.integers(MAX_SEED)))  # self.np_random is seeded by reset()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, self._state = self._reset_one(self._next_key(), self.params)
        obs, self._mask = _to_numpy((obs, self.env.action_mask(self._state, self.params)))
        return obs, {"action_mask": self._mask}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        obs, self._state, reward, terminated, truncated, info = self._step_one(
            self._next_key(), self._state, jnp.asarray(action, jnp.int32), self.params
        )
        obs, info = _to_numpy((obs, info))
        terminated, truncated = bool(terminated), bool(truncated)
        final_obs = info.pop("final_observation")
        self._mask = info["action_mask"]  # of the state kept, which after an episode's end is already reset
        return (final_obs if terminated or truncated else obs), float(reward), terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """[num_actions] bool: the valid actions in the current state."""
        if self._mask is None:
            raise RuntimeError("call reset() before action_masks()")
        return self._mask
