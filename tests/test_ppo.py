"""PPO core: masking, GAE with truncation, truncation bootstrap values, normaliser, chunked rollouts, learning.

Runs on gymnax CartPole and on a tiny masked env defined here, so it checks the trainer works on any gymnax env.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from agents.config import load_config
from agents.rl.networks import ActorCritic, forward_flops, log_probs_and_entropy, masked_logits, update_flops_per_step
from agents.rl.normalization import RunningMeanStd
from agents.rl.ppo import gae_targets, make_train, truncation_values
from agents.training.update import Update


# ------------------------------------------------------------------------------------------ a masked toy env
@struct.dataclass
class GuessState(environment.EnvState):
    target: jax.Array
    hits: jax.Array


@struct.dataclass
class GuessParams(environment.EnvParams):
    max_steps_in_episode: int = 8


class GuessEnv(environment.Environment):
    """Guess the one-hot target in the observation (reward 1 per hit). Action 4 is never valid and action 3 only
    on even steps; guessing 2 when the target is 0 ends the episode. Reports info["episode_hits"]."""

    @property
    def default_params(self) -> GuessParams:
        return GuessParams()

    @property
    def num_actions(self) -> int:
        return 5

    def action_space(self, params=None):
        return spaces.Discrete(5)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (5,), jnp.float32)

    def get_obs(self, state, params=None, key=None):
        return jnp.concatenate([jax.nn.one_hot(state.target, 4), (state.time / 8.0)[None]]).astype(jnp.float32)

    def action_mask(self, state, params):
        return jnp.array([True, True, True, False, False]).at[3].set(state.time % 2 == 0)

    def reset_env(self, key, params):
        state = GuessState(time=jnp.int32(0), target=jax.random.randint(key, (), 0, 4), hits=jnp.int32(0))
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        hit = action == state.target
        hits = state.hits + hit
        terminated = (action == 2) & (state.target == 0)
        new = GuessState(time=state.time + 1, target=jax.random.randint(key, (), 0, 4), hits=hits)
        info = {"episode_hits": hits.astype(jnp.float32)}
        return self.get_obs(new), new, hit.astype(jnp.float32), terminated, info


def tiny_cfg(*overrides: str):
    base = ["llm=none", "num_envs=16", "ppo.num_steps=8", "total_steps=4096", "network.actor_hidden=[32,32]",
            "network.critic_hidden=[32,32]"]
    return load_config(None, base + list(overrides))


class Compiled:
    """One PPO on GuessEnv with its jitted functions, shared by the tests below (compiling is the slow part)."""

    def __init__(self):
        self.env = GuessEnv()
        self.params = self.env.default_params
        cfg = tiny_cfg()
        self.ppo = make_train(cfg.ppo, cfg.network, self.env, self.params, num_envs=cfg.num_envs,
                              num_updates=cfg.num_updates)
        self.update = Update(self.ppo, tiny_cfg().ppo.num_steps, self.params)
        self.chunk = jax.jit(self.ppo.rollout_chunk, static_argnums=1)
        self.learn = jax.jit(self.ppo.learn)

    def init(self, key):
        return self.ppo.init(key, self.params)

    def rollout(self, rs, chunks: int):
        """`chunks` chunks of 4 steps, concatenated."""
        parts = []
        for _ in range(chunks):
            rs, traj = self.chunk(rs, 4, self.params)
            parts.append(traj)
        return rs, jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


@pytest.fixture(scope="module")
def guess() -> Compiled:
    return Compiled()


# ------------------------------------------------------------------------------------------------- masking
@pytest.mark.nojit
def test_masked_distribution_excludes_invalid_actions():
    logits = jnp.array([[0.0, 5.0, 0.0, 0.0]])
    mask = jnp.array([[True, False, True, False]])
    ml = masked_logits(logits, mask)
    logp, ent = log_probs_and_entropy(ml, jnp.array([0]))
    np.testing.assert_allclose(logp, np.log(0.5), rtol=1e-6)  # the large invalid logit takes no mass
    np.testing.assert_allclose(ent, np.log(2.0), rtol=1e-6)  # entropy over the two valid actions only
    grad = jax.grad(lambda x: log_probs_and_entropy(masked_logits(x, mask), jnp.array([0]))[1].sum())(logits)
    assert np.isfinite(np.asarray(grad)).all()
    samples = jax.random.categorical(jax.random.PRNGKey(0), jnp.repeat(ml, 2000, axis=0))
    assert set(np.unique(samples)) == {0, 2}


def test_rollout_never_takes_invalid_actions_and_stores_masked_log_probs(guess):
    rs = guess.init(jax.random.PRNGKey(0))
    rs, traj = guess.rollout(rs, 2)
    chosen_valid = np.take_along_axis(np.asarray(traj.mask), np.asarray(traj.action)[..., None], -1)
    assert chosen_valid.all()
    assert not np.asarray(traj.mask)[..., 4].any() and np.asarray(traj.mask)[..., 3].any()
    # stored log-probs are those of the masked distribution: recompute from the network
    logits, _ = guess.ppo.network.apply(rs.params, traj.obs)  # normaliser is still at its initial (identity-like) stats
    logp, _ = log_probs_and_entropy(masked_logits(logits, traj.mask), traj.action)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(traj.log_prob), atol=1e-3)


# ----------------------------------------------------------------------------------------------------- GAE
def reference_gae(reward, value, last_value, terminated, truncated, final_value, gamma, lam):
    T, N = reward.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                bootstrap, carry = 0.0, 0.0
            elif truncated[t, n]:
                bootstrap, carry = final_value[t, n], 0.0
            else:
                bootstrap = value[t + 1, n] if t + 1 < T else last_value[n]
                carry = running
            running = reward[t, n] + gamma * bootstrap - value[t, n] + gamma * lam * carry
            adv[t, n] = running
    return adv


@pytest.mark.nojit
def test_gae_bootstraps_on_truncation_not_termination():
    rng = np.random.default_rng(0)
    T, N = 12, 5
    reward, value, final_value = rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.normal(size=(T, N))
    last_value = rng.normal(size=N)
    terminated = rng.random((T, N)) < 0.15
    truncated = rng.random((T, N)) < 0.15
    terminated[3, 0] = truncated[3, 0] = True  # both at once: termination wins
    args = [jnp.asarray(x, jnp.float32) for x in (reward, value, last_value)]
    ends = (jnp.asarray(terminated), jnp.asarray(truncated))
    adv, ret = gae_targets(*args, *ends, jnp.asarray(final_value, jnp.float32), 0.9, 0.8)
    expected = reference_gae(reward, value, last_value, terminated, truncated, final_value, 0.9, 0.8)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), expected + value, rtol=1e-4, atol=1e-5)
    # the truncation bootstrap matters: zeroing final_value changes exactly the truncated-not-terminated steps
    adv0, _ = gae_targets(*args, *ends, jnp.zeros((T, N)), 0.9, 0.8)
    changed = np.abs(np.asarray(adv0) - np.asarray(adv)) > 1e-6
    assert changed[truncated & ~terminated].all()


@pytest.mark.nojit
@pytest.mark.parametrize("count", [0, 3, 8, 40])
def test_truncation_values_match_full_pass(count):
    n, rows = 64, 8
    obs = jax.random.normal(jax.random.PRNGKey(1), (n, 3))
    need = np.zeros(n, bool)
    need[np.random.default_rng(count).choice(n, count, replace=False)] = True
    value_fn = lambda x: x.sum(-1) * 2.0 + 1.0  # noqa: E731
    got = truncation_values(value_fn, obs, jnp.asarray(need), rows)
    np.testing.assert_allclose(np.asarray(got), np.where(need, np.asarray(value_fn(obs)), 0.0), rtol=1e-6)


def test_truncated_steps_carry_the_value_of_the_final_observation(guess):
    rs0 = guess.init(jax.random.PRNGKey(3))
    _, traj = guess.rollout(rs0, 3)  # 12 steps past a time limit of 8: envs that did not bust truncate at step 8
    need = np.asarray(traj.truncated & ~traj.terminated)
    assert need.any()
    assert (np.asarray(traj.final_value)[~need] == 0).all()
    # The final observation of an episode truncated at the limit is (one-hot target, time 8/8); the next row's
    # obs is the reset one (time 0), so a value taken from it would be wrong. Recompute V on the true final obs.
    t, n = np.argwhere(need)[0]
    assert float(traj.obs[t + 1, n, 4]) == 0.0  # the stored next obs is the reset one (time 0)
    # the env draws a fresh target every step: the final obs is one of these four
    candidates = jnp.concatenate([jnp.eye(4), jnp.ones((4, 1))], axis=1)
    values = guess.ppo.network.apply(rs0.params, rs0.obs_norm.normalize(candidates), method=ActorCritic.value)
    assert np.min(np.abs(np.asarray(values) - float(traj.final_value[t, n]))) < 1e-5


# ------------------------------------------------------------------------------------------------ normaliser
@pytest.mark.nojit
def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(50, 4)), rng.normal(-1.0, 0.5, size=(70, 4)), rng.normal(0, 1, (7, 4))]
    rms = RunningMeanStd.create((4,))
    for b in batches:
        rms = rms.update(jnp.asarray(b))
    allx = np.concatenate(batches)
    np.testing.assert_allclose(np.asarray(rms.mean), allx.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(rms.var), allx.var(0), rtol=1e-3, atol=1e-4)
    z = np.asarray(rms.normalize(jnp.asarray(allx)))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-3)


# --------------------------------------------------------------------------------------- update mechanics
def test_first_minibatch_ratio_is_one():
    """Acting and learning see identical inputs (frozen normaliser, stored log-probs): with one epoch and one
    minibatch the only gradient step happens at ratio 1, so nothing is clipped and approx_kl is ~0."""
    env = GuessEnv()
    cfg = tiny_cfg("ppo.update_epochs=1", "ppo.num_minibatches=1")
    ppo = make_train(cfg.ppo, cfg.network, env, env.default_params, num_envs=cfg.num_envs,
                     num_updates=cfg.num_updates)
    update = Update(ppo, cfg.ppo.num_steps, env.default_params)
    rs = ppo.init(jax.random.PRNGKey(0), env.default_params)
    for _ in range(3):  # later updates too, after the normaliser has moved
        rs, m = update(rs)
        assert float(m["clip_frac"]) == 0.0
        assert abs(float(m["approx_kl"])) < 1e-6


def test_chunked_rollout_equals_one_scan(guess):
    """The hybrid loop runs T steps as T/k chunks; the result must not depend on k."""
    rs0 = guess.init(jax.random.PRNGKey(5))
    rs_full, m_full = guess.update(rs0)
    rs, traj = guess.rollout(rs0, 2)
    rs_chunked, m_chunked = guess.learn(rs, traj)
    for a, b in zip(jax.tree.leaves(rs_full), jax.tree.leaves(rs_chunked)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert float(m_full["approx_kl"]) == pytest.approx(float(m_chunked["approx_kl"]), rel=1e-4, abs=1e-7)


def test_episode_stats_come_from_env_info(guess):
    rs, m = guess.update(guess.init(jax.random.PRNGKey(2)))
    assert int(m["episodes"]) > 0
    # reward is 1 per hit, so the env's episode_hits equals the trainer's own episode return
    assert float(m["episode_hits"]) == pytest.approx(float(m["episode_return"]), rel=1e-6)
    assert 1.0 <= float(m["episode_length"]) <= 8.0
    assert {"approx_kl", "clip_frac", "entropy", "explained_variance", "policy_loss", "value_loss"} <= set(m)


def test_same_seed_same_result(guess):
    init, update = guess.init, guess.update
    a, _ = update(init(jax.random.PRNGKey(9)))
    b, _ = update(init(jax.random.PRNGKey(9)))
    c, _ = update(init(jax.random.PRNGKey(10)))
    leaves = lambda s: np.concatenate([np.ravel(x) for x in jax.tree.leaves(s.params)])  # noqa: E731
    np.testing.assert_array_equal(leaves(a), leaves(b))
    assert not np.allclose(leaves(a), leaves(c))


def test_flop_count_from_layer_shapes():
    cfg = load_config(None, [])
    fwd = forward_flops(cfg.network, 261, 6)
    assert fwd == 2 * (261 * 256 + 256 * 256 + 256 * 6) + 2 * (261 * 256 + 256 * 256 + 256 * 1)
    first_layers = 2 * (261 * 256) * 2  # actor's and critic's: no gradient with respect to the observation
    assert update_flops_per_step(cfg.network, 261, 6, 4) == fwd + 4 * (3 * fwd - first_layers)


# ---------------------------------------------------------------------------------------------------- learning
def _train_updates(cfg, env, params, n, seed=0):
    ppo = make_train(cfg.ppo, cfg.network, env, params, num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    update = Update(ppo, cfg.ppo.num_steps, params)
    rs = ppo.init(jax.random.PRNGKey(seed), params)
    history = []
    for _ in range(n):
        rs, m = update(rs)
        history.append(jax.device_get(m))
    return history


def test_learns_masked_toy_env():
    env = GuessEnv()
    cfg = tiny_cfg("num_envs=64", "total_steps=40960", "ppo.lr=3e-3")
    hist = _train_updates(cfg, env, env.default_params, cfg.num_updates)
    first, last = hist[0], hist[-1]
    # random play hits ~1/4 per step; a learned policy hits nearly always and never busts early
    assert last["episode_return"] > 6.5 > first["episode_return"] + 2
    assert last["episode_length"] > 7.5


def test_learns_cartpole():
    import gymnax

    env, params = gymnax.make("CartPole-v1")
    cfg = tiny_cfg("num_envs=32", "ppo.num_steps=64", "total_steps=61440", "ppo.lr=2.5e-3", "ppo.ent_coef=0.0")
    hist = _train_updates(cfg, env, params, cfg.num_updates)
    assert hist[0]["episode_return"] < 40
    assert max(h["episode_return"] for h in hist[-5:]) > 150


def test_the_market_is_an_argument_of_the_update_program_not_a_constant_folded_into_it():
    """A hybrid update's program lowered for a market and for one twice its length is the same program but for the
    arrays' shapes: the market's arrays are parameters. Compiled in as constants (as before issue 64), the program's
    text held every bar, doubled with the market, and XLA folded them at every start."""
    from agents.advice.acting import make_acting
    from agents.training.env_setup import make_env_setup

    sizes = []
    for days in (30, 60):
        cfg = load_config(None, ["llm=mock", "num_envs=8", "ppo.num_steps=10", "ppo.num_minibatches=2",
                                 f"data.synthetic_days={days}", "log.progress=false"])
        setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
        ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                         num_envs=cfg.num_envs, num_updates=cfg.num_updates)
        update = Update(ppo, cfg.ppo.num_steps, setup.params)
        state = jax.eval_shape(ppo.init, jax.random.PRNGKey(0), setup.params)
        text = jax.jit(update._program).lower(state, setup.params).as_text()
        sizes.append((setup.market.num_bars, len(text)))
    (bars_a, text_a), (bars_b, text_b) = sizes
    assert bars_b > 1.9 * bars_a
    assert text_b < 1.02 * text_a, sizes  # a constant of the bars alone would add megabytes of digits
