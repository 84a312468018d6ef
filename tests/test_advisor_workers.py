"""Several advisor workers (hybrid.sidecar.workers): the split of a query step's prompts by measured rates, both
workers answering in a hybrid run, and a run that survives one worker being killed."""

from __future__ import annotations

import math
import os
import signal
import time

import jax
import numpy as np
import pytest

from agents.advice.acting import make_acting
from agents.advisor.query_loop import QueryLoop
from agents.advisor.workers import AdvisorPool, split_counts
from agents.config import ConfigError, load_config
from agents.rl.ppo import make_train
from agents.training.env_setup import make_env_setup
from agents.training.loop import _postfix
from agents.training.update import Update
from bridge import BridgeConfig
from bridge.protocol import STATUS_BACKEND_ERROR, STATUS_OK, STATUS_TIMEOUT

SMALL = ["num_envs=32", "ppo.num_steps=20", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_steps=1280",
         "network.actor_hidden=[32]", "network.critic_hidden=[32]", "data.source=synthetic:headlines",
         "data.synthetic_days=30", "checkpoint.eval_every_updates=0", "log.progress=false", "log.tensorboard=false",
         "llm=mock", "hybrid.mock.reads=text", "hybrid.link.budget=16", "hybrid.sidecar.workers=2"]


def test_split_follows_the_weights_and_sums_to_n():
    assert split_counts(16, [1.0, 1.0]).tolist() == [8, 8]
    assert split_counts(16, [30.0, 10.0]).tolist() == [12, 4]
    assert split_counts(10, [1.0, 0.0, 1.0]).tolist() == [5, 0, 5]  # a worker that is down gets nothing
    counts = split_counts(7, [1.0, 1.0, 1.0])
    assert counts.sum() == 7 and counts.max() - counts.min() == 1
    assert split_counts(0, [1.0, 2.0]).tolist() == [0, 0]
    assert split_counts(5, [0.0, 0.0]).tolist() == [0, 0]


def weights(pool: AdvisorPool) -> np.ndarray:
    """Each worker's share of the pool's next submission."""
    return pool.shares.weights(pool.shares.up(pool.workers))


class _Worker:
    def __init__(self, alive: bool):
        self.alive = alive
        self.config = BridgeConfig()


def test_weights_are_measured_rates_with_equal_shares_until_measured():
    pool = AdvisorPool([_Worker(True), _Worker(True), _Worker(False)])
    assert weights(pool).tolist() == [1.0, 1.0, 0.0]  # nothing measured: equal; the dead worker: none
    pool.shares.rates[:] = [30.0, np.nan, 50.0]
    assert weights(pool).tolist() == [30.0, 30.0, 0.0]  # unmeasured: the mean of the measured live ones
    pool.shares.rates[1] = 10.0
    assert split_counts(40, weights(pool)).tolist() == [30, 10, 0]


def test_learning_takes_one_worker():
    with pytest.raises(ConfigError, match="hybrid.sidecar.workers"):
        load_config(None, ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.sidecar.workers=2"])
    with pytest.raises(ConfigError, match="hybrid.sidecar.workers"):
        load_config(None, ["hybrid.sidecar.workers=0"])


def test_two_workers_answer_and_a_killed_one_is_restarted(tmp_path):
    # strict (the mock's auto latency); 0.1 s per prompt keeps the test's prompts in flight when a worker is killed
    cfg = load_config(None, SMALL + ["hybrid.mock.latency_s=0.1"])
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, setup.market, tmp_path,
                     seed=cfg.seed, num_steps=cfg.ppo.num_steps)
    update = Update(ppo, cfg.ppo.num_steps, setup.params, loop)
    try:
        assert len(loop.advisor.workers.workers) == 2
        state = jax.jit(ppo.init)(jax.random.PRNGKey(0), setup.params)
        state, _ = update(state)  # asks; the answers come into the table at the next update
        state, first = update(state)
        assert first["llm_workers_alive"] == 2
        assert first["llm_answered_w0"] > 0 and first["llm_answered_w1"] > 0  # both workers answered
        assert first["llm_rate_w0"] > 0 and first["llm_rate_w1"] > 0
        assert first["llm_answered_w0"] + first["llm_answered_w1"] == first["llm_ok"]
        assert "advised" in _postfix({"steps_per_s": 1.0, **first}, "score")  # coverage and rate on the bar

        state = loop.pacer.drain(state)  # nothing of the update in flight: the next submission is the test's
        pool = loop.advisor.workers
        ids = np.arange(8, dtype=np.int32)
        n0 = int(split_counts(8, weights(pool))[0])  # worker 0's share; worker 1 gets the rest
        assert 0 < n0 < 8
        pool.submit(ids, np.array([f"RSI {20 + i} ADX 30".encode() for i in ids]))  # 0.1 s of work per prompt
        old_pid = pool.workers[1].sidecar_pid
        os.kill(old_pid, signal.SIGKILL)  # worker 1 dies with its share in flight
        answers = pool.collect(timeout_s=30.0)
        assert answers.keys.tolist() == ids.tolist()  # merged in submission order
        assert (answers.status[n0:] == STATUS_BACKEND_ERROR).all()  # the dead worker's share
        assert (answers.status[:n0] != STATUS_BACKEND_ERROR).all()  # the other answered its own

        state, _ = update(state)  # goes on: worker 1 restarts while worker 0 is asked ...
        state, second = update(state)  # ... and its answers come in at the next update
        assert math.isfinite(second["policy_loss"]) and second["llm_answered_w0"] > 0
        deadline, back = time.monotonic() + 60, None
        while back is None and time.monotonic() < deadline:  # updates go on; worker 1 answers again once it is up
            state, m = update(state)
            back = m if m["llm_answered_w1"] > 0 else None
        assert back is not None and back["llm_workers_alive"] == 2
        pool = loop.advisor.workers
        assert pool.workers[1].sidecar_pid != old_pid
        assert pool.workers[1].stats()["restarts"] == 1 and pool.workers[0].stats()["restarts"] == 0
    finally:
        loop.close()
    # each worker's stderr went to the run folder, not through the progress bar
    assert (tmp_path / "advisor_w0.log").exists() and (tmp_path / "advisor_w1.log").exists()


