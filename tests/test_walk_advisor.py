"""A validation walk that training waits for is answered at normal priority: training's advisor runs at nice 19 (the
cores the trainer leaves), and a process can never lower its niceness again, so a walk answered by it crawls beside
any other work on the machine."""

from __future__ import annotations

import os

import pytest

from agents.advisor.pacer import QueryPacer
from agents.config import load_config
from agents.training.loop import train
from tests.processes import children

SMALL = ["num_envs=16", "ppo.num_steps=20", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_steps=320",
         "network.actor_hidden=[16]", "network.critic_hidden=[16]", "data.synthetic_days=30",
         "checkpoint.eval_every_updates=1", "log.progress=false", "log.tensorboard=false", "llm=smollm2",
         "hybrid.store=", "hybrid.sidecar.nice=19", "hybrid.sidecar.threads=1"]


class WalkStarted(Exception):
    pass


def test_the_walk_training_waits_for_has_its_own_advisor_at_normal_priority(tmp_path, monkeypatch):
    seen = {}

    def ask_all(pacer, keys, progress=False):
        seen["nice"] = sorted(os.getpriority(os.PRIO_PROCESS, pid) for pid in children(os.getpid()))
        seen["threads"] = pacer.h.sidecar.threads
        raise WalkStarted  # what was asked is all this test needs: stop the run here

    monkeypatch.setattr(QueryPacer, "ask_all", ask_all)
    cfg = load_config(None, SMALL)
    with pytest.raises(WalkStarted):
        train(cfg, tmp_path / "run")
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the test's own niceness: a sidecar adds to it
    # training's advisor at its niceness, the walk's at the trainer's own and every core
    assert seen["nice"] == [base, min(base + 19, 19)]
    assert seen["threads"] == (os.cpu_count() or 1)
    assert not children(os.getpid()), "a sidecar outlived the run"
