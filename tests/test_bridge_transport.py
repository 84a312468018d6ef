"""The shared-memory transport: round trip, overflow, timeout, stale answers, crash and restart, hangs,
and no shared-memory segment left behind after a normal stop, a Ctrl-C or a killed parent."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from bridge import (
    ECHO_PEER_COMMAND,
    STATUS_BACKEND_ERROR,
    STATUS_NO_VIEW,
    STATUS_OK,
    STATUS_PARSE_ERROR,
    STATUS_TIMEOUT,
    BridgeConfig,
    SidecarClient,
    SidecarError,
)  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
_counter = iter(range(10**6))


def unique_prefix() -> str:
    """Shared-memory names unique to this test process and test, so parallel runs never collide."""
    return f"jxft{os.getpid()}x{next(_counter)}_"


def shm_names(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def config(**overrides) -> BridgeConfig:
    return BridgeConfig(name_prefix=unique_prefix(), **overrides)


def distinct_prompts(n: int, width: int, salt: int = 0) -> np.ndarray:
    """n prompts of exactly `width` bytes, each starting with its own index."""
    heads = np.array([b"p%d-%07d|" % (salt, i) for i in range(n)])
    return np.strings.ljust(heads, width, b"x")


def test_round_trip_4096_prompts_of_512_bytes():
    with SidecarClient(config(capacity=4096, max_prompt_bytes=512, reason_bytes=32)) as client:
        client.start(command=ECHO_PEER_COMMAND)
        prompts = distinct_prompts(4096, 512)
        keys = np.arange(4096, dtype=np.int32)[::-1].copy()
        for round_ in range(3):
            seq = client.submit(keys, prompts)
            answers = client.collect(timeout_s=5.0)
            assert answers.seq == seq == round_ + 1
            assert (answers.status == STATUS_OK).all()
            assert (answers.keys == keys).all()
            assert np.allclose(answers.probs.sum(axis=1), 1.0)
            # the echo peer returns each prompt's first bytes as the reason: every row went through intact
            assert (answers.reasons == np.array([p[:32] for p in prompts])).all()
        assert client.stats()["ok"] == 3 * 4096


def test_prompts_longer_than_the_slab_are_an_error_or_counted_truncations():
    long_prompts = [b"a" * 10, b"b" * 40, "ünïcode".encode() * 2]
    with SidecarClient(config(max_prompt_bytes=16, capacity=4)) as client:
        client.start(command=ECHO_PEER_COMMAND)
        with pytest.raises(ValueError, match="max_prompt_bytes=16.*prompt 1 has 40 bytes"):
            client.submit([0, 1, 2], long_prompts)
        with pytest.raises(ValueError, match="capacity=4"):
            client.submit(np.arange(5), [b"x"] * 5)
        assert client.pending == 0  # a refused submission leaves nothing behind
    with SidecarClient(config(max_prompt_bytes=16, overflow="truncate")) as client:
        client.start(command=ECHO_PEER_COMMAND)
        client.submit([0, 1, 2], long_prompts)
        answers = client.collect(timeout_s=5.0)
        assert answers.reasons.tolist() == [b"a" * 10, b"b" * 16, ("ünïcode".encode() * 2)[:16]]
        assert client.stats()["truncated"] == 2


def test_a_no_view_answer_is_accepted_but_only_for_the_env_asked_about():
    """A no-view row carries no distribution to check, but it is written to its env's advice: its key must be the
    one asked about, as an ok row's. Errors and unknown statuses are refused as before."""
    from bridge.client import answer_problems

    uniform = np.full((4, 6), 1 / 6, np.float32)
    status = np.array([STATUS_NO_VIEW, STATUS_NO_VIEW, STATUS_PARSE_ERROR, 9], np.int8)
    problems = answer_problems(status, uniform, np.zeros(4, np.float32), np.full(4, -1, np.int8),
                               keys=np.array([3, 7, 8, 5]), submitted=np.array([3, 5, 5, 5]))
    assert problems.tolist() == ["", "key differs from the one asked about", "", "unknown status"]


def test_unanswered_rows_time_out_and_late_answers_are_never_taken_as_new():
    with SidecarClient(config()) as client:
        client.start(command=ECHO_PEER_COMMAND, delay_s=0.3)
        first = client.submit([7, 8], [b"first-a", b"first-b"])
        t0 = time.monotonic()
        answers = client.collect(timeout_s=0.05)
        assert time.monotonic() - t0 < 0.25
        assert answers.seq == first and (answers.status == STATUS_TIMEOUT).all()
        assert (answers.keys == [7, 8]).all() and np.allclose(answers.probs, 1 / 6)
        time.sleep(0.45)  # the peer now writes its late answers to `first` into that slot
        client.submit([1], [b"second"])
        assert client.collect(timeout_s=5.0).reasons.tolist() == [b"second"]
        third = client.submit([3, 4], [b"third-a", b"third-b"])  # reuses the slot holding the late answers
        answers = client.collect(timeout_s=0.0)
        assert answers.seq == third and (answers.status == STATUS_TIMEOUT).all()
        assert b"first" not in b"".join(answers.reasons.tolist())
        assert client.stats()["timeout"] == 4


