"""The hybrid loop with the mock advisor: in the trainer's process, and through the real bridge and its sidecar process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from agents.advice.acting import make_acting
from agents.advice.table import STATUS_ASKED
from agents.advisor.query_loop import QueryLoop
from agents.training.update import Update
from agents.config import load_config
from agents.rl.ppo import make_train
from agents.training.env_setup import make_env_setup
from agents.training.loop import train
from tests.processes import children, running

TIMING = ("steps_per_s", "achieved_gflops", "update_s", "compile_s")
SMALL = ["num_envs=32", "ppo.num_steps=20", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_steps=1280",
         "network.actor_hidden=[32]", "network.critic_hidden=[32]", "data.source=synthetic:headlines",
         "data.synthetic_days=30", "checkpoint.eval_every_updates=0", "log.progress=false", "log.tensorboard=false",
         "llm=mock", "hybrid.link.budget=256"]


def shm_segments() -> set[str]:
    """This process's bridge segments (named jxf<pid>_...); other test processes may hold their own."""
    mine = f"jxf{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)} if os.path.isdir("/dev/shm") else set()


@contextlib.contextmanager
def hybrid_loop(overrides: list[str], run_dir: Path):
    """(QueryLoop with its mock sidecar started, the Update it plugs into, initial RunnerState) for SMALL +
    overrides; closed after."""
    cfg = load_config(None, SMALL + overrides)
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, setup.market, run_dir,
                     seed=cfg.seed, num_steps=cfg.ppo.num_steps)
    update = Update(ppo, cfg.ppo.num_steps, setup.params, loop)
    try:
        yield loop, update, jax.jit(ppo.init)(jax.random.PRNGKey(0), setup.params)
    finally:
        loop.close()


def deterministic(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING and not k.startswith(("llm_latency", "llm_rate"))
            and k != "llm_wait_s_per_query"}


def test_strict_mode_with_mock_advisor_is_reproducible(tmp_path):
    before = shm_segments()
    results = [train(load_config(None, SMALL + ["seed=3"]), tmp_path / f"run{i}") for i in range(2)]
    a, b = (deterministic(r.last_metrics) for r in results)
    assert a == b
    assert a["llm_ok"] > 0 and a["advice_coverage"] > 0.1  # advice was asked, answered and used
    np.testing.assert_array_equal(np.asarray(results[0].state.params["params"]["gate"]["Dense_0"]["kernel"]),
                                  np.asarray(results[1].state.params["params"]["gate"]["Dense_0"]["kernel"]))
    assert shm_segments() == before  # the sidecar's segments are gone after training


