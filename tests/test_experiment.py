"""scripts/experiment.py: arms × seeds, bootstrap intervals, paired differences, resuming, bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.config import load_config
from experiments import fusion

ROOT = Path(__file__).resolve().parents[1]


def _check_schema(summary: dict, arms: list[str]) -> None:
    for arm in arms:
        for kind in fusion.CHECKPOINTS:
            figures = summary["arms"][arm][kind]
            for name in ("test_pnl", "llm_only_test_pnl", "paired_test_pnl_vs_rl_only"):
                f = figures[name]
                assert set(f) >= {"mean", "ci95"}
                if f["mean"] is not None:
                    lo, hi = f["ci95"]
                    assert lo <= f["mean"] <= hi
    for kind in fusion.CHECKPOINTS:  # the baseline against itself
        assert summary["arms"]["rl_only"][kind]["paired_test_pnl_vs_rl_only"] == {
            "mean": 0.0, "ci95": [0.0, 0.0], "n": len(summary["seeds"]), "ci95_days": [0.0, 0.0]}


def test_seeds_and_arms_parse():
    assert fusion.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert fusion.parse_seeds("3,1,1-2") == [1, 2, 3]
    assert fusion.parse_arms("news,random") == ["rl_only", "news", "random"]  # the baseline is always there
    for bad in ("a-b", "4-", ""):
        with pytest.raises(ValueError, match="--seeds"):
            fusion.parse_seeds(bad)
    with pytest.raises(ValueError, match="--arms: unknown arm nope"):
        fusion.parse_arms("news,nope")


def test_smollm2_arms_and_the_baseline_load_on_the_lora_config():
    plan = fusion.Plan(config=str(ROOT / "configs/headlines_lora.yaml"), arms=[], seeds=[0], json_path=Path("x"),
                       runs_dir=Path("x"), overrides=[], updates=None)
    baseline, frozen, learned, shuffled, online, placebo = (fusion.run_config(plan, arm, 0) for arm in (
        "rl_only", "frozen_smollm2", "learned_smollm2", "shuffled_smollm2", "online_smollm2", "online_placebo"))
    assert (baseline.llm, baseline.hybrid.learning.enabled) == ("none", False)  # the config's learning needs an advisor
    assert (frozen.llm, frozen.hybrid.learning.enabled, frozen.hybrid.sidecar.adapter) == ("smollm2", False, "")
    # the learned advisor is the shipped adapter, fixed; the shuffled control is that advisor asked about other bars
    assert (learned.hybrid.learning.enabled, learned.hybrid.sidecar.adapter) == (False, fusion.LEARNED_ADAPTER)
    assert Path(fusion.LEARNED_ADAPTER, "adapter_config.json").exists()
    assert dataclasses.replace(shuffled.hybrid, shuffled=False) == learned.hybrid and shuffled.hybrid.shuffled
    assert (online.llm, online.hybrid.learning.enabled) == ("smollm2", True)
    # apart from the adapter and learning, the SmolLM2 arms train the same run
    assert dataclasses.replace(learned.hybrid, sidecar=dataclasses.replace(learned.hybrid.sidecar, adapter="")) == frozen.hybrid
    assert dataclasses.replace(online.hybrid, learning=frozen.hybrid.learning) == frozen.hybrid
    # the placebo is the online arm learning from permuted moves
    assert placebo.hybrid.learning == dataclasses.replace(online.hybrid.learning, placebo=True)
    # on the mock config, where nothing learns, the baseline is the plain `--llm none` run of earlier experiments
    plan = dataclasses.replace(plan, config=str(ROOT / "configs/headlines.yaml"))
    assert fusion.run_config(plan, "rl_only", 3) == load_config(plan.config, ["llm=none", "seed=3"])


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_seeds():
    rng = np.random.default_rng(0)
    few, many = fusion.bootstrap(list(rng.normal(10, 5, 3))), fusion.bootstrap(list(rng.normal(10, 5, 200)))
    for f in (few, many):
        assert f["ci95"][0] <= f["mean"] <= f["ci95"][1]
    assert many["ci95"][1] - many["ci95"][0] < few["ci95"][1] - few["ci95"][0]
    assert 8 < many["ci95"][0] < 10 < many["ci95"][1] < 12
    assert fusion.bootstrap([None, None]) == {"mean": None, "ci95": None, "n": 0}


DAYS = ["2024-03-04", "2024-03-05", "2024-03-06", "2024-03-07"]


def _pnl_walk(pnl: float, **others) -> dict:
    """A walk's figures with its P&L earned on the first of DAYS (the others flat)."""
    return {"net_pnl": pnl, "daily_pnl": {day: pnl if i == 0 else 0.0 for i, day in enumerate(DAYS)}, **others}


