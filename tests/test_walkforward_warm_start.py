"""Walk-forward warm starts and the gate column (issue 74, items 5 and 7), without training: a warm-start walk-forward
has run folders and trials of its own, so one in the folder of a fresh one neither reads the fresh runs back as its
own nor goes uncounted; the report calls the gate's path what it is, a stitched path of the folds' agents."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from agents.config import to_dict
from experiments.walkforward import Plan, count_trials, summarize, table
from jaxenv.folds import FoldPlan, plan_folds

FOLDS = plan_folds(40, FoldPlan(folds=2, test_sessions=10, val_sessions=3))


def plan(out, warm_start: bool, seeds=(0, 1)) -> Plan:
    return Plan("configs/quick.yaml", ["rl_only"], list(seeds), FOLDS, out, [], warm_start)


def run_dirs(p: Plan) -> set:
    return {p.run_dir(f, a, s) for f in p.folds for a in p.arms for s in p.seeds}


def test_a_warm_start_walk_forward_has_run_folders_of_its_own(tmp_path):
    fresh, warm = plan(tmp_path, False), plan(tmp_path, True)
    assert not run_dirs(fresh) & run_dirs(warm)  # it never reads a fresh run back as its own
    for fold in FOLDS[1:]:  # each fold starts from its own previous fold, never from a fresh run
        cfg = warm.run_config(fold, "rl_only", 0)
        assert cfg.transfer.init_from == str(warm.run_dir(FOLDS[fold.index - 1], "rl_only", 0))
        assert not fresh.run_config(fold, "rl_only", 0).transfer.init_from


def test_a_warm_start_walk_forward_is_another_trial_in_the_folders_ledger(tmp_path):
    fresh, warm = plan(tmp_path, False), plan(tmp_path, True)
    assert fresh.trial("rl_only", 0)["config"] != warm.trial("rl_only", 0)["config"]
    assert count_trials(fresh) == 2  # two seeds
    assert count_trials(warm) == 4
    assert count_trials(fresh) == count_trials(warm) == 4  # each counted once
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 4


def test_a_run_started_from_another_runs_agent_is_another_trial_in_its_folders_ledger(tmp_path):
    from agents.runs.trials import count_trials as run_trials
    from agents.runs.trials import record_trial

    fresh, warm = plan(tmp_path, False), plan(tmp_path, True)
    fold = FOLDS[1]
    fresh_dir, warm_dir = fresh.run_dir(fold, "rl_only", 0), warm.run_dir(fold, "rl_only", 0)
    fresh_dir.parent.mkdir(parents=True)
    record_trial(fresh_dir, to_dict(fresh.run_config(fold, "rl_only", 0)))
    assert run_trials(warm_dir, to_dict(warm.run_config(fold, "rl_only", 0))) == 2
    moved = plan(tmp_path / "elsewhere", True)  # where the agent it starts from lies is not a setting tried
    assert moved.trial("rl_only", 0) == warm.trial("rl_only", 0)
    assert run_trials(fresh_dir, to_dict(fresh.run_config(fold, "rl_only", 0))) == 1  # a fresh run's digest as it was


def made_up_summary(p: Plan) -> dict:
    """A walk-forward's summary from made-up scores: an edge on seed 0, none on seed 1."""
    rng = np.random.default_rng(0)
    days = [d.date().isoformat() for d in pd.bdate_range("2024-01-02", periods=40)]
    results: dict = {f.index: {"rl_only": {}} for f in p.folds}
    for fold in p.folds:
        for seed in p.seeds:
            def walk(span, seed=seed):
                pnl = rng.normal(2000.0 if seed == 0 else 0.0, 300.0, span[1] - span[0])
                return {"metrics": {"breaches": 0.0, "trades": 20.0},
                        "sessions": dict(zip(days[span[0]:span[1]], pnl.tolist()))}
            test = walk(fold.test)
            results[fold.index]["rl_only"][seed] = {
                "test": test, "train": walk(fold.train),
                "buy_and_hold": {"sessions": {d: 500.0 for d in test["sessions"]}}}  # a steadily rising market
    summary = {"command": "walkforward", "seeds": p.seeds, "warm_start": p.warm_start, "trials": 2,
               "folds": [{"index": f.index, "splits": f.spec()} for f in p.folds],
               "cost": {"wall_s": 1.0, "runs_s": 0.0, "all_runs_train_s": 60.0, "all_runs_score_s": 6.0}}
    summary["summary"] = summarize(p, results, 2)
    return summary


def test_the_report_says_the_gate_ran_on_a_stitched_path_not_what_trade_py_sent(tmp_path):
    for warm_start in (False, True):
        summary = made_up_summary(plan(tmp_path, warm_start))
        report = table(summary, "walkforward")
        assert "would have sent" not in report and "would have" not in report
        header = next(line for line in report.splitlines() if line.startswith("| arm | out-of-sample"))
        assert "gate on the stitched path" in header and "vs buy-and-hold" in header
        held = summary["summary"]["arms"]["buy_and_hold"]
        assert held["oos"]["per_session"] == 500.0 and "gate" not in held  # a benchmark, not a trial
        assert summary["summary"]["arms"]["rl_only"]["vs_buy_and_hold"]["per_session"] < 1500.0
        assert any(line.startswith("| buy_and_hold | ") for line in report.splitlines())
        assert "not what `trade.py` would send" in report  # it gates one agent on that agent's own record
        assert ("a fresh agent per fold" in report) != warm_start
        assert ("each fold's agent started from the previous fold's" in report) == warm_start
        gate = summary["summary"]["arms"]["rl_only"]["gate"]
        assert gate[0]["opened"] and not gate[1]["opened"]
        json.dumps(summary, default=float)  # what walkforward.json holds
