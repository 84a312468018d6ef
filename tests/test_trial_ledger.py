"""The ledger of trials the deflated Sharpe ratio counts (agents/runs/trials.py): a run is a trial once it has trained
an update, not when it crashed at start-up; and scripts/trials.py lists a folder's trials and the count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.config import load_config, to_dict
from agents.runs.trials import TRIALS_FILE, count_trials, read_trials
from agents.training.loop import train

REPO = Path(__file__).resolve().parents[1]
TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
        "log.tensorboard=false", "data.source=synthetic:signal", "data.synthetic_days=30",
        "env.max_steps_in_episode=400", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=0",
        "total_steps=256"]  # two updates of 128 steps


def test_a_run_that_dies_before_its_first_update_is_no_trial(tmp_path, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("the advisor did not start")

    monkeypatch.setattr("agents.training.loop.make_train", fails)  # after config.yaml is written, before any update
    with pytest.raises(RuntimeError, match="the advisor did not start"):
        train(load_config(None, TINY), tmp_path / "runs" / "a")
    assert not (tmp_path / "runs" / TRIALS_FILE).exists()


def test_a_run_that_trains_one_update_is_one_trial_stopped_or_resumed(tmp_path):
    runs = tmp_path / "runs"
    cfg = load_config(None, TINY)
    assert train(cfg, runs / "a", stop_after=1).update == 1  # stopped after its first update: it was tried
    [trial] = read_trials(runs / TRIALS_FILE)
    assert (trial["run"], trial["seed"], trial["data"]) == ("a", cfg.seed, "synthetic:signal")
    assert "trained" in trial and count_trials(runs / "a", to_dict(cfg)) == 1
    assert train(None, runs / "a", resume=True).update == 2
    assert len((runs / TRIALS_FILE).read_text().splitlines()) == 1  # resuming it tries nothing new


def list_trials(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/trials.py", *args], capture_output=True, text=True, cwd=REPO)


def test_the_listing_shows_each_run_whether_it_trained_and_the_count(tmp_path):
    runs = tmp_path / "runs"
    (runs / "rl-a").mkdir(parents=True)
    (runs / "rl-a" / "metrics.jsonl").write_text('{"update": 1}\n')  # a run recorded as it started, which trained
    lines = [  # two recorded as they started (the ledger's old lines), two once trained, and a line cut short
        {"run": "advisor-a", "config": "1111aaaa2222bbbb", "seed": 0, "data": "synthetic:signal",
         "started": "2026-12-01 09:00:00"},  # died at start-up: its folder was discarded
        {"run": "rl-a", "config": "3333cccc4444dddd", "seed": 0, "data": "synthetic:signal",
         "started": "2026-12-01 09:05:00"},
        {"run": "rl-b", "config": "3333cccc4444dddd", "seed": 1, "data": "synthetic:signal",
         "trained": "2026-12-02 10:00:01"},
        {"run": "es-a", "config": "5555eeee6666ffff", "seed": 0, "data": "es.csv", "trained": "2026-12-03 11:00:00"},
    ]
    (runs / TRIALS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"run": "rl-c", "con')
    listed = list_trials(str(runs))
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout.splitlines()
    assert out[0] == f"{runs / TRIALS_FILE}: 4 runs recorded"
    assert [line.split() for line in out[1:6]] == [
        ["recorded", "run", "config", "seed", "data", "trained"],
        ["2026-12-01", "09:00:00", "advisor-a", "1111aaaa2222bbbb", "0", "synthetic:signal", "?"],
        ["2026-12-01", "09:05:00", "rl-a", "3333cccc4444dddd", "0", "synthetic:signal", "yes"],
        ["2026-12-02", "10:00:01", "rl-b", "3333cccc4444dddd", "1", "synthetic:signal", "yes"],
        ["2026-12-03", "11:00:00", "es-a", "5555eeee6666ffff", "0", "es.csv", "yes"],
    ]
    assert out[6].startswith("?: recorded as it started, and its folder holds no update")
    assert out[7:] == ["synthetic:signal: the deflated Sharpe ratio counts 3 trials (distinct configs and seeds)",
                       "es.csv: the deflated Sharpe ratio counts 1 trial (distinct configs and seeds)"]
    assert list_trials(str(runs / TRIALS_FILE)).stdout == listed.stdout  # the file itself, or its folder

    nowhere = tmp_path / "nowhere"
    for given, message in [(nowhere, f"{nowhere}: no such folder or file"),
                           (nowhere / TRIALS_FILE, f"{nowhere / TRIALS_FILE}: no such folder or file"),
                           (runs / "rl-a", f"{runs / 'rl-a'} holds no {TRIALS_FILE}: no run has trained in it")]:
        refused = list_trials(str(given))
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.splitlines() == [f"error: {message}"]