def _fake_scores(pnl: float, advised: bool) -> dict:
    walk = _pnl_walk(pnl, sharpe_daily=1.0, max_drawdown=500.0, breaches=0, trades=10)
    if advised:
        walk.update(mean_trust=0.5, advice_coverage=0.1, wait_rate=0.01)
        walks = {"val_agent": walk, "agent": walk, "fused_no_veto": walk, "llm_only": {**walk, **_pnl_walk(pnl / 2)},
                 "val_llm_only": {**walk, **_pnl_walk(pnl / 4)},
                 "fused_veto": {**walk, "net_pnl": pnl - 100, "breaches": 0, "max_drawdown": 400.0}}
    else:
        walks = {"val_agent": walk, "agent": walk}
    return {"version": fusion.EVAL_VERSION, **{kind: {"update": 3, "walks": walks} for kind in fusion.CHECKPOINTS}}


def _no_run(monkeypatch, why: str = "a finished run was trained again") -> None:
    """Every job's run (agents.runs.jobs.run_job) fails the test: the experiment must read its runs back."""
    from agents.runs import jobs

    monkeypatch.setattr(jobs, "run_job", lambda *a: pytest.fail(why))


def _no_training(monkeypatch) -> None:
    """Training fails the test; a job may score its run (fusion.score_run, patched by the test) but not train it."""
    from agents.training import loop

    monkeypatch.setattr(loop, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))


def _trained(plan, arm: str, seed: int) -> None:
    """The run's folder as a finished training leaves it (its config, checkpoints, its last update logged), untrained:
    a job scores it and does not train it."""
    from agents.config import save_config

    folder = plan.run_dir(arm, seed)
    cfg = fusion.run_config(plan, arm, seed)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    save_config(cfg, folder / "config.yaml")
    (folder / "metrics.jsonl").write_text(json.dumps({"update": cfg.num_updates}) + "\n")


def _without_timing(scores: dict) -> dict:
    """Scores as the scorer made them, less the time the job took (agents.runs.jobs adds train_s and score_s)."""
    return {k: v for k, v in scores.items() if k not in ("train_s", "score_s")}


