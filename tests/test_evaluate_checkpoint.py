"""scripts/evaluate.py on a tiny trained run: it reproduces the training-time evaluation, writes its reports, and
refuses a checkpoint that does not fit, saying what differs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
import yaml

from agents.config import load_config
from agents.evaluation.saved_run import EvalOptions, agent_walk, evaluate, load_run
from agents.runs.saved_runs import restore_policy
from agents.training.loop import train
from jaxenv.metrics import walk_metrics

TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "data.source=synthetic:signal", "data.synthetic_days=30",
        "env.max_steps_in_episode=400", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=1"]


def evaluate_main():
    from agents.evaluation.cli import main

    return main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """Two updates, each evaluated on the validation split (so both are in metrics.jsonl) and checkpointed."""
    path = tmp_path_factory.mktemp("eval") / "run"
    train(load_config(None, TINY + ["total_steps=256"]), path)
    return path


def test_evaluating_a_checkpoint_reproduces_the_training_time_evaluation(run_dir):
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    run = load_run(run_dir, "latest")
    for line in logged:  # every evaluated update: the same compiled walk, that checkpoint's policy
        checkpoint = dataclasses.replace(run, saved=restore_policy(run_dir, str(line["update"])))
        trace = agent_walk(checkpoint)("val", jax.random.PRNGKey(0))
        agent = walk_metrics(trace, run.market.timestamps, run.cfg.env.prop_firm)
        assert agent["net_pnl"] == pytest.approx(line["val_net_pnl"], abs=1e-3)
        for name in ("trades", "win_rate", "breaches", "max_drawdown"):
            assert agent[name] == pytest.approx(line[f"eval_{name}"], abs=1e-3), name
    best = restore_policy(run_dir, "best")
    assert best.step == max(logged, key=lambda m: m["val_net_pnl"])["update"]


def test_cli_writes_the_json_table_trades_and_plots(run_dir, tmp_path, capsys):
    out, json_path = tmp_path / "report", tmp_path / "numbers.json"
    args = ["--run-dir", str(run_dir), "--checkpoint", "latest", "--split", "val", "--seeds", "2", "--out", str(out),
            "--json", str(json_path), "--no-progress"]
    assert evaluate_main()(args) == 0
    printed = capsys.readouterr().out
    assert "Sharpe (daily)" in printed and "buy_and_hold" in printed

    numbers = json.loads(json_path.read_text())
    assert numbers["ablations"] == {}  # an RL-only run has none
    assert set(numbers["baselines"]) == {"flat", "random_valid", "buy_and_hold"}
    for who in (numbers["agent"], *numbers["baselines"].values()):
        assert {"net_pnl", "sharpe_daily", "max_drawdown", "win_rate", "trades", "prop_passed"} <= set(who)
    assert numbers["baselines"]["flat"]["net_pnl"] == 0.0 and numbers["baselines"]["flat"]["trades"] == 0.0
    assert numbers["baselines"]["buy_and_hold"]["trades"] == 1.0
    assert numbers["setup"]["checkpoints"] == ["latest-2"]
    assert numbers["setup"]["instrument"]["symbol"] == "NQ" and numbers["setup"]["instrument"]["point_value"] == 20.0
    assert "NQ (E-mini Nasdaq-100, future)" in printed  # the instrument under the table's title
    # a greedy walk of the same bars is the same for every seed: walked once; random actions once per seed
    assert numbers["agent"]["n"] == numbers["baselines"]["flat"]["n"] == 1 and "ci95" not in numbers["agent"]
    assert numbers["baselines"]["random_valid"]["n"] == 2 and "net_pnl" in numbers["baselines"]["random_valid"]["ci95"]

    trades = pd.read_csv(out / "trades.csv")
    assert len(trades) == numbers["agent"]["trades"]
    assert list(trades.columns[:9]) == ["entry_time", "exit_time", "side", "contracts", "entry_price", "exit_price",
                                        "pnl", "exit_reason", "bars_held"]
    assert trades["advice_action"].isna().all()  # no advisor: empty
    assert trades["pnl"].sum() == pytest.approx(numbers["agent"]["net_pnl"], abs=1.0)  # walks end flat here
    assert "| net P&L |" in (out / "table.md").read_text()
    assert "| advice coverage |" not in (out / "table.md").read_text()  # no advisor: no rows of zeros
    for png in ("equity.png", "underwater.png", "training.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_seeds_and_episodes_give_a_mean_and_a_95_percent_interval(run_dir):
    run = load_run(run_dir, "latest")
    result = evaluate([run], EvalOptions(split="val", episodes=2, seeds=2, progress=False))  # different bars per seed
    summary = result.summary()
    assert summary["agent"]["n"] == 4 and len(result.bars) == 2
    assert all(end - start == 401 for start, end in result.bars)  # env.max_steps_in_episode = 400 steps
    low, high = summary["agent"]["ci95"]["net_pnl"]
    assert low <= summary["agent"]["net_pnl"] <= high
    assert summary["baselines"]["flat"]["ci95"]["net_pnl"] == [0.0, 0.0]


def test_a_checkpoint_that_does_not_fit_says_what_differs(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["env"]["extended_features"] = False  # the 228-feature observation
    config["network"]["critic_hidden"] = [32, 16]
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate_main()(["--run-dir", str(copy), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "observation size 261 in the checkpoint, 228" in err
    assert "params/critic/Dense_0/kernel: shape (261, 16) in the checkpoint, (228, 32) now" in err

    assert evaluate_main()(["--run-dir", str(run_dir), "--checkpoint", "99", "--no-progress"]) == 2
    assert "no finished checkpoint '99' (checkpoints: best: " in capsys.readouterr().err



@pytest.fixture(scope="module")
def hybrid_run_dir(tmp_path_factory) -> Path:
    """A tiny hybrid run with the mock advisor reading headlines, evaluated (with advice) after each update."""
    path = tmp_path_factory.mktemp("eval") / "hybrid"
    cfg = [c for c in TINY if not c.startswith(("llm=", "data.source="))]
    train(load_config(None, cfg + ["llm=mock", "hybrid.link.budget=128", "data.source=synthetic:headlines",
                                   "total_steps=256"]), path)
    return path


def test_a_hybrid_run_is_evaluated_with_its_advisor_and_its_ablations(hybrid_run_dir, tmp_path):
    """The agent walks with advice exactly as training's evaluation did; the four ablations and the advice
    figures are reported, and trades.csv carries the advice in force at each entry."""
    logged = [json.loads(line) for line in (hybrid_run_dir / "metrics.jsonl").read_text().splitlines()]
    out, json_path = tmp_path / "report", tmp_path / "numbers.json"
    args = ["--run-dir", str(hybrid_run_dir), "--checkpoint", "latest", "--split", "val", "--out", str(out),
            "--json", str(json_path), "--no-progress"]
    assert evaluate_main()(args) == 0
    numbers = json.loads(json_path.read_text())
    agent, ablations = numbers["agent"], numbers["ablations"]
    assert agent["net_pnl"] == pytest.approx(logged[-1]["val_net_pnl"], abs=1e-3)
    assert agent["trades"] == pytest.approx(logged[-1]["eval_trades"], abs=1e-3)
    assert agent["advice_coverage"] == pytest.approx(logged[-1]["eval_advice_coverage"], abs=1e-6)

    assert set(ablations) == {"rl_only", "llm_only", "fused_no_veto", "fused_veto"}
    assert ablations["rl_only"]["advice_coverage"] == 0.0 and ablations["rl_only"]["override_rate"] == 0.0
    assert ablations["llm_only"]["advice_coverage"] > 0.3 and ablations["llm_only"]["trades"] > 0
    assert ablations["fused_no_veto"]["vetoes_consecutive_losses"] == 0.0
    for who in (agent, *ablations.values()):
        assert {"agreement", "mean_trust", "veto_rate", "vetoes_win_rate"} <= set(who)
    assert "advice_coverage" not in numbers["baselines"]["flat"]
    assert "| advice coverage |" in (out / "table.md").read_text()

    trades = pd.read_csv(out / "trades.csv", keep_default_na=False)
    advised = trades[trades["advice_action"] != ""]
    assert len(trades) == agent["trades"] and len(advised) > 0
    assert set(advised["advice_action"]) <= {"HOLD", "BUY", "SELL", "MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL"}
    assert (advised["advice_reason"].str.len() > 0).all()  # the mock's reason text, kept with the trade


def test_the_advised_walk_without_advice_is_the_plain_walk(hybrid_run_dir):
    """The RL-only ablation walks the same bars, account and breach restarts as `jaxenv.walk_split`: every
    column they share is equal, so ablations and baselines are compared like for like."""
    from agents.evaluation.advised_walk import ABLATIONS
    from jaxenv import walk_split

    run = load_run(hybrid_run_dir, "latest")
    key = jax.random.PRNGKey(4)
    advised = run.walker.walk(run.saved.params, run.saved.obs_norm, "val", key, greedy=True, **ABLATIONS["rl_only"])
    plain = walk_split(run.env, run.market, "val", run.act, key, (run.saved.params, run.saved.obs_norm))
    shared = set(plain) & set(advised)
    assert {"t", "action", "pnl", "equity", "breach", "trade_pnl"} <= shared
    for column in shared:
        np.testing.assert_array_equal(np.asarray(advised[column]), np.asarray(plain[column]), err_msg=column)
    assert not advised["advice_valid"].any()
    run.close()


def test_a_checkpoint_keeps_the_advice_record_and_its_walks_start_from_it(tmp_path):
    """hybrid.query.bind_on=record: the advice's track record is part of the trained agent. The checkpoint holds the
    one training ended with, and a walk from it reproduces the training-time evaluation, which walked from it too."""
    path = tmp_path / "record"
    cfg = [c for c in TINY if not c.startswith(("llm=", "data.source="))]
    result = train(load_config(None, cfg + ["llm=mock", "hybrid.link.budget=128", "data.source=synthetic:headlines",
                                            "total_steps=1024", "hybrid.query.advised_entries_only=true",
                                            "hybrid.query.bind_on=record"]), path)
    trained = result.state.hybrid.record
    saved = restore_policy(path, "latest")
    assert float(trained.calls) > 0 and float(trained.evidence.sessions) > 0  # the sessions answered in training
    assert float(saved.advice_record["calls"]) == float(trained.calls)
    for field in ("sessions", "clipped", "pnl"):
        assert float(saved.advice_record["evidence"][field]) == pytest.approx(float(getattr(trained.evidence, field)))
    np.testing.assert_allclose(saved.advice_record["evidence"]["log_wealth"], trained.evidence.log_wealth, rtol=1e-6)
    assert bool(saved.advice_record["bound"]) == bool(trained.bound)
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    run = load_run(path, "latest")
    trace = agent_walk(run)("val", jax.random.PRNGKey(int(result.update)))
    assert walk_metrics(trace, run.market.timestamps, run.cfg.env.prop_firm)["net_pnl"] == pytest.approx(
        logged[-1]["val_net_pnl"], abs=1e-3)
    run.close()
