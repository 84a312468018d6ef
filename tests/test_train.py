"""The training loop and CLI: run-folder contents, metrics, warnings, the trading env end to end, and learning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agents.config import LogConfig, load_config
from agents.training.comparison import final_comparison
from agents.training.loop import train
from agents.training.metrics import HealthMonitor, MetricsLogger
from tests.test_config import cli_main

TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false"]
REQUIRED = {"update", "env_steps", "steps_per_s", "episode_return", "episode_length", "approx_kl", "clip_frac",
            "explained_variance", "entropy", "policy_loss", "value_loss", "achieved_gflops"}


def test_cli_run_folder_on_any_gymnax_env(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), "--total-steps", "640", "--seed", "3", "--set", "env_name=CartPole-v1",
            "--set", "checkpoint.every_updates=2", "--set", "checkpoint.keep=2",
            "--set", "checkpoint.eval_every_updates=2", "--set", "checkpoint.eval_episodes=4"]
    for item in TINY:
        args += ["--set", item]
    assert cli_main()(args) == 0
    assert "val mean return of fresh episodes: agent_latest" in capsys.readouterr().out

    cfg = load_config(run_dir / "config.yaml")  # the resolved config, flags included
    assert cfg.seed == 3 and cfg.total_steps == 640 and cfg.env_name == "CartPole-v1" and cfg.num_envs == 8
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2, 3, 4, 5]
    assert [m["env_steps"] for m in lines] == [128 * u for u in range(1, 6)]
    assert REQUIRED <= set(lines[-1])
    assert "compile_s" in lines[0] and "eval_return" in lines[1]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    latest = sorted(int(p.name) for p in (run_dir / "checkpoints" / "latest").iterdir() if p.name.isdigit())
    assert latest == [4, 5]  # every 2 updates plus the end, keeping 2
    assert len([p for p in (run_dir / "checkpoints" / "best").iterdir() if p.name.isdigit()]) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"agent_best", "agent_latest", "action_0", "random"} == set(summary["val"])


def test_trading_env_end_to_end(tmp_path):
    """One tiny update on jaxenv.TradingEnv with the validation-split evaluation (the final summary on it is
    exercised by the slow learning test)."""
    cfg = load_config(None, TINY + ["total_steps=128", "data.source=synthetic:signal", "data.synthetic_days=30",
                                    "checkpoint.eval_every_updates=1", "log.tensorboard=false"])
    result = train(cfg, tmp_path)
    m = result.last_metrics
    assert m["update"] == 1 and "val_net_pnl" in m and "eval_trades" in m
    assert 0.0 <= m["entropy"] <= math.log(6)
    assert {"episode_pnl", "episode_trades", "win_rate", "episode_breached"} <= set(m)


# ------------------------------------------------------------------------------------------------- warnings
def monitor(**overrides) -> HealthMonitor:
    cfg = LogConfig(**{"warmup_updates": 0, "frozen_updates": 3, **overrides})
    return HealthMonitor(cfg, num_actions=6, episode_limit=1000)


def healthy(update: int, **changes) -> dict:
    return {"update": update, "approx_kl": 0.01, "entropy": 1.2, "episodes": 10, "episode_length": 900.0, **changes}


def test_warns_on_frozen_policy_once_per_episode_of_trouble():
    h = monitor()
    fired = [h.check(healthy(u, approx_kl=0.0)) for u in range(1, 6)]
    assert [len(f) for f in fired] == [0, 0, 1, 0, 0] and "frozen_policy" in fired[2][0]
    assert h.check(healthy(6)) == []  # recovered
    assert [len(h.check(healthy(u, approx_kl=1e-9))) for u in range(7, 10)] == [0, 0, 1]  # and again


def test_warns_on_collapsed_entropy_and_short_episodes():
    h = monitor()
    assert "entropy_collapse" in h.check(healthy(1, entropy=0.01))[0]
    assert "short_episodes" in h.check(healthy(2, episode_length=40.0))[0]
    assert h.check(healthy(3, episode_length=40.0, episodes=0)) == []  # no episode ended: nothing to judge
    assert monitor(warmup_updates=5).check(healthy(2, entropy=0.0)) == []  # not during warm-up


def test_metrics_logger_writes_json_with_nulls_and_trims_on_resume(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for u in (1, 2, 3):
        log.log({"update": u, "env_steps": u * 10, "episode_return": float("nan") if u == 2 else 1.5})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["episode_return"] is None and lines[0]["episode_return"] == 1.5
    MetricsLogger(tmp_path, tensorboard=False, resume_update=2).close()
    assert [json.loads(x)["update"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# ------------------------------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_learns_out_of_sample_on_synthetic_signal(tmp_path):
    """A smaller version of docs/training.md's learning check (configs/signal.yaml): after training, the validation
    split's P&L after costs clearly beats never trading and trading at random."""
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "signal.yaml",
                      ["total_steps=1500000", "log.progress=false", "log.tensorboard=false"])
    result = train(cfg, tmp_path)
    summary = final_comparison(cfg, tmp_path, result.setup)
    val = summary["val"]
    agent, flat, rand = val["agent_latest"]["net_pnl"], val["flat"]["net_pnl"], val["random_valid"]["net_pnl"]
    assert flat == 0.0 and val["flat"]["trades"] == 0.0
    assert agent > flat + 10_000 and agent > rand + 10_000, val
    # the test split (never used for selection) too, and not just by riding its drift in one direction
    test = summary["test"]
    baselines = ("random_valid", "always_long", "always_short")
    assert test["agent_latest"]["net_pnl"] > max(test[k]["net_pnl"] for k in baselines), test