def test_saved_runs_are_read_back_not_retrained(tmp_path, monkeypatch):
    """A second invocation reads every finished run's saved scores: nothing trains; the paired differences are
    taken seed by seed."""
    seeds, arms = [0, 1, 2], ["rl_only", "news", "random"]
    edge = {"rl_only": 0.0, "news": 300.0, "random": 100.0 * np.array([1.0, -1.0, 3.0])}
    runs = tmp_path / "runs"
    for seed in seeds:
        for arm in arms:
            folder = runs / f"{arm}-s{seed}"
            folder.mkdir(parents=True)
            pnl = 1000.0 * (seed + 1) + float(np.broadcast_to(edge[arm], 3)[seed])
            (folder / fusion.EVAL_FILE).write_text(json.dumps(_fake_scores(pnl, arm != "rl_only")))
    _no_run(monkeypatch)
    plan = fusion.Plan("configs/headlines.yaml", arms, seeds, tmp_path / "experiment.json", runs, [], None)
    summary = fusion.run(plan, "python scripts/experiment.py ...", progress=False)
    _check_schema(summary, arms)
    news = summary["arms"]["news"]["latest"]
    assert news["paired_test_pnl_vs_rl_only"] == {"mean": 300.0, "ci95": [300.0, 300.0], "n": 3,
                                                  "ci95_days": [0.0, 600.0]}  # earned on one day of four, drawn 0-2 times
    # the advice alone, on validation too, and the two splits together
    assert news["paired_val_pnl_vs_llm_only"]["mean"] == pytest.approx(0.75 * news["val_pnl"]["mean"])
    assert news["paired_val_test_pnl_vs_llm_only"]["mean"] == pytest.approx(
        news["paired_val_pnl_vs_llm_only"]["mean"] + news["paired_test_pnl_vs_llm_only"]["mean"])
    # arm against arm, seed by seed (news − random: 200, 400, 0), both ways, never against itself or the baseline
    assert news["paired_test_pnl_vs"]["random"]["mean"] == pytest.approx(200.0)
    assert news["paired_test_pnl_vs"]["random"]["ci95"][0] >= 0.0
    assert summary["arms"]["random"]["latest"]["paired_test_pnl_vs"]["news"]["mean"] == pytest.approx(-200.0)
    assert set(news["paired_test_pnl_vs"]) == {"random"}
    assert news["test_pnl"]["mean"] == pytest.approx(2300.0)
    assert news["llm_only_test_pnl"]["mean"] == pytest.approx(1150.0)
    assert news["veto_pnl_cost"] == pytest.approx(100 / 2300)
    assert summary["arms"]["rl_only"]["latest"]["llm_only_test_pnl"]["mean"] is None
    assert json.loads((tmp_path / "experiment.json").read_text())["arms"]["news"]["best"]["test_pnl"]["n"] == 3
    text = (tmp_path / "table.md").read_text()
    assert "| news | latest | 2,300 [" in text and "python scripts/experiment.py" in text
    assert "| news |  | 200 [" in text  # the arm-against-arm table: news − random
    assert "| news | latest | 300 [0, 600] |" in text  # the table over seeds and market days
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_runs_trained_with_other_settings_are_refused_not_read_back(tmp_path, monkeypatch, capsys):
    """A runs folder reused with another market (or any other setting) would mix results silently: the experiment
    exits 2 with one line naming the run and the key, before it trains or writes anything. The policy alone has no
    advisor, so its hybrid settings do not count."""
    from agents.config import save_config

    runs = tmp_path / "runs"
    plan = fusion.Plan("configs/headlines.yaml", ["rl_only", "news"], [0], tmp_path / "out" / "experiment.json",
                       runs, [], None)
    for arm in plan.arms:
        (runs / f"{arm}-s0").mkdir(parents=True)
        (runs / f"{arm}-s0" / fusion.EVAL_FILE).write_text(json.dumps(_fake_scores(100.0, arm == "news")))
    other = fusion.run_config(dataclasses.replace(plan, overrides=["data.source=synthetic:headlines_then_trend"]), "news", 0)
    save_config(other, runs / "news-s0" / "config.yaml")
    save_config(fusion.run_config(dataclasses.replace(plan, overrides=["hybrid.fusion=rules"]), "rl_only", 0),
                runs / "rl_only-s0" / "config.yaml")
    _no_run(monkeypatch, "trained")
    argv = ["--arms", "news", "--seeds", "0", "--json", str(plan.json_path), "--runs", str(runs), "--no-progress"]
    assert fusion.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "news-s0" in err and "data.source" in err and "headlines_then_trend" in err
    assert not plan.json_path.parent.exists()
    save_config(fusion.run_config(plan, "news", 0), runs / "news-s0" / "config.yaml")  # the settings asked for
    assert fusion.main(argv) == 0


def test_ctrl_c_stops_the_experiment_cleanly(tmp_path, monkeypatch, capsys):
    """Ctrl-C stops with one line and exit 130: the run in training keeps its checkpoints, and the same command
    resumes."""
    runs = tmp_path / "runs"
    plan = fusion.Plan("configs/headlines.yaml", ["rl_only", "news"], [0], tmp_path / "experiment.json", runs, [], None)
    (runs / "rl_only-s0").mkdir(parents=True)
    (runs / "rl_only-s0" / fusion.EVAL_FILE).write_text(json.dumps(_fake_scores(100.0, False)))

    from types import SimpleNamespace

    from agents.training import loop

    monkeypatch.setattr(loop, "train", lambda *a, **k: SimpleNamespace(interrupted=True))  # as Ctrl-C leaves it
    argv = ["--arms", "news", "--seeds", "0", "--json", str(plan.json_path), "--runs", str(runs), "--no-progress"]
    assert fusion.main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "news-s0" in err and "resume" in err


def test_the_experiment_runs_its_runs_as_jobs_seed_major(tmp_path, monkeypatch):
    """Each arm × seed is a job: its folder's job.yaml holds the run's config, scored by experiments.fusion with the
    experiment's --fresh-days; the jobs run seed-major (a stopped experiment leaves whole seeds) and the report is
    read back from the folders; a second invocation runs nothing."""
    from agents.config import to_dict
    from agents.runs import jobs

    ran = []

    def run_job(job):  # the job's run, cheap: its scores written where the scorer would
        ran.append(job.label)
        scores = {**_fake_scores(100.0, job.label.startswith("news")), "fresh_days": job.options["fresh_days"]}
        (job.run_dir / fusion.EVAL_FILE).write_text(json.dumps(scores))
        return scores, True

    monkeypatch.setattr(jobs, "run_job", run_job)
    out = tmp_path / "experiment.json"
    argv = ["--arms", "news", "--seeds", "0-1", "--fresh-days", "5", "--json", str(out), "--no-progress"]
    assert fusion.main(argv) == 0
    assert ran == ["rl_only-s0", "news-s0", "rl_only-s1", "news-s1"]
    plan = fusion.plan_from_args(fusion.parser().parse_args(argv))
    assert [j.run_dir for j in fusion.plan_jobs(plan)] == [tmp_path / "runs" / name for name in ran]
    for name in ran:
        job = jobs.read_job(tmp_path / "runs" / name)
        assert (job.scorer, job.options, job.label, job.needs) == ("experiments.fusion", {"fresh_days": 5}, name, ())
        arm, seed = name.rsplit("-s", 1)
        assert to_dict(job.config) == to_dict(fusion.run_config(plan, arm, int(seed)))
    summary = json.loads(out.read_text())
    assert summary["seeds"] == [0, 1] and summary["arms"]["news"]["latest"]["test_pnl"]["n"] == 2
    assert fusion.main(argv) == 0 and len(ran) == 4  # read back, not run again