def test_two_submissions_may_await_collect_but_not_three():
    with SidecarClient(config()) as client:
        client.start(command=ECHO_PEER_COMMAND)
        with pytest.raises(SidecarError, match="without a pending submission"):
            client.collect(0.0)
        client.submit([0], [b"q"])
        client.submit([1], [b"q+1"])
        with pytest.raises(SidecarError, match="2 submissions already await"):
            client.submit([2], [b"q+2"])
        assert client.collect(5.0).reasons.tolist() == [b"q"]  # oldest first
        assert client.collect(5.0).reasons.tolist() == [b"q+1"]


def test_a_crashed_sidecar_gives_backend_errors_and_can_be_restarted():
    with SidecarClient(config()) as client:
        client.start(backend="mock", crash_after=40, batch_size=16)
        client.submit(np.arange(32), [b"RSI %d" % i for i in range(32)])
        assert (client.collect(timeout_s=10.0).status == STATUS_OK).all()
        client.submit(np.arange(32), [b"ADX %d" % i for i in range(32)])  # dies after 8 more prompts
        answers = client.collect(timeout_s=10.0)
        assert not client.alive
        assert (answers.status == STATUS_BACKEND_ERROR).sum() == 32 and b"code 70" in answers.reasons[0]
        client.submit([5], [b"while down"])
        assert client.collect(timeout_s=10.0).status.tolist() == [STATUS_BACKEND_ERROR]
        client.restart()
        assert client.alive
        client.submit(np.arange(4), [b"RSI 20", b"RSI 80", b"RSI 50", b"ADX 10"])
        answers = client.collect(timeout_s=10.0)
        assert (answers.status == STATUS_OK).all() and answers.action.tolist()[:2] == [1, 2]
        assert client.stats()["restarts"] == 1


def test_a_hung_sidecar_is_detected_by_its_heartbeat():
    with SidecarClient(config(heartbeat_timeout_s=0.5)) as client:
        client.start(command=ECHO_PEER_COMMAND)
        os.kill(client.sidecar_pid, signal.SIGSTOP)
        try:
            client.submit([0], [b"anyone there?"])
            t0 = time.monotonic()
            answers = client.collect(timeout_s=10.0)
            assert time.monotonic() - t0 < 3.0
            assert answers.status.tolist() == [STATUS_BACKEND_ERROR] and b"heartbeat" in answers.reasons[0]
        finally:
            os.kill(client.sidecar_pid, signal.SIGCONT)


def test_a_sidecar_outlives_ctrl_c_until_its_client_stops_it():
    """Ctrl-C reaches the whole process group; the sidecar ignores it and keeps answering, so the trainer can
    finish its update and have its advisor save an adapter before it stops the sidecar itself."""
    cfg = config()
    client = SidecarClient(cfg).start(backend="mock")
    pid = client.sidecar_pid
    try:
        os.kill(pid, signal.SIGINT)
        time.sleep(0.3)
        assert _process_exists(pid)
        client.submit([0], [b"RSI 25 flat"])
        assert client.collect(timeout_s=10.0).status.tolist() == [STATUS_OK]
    finally:
        client.close()
    assert shm_names(cfg.name_prefix) == [] and not _process_exists(pid)


def test_normal_stop_unlinks_every_segment():
    cfg = config()
    client = SidecarClient(cfg).start(backend="mock")
    assert len(shm_names(cfg.name_prefix)) == 2
    pid = client.sidecar_pid
    client.close()
    client.close()  # idempotent
    assert shm_names(cfg.name_prefix) == []
    assert not _process_exists(pid)


TRAINER_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    # Ctrl-C as from a terminal, even when the tests run as a shell's background job (which ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from bridge import BridgeConfig, SidecarClient
    client = SidecarClient(BridgeConfig(name_prefix=sys.argv[1])).start(backend="mock")
    print(client.sidecar_pid, flush=True)
    try:
        while True:
            client.submit([0], [b"RSI 50"]); client.collect(1.0); time.sleep(0.01)
    except KeyboardInterrupt:
        client.close()  # what a trainer's `with` block does on Ctrl-C
""")


@pytest.mark.parametrize("how", ["ctrl_c", "kill_parent"])
def test_no_segment_survives_ctrl_c_or_a_killed_parent(tmp_path, how):
    prefix = unique_prefix()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    stderr = open(tmp_path / "stderr.txt", "w+")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen([sys.executable, str(script), prefix], stdout=subprocess.PIPE, stderr=stderr,
                               env=env, start_new_session=True, text=True)
    try:
        sidecar_pid = int(trainer.stdout.readline())
        assert len(shm_names(prefix)) == 2
        if how == "ctrl_c":
            os.killpg(trainer.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
        else:
            os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=15)
        deadline = time.monotonic() + 10
        while (shm_names(prefix) or _process_exists(sidecar_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shm_names(prefix) == []
        assert not _process_exists(sidecar_pid), "orphaned sidecar"
        if how == "kill_parent":
            stderr.seek(0)
            assert "parent process is gone" in stderr.read()  # the sidecar itself cleaned up
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) has left nothing running
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"
