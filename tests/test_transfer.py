"""Transfer (`train.py --init-from`): a 261-feature policy started from a 228-feature run acts exactly as the
source did, a warm-up freezes the copied layers and then releases them, and a warm-up lasting the whole run is
refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.config import ConfigError, load_config
from agents.evaluation.policies import make_act
from agents.evaluation.saved_run import agent_walk, load_run
from agents.rl.freeze import FreezeState
from agents.rl.ppo import make_train
from agents.runs.saved_runs import restore_policy
from agents.training.loop import train
from agents.training.transfer import load_source, start_from
from jaxenv import EnvConfig, TradingEnv, load_market, walk_split
from tests.test_config import cli_main

TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "data.source=synthetic:signal", "data.synthetic_days=30",
        "transfer.checkpoint=latest"]


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
    """A one-update run on the 228-feature observation."""
    path = tmp_path_factory.mktemp("transfer") / "source"
    train(load_config(None, TINY + ["total_steps=128", "env.extended_features=false",
                                    "checkpoint.eval_every_updates=0"]), path)
    return path


def test_the_261_feature_policy_starts_acting_exactly_like_the_228_feature_one(source_dir):
    cfg = load_config(None, TINY + ["total_steps=128", f"transfer.init_from={source_dir}"])
    env, market = TradingEnv(cfg.env), load_market(cfg.data)
    params = env.make_params(market, "train")
    ppo = make_train(cfg.ppo, cfg.network, env, params, num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    state = start_from(jax.jit(ppo.init)(jax.random.PRNGKey(7), params),
                       load_source(cfg.transfer, cfg.network, cfg.env_name, cfg.env.window, env, params),
                       cfg.transfer, cfg.steps_per_update)
    source = restore_policy(source_dir, "latest")
    assert ppo.obs_dim == 261 and source.obs_dim == 228

    kernel = state.params["params"]["actor"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(kernel[:228], source.params["params"]["actor"]["Dense_0"]["kernel"])
    assert not kernel[228:].any() and not state.params["params"]["critic"]["Dense_0"]["kernel"][228:].any()
    np.testing.assert_array_equal(state.obs_norm.mean[:228], source.obs_norm.mean)

    # the short observation is the long one's first 228 features, and on them both networks agree
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.PRNGKey(1), 64), params)
    short_env = TradingEnv(EnvConfig(extended_features=False))
    np.testing.assert_array_equal(jax.vmap(short_env.get_obs, in_axes=(0, None))(env_state, params), obs[:, :228])
    logits = lambda variables, norm, x: ppo.network.apply(variables, norm.normalize(x), method="logits")  # noqa: E731
    np.testing.assert_allclose(logits(state.params, state.obs_norm, obs),
                               logits(source.params, source.obs_norm, obs[:, :228]), atol=1e-5)

    # walking the validation split, every action is the same
    old = agent_walk(load_run(source_dir, "latest"))("val", jax.random.PRNGKey(0))
    new = walk_split(env, market, "val", make_act(ppo, True), jax.random.PRNGKey(0), (state.params, state.obs_norm))
    assert len(new["action"]) > 1000 and np.asarray(old["trade_pnl"] != 0).sum() > 10
    np.testing.assert_array_equal(new["action"], old["action"])
    assert new["pnl"].sum() == pytest.approx(old["pnl"].sum())


def test_a_warm_up_freezes_the_copied_layers_then_releases_them(source_dir, tmp_path):
    cfg = load_config(None, TINY + ["total_steps=256", f"transfer.init_from={source_dir}", "transfer.freeze_steps=100",
                                    "checkpoint.every_updates=1", "checkpoint.eval_every_updates=0"])
    source = restore_policy(source_dir, "latest").params["params"]
    done = train(cfg, tmp_path / "run").state
    warm = restore_policy(tmp_path / "run", "1").params["params"]  # after update 1 of 2: the warm-up
    for net in ("actor", "critic"):
        np.testing.assert_array_equal(warm[net]["Dense_0"]["kernel"][:228], source[net]["Dense_0"]["kernel"])
        assert jnp.abs(warm[net]["Dense_0"]["kernel"][228:]).sum() > 0  # the new columns learned
        for layer in ("Dense_1", "Dense_2"):
            for leaf in ("kernel", "bias"):
                np.testing.assert_array_equal(warm[net][layer][leaf], source[net][layer][leaf])

    assert isinstance(done.opt_state[0], FreezeState) and int(done.opt_state[0].count) == 2 * 2 * 2
    after = done.params["params"]  # after update 2: everything learns
    for net in ("actor", "critic"):
        assert not np.array_equal(after[net]["Dense_1"]["kernel"], source[net]["Dense_1"]["kernel"])
        assert not np.array_equal(after[net]["Dense_0"]["kernel"][:228], source[net]["Dense_0"]["kernel"])


def test_a_warm_up_that_would_last_the_whole_run_is_refused():
    # the seeds' failure: a 100K-step warm-up in an ~82K-step run
    with pytest.raises(ConfigError, match="transfer.freeze_steps: a warm-up of 100000 steps .* for the whole run"):
        load_config(None, TINY + ["total_steps=81920", "transfer.init_from=runs/x", "transfer.freeze_steps=100000"])
    with pytest.raises(ConfigError, match="whole run"):  # a warm-up must leave at least one update
        load_config(None, TINY + ["total_steps=256", "transfer.init_from=runs/x", "transfer.freeze_steps=129"])
    with pytest.raises(ConfigError, match="needs transfer.init_from"):
        load_config(None, TINY + ["transfer.freeze_steps=10"])
    assert load_config(None, TINY + ["total_steps=256", "transfer.init_from=x", "transfer.freeze_steps=128"])


def test_init_from_a_run_that_cannot_start_this_one_leaves_nothing_behind(source_dir, tmp_path, capsys):
    main = cli_main()
    flags = ["--total-steps", "128", "--no-progress"] + [x for item in TINY for x in ("--set", item)]
    assert main(["--init-from", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "a")] + flags) == 2
    assert "missing/config.yaml not found" in capsys.readouterr().err
    wider = flags + ["--set", "network.actor_hidden=[32,16]"]
    assert main(["--init-from", str(source_dir), "--run-dir", str(tmp_path / "b")] + wider) == 2
    assert "network.actor_hidden [16, 16] there, [32, 16] here" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["--resume", str(source_dir), "--init-from", str(source_dir)]) == 2
    assert "drop --init-from" in capsys.readouterr().err