def test_a_failed_run_is_named_in_one_line_and_no_report_is_written(tmp_path, monkeypatch, capsys):
    """A run that fails is named (with why) in one line, the others go on, and the experiment exits 1 without writing
    its JSON, table or plot; the same command runs the failed run again."""
    from agents.training import loop

    runs = tmp_path / "runs"
    (runs / "rl_only-s0").mkdir(parents=True)
    (runs / "rl_only-s0" / fusion.EVAL_FILE).write_text(json.dumps(_fake_scores(100.0, False)))

    def broken(*a, **k):
        raise RuntimeError("the advisor is gone")

    monkeypatch.setattr(loop, "train", broken)
    out = tmp_path / "out" / "experiment.json"
    argv = ["--arms", "news,random", "--seeds", "0", "--json", str(out), "--runs", str(runs), "--no-progress"]
    assert fusion.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("error:")] == [
        f"error: {runs / name}: failed (RuntimeError: the advisor is gone); its traceback is above"
        for name in ("news-s0", "random-s0")]
    assert err[-1].startswith("no table written: 2 run(s) failed")
    assert not out.parent.exists()


def test_a_run_scored_by_an_older_version_is_scored_again_not_trained(tmp_path, monkeypatch):
    """Runs scored before daily P&L was kept are scored again from their checkpoints, and the new scores saved."""
    runs = tmp_path / "runs"
    plan = fusion.Plan("configs/headlines.yaml", ["rl_only", "news"], [0], tmp_path / "experiment.json", runs, [], None)
    for arm in ("rl_only", "news"):
        _trained(plan, arm, 0)
        old = _fake_scores(100.0, arm == "news")
        del old["version"]
        (runs / f"{arm}-s0" / fusion.EVAL_FILE).write_text(json.dumps(old))
    scored = []
    _no_training(monkeypatch)
    monkeypatch.setattr(fusion, "score_run",
                        lambda run_dir, fresh_days: scored.append(run_dir.name) or _fake_scores(7.0, True))
    fusion.run(plan, "python scripts/experiment.py ...", progress=False)
    assert scored == ["rl_only-s0", "news-s0"]
    saved = json.loads((runs / "news-s0" / fusion.EVAL_FILE).read_text())
    assert _without_timing(saved) == _fake_scores(7.0, True) and saved["score_s"] >= 0
    fusion.run(plan, "python scripts/experiment.py ...", progress=False)
    assert len(scored) == 2  # the new scores are read back
    # asked for a fresh market path the saved scores lack: scored again, with it
    monkeypatch.setattr(fusion, "score_run", lambda run_dir, fresh_days: scored.append(fresh_days) or {
        **_fake_scores(7.0, True), "fresh_days": fresh_days})
    fusion.run(dataclasses.replace(plan, fresh_days=40), "python scripts/experiment.py ...", progress=False)
    assert scored[2:] == [40, 40]
    # an experiment without a fresh path reads them back (without the fresh walks); one with another N scores again
    fusion.run(plan, "python scripts/experiment.py ...", progress=False)
    fusion.run(dataclasses.replace(plan, fresh_days=60), "python scripts/experiment.py ...", progress=False)
    assert scored[4:] == [60, 60]


