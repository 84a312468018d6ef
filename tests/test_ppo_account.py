"""PPO over one account of several instruments (agents.rl.account, jaxenv.account_env.AccountEnv, issue 77): one head
per instrument sampled under the env's sequential masks, the stored masks giving the loss the exact log-probability,
and weights shared across instruments (the same parameters on one, two and three instruments)."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.config import load_config
from agents.rl.account import AccountHeads
from agents.rl.normalization import normalize_obs
from agents.rl.ppo import make_train
from jaxenv.account_env import AccountEnv
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.market_files import write_pair
from jaxenv.market_set import load_market_set
from tests.conftest import account_config

ENVS, STEPS = 4, 8
BASE = DataConfig(synthetic_days=4, synthetic_seed=0)
# A cap of one mini and a correlated pair: head 1's mask often depends on what head 0 chose.
ENV = AccountEnv(account_config(EnvConfig(max_steps_in_episode=40), max_contracts=1.0, correlated=[["NQ", "ES"]]))


def tiny_cfg():
    return load_config(None, ["llm=none", f"num_envs={ENVS}", f"ppo.num_steps={STEPS}", "total_steps=4096",
                              "ppo.num_minibatches=2", "ppo.update_epochs=2", "network.actor_hidden=[16,16]",
                              "network.critic_hidden=[16,16]"])


class Compiled:
    """make_train on one market set, with its jitted functions."""

    def __init__(self, market_set):
        cfg = tiny_cfg()
        self.params = ENV.make_params(market_set, "train")
        self.ppo = make_train(cfg.ppo, cfg.network, ENV, self.params, num_envs=ENVS, num_updates=cfg.num_updates)
        self.init = jax.jit(self.ppo.init)
        self.chunk = jax.jit(self.ppo.rollout_chunk, static_argnums=1)
        self.learn = jax.jit(self.ppo.learn)

    def rollout(self, rs, steps: int = STEPS):
        """`steps` chunks of one step, concatenated (one compiled chunk serves every test)."""
        parts = []
        for _ in range(steps):
            rs, traj = self.chunk(rs, 1, self.params)
            parts.append(traj)
        return rs, jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """synthetic:pair's NQ and ES as files, and a copy of NQ's bars under MNQ (a third instrument)."""
    folder = tmp_path_factory.mktemp("pair")
    nq, es = write_pair(folder, "pair", ("NQ", "ES"), BASE.synthetic_days, BASE.synthetic_seed)
    mnq = folder / "MNQ.csv"
    shutil.copy(nq, mnq)
    return {"NQ": str(nq), "ES": str(es), "MNQ": str(mnq)}


@pytest.fixture(scope="module")
def pair() -> Compiled:
    return Compiled(load_market_set([("NQ", "synthetic:pair"), ("ES", "synthetic:pair")], BASE))


def test_a_two_instrument_ppo_rolls_out_and_learns(pair):
    rs = pair.init(jax.random.PRNGKey(0), pair.params)
    assert rs.obs.instruments.shape == (ENVS, 2, ENV.instrument_obs_size) and rs.mask.shape == (ENVS, 2, 6)
    assert rs.obs_norm.instruments.mean.shape == (ENV.instrument_obs_size,)  # per feature, across instruments
    for update in range(3):
        rs, traj = pair.rollout(rs)
        assert traj.action.shape == (STEPS, ENVS, 2) and traj.mask.shape == (STEPS, ENVS, 2, 6)
        assert traj.log_prob.shape == (STEPS, ENVS)
        rows, accounts = float(rs.obs_norm.instruments.count), float(rs.obs_norm.account.count)
        rs, metrics = pair.learn(rs, traj)
        # the rows of every env, step and instrument merged into one normaliser
        assert float(rs.obs_norm.instruments.count) == pytest.approx(rows + STEPS * ENVS * 2, rel=1e-6)
        assert float(rs.obs_norm.account.count) == pytest.approx(accounts + STEPS * ENVS, rel=1e-6)
        for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
            assert np.isfinite(float(metrics[name])), (update, name)
        assert np.asarray(metrics["instrument_trades"]).shape == (2,)
        assert np.asarray(metrics["instrument_pnl"]).shape == (2,)
    assert int(rs.update) == 3
    assert np.isfinite(np.asarray(jax.tree.leaves(rs.params)[0])).all()


def test_the_stored_masks_are_the_sequential_ones_and_give_the_exact_log_probability(pair):
    rs = pair.init(jax.random.PRNGKey(1), pair.params)
    rs, traj = pair.rollout(rs)
    rs, _ = pair.learn(rs, traj)  # a policy and a normaliser that have moved from their initial values
    v_masks = jax.jit(jax.vmap(ENV.sequential_masks, in_axes=(0, None, 0)))
    v_log_prob = jax.jit(jax.vmap(ENV.log_prob, in_axes=(0, None, 0, 0)))
    bound = 0
    for _ in range(24):
        before = rs
        rs, traj = pair.chunk(rs, 1, pair.params)
        action, mask, log_prob = traj.action[0], traj.mask[0], traj.log_prob[0]
        # each head's mask is the env's sequential one given the earlier heads' actions; no action is outside it
        expected, taken = v_masks(before.env_state, pair.params, action)
        np.testing.assert_array_equal(np.asarray(mask), np.asarray(expected))
        np.testing.assert_array_equal(np.asarray(taken), np.asarray(action))
        assert np.take_along_axis(np.asarray(mask), np.asarray(action)[..., None], -1).all()
        bound += int((np.asarray(mask) != np.asarray(before.mask)).any(axis=(1, 2)).sum())
        # the loss's log-probability: from the stored (obs, masks, actions), as agents.rl.ppo's loss computes it
        obs = normalize_obs(before.obs_norm, jax.tree.map(lambda x: x[0], traj.obs))
        logits = pair.ppo.network.apply(before.params, obs, method=type(pair.ppo.network).logits)
        recomputed, entropy = AccountHeads.log_prob_entropy(logits, mask, action)
        np.testing.assert_allclose(np.asarray(recomputed), np.asarray(log_prob), atol=1e-5)
        # and the env's own scoring of the joint action agrees
        np.testing.assert_allclose(np.asarray(v_log_prob(before.env_state, pair.params, logits, action)),
                                   np.asarray(log_prob), atol=1e-5)
        assert (np.asarray(entropy) >= -1e-6).all()
    assert bound > 0  # some later head's mask depended on an earlier head's entry (the cap or the pair)


def test_the_same_parameters_run_on_one_two_and_three_instruments(pair, files):
    sets = {n: load_market_set([(s, files[s]) for s in ("NQ", "ES", "MNQ")[:n]], BASE) for n in (1, 3)}
    shapes = lambda state: jax.tree.map(lambda x: x.shape, state.params)  # noqa: E731
    trained = pair.init(jax.random.PRNGKey(2), pair.params)
    trained, traj = pair.rollout(trained)
    trained, _ = pair.learn(trained, traj)
    for n, market_set in sets.items():
        other = Compiled(market_set)
        fresh = jax.eval_shape(other.ppo.init, jax.random.PRNGKey(0), other.params)
        assert shapes(fresh) == shapes(trained), n  # no parameter depends on the instrument count
        rs = other.init(jax.random.PRNGKey(3), other.params)
        rs = rs.replace(params=trained.params, opt_state=trained.opt_state, obs_norm=trained.obs_norm)
        rs, traj = other.rollout(rs)
        assert traj.action.shape == (STEPS, ENVS, n)
        assert np.take_along_axis(np.asarray(traj.mask), np.asarray(traj.action)[..., None], -1).all()
        actions = other.ppo.policy(rs.params, rs.obs_norm, rs.obs, rs.mask, jax.random.PRNGKey(4), True)
        assert actions.shape == (ENVS, n)
        assert np.take_along_axis(np.asarray(rs.mask), np.asarray(actions)[..., None], -1).all()
    assert other.params.entry_tenths.tolist() == [10, 10, 1]  # the three: two minis and a micro


def test_the_actor_sees_each_instrument_through_shared_weights(pair):
    """Swapping the two instruments' rows swaps their logits: one actor for every head."""
    rs = pair.init(jax.random.PRNGKey(5), pair.params)
    obs = normalize_obs(rs.obs_norm, rs.obs)
    logits_of = type(pair.ppo.network).logits
    logits = pair.ppo.network.apply(rs.params, obs, method=logits_of)
    swapped = pair.ppo.network.apply(rs.params, obs.replace(instruments=obs.instruments[:, ::-1]), method=logits_of)
    np.testing.assert_allclose(np.asarray(swapped), np.asarray(logits[:, ::-1]), atol=1e-6)
    value = pair.ppo.network.apply(rs.params, obs, method=type(pair.ppo.network).value)
    value_swapped = pair.ppo.network.apply(rs.params, obs.replace(instruments=obs.instruments[:, ::-1]),
                                           method=type(pair.ppo.network).value)
    np.testing.assert_allclose(np.asarray(value_swapped), np.asarray(value), atol=1e-5)  # the critic pools
