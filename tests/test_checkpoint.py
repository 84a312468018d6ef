"""Checkpoints: exact resume, no half-written checkpoint after a crash, and Ctrl-C saving a final one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from agents.config import load_config
from agents.runs.checkpoints import RunCheckpoints
from agents.training.loop import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ["llm=none", "env_name=CartPole-v1", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2",
        "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false"]


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_updates_then_resume_then_two_equals_four_straight(tmp_path):
    cfg = load_config(None, TINY + ["total_steps=512", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=2",
                                    "checkpoint.eval_episodes=4", "ppo.scale_rewards=true"])
    assert cfg.num_updates == 4
    straight = train(cfg, tmp_path / "a")

    first = train(cfg, tmp_path / "b", stop_after=2)
    assert first.update == 2 and not first.interrupted
    # a line from updates that were never checkpointed (as after a crash) must not survive the resume
    with open(tmp_path / "b" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"update": 3, "env_steps": 384, "bogus": True}) + "\n")
    resumed = train(None, tmp_path / "b", resume=True)
    assert resumed.update == 4

    # everything: params, Adam moments and step count, normalisers, env states, episode counters, RNG key
    a_leaves, b_leaves = jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state)
    assert len(a_leaves) == len(b_leaves)
    for a, b in zip(a_leaves, b_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert resumed.best_score == straight.best_score

    with pytest.raises(FileExistsError, match="--resume"):  # a new run never overwrites an existing one
        train(cfg, tmp_path / "b")
    assert train(None, tmp_path / "b", resume=True).update == 4  # a finished run resumes to nothing to do

    a_lines, b_lines = metrics_lines(tmp_path / "a"), metrics_lines(tmp_path / "b")
    assert [m["update"] for m in b_lines] == [1, 2, 3, 4]
    for ma, mb in zip(a_lines, b_lines):
        for k in ("approx_kl", "entropy", "value_loss", "episode_return", "explained_variance"):
            assert ma[k] == mb[k] or abs(ma[k] - mb[k]) < 1e-4 * max(1.0, abs(ma[k])), k


# A child process saves step 1, then crashes (SIGKILL from the parent) while step 2 is being written: orbax's
# finalisation (the rename of the temporary directory) is made to hang so the kill lands mid-save every time.
CRASHING_CHILD = textwrap.dedent(
    """
    import sys, time
    import jax.numpy as jnp
    from orbax.checkpoint._src.path import atomicity
    from agents.runs.checkpoints import RunCheckpoints

    run_dir, marker = sys.argv[1], sys.argv[2]
    ckpt = RunCheckpoints(run_dir, keep=3)
    ckpt.save_latest(1, {"w": jnp.full((1000,), 1.0)}, {"update": 1})
    ckpt.wait()

    async def hang(self):
        open(marker, "w").close()
        while True:
            time.sleep(1)

    atomicity.AtomicRenameTemporaryPath.finalize = hang
    ckpt.save_latest(2, {"w": jnp.full((1000,), 2.0)}, {"update": 2})
    ckpt.wait()
    """
)


def test_crash_mid_save_leaves_no_checkpoint_a_resume_would_pick(tmp_path):
    marker = tmp_path / "saving"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CRASHING_CHILD, str(tmp_path / "run"), str(marker)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 90
        while not marker.exists():
            assert child.poll() is None, child.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "the child never reached the second save"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()

    latest_dir = tmp_path / "run" / "checkpoints" / "latest"
    leftovers = [p.name for p in latest_dir.iterdir() if "tmp" in p.name]
    assert leftovers, "expected the interrupted save's temporary directory"
    ckpt = RunCheckpoints(tmp_path / "run", keep=3)
    assert ckpt.latest_step() == 1
    state, host = ckpt.restore({"w": jax.ShapeDtypeStruct((1000,), np.float32)})
    ckpt.close()
    assert host == {"update": 1} and float(state["w"][0]) == 1.0


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])  # Ctrl-C; timeout, a scheduler
def test_ctrl_c_or_sigterm_saves_a_final_checkpoint_and_exits_cleanly(tmp_path, signum, code):
    run_dir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "scripts" / "train.py"), "--run-dir", str(run_dir), "--total-steps", "10000000",
            "--set", "checkpoint.every_updates=100000", "--set", "checkpoint.eval_every_updates=0",
            "--set", "log.tensorboard=false"]
    for item in TINY:
        args += ["--set", item]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while not (run_dir / "metrics.jsonl").exists() or len(metrics_lines(run_dir)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err and "checkpoint saved" in err
    last = metrics_lines(run_dir)[-1]["update"]
    ckpt = RunCheckpoints(run_dir, keep=3)
    assert ckpt.latest_step() == last  # the update in flight finished, was logged and saved
    ckpt.close()