def test_version_2_scores_stand_for_a_run_without_an_advisor_only(tmp_path, monkeypatch):
    """Version 3 changed only the veto's walks (a new rule; the fresh path): saved version-2 scores of a run without
    an advisor stand, an advised run is walked again."""
    runs = tmp_path / "runs"
    plan = fusion.Plan("configs/headlines.yaml", ["rl_only", "news"], [0], tmp_path / "experiment.json", runs, [], None)
    for arm in ("rl_only", "news"):
        _trained(plan, arm, 0)
        (runs / f"{arm}-s0" / fusion.EVAL_FILE).write_text(json.dumps(
            {**_fake_scores(100.0, arm == "news"), "version": 2, "fresh_days": 40}))
    scored = []
    _no_training(monkeypatch)
    monkeypatch.setattr(fusion, "score_run", lambda run_dir, fresh_days: scored.append(run_dir.name) or {
        **_fake_scores(7.0, True), "fresh_days": fresh_days})
    fusion.run(dataclasses.replace(plan, fresh_days=40), "python scripts/experiment.py ...", progress=False)
    assert scored == ["news-s0"]
    fusion.run(plan, "python scripts/experiment.py ...", progress=False)
    assert scored == ["news-s0"]  # read back


def test_a_fresh_path_is_the_same_preset_on_bars_no_run_trained_on(tmp_path):
    from jaxenv.market import load_market

    cfg = load_config("configs/headlines.yaml")
    fresh = fusion.fresh_market(cfg.data, 25)
    assert (fresh.source, fresh.synthetic_days) == (cfg.data.source, 25)
    trained, unseen = load_market(cfg.data), load_market(fresh)
    assert not np.array_equal(unseen.close[:1000], trained.close[:1000])  # another path, not the training bars
    assert 20 <= len(np.unique(unseen.sessions.day)) <= 25
    # a file market has no fresh path: one line naming the flag
    csv = tmp_path / "bars.csv"
    csv.write_text("timestamp,open,high,low,close,volume\n")
    assert fusion.main(["--json", str(tmp_path / "experiment.json"), "--fresh-days", "30", "--set",
                        f"data.source={csv}"]) == 2


def test_a_market_written_as_files_gets_its_fresh_path_written_beside_it(tmp_path):
    """scripts/write_market.py's files: the fresh path is the same preset on another seed, read as files too."""
    from jaxenv.config import DataConfig
    from jaxenv.market import load_market
    from jaxenv.market_files import write_market

    bars, news = write_market(tmp_path / "m", "headlines", "NQ", 4, 0)
    data = DataConfig(source=str(bars), news=str(news), news_items=1, news_max_age="4D")
    fresh = fusion.fresh_market(data, 3)
    assert Path(fresh.source).parent == tmp_path / "m" / f"fresh-3d-s{fusion.FRESH_SEED_OFFSET}"
    assert Path(fresh.news).exists() and (fresh.news_items, fresh.news_max_age) == (1, "4D")
    unseen = load_market(fresh)
    expected = load_market(DataConfig(source="synthetic:headlines", synthetic_days=3,
                                      synthetic_seed=fusion.FRESH_SEED_OFFSET))
    np.testing.assert_array_equal(unseen.close, expected.close)
    np.testing.assert_array_equal(unseen.text_index, expected.text_index)
    assert fusion.fresh_market(data, 3) == fresh  # written once, then read


def test_the_table_shows_the_fresh_path_when_scored(tmp_path):
    runs = tmp_path / "runs"
    for arm, pnl in (("rl_only", 100.0), ("news", 400.0)):
        scores = _fake_scores(pnl, arm == "news")
        for kind in fusion.CHECKPOINTS:
            walks = scores[kind]["walks"]
            walks["fresh_agent"] = _pnl_walk(pnl * 10)
            if arm == "news":
                walks["fresh_llm_only"] = _pnl_walk(pnl * 5)
                walks["fresh_fused_no_veto"] = walks["fresh_agent"]
        if arm == "news":  # the veto switched on, at the latest only: it halves the P&L, breaches 3 -> 1
            scores["latest"]["walks"]["fresh_agent"].update(breaches=3, max_drawdown=900.0)
            scores["latest"]["walks"]["fresh_fused_veto"] = _pnl_walk(pnl * 5, breaches=1, max_drawdown=700.0)
        (runs / f"{arm}-s0").mkdir(parents=True)
        (runs / f"{arm}-s0" / fusion.EVAL_FILE).write_text(json.dumps({**scores, "fresh_days": 4}))
    plan = fusion.Plan("configs/headlines.yaml", ["rl_only", "news"], [0], tmp_path / "experiment.json", runs, [],
                       None, fresh_days=4)
    news = fusion.run(plan, "python scripts/experiment.py ...", progress=False)["arms"]["news"]["latest"]
    assert news["paired_fresh_pnl_vs_rl_only"]["mean"] == 3000.0
    assert news["paired_fresh_pnl_vs_llm_only"]["mean"] == 2000.0
    # the veto's trade-off on the fresh path: on − off, and its cost
    assert (news["paired_veto_fresh_pnl"]["mean"], news["paired_veto_fresh_breaches"]["mean"],
            news["paired_veto_fresh_max_drawdown"]["mean"], news["veto_fresh_pnl_cost"]) == (-2000.0, -2.0, -200.0, 0.5)
    assert news["paired_veto_fresh_pnl"]["ci95_days"] == [-4000.0, 0.0]  # lost on one day of four, drawn 0-2 times
    text = (tmp_path / "table.md").read_text()
    assert "fresh: 4 days" in text and "| − advice alone, fresh |" in text
    assert "| news | fresh | 4,000 [4,000, 4,000] | 2,000 [2,000, 2,000] | -2,000 [-2,000, -2,000] {-4,000, 0} | 50.0% | " \
           "3.000 [3.000, 3.000] | 1.000 [1.000, 1.000] | -2.000 [-2.000, -2.000] |" in text
    # the same runs in an experiment that did not ask for a fresh path: no fresh figures in its report
    summary = fusion.run(dataclasses.replace(plan, fresh_days=0), "python scripts/experiment.py ...", progress=False)
    assert summary["arms"]["news"]["latest"]["fresh_pnl"]["mean"] is None
    assert "fresh" not in (tmp_path / "table.md").read_text()


