"""Faults an operator meets, done for real: damaged checkpoints, two writers on one run folder, a disk that fills
up, writes that fail, bad input at the process boundary, and kills. Each test checks the exit code, the message the
user sees, and that no shared memory, process or half-written file is left behind.

Most tests copy one small run trained once for the module (4 of 6 updates). Tests that start real trainers and kill
them take minutes on 2 cores and are marked `slow`: `pytest -m slow tests/test_faults.py`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml

from agents.config import load_config
from agents.runs import storage
from agents.runs.checkpoints import RunCheckpoints
from agents.runs.integrity import MANIFEST_FILE, CheckpointDamaged, content_hashes, verify
from agents.runs.lock import RunLock
from agents.runs.saved_runs import restore_policy
from agents.training.loop import train
from bridge import ECHO_PEER_COMMAND, STATUS_OK, STATUS_PARSE_ERROR, BridgeConfig, SidecarClient
from bridge import transport as tp
from bridge.echo_peer import BAD_ANSWERS
from tests.processes import children, running

ROOT = Path(__file__).resolve().parents[1]
TINY = ["llm=none", "num_envs=8", "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=1",
        "network.actor_hidden=[16]", "network.critic_hidden=[16]", "log.progress=false", "log.tensorboard=false",
        "data.source=synthetic:signal", "data.synthetic_days=20", "env.max_steps_in_episode=400",
        "checkpoint.every_updates=1", "checkpoint.eval_every_updates=2", "total_steps=768"]  # 6 updates
TINY_FLAGS = [a for item in TINY for a in ("--set", item)]


# ---- helpers -----------------------------------------------------------------------------------------------------

def train_main(args: list[str]) -> int:
    from agents.training.cli import main

    return main(args)


def evaluate_main(args: list[str]) -> int:
    from agents.evaluation.cli import main

    return main(args)


def error_lines(text: str) -> list[str]:
    """What the user is told: lines starting with error/WARNING/Traceback (the data load report comes before)."""
    return [line for line in text.splitlines() if line.startswith(("error", "Traceback", "ERROR", "WARNING"))]


def updates(run_dir: Path) -> list[int]:
    """The update of every metrics line; every line must be whole JSON ending in a newline."""
    text = (run_dir / "metrics.jsonl").read_text()
    assert text == "" or text.endswith("\n"), "torn last line"
    return [json.loads(line)["update"] for line in text.splitlines()]


def half_written(run_dir: Path) -> list[str]:
    """Files a failed write could leave: orbax temporary folders, staging files, checkpoints without a manifest."""
    found = [str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
             if ".orbax-checkpoint-tmp" in p.name or p.name.endswith(".tmp")]
    for kind in ("latest", "best"):
        folder = run_dir / "checkpoints" / kind
        found += [f"{kind}/{p.name} (no manifest)" for p in (folder.iterdir() if folder.is_dir() else ())
                  if p.name.isdigit() and not (p / MANIFEST_FILE).is_file()]
    return found


def shm_segments(pid: int | None = None) -> set[str]:
    mine = f"jxf{pid or os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}


def lock_is_free(run_dir: Path) -> bool:
    try:
        RunLock.acquire(run_dir, create=False).release()
        return True
    except Exception:
        return False


def biggest_data_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def damage(run_dir: Path, step: int, how: str) -> Path:
    """Damages checkpoint latest/<step> as a failing disk or a stray write would; returns the file."""
    step_dir = run_dir / "checkpoints" / "latest" / str(step)
    if how == "metadata":
        path = step_dir / "state" / "_METADATA"
        path.write_bytes(b"\xff" * path.stat().st_size)
        return path
    path = biggest_data_file(step_dir)
    if how == "bytes":  # same size; before manifests this restored as NaN weights or silently different ones
        with open(path, "r+b") as f:
            f.seek(min(2048, path.stat().st_size // 2))
            f.write(b"\xff" * 16)
    else:
        os.truncate(path, path.stat().st_size // 3)
    return path


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """6-update run stopped after 4: latest checkpoints 2, 3, 4 and a best one, all with manifests."""
    path = tmp_path_factory.mktemp("faults") / "run"
    train(load_config(None, TINY), path, stop_after=4)
    return path


def copy_run(src: Path, tmp_path: Path, name: str = "run") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


# ---- checkpoint integrity ------------------------------------------------------------------------------------------

def test_every_checkpoint_carries_a_manifest_of_its_files(stopped_run):
    steps = {kind: sorted(int(p.name) for p in (stopped_run / "checkpoints" / kind).iterdir()) for kind in
             ("latest", "best")}
    assert steps["latest"] == [2, 3, 4] and len(steps["best"]) == 1
    for kind, found in steps.items():
        for step in found:
            step_dir = stopped_run / "checkpoints" / kind / str(step)
            listed = json.loads((step_dir / MANIFEST_FILE).read_text())["files"]
            assert listed == content_hashes(step_dir) and any(name.startswith("state/") for name in listed)
            verify(step_dir)
    assert half_written(stopped_run) == []


@pytest.mark.parametrize("how", ["bytes", "truncate", "metadata"])
def test_a_damaged_checkpoint_is_a_clean_error_naming_checkpoint_and_file(stopped_run, tmp_path, capsys, how):
    run = copy_run(stopped_run, tmp_path)
    path = damage(run, 4, how)
    capsys.readouterr()

    # evaluation never reports figures from it
    assert evaluate_main(["--run-dir", str(run), "--checkpoint", "latest", "--split", "val", "--no-progress"]) == 2
    out = capsys.readouterr()
    [line] = error_lines(out.err)
    assert line.startswith(f"error: checkpoint latest/4 of {run} is damaged: {path}")
    assert "intact checkpoints:" in line and "latest 2, 3" in line
    assert "net P&L" not in out.out and not (run / "eval").exists()

    # --resume names the newest intact checkpoint and how to continue from it, and changes nothing
    before = sorted(str(p) for p in run.rglob("*"))
    assert train_main(["--resume", str(run)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: checkpoint latest/4 of {run} is damaged: {path}")
    assert line.endswith(f"the newest intact checkpoint is update 3: continue from it with --resume {run} "
                         "--from-intact")
    assert sorted(str(p) for p in run.rglob("*")) == before and lock_is_free(run)


def test_non_finite_parameters_are_refused_even_with_a_matching_manifest(stopped_run, tmp_path, capsys):
    """A run that diverged (or a checkpoint rewritten with its manifest) holds NaN weights: never restored."""
    run = copy_run(stopped_run, tmp_path)
    ckpt = RunCheckpoints(run, keep=10)
    state = ckpt.latest.restore(4, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                           host=ocp.args.JsonRestore())).state
    state["params"]["params"]["actor"]["Dense_0"]["bias"] = np.full_like(
        state["params"]["params"]["actor"]["Dense_0"]["bias"], np.nan)
    ckpt.save_latest(5, state, {"update": 5})  # saved with a manifest that matches it
    ckpt.close()
    verify(run / "checkpoints" / "latest" / "5")
    expected = (r"latest/5 .* is damaged: params/params/actor/Dense_0/bias holds 16 non-finite value\(s\) of 16; "
                r"intact checkpoints: .*latest 2, 3, 4, 5")
    with pytest.raises(CheckpointDamaged, match=expected):
        restore_policy(run, "latest")
    assert evaluate_main(["--run-dir", str(run), "--checkpoint", "5", "--split", "val", "--no-progress"]) == 2
    assert "non-finite" in error_lines(capsys.readouterr().err)[0]


def test_resume_from_intact_sets_the_damaged_checkpoint_aside_and_finishes(stopped_run, tmp_path, capsys):
    run = copy_run(stopped_run, tmp_path)
    damage(run, 4, "bytes")
    result = train(None, run, resume=True, from_intact=True)
    err = capsys.readouterr().err
    assert "WARNING: checkpoint latest/4" in err and "continuing from update 3" in err
    assert result.update == 6 and updates(run) == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "damaged" / "latest-4").is_dir()  # kept for inspection, out of orbax's way
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.state.params))
    assert half_written(run) == [] and lock_is_free(run)


def test_a_checkpoint_whose_manifest_was_never_written_is_an_unfinished_save(stopped_run, tmp_path, capsys):
    """Killed between orbax's rename and the manifest: like orbax's own temporary folders, not a checkpoint."""
    from agents.rl.ppo import make_train
    from agents.training.env_setup import make_env_setup

    run = copy_run(stopped_run, tmp_path)
    (run / "checkpoints" / "latest" / "4" / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointDamaged, match="has no manifest.json \\(its save never finished\\)"):
        restore_policy(run, "latest")  # evaluation names it, and lists the intact ones
    cfg = load_config(run / "config.yaml")
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, None,
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    ckpt = RunCheckpoints(run, keep=3)
    state, host = ckpt.restore(jax.eval_shape(ppo.init, jax.random.PRNGKey(0), setup.params))  # resumed: from update 3
    ckpt.close()
    assert int(state.update) == 3 and host["update"] == 3
    assert "latest/4 never finished saving" in capsys.readouterr().err
    assert (run / "checkpoints" / "damaged" / "latest-4").is_dir() and half_written(run) == []


def test_a_config_that_no_longer_fits_its_checkpoint_fails_naming_the_key(stopped_run, tmp_path, capsys):
    run = copy_run(stopped_run, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["network"]["actor_hidden"] = [32]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    capsys.readouterr()
    assert train_main(["--resume", str(run)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: config.yaml does not match checkpoint latest/4 of {run}: "
                           "params/params/actor/Dense_0/bias has shape (16,) in the checkpoint, (32,) with the config")
    assert "network.actor_hidden" in line and lock_is_free(run)


def test_a_checkpoint_of_per_env_advice_is_refused_with_what_still_works():
    """A hybrid run saved before advice was keyed held its advice per env (hybrid/advice/age): a resume says it cannot
    continue it and names the two ways its networks are still used, instead of blaming a changed config."""
    from agents.runs.checkpoints import CheckpointMismatch, check_shapes

    stored = {"hybrid": {"advice": {"age": np.zeros(8, np.int32), "probs": np.zeros((8, 6), np.float32)}}}
    wanted = {"hybrid": {"advice": {"probs": jax.ShapeDtypeStruct((30, 6), np.float32)}}}
    with pytest.raises(CheckpointMismatch, match="saved before advice was keyed by market context") as refused:
        check_shapes(stored, wanted, "latest/4 of runs/old")
    assert "--init-from" in str(refused.value) and "evaluate.py" in str(refused.value)
    with pytest.raises(CheckpointMismatch, match="was llm / hybrid.\\* changed"):  # any other advice shape: the config
        check_shapes({"hybrid": {"advice": {"probs": np.zeros((8, 6))}}}, wanted, "latest/4 of runs/old")
    # a record of every env's calls (before the record counted one call per key): refused the same way
    old_record = {"hybrid": {"record": {"calls": {"weight": np.zeros(()), "total": np.zeros(())}, "side": np.zeros(8)}}}
    new_record = {"hybrid": {"record": {"tally": {"calls": jax.ShapeDtypeStruct((), np.float32)}}}}
    with pytest.raises(CheckpointMismatch, match="saved before the advice record counted one call per key"):
        check_shapes(old_record, new_record, "latest/4 of runs/old")
    # env states from before a breached account's successor was locked out of entries (issue 74): refused the same
    # way, not blamed on num_envs
    old_env = {"env_state": {"side": np.zeros(8, np.int32)}}
    new_env = {"env_state": {"side": jax.ShapeDtypeStruct((8,), np.int32),
                             "entry_locked": jax.ShapeDtypeStruct((8,), bool)}}
    with pytest.raises(CheckpointMismatch, match="saved before a breached account's successor entered nothing"):
        check_shapes(old_env, new_env, "latest/4 of runs/old")


def test_a_run_from_before_manifests_restores_unverified_with_a_note(stopped_run, tmp_path, capsys):
    run = copy_run(stopped_run, tmp_path)
    for manifest in run.rglob(MANIFEST_FILE):
        manifest.unlink()
    saved = restore_policy(run, "latest")
    assert saved.step == 4 and "restored unverified" in capsys.readouterr().err


# ---- one writer per run folder -------------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from agents.runs.lock import RunLock
    lock = RunLock.acquire(sys.argv[1])
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_does_not_block(stopped_run, tmp_path, capsys):
    run = copy_run(stopped_run, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(str(p) for p in run.rglob("*"))
        expected = f"error: {run} is in use by PID {holder.pid} on host {socket.gethostname()}"
        capsys.readouterr()
        assert train_main(["--resume", str(run)]) == 2  # a resume of a live run
        assert error_lines(capsys.readouterr().err)[0].startswith(expected)
        assert train_main(["--run-dir", str(run), *TINY_FLAGS]) == 2  # a second start on the same folder
        assert error_lines(capsys.readouterr().err)[0].startswith(expected)
        fresh = tmp_path / "fresh"
        holder2 = subprocess.Popen([sys.executable, "-c", HOLDER, str(fresh)], cwd=ROOT, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert holder2.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        assert train_main(["--run-dir", str(fresh), *TINY_FLAGS]) == 2  # refused before the data is loaded
        assert time.monotonic() - t0 < 5 and not (fresh / "config.yaml").exists()
        holder2.kill()
        holder2.wait()
        assert sorted(str(p) for p in run.rglob("*")) == before  # the refused writers wrote nothing
    finally:
        holder.kill()
        holder.wait()
    assert lock_is_free(run)  # killed with SIGKILL: the kernel dropped its lock, nothing stale blocks


# ---- disk full and write failures ---------------------------------------------------------------------------------

def test_a_failed_checkpoint_write_stops_the_run_and_resume_continues(stopped_run, tmp_path, capsys, monkeypatch):
    run = copy_run(stopped_run, tmp_path)
    save = ocp.CheckpointManager.save

    def full_disk(self, step, *args, **kwargs):
        if step == 5:  # orbax starts writing, then the disk is full
            partial = Path(self.directory) / "5.orbax-checkpoint-tmp-1234" / "state"
            partial.mkdir(parents=True)
            (partial / "_METADATA").write_bytes(b"{\"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    capsys.readouterr()
    assert train_main(["--resume", str(run)]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith("error: checkpoint latest/5 was not saved (No space left on device); ")
    assert " free on " in line and line.endswith("the last good checkpoint is latest/4")
    assert half_written(run) == [] and lock_is_free(run)
    assert updates(run) == [1, 2, 3, 4, 5]  # update 5 was logged; its checkpoint never finished

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)  # space is back: no hand edits
    assert train(None, run, resume=True).update == 6
    assert updates(run) == [1, 2, 3, 4, 5, 6] and half_written(run) == []


def test_a_failed_metrics_write_leaves_whole_lines_and_resume_drops_a_torn_one(stopped_run, tmp_path, capsys,
                                                                               monkeypatch):
    run = copy_run(stopped_run, tmp_path)

    def full_disk(fd, data):  # half the line reaches the disk, then it is full
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage, "_write", full_disk)
    capsys.readouterr()
    assert train_main(["--resume", str(run)]) == 1
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: {run / 'metrics.jsonl'}: the line of update 5 was not written (No space left on "
                           "device); ")
    assert line.endswith("the last good checkpoint is latest/4")
    assert updates(run) == [1, 2, 3, 4]  # the half line was cut back off
    assert sorted(p.name for p in (run / "checkpoints" / "latest").iterdir()) == ["2", "3", "4"]
    assert half_written(run) == [] and lock_is_free(run)

    monkeypatch.setattr(storage, "_write", os.write)
    with open(run / "metrics.jsonl", "a") as f:  # a torn line, as a crash mid-write by an older version leaves
        f.write('{"update": 5, "env_steps": 640, "steps_p')
    assert train(None, run, resume=True).update == 6
    assert "dropped a torn line" in capsys.readouterr().err
    assert updates(run) == [1, 2, 3, 4, 5, 6]


@pytest.fixture
def tmpfs(tmp_path):
    """A real, small file system (root only): mounted here, unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    point = tmp_path / "tmpfs"
    point.mkdir()

    def mount(size_kib: int) -> Path:
        options = f"size={size_kib}k" if not os.path.ismount(point) else f"remount,size={size_kib}k"
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        return point

    yield mount
    if os.path.ismount(point) and subprocess.run(["umount", str(point)]).returncode != 0:
        subprocess.run(["umount", "-l", str(point)])


