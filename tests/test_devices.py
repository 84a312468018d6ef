"""Envs sharded over several devices and processes (docs/scale.md): a 2-device run learns as a 1-device run of the
same seed and envs, its checkpoint resumes and evaluates on 1 device, a device count that does not divide the envs
exits 2, and two processes on 127.0.0.1 train one run together.

The device count is fixed when JAX starts (conftest forces 1), so each side runs in its own Python process with
XLA_FLAGS forcing host devices."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ""  # set per module by the compilation_cache fixture
# Three updates of 16 envs x 16 steps, small networks, no evaluation: seconds per update on 2 shared cores.
OVERRIDES = ["num_envs=16", "ppo.num_steps=16", "total_steps=768", "network.actor_hidden=[32]",
             "network.critic_hidden=[32]", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=0",
             "log.progress=false", "log.tensorboard=false", "llm=none"]


def python_env(devices: int) -> dict:
    """`devices` forced host devices, and a compilation cache shared by the test's processes (the same 1-device
    program is compiled by several of them)."""
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "PYTHONPATH": str(ROOT),
            "JAX_COMPILATION_CACHE_DIR": CACHE_DIR, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def run_python(code: str, devices: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = python_env(devices)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    global CACHE_DIR
    CACHE_DIR = str(tmp_path_factory.mktemp("jax-cache"))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_device_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """Two of the three updates on 2 devices (stopped there with a checkpoint); then train.py with 17 envs."""
    run_dir = tmp_path_factory.mktemp("devices") / "two"
    done = run_python(f"""
        import sys
        import jax
        from agents.config import load_config
        from agents.training import cli
        from agents.training.loop import train
        assert jax.local_device_count() == 2
        result = train(load_config("configs/quick.yaml", {OVERRIDES!r}), sys.argv[1], stop_after=2)
        assert result.state.obs.sharding.spec == jax.sharding.PartitionSpec("envs"), result.state.obs.sharding
        print("rc17", cli.main(["--config", "configs/quick.yaml", "--envs", "17", "--llm", "none",
                                "--run-dir", sys.argv[1] + "-17"]))
    """, 2, str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, done


def test_envs_must_split_over_the_devices(two_device_run):
    run_dir, done = two_device_run
    assert "rc17 2" in done.stdout
    assert "num_envs (--envs): 17 envs do not split evenly over 2 devices" in done.stderr
    assert not Path(f"{run_dir}-17").exists()  # nothing written


def test_two_devices_learn_as_one_and_resume_on_one(two_device_run, tmp_path):
    """The 2-device run's first two updates match a 1-device run's; resumed on 1 device for the third, its
    networks equal the 1-device run's within float tolerance."""
    two, _ = two_device_run
    one = tmp_path / "one"
    done = run_python(f"""
        import sys
        import jax
        import numpy as np
        from agents.config import load_config
        from agents.training.loop import train
        assert jax.local_device_count() == 1
        straight = train(load_config("configs/quick.yaml", {OVERRIDES!r}), sys.argv[1])
        resumed = train(None, sys.argv[2], resume=True, devices="1")
        assert straight.update == resumed.update == 3
        np.savez(sys.argv[3], *jax.tree.leaves(jax.device_get(straight.state.params)))
        np.savez(sys.argv[4], *jax.tree.leaves(jax.device_get(resumed.state.params)))
    """, 1, str(one), str(two), str(tmp_path / "one.npz"), str(tmp_path / "two.npz"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed" in done.stderr and "update 2 / 3" in done.stderr

    for a, b in zip(metrics(one)[:2], metrics(two)[:2], strict=True):
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "episodes"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["update"], key)
    straight, resumed = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert straight.files == resumed.files
    for name in straight.files:
        np.testing.assert_allclose(straight[name], resumed[name], rtol=1e-4, atol=1e-6)


def test_two_device_checkpoint_evaluates_on_one(two_device_run, tmp_path):
    two, _ = two_device_run
    out = tmp_path / "eval"
    done = run_python("""
        import sys
        from agents.evaluation.cli import main
        raise SystemExit(main(["--run-dir", sys.argv[1], "--checkpoint", "latest", "--split", "val",
                               "--episodes", "1", "--no-progress", "--out", sys.argv[2]]))
    """, 1, str(two), str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "devices: 1 x cpu" in done.stderr
    summary = json.loads((out / "evaluation.json").read_text())
    assert summary  # the agent walked the split with the 2-device run's networks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_in_two_processes(tmp_path, overrides: list[str]) -> tuple[Path, list[tuple[str, str]]]:
    """train.py's start in two processes on 127.0.0.1 (CPU collectives), one device each; (run folder, each
    process's stdout and stderr). Both must finish all 3 updates."""
    run_dir = tmp_path / "run"
    driver = """
        import sys
        from agents.devices.distributed import join_from_argv
        join_from_argv()  # before anything initialises a JAX backend
        import jax
        from agents.training import cli
        result = cli.start(cli.parse_args(sys.argv[1:]))
        print("process", jax.process_index(), "of", jax.process_count(), "update", result.update)
    """
    flags = ["--config", "configs/quick.yaml", "--run-dir", str(run_dir), "--coordinator", f"127.0.0.1:{free_port()}",
             "--num-processes", "2"] + [a for o in overrides for a in ("--set", o)]
    env = python_env(1)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(driver), *flags, "--process-id", str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=400) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"process {i}: {err[-3000:]}"
        assert f"process {i} of 2 update 3" in out
    return run_dir, outs


def test_two_processes_train_one_run(tmp_path):
    """Two processes train a run to its end: one run folder, one metrics line per update, written by process 0
    alone."""
    run_dir, outs = train_in_two_processes(tmp_path, OVERRIDES)
    assert "envs sharded over 2 (process 0 of 2" in outs[0][1]
    assert [m["update"] for m in metrics(run_dir)] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "latest").iterdir()) == ["1", "2", "3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "trials.jsonl"]  # one run folder, one trial
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow  # (the suite's time) two processes training one run is a default test above
def test_two_processes_each_ask_their_own_advisor(tmp_path):
    """A hybrid run (mock advisor) in two processes: each process's workers answer about its share of the keys,
    every process writes all answers into the one advice table, and process 0 alone writes the run folder (its LLM log). Both
    walk the validation split with their own advisor and agree on the best checkpoint by process 0's score."""
    hybrid = [o for o in OVERRIDES if o not in ("llm=none", "checkpoint.eval_every_updates=0")] + [
        "llm=mock", "hybrid.link.budget=64", "hybrid.link.log_llm=8", "checkpoint.eval_every_updates=3"]
    run_dir, _ = train_in_two_processes(tmp_path, hybrid)
    lines = metrics(run_dir)
    assert [m["update"] for m in lines] == [1, 2, 3]
    assert all(m["llm_rate_p0"] > 0 and m["llm_rate_p1"] > 0 for m in lines[1:])  # answers from both processes
    assert all(m["advice_coverage"] > 0 for m in lines[1:])
    # the LLM log is process 0's alone: the keys it asked (each process asks every other picked key), each once
    logged = [json.loads(line)["key"] for line in (run_dir / "llm_log.jsonl").read_text().splitlines()]
    assert logged and len(set(logged)) == len(logged)
    assert [p.name for p in (run_dir / "checkpoints" / "best").iterdir()] == ["3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "trials.jsonl"]


@pytest.mark.parametrize("cuda_visible, user_setting, left", [
    ("0,1", None, True),  # GPUs: JAX allocates as it needs, so the advisor's PyTorch gets the rest
    ("", None, False),  # no GPU: nothing to share
    ("0", ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5"), False),  # the user chose: left as it is
])  # fmt: skip
def test_jax_leaves_the_gpu_memory_to_the_advisor_unless_the_user_chose(monkeypatch, cuda_visible, user_setting, left):
    from agents.devices.gpus import XLA_GPU_MEMORY_VARIABLES, leave_gpu_memory_to_advisor, visible_gpus

    for name in XLA_GPU_MEMORY_VARIABLES:  # set first so that monkeypatch restores them, the function's too
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible)
    if user_setting:
        monkeypatch.setenv(*user_setting)
    visible_gpus.cache_clear()
    try:
        assert leave_gpu_memory_to_advisor() is left
        assert os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == ("false" if left else None)
    finally:
        visible_gpus.cache_clear()


def test_entry_scripts_leave_the_gpu_memory_before_anything_starts_jax():
    """JAX takes its GPU memory when its backend starts, and importing gymnax starts it: each entry script must
    call leave_gpu_memory_to_advisor before its other imports."""
    scripts = sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "scripts" / "advisor_learning").glob("*.py"))
    assert len(scripts) >= 9
    for script in scripts:
        code = script.read_text()
        statements = [line for line in code.splitlines() if line.startswith(("from ", "import ", "leave_gpu"))]
        assert statements[:2] == ["from agents.devices.gpus import leave_gpu_memory_to_advisor",
                                  "leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the "
                                  "advisor shares the GPUs"], script
    check = ("import sys, agents.devices.gpus; assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'gymnax', "
             "'torch')]")  # the module itself starts nothing
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
