"""Walk-forward evaluation (jaxenv.folds, experiments/walkforward.py): the fold arithmetic over whole sessions, bad
input in one line with nothing written, and a killed walk-forward resumed where it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxenv.folds import FoldPlan, plan_folds

TINY = ["num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=1",
        "network.actor_hidden=[16]", "network.critic_hidden=[16]", "log.tensorboard=false",
        "data.synthetic_days=30", "env.max_steps_in_episode=400", "checkpoint.every_updates=1",
        "checkpoint.eval_every_updates=1"]


def sessions_of(span: tuple[int, int]) -> set[int]:
    return set(range(*span))


@pytest.mark.parametrize("train_sessions", [0, 40])
@pytest.mark.parametrize("purge", [0, 2])
def test_folds_purge_and_never_train_or_choose_on_a_test_session(train_sessions, purge):
    folds = plan_folds(120, FoldPlan(folds=4, test_sessions=12, val_sessions=10, purge=purge,
                                     train_sessions=train_sessions))
    assert len(folds) == 4 and folds[-1].test[1] == 120
    tests = [sessions_of(f.test) for f in folds]
    assert sum(map(len, tests)) == len(set().union(*tests))  # every session in at most one test window
    for fold in folds:
        assert fold.train[1] == fold.val[0] and fold.val[1] - fold.val[0] == 10  # validation cut from its end
        assert fold.test[0] - fold.val[1] == purge  # the purge between them
        seen = sessions_of(fold.train) | sessions_of(fold.val)
        assert not seen & set().union(*tests[fold.index:])  # never a session of its own or a later test window
        assert fold.train[0] == (0 if not train_sessions else fold.val[1] - train_sessions)
    assert [f.test[0] for f in folds] == [72, 84, 96, 108]  # back to back at the data's end


@pytest.mark.parametrize("plan, problem", [
    (FoldPlan(folds=4, test_sessions=12, val_sessions=12, purge=1), "hold 4 folds of 12 test sessions"),
    (FoldPlan(folds=1, test_sessions=12, val_sessions=12, purge=40), "after a purge of 40"),  # it eats the window
    (FoldPlan(folds=2, test_sessions=12, val_sessions=5, step=6), "test windows would overlap"),
    (FoldPlan(folds=2, test_sessions=5, val_sessions=5, train_sessions=6), "--train-sessions 6 leaves fewer"),
    (FoldPlan(folds=2, test_sessions=5, val_sessions=5, train_sessions=50), "fold 0 has only"),
])
def test_folds_that_do_not_fit_are_refused_naming_the_setting(plan, problem):
    with pytest.raises(ValueError, match=problem):
        plan_folds(60, plan)


def walkforward(out, *extra: str) -> int:
    from experiments.walkforward import main

    return main(["--config", "configs/quick.yaml", "--seeds", "0", "--folds", "2", "--test-sessions", "3",
                 "--val-sessions", "3", "--total-steps", "256", "--out", str(out), "--no-progress",
                 *(f"--set={o}" for o in TINY), *extra])


def test_bad_input_gets_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "wf"
    assert walkforward(out, "--folds", "9") == 2
    assert capsys.readouterr().err.startswith("error: 30 sessions hold 9 folds of 3 test sessions")
    bars = tmp_path / "bars.csv"
    bars.write_text("timestamp,open,high,low,close,volume\n2024-01-02 09:30:00,1,1,1,1,1\n")
    assert walkforward(out, "--data", str(bars)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bars}")
    assert walkforward(out, "--arms", "rl_only,nonsense") == 2
    assert "unknown arm nonsense" in capsys.readouterr().err
    assert not out.exists()


def walkforward_plan(out, *extra: str):
    from experiments.walkforward import parser, plan_from_args

    return plan_from_args(parser().parse_args(
        ["--config", "configs/quick.yaml", "--seeds", "0", "--folds", "2", "--test-sessions", "3",
         "--val-sessions", "3", "--total-steps", "256", "--out", str(out), *(f"--set={o}" for o in TINY), *extra]))


def test_llm_names_the_advised_arms_advisor_and_no_other_arms(tmp_path):
    from agents.config import RUN_CONFIG_FILE, save_config
    from experiments.walkforward import check_saved_runs

    out = tmp_path / "wf"
    plan = walkforward_plan(out, "--llm", "mock")  # configs/quick.yaml: llm: none
    assert plan.arms == ["rl_only", "advised"]  # added after the arms asked for
    fold = plan.folds[0]
    assert plan.run_config(fold, "advised", 0).llm == "mock" and plan.run_config(fold, "rl_only", 0).llm == "none"
    assert plan.trial("advised", 0)["config"] != plan.trial("rl_only", 0)["config"]  # the ledger tells them apart
    news = walkforward_plan(out, "--arms", "news,advised", "--llm", "smollm2")
    assert news.arms == ["rl_only", "news", "advised"] and news.run_config(fold, "news", 0).llm == "mock"
    # a saved run of the advised arm trained with another advisor is not read back
    saved = plan.run_dir(fold, "advised", 0)
    saved.mkdir(parents=True)
    save_config(plan.run_config(fold, "rl_only", 0), saved / RUN_CONFIG_FILE)
    with pytest.raises(ValueError, match="llm='none', this walk-forward asks for llm='mock'"):
        check_saved_runs(plan)
    plain, none = walkforward_plan(out), walkforward_plan(out, "--llm", "none")  # --llm none changes nothing
    assert plain.arms == none.arms == ["rl_only"] and plain.trial("rl_only", 0) == none.trial("rl_only", 0)


def test_on_a_set_an_advisor_that_cannot_advise_is_one_line(tmp_path, capsys, monkeypatch):
    from agents.runs import jobs

    monkeypatch.setattr(jobs, "run_job", lambda *a: pytest.fail("trained a run"))
    out = tmp_path / "wf"
    data = ["--data", "NQ=synthetic:pair", "--data", "ES=synthetic:pair", "--set=data.synthetic_days=20"]
    assert walkforward(out, *data, "--llm", "./no_such_model") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: llm: no model folder at ./no_such_model (a local model is a folder; a hub id is NAME or ORG/NAME)")
    assert not out.exists()


def test_the_advised_arm_without_an_advisor_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from agents.runs import jobs

    monkeypatch.setattr(jobs, "run_job", lambda *a: pytest.fail("trained a run"))
    out = tmp_path / "wf"
    assert walkforward(out, "--arms", "advised") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --arms advised: the config trains no advisor (llm: none); name one with --llm"]
    assert not out.exists()


def test_a_killed_walk_forward_resumes_where_it_was(tmp_path, monkeypatch):
    import experiments.walkforward as wf
    from agents.runs import jobs

    out = tmp_path / "wf"
    calls = []
    scored = jobs.run_job

    def killed_after_the_first(job):
        if calls:
            raise KeyboardInterrupt
        calls.append(job.run_dir)
        return scored(job)

    monkeypatch.setattr(jobs, "run_job", killed_after_the_first)
    assert walkforward(out) == 130
    first = out / "runs" / "fold0" / "rl_only-s0"
    kept = (first / wf.SCORE_FILE).read_text()
    monkeypatch.setattr(jobs, "run_job", scored)
    assert walkforward(out) == 0
    assert (first / wf.SCORE_FILE).read_text() == kept  # read back, not trained or scored again
    summary = json.loads((out / "walkforward.json").read_text())
    arms = summary["summary"]["arms"]
    assert set(arms) == {"rl_only", "flat", "buy_and_hold"} and summary["summary"]["sessions"] == 6
    assert "vs_buy_and_hold" in arms["rl_only"] and "gate" not in arms["buy_and_hold"]
    assert arms["flat"]["oos"]["mean"] == 0 and len(arms["rl_only"]["in_vs_out"]) == 2
    assert summary["trials"] == 1 and 0 <= summary["summary"]["pbo"]["pbo"] <= 1
    gate = arms["rl_only"]["gate"]["0"]
    assert gate["sessions"] == 6 and isinstance(gate["opened"], bool) and "gate" not in arms["flat"]
    assert {p.name for p in out.iterdir()} >= {"walkforward.json", "table.md", "equity.png", "in_vs_out.png",
                                               "trials.jsonl", "runs"}


def test_the_gate_on_a_stitched_path_opens_on_an_edge_and_not_on_none():
    import numpy as np
    import pandas as pd

    from agents.evidence.gate import Gate, OutOfSample
    from experiments.walkforward import gate_verdict

    days = [d.date().isoformat() for d in pd.bdate_range("2024-01-02", periods=40)]
    edge = gate_verdict(days, np.full(40, 1000.0), 2500.0)
    assert edge["opened"] and edge["live_at_end"] and edge["sessions"] == 40
    first = edge["opened_after_sessions"]  # the first prefix on which the gate itself passes
    assert not Gate.start(OutOfSample(days[:first - 1], [1000.0] * (first - 1), "t"), 2500.0).passing
    assert Gate.start(OutOfSample(days[:first], [1000.0] * first, "t"), 2500.0).passing
    # gains count up to +c, losses in full: no edge, however large; −6,000 is beyond 2c, the test's exact range
    churn = gate_verdict(days, np.tile([3000.0, -6000.0], 20), 2500.0)
    assert not churn["opened"] and churn["opened_after_sessions"] is None and churn["clipped"] == 20


@pytest.mark.slow  # (the suite's time: 2-3 min) its results are committed under docs/results/walk-forward/
def test_an_account_of_two_files_walks_forward_with_each_instruments_figures(tmp_path, capsys):
    """--data SYMBOL=PATH once per instrument: folds over the set's sessions, each run scored by the account's walk,
    each instrument's P&L on the stitched test windows summing to the account's, the gate on the account's path; with
    --llm, the advised arm trained with that advisor on each instrument, and each run's test window walked on that
    advisor's advice alone too."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    files = tmp_path / "pair"
    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "20", "--out", str(files)],
                   cwd=repo, check=True, capture_output=True)
    out = tmp_path / "wf"
    assert walkforward(out, "--data", f"NQ={files / 'NQ.csv'}", "--data", f"ES={files / 'ES.csv'}",
                       "--set=data.synthetic_days=20", "--llm", "mock") == 0
    written = json.loads((out / "walkforward.json").read_text())
    summary = written["summary"]
    assert written["arms"] == ["rl_only", "advised"] and written["advisor"] == "mock"
    advised = [r for fold in written["runs"].values() for r in fold["advised"].values()]
    assert all(r["test"]["sessions"].keys() == r["advice_alone"]["sessions"].keys() for r in advised)
    assert summary["arms"]["advised"]["oos"]["mean"] is not None and "instruments" in summary["arms"]["advised"]
    rl = summary["arms"]["rl_only"]
    runs = [r for fold in written["runs"].values() for r in fold["rl_only"].values()]
    alone = sum(sum(r["advice_alone"]["sessions"].values()) for r in runs) / len(written["seeds"])
    assert rl["advice_alone"]["mean"] == pytest.approx(alone) and rl["vs_advice_alone"] is not None
    assert all(r["advice_alone"]["sessions"].keys() == r["test"]["sessions"].keys() for r in runs)
    assert set(rl["instruments"]) == {"NQ", "ES"} and summary["sessions"] == 6
    assert sum(f["net_pnl"] for f in rl["instruments"].values()) == pytest.approx(rl["oos"]["mean"], abs=0.5)
    assert "opened" in next(iter(rl["gate"].values()))  # the gate on seed 0's stitched path
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert trials[0]["source"] == f"NQ={files / 'NQ.csv'},ES={files / 'ES.csv'}"
    assert "rl_only: each instrument of the account" in capsys.readouterr().out