def test_a_full_disk_stops_the_run_cleanly_and_resume_works_once_space_is_freed(stopped_run, tmpfs, capsys):
    used = storage.allocated_bytes(stopped_run)
    run = copy_run(stopped_run, tmpfs(used // 1024 + 160))  # room for a few metrics lines, not a checkpoint
    capsys.readouterr()
    assert train_main(["--resume", str(run)]) == 1
    err = capsys.readouterr().err
    [line] = error_lines(err)
    assert "Traceback" not in err and " free on " in line
    assert line.startswith("error: checkpoint latest/5 was not saved") or "metrics.jsonl: the line of" in line
    assert line.endswith("the last good checkpoint is latest/4")
    assert half_written(run) == [] and lock_is_free(run)
    assert updates(run)[:4] == [1, 2, 3, 4]

    tmpfs(used // 1024 + 8192)  # space freed
    assert train(None, run, resume=True).update == 6
    assert updates(run) == [1, 2, 3, 4, 5, 6] and half_written(run) == []


# ---- bad input at the boundary ------------------------------------------------------------------------------------

def test_zero_envs_fails_early_naming_the_key(tmp_path, capsys):
    assert train_main(["--envs", "0", "--run-dir", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert error_lines(capsys.readouterr().err) == ["error: num_envs: must be >= 1, got 0"]
    assert not (tmp_path / "run").exists()


def test_a_missing_model_path_fails_early_and_leaves_nothing_to_block_a_rerun(tmp_path, capsys):
    for _ in range(2):  # the same --run-dir again: the same message, not "already holds a run"
        assert train_main(["--llm", "/nonexistent/model", "--run-dir", str(tmp_path / "run"), *TINY_FLAGS]) == 2
        assert error_lines(capsys.readouterr().err) == [
            "error: llm: no model folder at /nonexistent/model (a local model is a folder; a hub id is NAME or "
            "ORG/NAME)"]
        assert not (tmp_path / "run").exists()


def test_bad_data_leaves_no_run_folder(tmp_path, capsys):
    assert train_main(["--data", str(tmp_path / "missing.csv"), "--run-dir", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert "missing.csv" in line and not (tmp_path / "run").exists()


def test_a_model_folder_that_does_not_load_fails_with_one_line_and_no_run_folder(tmp_path, capfd):
    """The sidecar cannot load the model (here an empty folder): the run stops before its first update, its
    folder is removed, and no sidecar or shared memory is left."""
    model = tmp_path / "not_a_model"
    model.mkdir()
    before = shm_segments()
    args = ["--llm", str(model), "--run-dir", str(tmp_path / "run"), *TINY_FLAGS, "--set", "hybrid.link.budget=4",
            "--set", "checkpoint.eval_every_updates=0"]
    assert train_main(args) == 2
    err = capfd.readouterr().err
    [line] = error_lines(err)
    assert line.startswith("error: sidecar failed while starting:") and str(model) in line
    assert "Traceback" not in err and "[llm_sidecar] cannot start the transformers backend" in err
    assert not (tmp_path / "run").exists()
    assert shm_segments() == before and children(os.getpid()) == []


@pytest.mark.parametrize("bad", BAD_ANSWERS)
def test_answers_that_no_answer_can_be_are_counted_parse_errors(bad):
    prefix = f"jxfb{os.getpid()}_"
    with SidecarClient(BridgeConfig(name_prefix=prefix)) as client:
        client.start(command=(*ECHO_PEER_COMMAND, "--bad", bad))
        client.submit([3, 5], [b"RSI 20", b"RSI 80"])
        answers = client.collect(timeout_s=10.0)
        assert answers.status.tolist() == [STATUS_PARSE_ERROR] * 2
        assert answers.keys.tolist() == [3, 5]  # the envs asked about, never an id from shared memory
        assert np.allclose(answers.probs, 1 / 6) and (answers.confidence == 0).all() and (answers.action == -1).all()
        assert all(r.startswith(b"invalid answer: ") for r in answers.reasons)
        stats = client.stats()
        assert stats["invalid_answers"] == 2 and stats["parse_error"] == 2 and stats["ok"] == 0
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


@pytest.mark.parametrize("count, length", [(-5, 3), (100, 3), (2, 10_000), (2, -1)])
def test_the_sidecar_rejects_a_header_that_does_not_fit_its_slot(count, length):
    prefix = f"jxfh{os.getpid()}_"
    with SidecarClient(BridgeConfig(name_prefix=prefix, capacity=8, max_prompt_bytes=64)) as client:
        client.start(backend="mock")
        res = client._res  # noqa: SLF001 — a corrupt or hostile writer, bypassing submit()'s own checks
        header, slot = res.request["header"], 1
        header[tp.REQ_SLOT_SEQ + slot] = -1
        res.request[f"lengths{slot}"][:2] = length
        res.request[f"prompts{slot}"][:2, :3] = np.frombuffer(b"RSI", np.uint8)
        header[tp.REQ_SLOT_COUNT + slot] = count
        header[tp.REQ_SLOT_SEQ + slot] = 1
        client._next_seq = 2  # noqa: SLF001
        res.request_signal.post()
        deadline = time.monotonic() + 10
        while client.stats()["sidecar_rejected"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.stats()["sidecar_rejected"] == 1 and client.stats()["sidecar_answered"] == 0
        assert client.alive
        client.submit([0, 1], [b"RSI 20", b"RSI 80"])  # the next honest submission is answered
        assert (client.collect(timeout_s=10.0).status == STATUS_OK).all()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_the_trainer_counts_bad_answers_as_parse_errors_and_keeps_training(tmp_path):
    from agents.advice.acting import make_acting
    from agents.advisor.query_loop import QueryLoop
    from agents.training.update import Update
    from agents.rl.ppo import make_train
    from agents.training.env_setup import make_env_setup

    cfg = load_config(None, ["num_envs=16", "ppo.num_steps=10", "ppo.num_minibatches=2", "ppo.update_epochs=1",
                             "total_steps=320", "network.actor_hidden=[16]", "network.critic_hidden=[16]",
                             "data.source=synthetic:headlines", "data.synthetic_days=30", "llm=mock",
                             "hybrid.link.budget=8", "log.progress=false", "log.tensorboard=false"])
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, make_acting(cfg.hybrid, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    before = shm_segments()
    client = SidecarClient(BridgeConfig(capacity=16)).start(command=(*ECHO_PEER_COMMAND, "--bad", "nan_probs"))
    loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, setup.market, tmp_path, client=client,
                     seed=cfg.seed, num_steps=cfg.ppo.num_steps)
    update = Update(ppo, cfg.ppo.num_steps, setup.params, loop)
    try:
        state = jax.jit(ppo.init)(jax.random.PRNGKey(0), setup.params)
        for _ in range(2):
            state, metrics = update(state)
        assert metrics["llm_parse_error"] > 0 and metrics["llm_ok"] == 0
        assert np.isfinite(metrics["policy_loss"])
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
    finally:
        loop.close()
    assert shm_segments() == before


# ---- real trainers: kills, Ctrl-C, two at once (slow) ---------------------------------------------------------------

def start_trainer(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)


def wait_for(condition, proc: subprocess.Popen | None, log: Path | None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, log.read_text()[-3000:] if log else "process ended"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def metric_count(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


LONG = [*TINY_FLAGS, "--set", "total_steps=25600", "--set", "checkpoint.eval_every_updates=0"]  # 200 updates


@pytest.mark.slow
def test_two_trainers_at_once_and_a_resume_of_a_live_run(tmp_path):
    run = tmp_path / "run"
    trainers = [start_trainer(["--run-dir", str(run), *LONG], tmp_path / "a.log")]
    time.sleep(0.1)
    trainers.append(start_trainer(["--run-dir", str(run), *LONG], tmp_path / "b.log"))
    try:
        wait_for(lambda: any(t.poll() is not None for t in trainers), None, None)
        [refused] = [i for i, t in enumerate(trainers) if t.poll() is not None]  # whichever locked second
        first = trainers[1 - refused]
        log = tmp_path / ("ab"[1 - refused] + ".log")
        assert trainers[refused].returncode == 2
        message = error_lines((tmp_path / ("ab"[refused] + ".log")).read_text())
        assert message[0].startswith(f"error: {run} is in use by PID {first.pid} on host {socket.gethostname()}")
        wait_for(lambda: (run / "checkpoints" / "latest" / "2").is_dir(), first, log)
        live = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--resume", str(run)], cwd=ROOT,
                              capture_output=True, text=True)
        assert live.returncode == 2 and f"is in use by PID {first.pid}" in error_lines(live.stderr)[0]
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(timeout=120) == 130
    finally:
        for t in trainers:
            if t.poll() is None:
                os.killpg(t.pid, signal.SIGKILL)
    lines = updates(run)
    assert lines == list(range(1, len(lines) + 1))  # one writer: every update once, in order
    assert half_written(run) == [] and lock_is_free(run)


@pytest.mark.slow
def test_ctrl_c_then_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    args = [*TINY_FLAGS, "--set", "total_steps=51200", "--set", "checkpoint.every_updates=1000",
            "--set", "checkpoint.eval_every_updates=0"]  # 400 updates
    run = tmp_path / "run"
    trainer = start_trainer(["--run-dir", str(run), *args], tmp_path / "first.log")
    try:
        wait_for(lambda: metric_count(run) >= 3, trainer, tmp_path / "first.log")
        os.killpg(trainer.pid, signal.SIGINT)
        assert trainer.wait(timeout=120) == 130
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert "checkpoint saved" in (tmp_path / "first.log").read_text() and lock_is_free(run)
    stopped = updates(run)[-1]
    assert stopped < 400
    resumed = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--resume", str(run)], cwd=ROOT,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert updates(run) == list(range(1, 401))
    straight = train(load_config(None, TINY + ["total_steps=51200", "checkpoint.every_updates=1000",
                                               "checkpoint.eval_every_updates=0"]), tmp_path / "straight")
    ckpt = RunCheckpoints(run, keep=3)
    state, _ = ckpt.restore(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), straight.state))
    ckpt.close()
    for a, b in zip(jax.tree.leaves(straight.state), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_kill_9_of_sidecar_and_trainer_leaves_nothing_and_the_run_resumes(tmp_path):
    hybrid = [*TINY_FLAGS, "--llm", "mock", "--set", "data.source=synthetic:headlines",
              "--set", "data.synthetic_days=30", "--set", "hybrid.link.budget=4", "--set", "total_steps=6400",
              "--set", "checkpoint.eval_every_updates=0", "--set", "hybrid.mock.reads=text"]
    run, log = tmp_path / "run", tmp_path / "trainer.log"
    trainer = start_trainer(["--run-dir", str(run), *hybrid], log)
    try:
        wait_for(lambda: metric_count(run) >= 2, trainer, log)
        [sidecar] = children(trainer.pid)
        os.kill(sidecar, signal.SIGKILL)  # the sidecar dies: restarted, and advice comes back
        seen = metric_count(run)
        wait_for(lambda: children(trainer.pid) not in ([], [sidecar]), trainer, log)
        wait_for(lambda: any(json.loads(line)["llm_ok"] > 0 for line in
                             (run / "metrics.jsonl").read_text().splitlines()[seen + 1:]), trainer, log)
        wait_for(lambda: (run / "checkpoints" / "latest").is_dir() and any(
            p.name.isdigit() for p in (run / "checkpoints" / "latest").iterdir()), trainer, log)
        sidecars = children(trainer.pid)
        os.kill(trainer.pid, signal.SIGKILL)  # then the trainer dies
        trainer.wait(timeout=30)
        wait_for(lambda: not shm_segments(trainer.pid) and not [p for p in sidecars if running(p)], None, None, 15)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert lock_is_free(run)  # the dead trainer's lock does not block
    resumed = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--resume", str(run)], cwd=ROOT,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert updates(run) == list(range(1, 51)) and half_written(run) == []