def test_the_market_interval_sees_an_edge_that_one_day_made():
    """Every seed earning the same on the same one day: the seed-only interval is a point, the interval over seeds
    and days reaches 0. An edge earned every day keeps an interval above 0, and noise between seeds still widens it."""
    days = 18
    one_day = np.zeros((5, days))
    one_day[:, 4] = 1000.0
    assert fusion.bootstrap(list(one_day.sum(1)))["ci95"] == [1000.0, 1000.0]
    lo, hi = fusion.seeds_and_days_interval([one_day])
    assert lo == 0.0 and hi >= 1000.0
    rng = np.random.default_rng(1)
    steady = 100.0 + rng.normal(0, 20, (5, days))
    lo, hi = fusion.seeds_and_days_interval([steady])
    assert 1500 < lo < steady.sum(1).mean() < hi < 2100
    noisy_seeds = steady + rng.normal(0, 100, (5, 1))  # a seed's level shifts all its days
    wide = fusion.seeds_and_days_interval([noisy_seeds])
    assert wide[1] - wide[0] > hi - lo
    # two splits add up: val and test together
    both = fusion.seeds_and_days_interval([steady, steady[:, :10]])
    assert both[0] < steady.sum(1).mean() + steady[:, :10].sum(1).mean() < both[1]