def test_the_account_against_the_single_agents_is_compared_seed_by_seed_on_the_same_sessions():
    from experiments.account_vs_singles import compare

    def walked(pnl: dict[int, list[float]], days=("2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05")) -> dict:
        runs = {f"fold{k}": {"rl_only": {str(s): {"test": {"sessions": dict(zip(days[2 * k: 2 * k + 2],
                                                                                p[2 * k: 2 * k + 2]))}}
                                         for s, p in pnl.items()}} for k in (0, 1)}
        return {"runs": runs, "summary": {"arms": {"rl_only": {"gate_opened": 0.5}}}}

    account = walked({0: [1, 2, 3, 4], 1: [0, 0, 0, 10]})
    nq, es = walked({0: [1, 1, 1, 1], 1: [1, 1, 1, 1]}), walked({0: [0, 0, 0, 0], 1: [2, 2, 2, 2]})
    result = compare(account, [nq, es])
    assert result["sessions"] == 4 and result["seeds"] == [0, 1]
    assert result["account"]["mean"] == 10.0 and result["singles_summed"]["mean"] == 8.0  # (4 + 12) / 2
    assert result["account_minus_singles"]["mean"] == 2.0
    with pytest.raises(ValueError, match="sessions differ"):
        compare(account, [walked({0: [1] * 4, 1: [1] * 4}, days=("2024-02-01", "2024-02-02", "2024-02-05",
                                                                   "2024-02-06")), es])


def walkforward_figures(folder: Path) -> dict:
    """A walk-forward's figures (its summary, each run's scores, its trials), less the times its runs took: what two
    backends that trained the same runs must agree on."""
    summary = json.loads((folder / "walkforward.json").read_text())
    runs = {fold: {arm: {s: {k: v for k, v in r.items() if k not in ("train_s", "score_s")}
                         for s, r in by_seed.items()} for arm, by_seed in by_arm.items()}
            for fold, by_arm in summary["runs"].items()}
    return {"summary": summary["summary"], "runs": runs, "trials": summary["trials"]}