@pytest.mark.slow  # (the suite's time: tests/test_advisor_workers.py and test_faults.py train the mock in a sidecar)
def test_the_mock_trains_the_same_from_fields_in_process_as_from_text_in_its_sidecar(tmp_path):
    (tmp_path / "loop").mkdir()
    with hybrid_loop(["hybrid.link.log_llm=4"], tmp_path / "loop") as (loop, update, state):  # the default: no process, no memory
        for _ in range(2):
            state, _ = update(state)
        assert children(os.getpid()) == [] and shm_segments() == set()
    logged = [json.loads(line) for line in (tmp_path / "loop" / "llm_log.jsonl").read_text().splitlines()]
    assert logged and all(re.match(r"\d\d:\d\d [A-Z]+ \d+ ADX", row["prompt"]) and row["answer"] for row in logged)  # as text
    runs = {reads: train(load_config(None, SMALL + ["seed=3", f"hybrid.mock.reads={reads}"]), tmp_path / reads)
            for reads in ("fields", "text")}
    for a, b in zip(*(jax.tree.leaves(r.state.params) for r in runs.values())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fields, text = (r.last_metrics for r in runs.values())
    assert fields["llm_ok"] == text["llm_ok"] > 0
    same = ("advice_coverage", "episode_return", "policy_loss", "mean_trust")
    np.testing.assert_equal({k: fields[k] for k in same}, {k: text[k] for k in same})


def test_every_update_gets_answers(tmp_path):
    """The keys asked at one update are answered into the table at the next, so advice keeps coming; a query step
    marks as asked exactly the keys it asks (at most B)."""
    with hybrid_loop(["ppo.num_steps=64", "total_steps=2048", "hybrid.link.budget=8"], tmp_path) as (loop, update, state):
        for i in range(4):
            state, m = update(state)
            assert m["llm_prompts"] == 8 and (m["llm_ok"] == 8 or i == 0)
        before = loop.pacer.counts.prompts
        state = loop.pacer.query_step(state)
        loop.pacer.send()
        asked = int((np.asarray(state.hybrid.advice.status) == STATUS_ASKED).sum())
        assert 0 < asked == loop.pacer.counts.prompts - before <= 8


def test_a_slow_async_advisor_never_stalls_the_rollout_and_its_answers_still_arrive(tmp_path):
    """Async latency with an advisor that takes 0.2 s a batch: query steps never wait for it, the answers come some
    query steps later, and the keys are asked that many query steps further ahead, so they are read."""
    overrides = ["hybrid.link.latency=async", "hybrid.mock.reads=text", "hybrid.mock.latency_s=0.2", "hybrid.link.budget=64"]
    with hybrid_loop(overrides, tmp_path) as (loop, update, state):
        covered, deadline = 0.0, time.monotonic() + 60
        while covered == 0.0 and time.monotonic() < deadline:
            state, m = update(state)
            assert m["llm_wait_s_per_query"] < 0.05
            covered = m["advice_coverage"]
        assert covered > 0 and m["advice_keys_filled"] > 0
        assert loop.pacer.lag > 0  # the answers took more than one query step


def test_training_survives_a_killed_sidecar(tmp_path):
    # strict: collecting must notice the dead sidecar instead of waiting
    cfg = load_config(None, SMALL + ["hybrid.mock.reads=text"])
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    before = shm_segments()
    loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, setup.market, tmp_path,
                     seed=cfg.seed, num_steps=cfg.ppo.num_steps)
    update = Update(ppo, cfg.ppo.num_steps, setup.params, loop)
    try:
        state = jax.jit(ppo.init)(jax.random.PRNGKey(0), setup.params)
        state, first = update(state)
        assert first["llm_prompts"] > 0
        os.kill(loop.advisor.workers.workers[0].sidecar_pid, signal.SIGKILL)
        state, second = update(state)  # goes on without advice while a new sidecar starts
        assert int(state.update) == 2 and np.isfinite(second["policy_loss"])
        deadline = time.monotonic() + 60
        answered = 0
        while not answered and time.monotonic() < deadline:  # updates go on; advice returns once it is up
            state, later = update(state)
            answered = later["llm_ok"]
        assert answered > 0
        assert loop.advisor.workers.metrics()["restarts"] == 1
    finally:
        loop.close()
    assert shm_segments() == before


def test_rules_fusion_and_no_veto_run(tmp_path):
    result = train(load_config(None, SMALL + ["hybrid.fusion=rules", "hybrid.veto.enabled=false", "total_steps=640"]),
                   tmp_path / "rules")
    m = result.last_metrics
    assert m["veto_rate"] == 0.0 and m["mean_trust"] == 0.0
    assert 0.0 <= m["override_rate"] <= 1.0


def test_ctrl_c_stops_training_sidecars_and_all(tmp_path):
    """Ctrl-C on `train.py --llm mock` (training sidecar and the validation walk's sidecar both up): the run
    saves a checkpoint and exits, no sidecar outlives it, no shared-memory segment is left."""
    root = Path(__file__).resolve().parents[1]
    sets = [a for o in SMALL if not o.startswith(("total_steps", "checkpoint.eval_every", "llm="))
            for a in ("--set", o)]
    cmd = [sys.executable, str(root / "scripts" / "train.py"), "--llm", "mock", "--total-steps", "6400000",
           "--run-dir", str(tmp_path / "run"), *sets, "--set", "checkpoint.eval_every_updates=1",
           "--set", "hybrid.mock.reads=text"]
    trainer = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        metrics = tmp_path / "run" / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert trainer.poll() is None, trainer.stderr.read()
            time.sleep(0.2)
        sidecars = children(trainer.pid)
        assert len(sidecars) == 2  # the training loop's and the validation walk's
        os.killpg(trainer.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
        assert trainer.wait(timeout=60) == 130
        assert not [p for p in sidecars if running(p)], "orphaned sidecar"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"jxf{trainer.pid}_")]
        assert "checkpoint saved" in trainer.stderr.read()
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