@pytest.mark.parametrize("args, flag", [
    (["--arms", "news,bogus"], "--arms"),
    (["--seeds", "x"], "--seeds"),
    (["--config", "configs/nope.yaml"], "--config"),
    (["--json", "out/results.json"], "--json"),
    (["--set", "ppo.lr=oops"], "ppo.lr"),
    (["--fresh-days", "-3"], "--fresh-days"),
    (["--jobs", "2"], "--jobs 2: give --backend processes, ray or slurm (local runs one at a time)"),
    (["--backend", "processes", "--jobs", "0"], "--jobs 0: must be at least 1"),
    (["--ray-address", "auto"], "--ray-address: give --backend ray"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, flag, capsys):
    argv = ["--json", str(tmp_path / "experiment.json"), *args]
    assert fusion.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err


@pytest.mark.slow
def test_quick_experiment_trains_scores_and_resumes(tmp_path):
    """The real thing at its smallest: `--quick` (2 seeds, tiny runs) for rl_only and news, then again: the second
    invocation trains nothing."""
    out = tmp_path / "experiment.json"
    cmd = [sys.executable, "scripts/experiment.py", "--quick", "--arms", "rl_only,news", "--json", str(out),
           "--fresh-days", "5", "--no-progress"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2400, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(out.read_text())
    _check_schema(summary, ["rl_only", "news"])
    assert summary["seeds"] == [0, 1]
    assert summary["arms"]["news"]["latest"]["llm_only_test_pnl"]["n"] == 2
    assert summary["arms"]["news"]["latest"]["paired_fresh_pnl_vs_llm_only"]["ci95_days"] is not None
    stamps = {p: p.stat().st_mtime for p in (tmp_path / "runs").glob("*/metrics.jsonl")}
    assert len(stamps) == 4
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {p: p.stat().st_mtime for p in stamps} == stamps  # nothing trained again
    assert json.loads(out.read_text())["arms"] == summary["arms"]
    # the veto's variants on the same runs: the veto switched on is the experiment's fresh veto walk
    variants = tmp_path / "veto.json"
    cmd = [sys.executable, "experiments/veto_variants.py", "--runs", str(tmp_path / "runs"), "--arm", "news",
           "--seeds", "0-1", "--days", "5", "--offset", str(fusion.FRESH_SEED_OFFSET), "--variant", "off",
           "--variant", "on", "--json", str(variants)]
    third = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert third.returncode == 0, third.stderr[-3000:]
    walked = json.loads(variants.read_text())
    fresh_veto = summary["arms"]["news"]["latest"]["veto_on_fresh_pnl"]["mean"]
    assert np.mean([walked["runs"][s]["on"]["net_pnl"] for s in ("0", "1")]) == pytest.approx(fresh_veto)


def test_veto_variants_read_hybrid_veto_keys_and_pair_each_variant_with_the_veto_off():
    from experiments.veto_variants import account_windows, parse_variant, summary_table

    assert parse_variant("off") == ("off", None) and parse_variant("on") == ("on", {})
    assert parse_variant("near:advised_only_below=0.25,cooldown_bars=60,consecutive_losses=5") == (
        "near", {"advised_only_below": 0.25, "cooldown_bars": 60, "consecutive_losses": "5"})
    assert parse_variant("m:win_rate_margin=0.1,consecutive_losses=auto") == (
        "m", {"win_rate_margin": 0.1, "consecutive_losses": "auto"})
    for bad in ("near", "near:", "near:enabled=0", "near:cooldown=5", "near:significance=often"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)
    walk = {"trades": 10.0, "veto_rate": 0.0}
    rows = {str(s): {"off": {**walk, "net_pnl": 100.0 * s, "breaches": 3.0, "max_drawdown": 900.0},
                     "on": {**walk, "net_pnl": 100.0 * s - 10, "breaches": 1.0, "max_drawdown": 700.0}}
            for s in range(3)}
    summary, table = summary_table(rows)
    assert summary["on"]["net_pnl_vs_off"]["mean"] == pytest.approx(-10.0)
    assert summary["on"]["breaches_vs_off"]["ci95"] == [-2.0, -2.0] and "net_pnl_vs_off" not in summary["off"]
    assert "| on | 90 | -10 [-10, -10] | 1.0 | -2.0 [-2.0, -2.0] | 700 | -200 [-200, -200] |" in table
    # fresh accounts of D days: one per whole block of D trading days, from the first bar traded on
    assert account_windows(np.repeat(np.arange(25), 3), 2, 10) == [(2, 30), (30, 60)]
    for s in rows:
        rows[s]["off"].update(accounts_breached=0.5, accounts_passed=0.25)
        rows[s]["on"].update(accounts_breached=0.25, accounts_passed=0.25)
    summary, table = summary_table(rows)
    assert summary["on"]["accounts_breached_vs_off"]["mean"] == pytest.approx(-0.25)
    assert table.splitlines()[3].endswith("| 25% | -25% [-25%, -25%] | 25% | 0% [0%, 0%] |")


def test_the_shuffled_control_asks_about_a_block_of_the_past_of_its_own_split():
    """hybrid.shuffled: every key's prompt is the market of the block one session earlier, on the key's own side, so
    the news advisor's answers keep their statistics and no longer follow the key's own headline. Every prompt is
    rendered from a bar before the key's block and inside the key's split (no look-ahead, no other split); keys in a
    split's first session have no such block and are answered PASS without asking."""
    from agents.advice.table import SIDES, num_blocks
    from agents.advisor.prompt_fields import PromptFieldBuilder
    from agents.advisor.store import KnownAdvice
    from bridge.protocol import BUY, SELL, STATUS_NO_VIEW
    from jaxenv.config import DataConfig
    from jaxenv.market import load_market
    from jaxenv.synthetic import headline_sentiment

    market = load_market(DataConfig(source="synthetic:headlines", synthetic_days=20))
    own, far = (PromptFieldBuilder(market, ["NQ"], 1, 5, shuffled=s) for s in (False, True))
    blocks = num_blocks(market.num_bars, 5)
    keys = np.arange(blocks * SIDES)
    shown = far.rendered_bar(keys)
    has = shown >= 0
    assert far.shift == 390 // 5 and 0.75 < has.mean() < 0.95  # one session of 1-minute bars; the splits' first lost
    own_bar = own.rendered_bar(keys)
    assert (shown[has] == own_bar[has] - far.shift * 5).all()  # the past ...
    split_of = lambda bar: np.searchsorted([e for _, e in market.splits.values()], bar, side="right")  # noqa: E731
    assert (split_of(shown[has]) == split_of(own_bar[has])).all()  # ... of the key's own split
    assert np.array_equal(far.build(keys[has]), own.build(keys[has] - far.shift * SIDES), equal_nan=True)
    known = KnownAdvice.empty(len(keys))
    far.without_past(known)
    assert (known.status[~has] == STATUS_NO_VIEW).all() and not known.filled()[has].any()

    sentiment = np.array([headline_sentiment(market.text_table[i]) if i >= 0 else 0 for i in market.text_index])
    flat = keys[(keys % SIDES == 1) & has]
    said = np.where(sentiment[own.rendered_bar(flat)] > 0, BUY, np.where(sentiment[own.rendered_bar(flat)] < 0, SELL, -1))
    heard = np.where(sentiment[far.rendered_bar(flat)] > 0, BUY, np.where(sentiment[far.rendered_bar(flat)] < 0, SELL, -1))
    assert abs((heard == BUY).mean() - (said == BUY).mean()) < 0.1
    assert 0.3 < (heard == said)[(said >= 0) & (heard >= 0)].mean() < 0.7  # a coin's agreement with its own headline


def test_the_shuffled_control_cannot_learn():
    from agents.config import ConfigError

    with pytest.raises(ConfigError, match="hybrid.shuffled"):
        load_config(ROOT / "configs/headlines_lora.yaml", ["hybrid.shuffled=true"])


def test_partial_reports_the_seeds_every_arm_finished(tmp_path):
    runs = tmp_path / "runs"
    for arm, seed in (("rl_only", 0), ("news", 0), ("rl_only", 1)):  # news-s1 is still training
        (runs / f"{arm}-s{seed}").mkdir(parents=True)
        (runs / f"{arm}-s{seed}" / fusion.EVAL_FILE).write_text(json.dumps(_fake_scores(100.0 + seed, arm == "news")))
    argv = ["--arms", "news", "--seeds", "0-1", "--partial", "--json", str(tmp_path / "experiment.json"),
            "--runs", str(runs), "--no-progress"]
    assert fusion.main(argv) == 0
    summary = json.loads((tmp_path / "experiment.json").read_text())
    assert summary["seeds"] == [0] and summary["partial"]
    assert "partial" in (tmp_path / "table.md").read_text()
    assert fusion.main([*argv[:-2], str(tmp_path / "empty"), "--no-progress"]) == 2  # nothing finished there


def test_session_halves_put_the_split_sessions_news_bars_in_the_first_half():
    """experiments/session_halves.py: on headlines_then_trend the first half is exactly the news bars of each
    session, so its P&L by half says which edge was traded; a walk's P&L and entries are split by half."""
    from experiments.session_halves import bar_halves, halves_of
    from jaxenv.config import DataConfig
    from jaxenv.market import load_market
    from jaxenv.synthetic import BARS_PER_SESSION, NEWS_BARS

    market = load_market(DataConfig(source="synthetic:headlines_then_trend", synthetic_days=4))
    halves = bar_halves(market)
    minute = np.tile(np.arange(BARS_PER_SESSION), 4)
    assert (halves == (minute >= NEWS_BARS)).all()
    trace = {"t": np.array([0, NEWS_BARS - 1, NEWS_BARS, BARS_PER_SESSION + 1]), "pnl": np.array([1.0, 2.0, 4.0, 8.0]),
             "entry_side": np.array([1, 0, -1, 0])}
    assert halves_of(trace, halves) == {"pnl_first": 11.0, "entries_first": 1, "pnl_second": 4.0, "entries_second": 1}


def test_the_shipped_adapter_answers_by_the_headline_more_than_the_base_model():
    """adapters/smollm2-headlines (the learned_smollm2 arm's advisor) has learned the headline's direction: on flat
    prompts half bullish, half bearish, its top action follows the headline more often than the base model's, and
    it says BUY far more after bullish than after bearish headlines."""
    from bridge import PromptRenderer
    from bridge.protocol import BUY, SELL
    from experiments.lora_probe import direction_figures, flat_headline_prompts, score

    renderer = PromptRenderer.from_yaml()
    prompts, bull = flat_headline_prompts(renderer, 40, np.random.default_rng(1), fields_seed=5)

    def follows(probs: np.ndarray) -> float:
        top = probs.argmax(1)
        return float(np.where(bull, top == BUY, top == SELL).mean())

    base, learned = (score(renderer, prompts, adapter) for adapter in (None, fusion.LEARNED_ADAPTER))
    assert follows(learned) >= 0.85 and follows(learned) > follows(base) + 0.1
    spread = {name: f["p_buy_bull"] - f["p_buy_bear"] for name, f in
              (("base", direction_figures(base, bull)), ("learned", direction_figures(learned, bull)))}
    assert spread["learned"] > spread["base"] + 0.1