def test_auto_budget_asks_only_what_the_advisor_answered_in_a_chunk():
    """Answers that kept the advisor busy until collected (async: not ready a query step later), or not all
    answered, size B to 90% of what it answered between query steps at its measured rate (a niced advisor's rate is the idle
    CPU it found); answers all ready let B double."""
    from agents.advisor.pacer import Budget
    from bridge.client import Answers

    def answers(ok: int, timed_out: int) -> Answers:
        n = ok + timed_out
        status = np.array([STATUS_OK] * ok + [STATUS_TIMEOUT] * timed_out, np.int8)
        return Answers(1, np.arange(n, dtype=np.int32), np.full((n, 6), 1 / 6, np.float32), np.zeros(n, np.int8),
                       np.zeros(n, np.float32), status, np.zeros(n, "S1"))

    budget = Budget(16, 1024, auto=True)
    budget.resize(answers(ok=4, timed_out=0), latency=2.0, busy=True, since_s=1.0)
    assert budget.size == 4  # 4 answers in 2 s: 2/s × 1 s chunk × 0.9, at least the floor of 4
    budget.size = 40
    budget.resize(answers(ok=30, timed_out=10), latency=1.0, busy=False, since_s=1.0)
    assert budget.size == 27
    budget.resize(answers(ok=27, timed_out=0), latency=1.0, busy=False, since_s=1.0)
    assert budget.size == 54  # all ready: twice as many


def test_a_slow_answer_is_collected_when_done_not_abandoned():
    """Async mode collects a submission only once `oldest_done`: a batch that takes longer than a chunk arrives
    late instead of timing out (the trainer never waits either way)."""
    pool = AdvisorPool.start([("mock", {"latency_s": 0.1})] * 2, BridgeConfig(capacity=8))
    try:
        pool.submit(np.arange(6, dtype=np.int32), np.array([f"RSI {20 + i} ADX 30".encode() for i in range(6)]))
        assert not pool.oldest_done  # 0.3 s of work per worker
        deadline = time.monotonic() + 30
        while not pool.oldest_done and time.monotonic() < deadline:
            time.sleep(0.05)
        answers = pool.collect(timeout_s=0.0)
        assert (answers.status != STATUS_BACKEND_ERROR).all() and (answers.status != STATUS_TIMEOUT).all()
        assert pool.metrics()["llm_answered_w0"] + pool.metrics()["llm_answered_w1"] == int((answers.status == STATUS_OK).sum())
    finally:
        pool.close()


def test_a_restarted_worker_answers_with_the_adapter_the_pool_loaded(tmp_path):
    """A worker restarts from its start flags (here: the base model); the pool's last `load` is sent to it again
    before it is given prompts, so its answers are the loaded adapter's, which they are stored as."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from bridge import PromptRenderer
    from llm_sidecar.__main__ import example_fields
    from llm_sidecar.models import build_tiny_phi3

    renderer = PromptRenderer.from_yaml()
    model = str(build_tiny_phi3(tmp_path / "tiny_phi3"))
    torch.manual_seed(1)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(model),
                          LoraConfig(r=4, lora_alpha=16, target_modules=["qkv_proj", "o_proj"],
                                     init_lora_weights=False))  # random B: answers differ from the base model's
    lora.save_pretrained(tmp_path / "adapter")
    fields, texts = example_fields(6, seed=5)
    prompts, ids = renderer.render(fields, texts), np.arange(6, dtype=np.int32)

    def ask() -> np.ndarray:
        pool.submit(ids, prompts)
        answers = pool.collect(timeout_s=60.0)
        assert (answers.status == STATUS_OK).all()
        return answers.probs

    pool = AdvisorPool.start([("transformers", {"model": model, "batch_size": 8, "threads": 1})],
                             BridgeConfig(capacity=8, name_prefix=f"jxfr{os.getpid()}_"), prompts=renderer)
    try:
        base = ask()
        pool.command("load", path=str(tmp_path / "adapter"))
        adapted = ask()
        assert np.abs(adapted - base).max() > 1e-3
        worker, old_pid = pool.workers[0], pool.workers[0].sidecar_pid
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while worker.sidecar_pid == old_pid:  # restarted once it is seen dead
            assert time.monotonic() < deadline, "the worker was not restarted"
            pool.restart_dead()
            time.sleep(0.05)
        while not worker.alive:  # its new process reports ready
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(0.05)
        assert not pool.alive and weights(pool)[0] == 0  # ready, but still answering with its start flags' model
        pool.restart_dead()  # sends it the pool's load before anything else
        assert pool.alive and weights(pool)[0] > 0 and worker.stats()["restarts"] == 1
        assert np.allclose(ask(), adapted, atol=1e-5)  # the adapter's answers, not the base model's
    finally:
        pool.close()
