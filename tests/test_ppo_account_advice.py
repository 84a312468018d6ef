"""PPO with advice on an account of several instruments (agents.advice.account_acting, issue 77): each head acts on
its own instrument's advice under the env's sequential mask, and the loss recomputes the stored joint log-probability
exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.advice.acting import make_acting
from agents.advice.table import SIDES, AdviceTable
from agents.config import load_config
from agents.rl.normalization import normalize_obs
from agents.rl.ppo import make_train
from bridge.protocol import HOLD, NUM_ACTIONS, SELL, STATUS_OK
from jaxenv.market_set import load_market_set
from tests.test_ppo_account import BASE, ENV, ENVS, STEPS


class Advised:
    """make_train on synthetic:pair with advice fused as `fusion` says, its jitted functions."""

    def __init__(self, fusion: str):
        self.cfg = load_config(None, ["llm=mock", f"hybrid.fusion={fusion}", f"num_envs={ENVS}",
                                      f"ppo.num_steps={STEPS}", "total_steps=4096", "ppo.num_minibatches=2",
                                      "ppo.update_epochs=2", "network.actor_hidden=[16,16]",
                                      "network.critic_hidden=[16,16]", "hybrid.query.interval=4"])
        market_set = load_market_set([("NQ", "synthetic:pair"), ("ES", "synthetic:pair")], BASE)
        self.params = ENV.make_params(market_set, "train")
        self.acting = make_acting(self.cfg.hybrid, ENV)
        self.ppo = make_train(self.cfg.ppo, self.cfg.network, ENV, self.params, self.acting, num_envs=ENVS,
                              num_updates=self.cfg.num_updates)
        self.init = jax.jit(self.ppo.init)
        self.chunk = jax.jit(self.ppo.rollout_chunk, static_argnums=1)
        self.learn = jax.jit(self.ppo.learn)


def answered_everywhere(table: AdviceTable, action: int) -> AdviceTable:
    """Every key answered, all its probability on `action`, with full confidence."""
    k = table.num_keys
    return table.replace(probs=jnp.tile(jax.nn.one_hot(action, NUM_ACTIONS), (k, 1)), confidence=jnp.ones(k),
                         status=jnp.full(k, STATUS_OK, jnp.int32), version=jnp.zeros(k, jnp.int32))


def advised_state(advised: Advised, key: int, actions: tuple[int, int]):
    """A fresh state whose instrument i has `actions[i]` advised on every key."""
    rs = advised.init(jax.random.PRNGKey(key), advised.params)
    return rs.replace(hybrid=tuple(c.replace(advice=answered_everywhere(c.advice, a))
                                   for c, a in zip(rs.hybrid, actions)))


@pytest.fixture(scope="module")
def switch() -> Advised:
    return Advised("switch")


@pytest.fixture(scope="module")
def learned() -> Advised:
    return Advised("learned")


def test_each_head_acts_on_its_own_instruments_advice_within_its_sequential_mask(switch):
    rs = advised_state(switch, 0, (HOLD, SELL))  # NQ told to hold, ES to sell
    assert len(rs.hybrid) == 2 and rs.hybrid[0].advice.num_keys % SIDES == 0
    v_masks = jax.jit(jax.vmap(ENV.sequential_masks, in_axes=(0, None, 0)))
    advised_sells = 0
    for _ in range(3 * STEPS):
        before = rs
        rs, traj = switch.chunk(rs, 1, switch.params)
        # traj.action is what PPO learns from: the executed action wherever no head's was replaced by the advice
        action, mask = np.asarray(traj.action[0]), np.asarray(traj.mask[0])
        heads = traj.extras.heads
        own = np.all([np.asarray(h.pg_weight[0]) == 1 for h in heads], axis=0)
        assert np.take_along_axis(mask, action[..., None], -1)[own].all()
        # each stored mask lies within the env's sequential mask given the earlier heads' executed actions
        expected, taken = v_masks(before.env_state, switch.params, action)
        assert not (mask & ~np.asarray(expected))[own].any()
        np.testing.assert_array_equal(np.asarray(taken)[own], action[own])
        valid = [np.asarray(h.advice.valid[0]) for h in heads]
        side_before, side = np.asarray(before.env_state.legs.side), np.asarray(rs.env_state.legs.side)
        flat = side_before == 0
        assert (side[valid[0] & flat[:, 0], 0] == 0).all()  # NQ's advice in force: a flat NQ stays flat
        sells = valid[1] & flat[:, 1] & mask[:, 1, SELL]
        assert (side[sells, 1] == -1).all()  # ES's: a flat ES sells wherever it may
        advised_sells += int(sells.sum())
    assert advised_sells > 0


def test_the_loss_recomputes_the_joint_log_probability_of_a_learned_fusion(learned):
    rs = advised_state(learned, 1, (SELL, HOLD))
    rs, traj = learned.chunk(rs, STEPS, learned.params)
    rs, metrics = learned.learn(rs, traj)  # the policy, its gate and the normaliser move off their initial values
    assert all(np.isfinite(float(metrics[k])) for k in ("policy_loss", "value_loss", "entropy"))
    network = learned.ppo.network
    for _ in range(4):
        before = rs
        rs, traj = learned.chunk(rs, 1, learned.params)
        step = jax.tree.map(lambda x: x[0], traj)
        logits = network.apply(before.params, normalize_obs(before.obs_norm, step.obs),
                               method=type(network).logits)
        log_prob, entropy, weight = learned.acting.log_prob_entropy(network, before.params, logits, step.mask,
                                                                   learned.acting.loss_extras(step.extras),
                                                                   step.action)
        np.testing.assert_allclose(np.asarray(log_prob), np.asarray(step.log_prob), atol=1e-5)
        assert (np.asarray(entropy) >= -1e-6).all() and (np.asarray(weight) == 1).all()
    assert float(traj.extras.stats["with_advice"].sum()) > 0  # the advice was in force, so the gate mixed it in
    assert float(traj.extras.stats["decisions"].sum()) == ENVS * 2  # one decision per head


def test_a_head_the_advice_overrode_leaves_the_ratio_and_the_others_still_learn(switch):
    """Switch fusion, NQ's advice in force everywhere, ES with none: NQ's action is the advice's (its weight 0), ES's
    policy chooses. The step still carries ES's policy gradient, and its stored log-probability, recomputed by the
    loss, is ES's head's alone."""
    rs = switch.init(jax.random.PRNGKey(2), switch.params)
    rs = rs.replace(hybrid=(rs.hybrid[0].replace(advice=answered_everywhere(rs.hybrid[0].advice, HOLD)),
                            rs.hybrid[1]))
    network = switch.ppo.network
    mixed = 0
    for _ in range(STEPS):
        before = rs
        rs, traj = switch.chunk(rs, 1, switch.params)
        step = jax.tree.map(lambda x: x[0], traj)
        heads = switch.acting.loss_extras(step.extras)
        nq, es = (np.asarray(h.pg_weight) for h in heads)
        logits = network.apply(before.params, normalize_obs(before.obs_norm, step.obs), method=type(network).logits)
        log_prob, _, weight = switch.acting.log_prob_entropy(network, before.params, logits, step.mask, heads,
                                                             step.action)
        np.testing.assert_allclose(np.asarray(log_prob), np.asarray(step.log_prob), atol=1e-5)
        es_alone, _, _ = switch.acting.single.log_prob_entropy(network, before.params, logits[:, 1], step.mask[:, 1],
                                                               heads[1], step.action[:, 1])
        rows = (nq == 0) & (es == 1)
        np.testing.assert_allclose(np.asarray(log_prob)[rows], np.asarray(es_alone)[rows], atol=1e-5)
        np.testing.assert_array_equal(np.asarray(weight), np.maximum(nq, es))
        mixed += int(rows.sum())
    assert mixed > 0
