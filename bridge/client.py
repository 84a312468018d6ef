"""The trainer's side of the bridge: owns the shared memory, spawns the sidecar, submits and collects."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import select
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bridge import transport as tp
from bridge.protocol import (
    NUM_ACTIONS,
    STATUS_BACKEND_ERROR,
    STATUS_NAMES,
    STATUS_NO_VIEW,
    STATUS_OK,
    STATUS_PARSE_ERROR,
    STATUS_TIMEOUT,
)  # fmt: skip

_PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
_segment_counter = itertools.count()
SIDECAR_COMMAND = ("-m", "llm_sidecar", "serve")
ECHO_PEER_COMMAND = ("-m", "bridge.echo_peer")


class SidecarError(RuntimeError):
    """The sidecar could not start, or the bridge was used out of order."""


@dataclass
class BridgeConfig:
    capacity: int = 4096  # most prompts in one submission
    max_prompt_bytes: int = 512  # bytes per prompt in the request slab
    reason_bytes: int = 512  # bytes of the model's reason kept per answer (chain-of-thought summaries are long)
    static_bytes: int = 16384  # room for the system prompts, answer prefix and sidecar options
    outcome_capacity: int = 65536  # most outcome rows sent at once (the rest are dropped and counted)
    overflow: str = "error"  # a prompt longer than max_prompt_bytes: "error" or "truncate" (counted)
    heartbeat_timeout_s: float = 10.0  # a sidecar silent this long counts as hung
    start_timeout_s: float = 600.0  # model loading included
    stop_timeout_s: float = 5.0  # grace period on close() before SIGTERM, then SIGKILL
    name_prefix: str = "jxf"  # shared-memory names: {prefix}{pid}_{counter}_{random}{q|a}
    # the sidecar's stderr is appended here (a training run's folder: its lines never break the progress bar);
    # empty: it shares the trainer's stderr, which it still has to say why it stopped if the trainer is killed
    log_file: str = ""

    def __post_init__(self):
        for name in ("capacity", "max_prompt_bytes", "reason_bytes", "static_bytes", "outcome_capacity"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"BridgeConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.overflow not in ("error", "truncate"):
            raise ValueError(f"BridgeConfig.overflow must be 'error' or 'truncate', got {self.overflow!r}")


@dataclass
class Answers:
    """Answers to one submission, in the order the prompts were submitted."""

    seq: int
    keys: np.ndarray  # int32 [n]
    probs: np.ndarray  # float32 [n, 6]; uniform where status != ok
    action: np.ndarray  # int8 [n]; the answer's action, -1 where status != ok
    confidence: np.ndarray  # float32 [n]; 0 where status != ok
    status: np.ndarray  # int8 [n]; bridge.STATUS_*
    reasons: np.ndarray  # bytes [n] ('S' dtype); the model's reason or why it failed, may be empty
    version: np.ndarray | None = None  # int32 [n]: the advisor version that gave each answer (None: one that never
    # learns, version 0)

    def __len__(self) -> int:
        return len(self.keys)

    def counts(self) -> dict[str, int]:
        """Rows per status name."""
        per_status = np.bincount(self.status.astype(np.int64), minlength=len(STATUS_NAMES))
        return {name: int(c) for name, c in zip(STATUS_NAMES, per_status)}


@dataclass
class _Submission:
    seq: int
    slot: int
    count: int
    lost: bool = False  # submitted to a sidecar that has since been replaced


@dataclass
class _Resources:
    """Everything close() releases; held apart from the client so a finalizer can release it too."""

    request: tp.Segment | None = None
    response: tp.Segment | None = None
    request_signal: tp.EventFd | None = None
    response_signal: tp.EventFd | None = None
    process: subprocess.Popen | None = None
    pidfd: int | None = None
    stop_timeout_s: float = 5.0

    def stop_process(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            if self.request is not None:
                self.request["header"][tp.REQ_STOP] = 1
                self.request_signal.post()
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if self.request is not None:
            self.request["header"][tp.REQ_STOP] = 0

    def release(self) -> None:
        self.stop_process()
        for segment in (self.request, self.response):
            if segment is not None:
                segment.close()
        for signal in (self.request_signal, self.response_signal):
            if signal is not None:
                signal.close()
        self.request = self.response = self.request_signal = self.response_signal = None


def answer_problems(status: np.ndarray, probs: np.ndarray, confidence: np.ndarray, action: np.ndarray,
                    keys: np.ndarray, submitted: np.ndarray) -> np.ndarray:
    """Why each row's answer cannot be used ('' where it can): shared memory is written by another process, so an
    answer is checked before it reaches the advice table. A status outside the known ones, or an ok row whose
    probabilities are not a finite distribution, whose confidence is not in [0, 1], whose action is out of range,
    or an ok or no-view row whose key is not the one asked about."""
    problems = np.full(len(status), "", dtype=object)
    known = (status >= -1) & (status < len(STATUS_NAMES))
    ok = status == STATUS_OK
    with np.errstate(invalid="ignore"):
        checks = (
            (~known, "unknown status"),
            (ok & ~np.isfinite(probs).all(axis=1), "non-finite probabilities"),
            (ok & ((probs < 0) | (probs > 1)).any(axis=1), "probabilities outside [0, 1]"),
            (ok & (np.abs(probs.sum(axis=1) - 1) > 1e-3), "probabilities do not sum to 1"),
            (ok & ~(np.isfinite(confidence) & (confidence >= 0) & (confidence <= 1)), "confidence outside [0, 1]"),
            (ok & ((action < 0) | (action >= NUM_ACTIONS)), "action out of range"),
            ((ok | (status == STATUS_NO_VIEW)) & (keys != submitted), "key differs from the one asked about"),
        )
    for bad, why in reversed(checks):  # the first failed check names the row
        problems[bad] = why
    return problems


class SidecarClient:
    """Submits rendered prompts to a sidecar process over shared memory and collects its answers.

    Usage:
        with SidecarClient(BridgeConfig()) as client:
            client.start(backend="mock", prompts=renderer)
            seq = client.submit(keys, renderer.render(fields, texts))
            answers = client.collect(timeout_s=1.0)
    At most two submissions may await collect(); collect() always takes the oldest.
    """

    def __init__(self, config: BridgeConfig | None = None):
        self.config = config or BridgeConfig()
        c = self.config
        base = f"{c.name_prefix}{os.getpid()}_{next(_segment_counter)}_{secrets.token_hex(3)}"
        self._res = _Resources(stop_timeout_s=c.stop_timeout_s)
        self._finalizer = weakref.finalize(self, _Resources.release, self._res)
        self._res.request = tp.Segment.create(
            base + "q", tp.request_layout(c.capacity, c.max_prompt_bytes, c.static_bytes, c.outcome_capacity))
        self._res.response = tp.Segment.create(base + "a", tp.response_layout(c.capacity, c.reason_bytes))
        self._res.request_signal = tp.EventFd()
        self._res.response_signal = tp.EventFd()
        header = self._res.request["header"]
        header[[tp.REQ_MAGIC, tp.REQ_VERSION, tp.REQ_CAPACITY, tp.REQ_PROMPT_BYTES, tp.REQ_REASON_BYTES,
                tp.REQ_STATIC_BYTES, tp.REQ_OUTCOME_CAPACITY]] = [tp.MAGIC, tp.VERSION, c.capacity, c.max_prompt_bytes,
                                                                  c.reason_bytes, c.static_bytes, c.outcome_capacity]
        self._next_seq = 1
        self._pending: deque[_Submission] = deque()
        self._command: list[str] = []  # python and the sidecar module
        self._options: list[str] = []  # backend flags
        self._outcome_batch = 0
        self._command_id = 0
        self.counters = {"submitted": 0, "truncated": 0, "restarts": 0, "outcomes_sent": 0, "outcomes_dropped": 0,
                         "invalid_answers": 0, **{name: 0 for name in STATUS_NAMES}}

    # ---- lifecycle -------------------------------------------------------------------------------------

    @property
    def segment_names(self) -> tuple[str, str]:
        return self._res.request.name, self._res.response.name

    def start(
        self,
        backend: str = "mock",
        prompts: Any = None,
        *,
        system: str | None = None,
        answer_prefix: str | None = None,
        command: Sequence[str] = SIDECAR_COMMAND,
        wait: bool = True,
        learning: dict | None = None,
        **options: Any,
    ) -> "SidecarClient":
        """Spawns `python <command>` as the sidecar and (by default) waits until it reports ready.

        `prompts` (a PromptRenderer) supplies the system prompt, answer prefix and chain-of-thought template,
        unless given directly. `learning` (a dict of llm_sidecar.learning.LearningOptions fields) turns on LoRA
        learning from the outcomes sent with send_outcomes().
        Other keyword options become command-line flags: model="smollm2", batch_size=64 → --model smollm2
        --batch-size 64; True → a bare flag. See `python -m llm_sidecar serve --help`.
        """
        if self._res.process is not None:
            raise SidecarError("sidecar already started; use restart()")
        if getattr(prompts, "action_labels", None) and "action_labels" not in options:
            options["action_labels"] = ",".join(prompts.action_labels)  # the sidecar scores the template's labels
        system = system if system is not None else getattr(prompts, "system", "")
        answer_prefix = answer_prefix if answer_prefix is not None else getattr(prompts, "answer_prefix", "Action:")
        static = json.dumps({"system": system, "answer_prefix": answer_prefix,
                             "reasoning": getattr(prompts, "reasoning", None), "learning": learning}).encode()
        if len(static) > self.config.static_bytes:
            raise ValueError(f"system prompt + answer prefix take {len(static)} bytes; raise BridgeConfig.static_bytes "
                             f"(now {self.config.static_bytes})")
        self._res.request["static"][: len(static)] = np.frombuffer(static, np.uint8)
        self._res.request["header"][tp.REQ_STATIC_LEN] = len(static)
        self._command = [sys.executable, *command]
        self._options = ["--backend", backend]
        for key, value in options.items():
            if value is None or value is False:
                continue
            flag = "--" + key.replace("_", "-")
            self._options += [flag] if value is True else [flag, str(value)]
        self._spawn()
        if wait:
            self.wait_ready()
        return self

    def _spawn(self) -> None:
        res = self._res
        res.response["header"][[tp.RESP_STATE, tp.RESP_PID, tp.RESP_HEARTBEAT_NS]] = [tp.PEER_STARTING, 0, 0]
        transport_args = [
            "--request-shm", res.request.name, "--response-shm", res.response.name,
            "--request-fd", str(res.request_signal.fd), "--response-fd", str(res.response_signal.fd),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        fds = (res.request_signal.fd, res.response_signal.fd)
        for fd in fds:
            os.set_inheritable(fd, True)
        # the child keeps its own copy of the log file
        with open(self.config.log_file, "ab") if self.config.log_file else contextlib.nullcontext() as log:
            try:
                res.process = subprocess.Popen(self._command + transport_args + self._options, pass_fds=fds,
                                               env=env, stderr=log)
            finally:
                for fd in fds:
                    os.set_inheritable(fd, False)
        res.pidfd = os.pidfd_open(res.process.pid)

    @property
    def _command_line(self) -> str:
        return " ".join(self._command[1:] + self._options)

    def _said(self) -> str:
        """Where the sidecar said why it failed: its log's last lines, or its stderr above."""
        if not self.config.log_file:
            return "see its stderr above"
        try:  # it says why, then exits: its last line is written once it has exited
            if self._res.process is not None:
                self._res.process.wait(self.config.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            tail = Path(self.config.log_file).read_text(errors="replace").splitlines()[-5:]
        except OSError:
            tail = []
        return f"{self.config.log_file} ends: " + " | ".join(tail) if tail else f"see {self.config.log_file}"

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Blocks until the sidecar reports ready; raises SidecarError if it exits or times out first."""
        timeout_s = self.config.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        header = self._res.response["header"]
        while header[tp.RESP_STATE] != tp.PEER_READY:
            if header[tp.RESP_STATE] == tp.PEER_FAILED:  # it said why on its stderr, then exited (or is exiting)
                raise SidecarError(f"sidecar failed while starting: {self._command_line} ({self._said()})")
            if self._res.process is None or self._res.process.poll() is not None:
                code = None if self._res.process is None else self._res.process.returncode
                raise SidecarError(f"sidecar exited with code {code} before it was ready: {self._command_line} "
                                   f"({self._said()})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SidecarError(f"sidecar not ready after {timeout_s:.0f} s: {self._command_line}")
            self._wait_signal(min(remaining, 0.5))

    def restart(self, wait: bool = True) -> None:
        """Replaces the sidecar (dead or not). Pending submissions are reported as backend_error."""
        if not self._command:
            raise SidecarError("restart() before start()")
        self._res.stop_process()
        for submission in self._pending:
            submission.lost = True
        self._res.request["header"][tp.REQ_ABANDONED] = self._next_seq - 1
        # The new peer starts from the response header's marks: nothing of the old exchanges is pending for it.
        header = self._res.response["header"]
        header[tp.RESP_OUTCOMES_TAKEN] = self._outcome_batch
        header[tp.RESP_REPLY_ID] = self._command_id
        self.counters["restarts"] += 1
        self._spawn()
        if wait:
            self.wait_ready()

    @property
    def sidecar_pid(self) -> int | None:
        return None if self._res.process is None else self._res.process.pid

    @property
    def alive(self) -> bool:
        """The sidecar process runs, reported ready and has a fresh heartbeat."""
        return self._down_reason() == ""

    def _down_reason(self) -> str:
        proc = self._res.process
        if proc is None:
            return "sidecar not started"
        if proc.poll() is not None:
            return f"sidecar exited with code {proc.returncode}"
        header = self._res.response["header"]
        if header[tp.RESP_STATE] != tp.PEER_READY:
            return "sidecar not ready"
        age = (time.monotonic_ns() - int(header[tp.RESP_HEARTBEAT_NS])) / 1e9
        if age > self.config.heartbeat_timeout_s:
            return f"sidecar heartbeat {age:.1f} s old"
        return ""

    def close(self) -> None:
        """Stops the sidecar and unlinks the shared memory. Safe to call twice."""
        self._finalizer()

    def __enter__(self) -> "SidecarClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- requests and answers --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Submissions awaiting collect()."""
        return len(self._pending)

    @property
    def oldest_done(self) -> bool:
        """collect() would not wait: the oldest pending submission is all answered, or the sidecar is down."""
        sub = self._pending[0]
        if sub.lost or (self._res.response[f"row_seq{sub.slot}"][: sub.count] == sub.seq).all():
            return True
        return self._down_reason() != ""

    def submit(self, keys: np.ndarray | Sequence[int], prompts: np.ndarray | Sequence[bytes | str],
               think: np.ndarray | Sequence[bool] | None = None) -> int:
        """Copies prompts into the request slab and signals the sidecar; never waits. Returns the seq.
        `think` marks rows to answer with chain of thought (generate mode) instead of the sidecar's usual mode."""
        if self._res.request is None:
            raise SidecarError("submit() after close()")
        if len(self._pending) >= tp.NUM_SLOTS:
            raise SidecarError(f"{len(self._pending)} submissions already await collect(); collect one first")
        matrix, lengths = self._pack(prompts)
        keys = np.asarray(keys, dtype=np.int32)
        n = len(lengths)
        if keys.shape != (n,):
            raise ValueError(f"keys has shape {keys.shape} but there are {n} prompts")
        if n > self.config.capacity:
            raise ValueError(f"{n} prompts exceed BridgeConfig.capacity={self.config.capacity}")
        seq = self._next_seq
        self._next_seq += 1
        slot = seq % tp.NUM_SLOTS
        req = self._res.request
        header = req["header"]
        header[tp.REQ_SLOT_SEQ + slot] = -1  # seqlock: being written
        req[f"keys{slot}"][:n] = keys
        req[f"lengths{slot}"][:n] = lengths
        req[f"prompts{slot}"][:n, : matrix.shape[1]] = matrix
        req[f"think{slot}"][:n] = 0 if think is None else np.asarray(think, dtype=bool)
        header[tp.REQ_SLOT_COUNT + slot] = n
        header[tp.REQ_SLOT_SEQ + slot] = seq
        self._res.request_signal.post()
        self._pending.append(_Submission(seq=seq, slot=slot, count=n))
        self.counters["submitted"] += n
        return seq

    def _pack(self, prompts) -> tuple[np.ndarray, np.ndarray]:
        """Prompts as a uint8 matrix [n, <= max_prompt_bytes] and their byte lengths, applying the overflow rule."""
        if not isinstance(prompts, np.ndarray):
            prompts = [p.encode("utf-8") if isinstance(p, str) else p for p in prompts]
            prompts = np.array(prompts, dtype="S") if prompts else np.zeros(0, dtype="S1")
        if prompts.dtype.kind != "S" or prompts.ndim != 1:
            raise TypeError(f"prompts must be a 1-D bytes array or a sequence of bytes/str, got {prompts.dtype} "
                            f"with shape {prompts.shape}")
        lengths = np.strings.str_len(prompts).astype(np.int32)
        limit = self.config.max_prompt_bytes
        too_long = lengths > limit
        if too_long.any():
            if self.config.overflow == "error":
                first = int(np.argmax(too_long))
                raise ValueError(f"{int(too_long.sum())} prompt(s) exceed BridgeConfig.max_prompt_bytes={limit} "
                                 f"(prompt {first} has {int(lengths[first])} bytes); shorten the template or set "
                                 f"overflow='truncate'")
            self.counters["truncated"] += int(too_long.sum())
            lengths = np.minimum(lengths, limit)
        width = prompts.dtype.itemsize
        matrix = np.ascontiguousarray(prompts).view(np.uint8).reshape(len(prompts), width)
        return matrix[:, :limit], lengths

    def collect(self, timeout_s: float | None = None) -> Answers:
        """Answers to the oldest pending submission, waiting at most timeout_s (None = until all answered).

        Rows not answered in time are status timeout; if the sidecar is dead or hung, backend_error.
        A timed-out submission is abandoned: the sidecar skips what it has not started.
        """
        if not self._pending:
            raise SidecarError("collect() without a pending submission")
        sub = self._pending[0]
        resp = self._res.response
        row_seq = resp[f"row_seq{sub.slot}"][: sub.count]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        failure = "sidecar was restarted" if sub.lost else ""
        while not failure:
            done = row_seq == sub.seq
            if done.all():
                break
            failure = self._down_reason()
            if failure:
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            # Wake at least every second to notice a hung sidecar through its heartbeat.
            self._wait_signal(1.0 if remaining is None else min(remaining, 1.0))
        answers = self._read(sub)
        missing = answers.status < 0
        if missing.any():
            answers.status[missing] = STATUS_BACKEND_ERROR if failure else STATUS_TIMEOUT
            answers.reasons[missing] = (failure or "timeout").encode()[: self.config.reason_bytes]
            answers.keys[missing] = self._res.request[f"keys{sub.slot}"][: sub.count][missing]
            header = self._res.request["header"]
            header[tp.REQ_ABANDONED] = max(int(header[tp.REQ_ABANDONED]), sub.seq)
        self._pending.popleft()
        for name, count in answers.counts().items():
            self.counters[name] += count
        return answers

    def _read(self, sub: _Submission) -> Answers:
        """The slot's answers, copied out; a row answered ok but holding values no answer can have (see
        `answer_problems`) becomes a parse error, counted in `invalid_answers`."""
        resp = self._res.response
        s, n = sub.slot, sub.count
        done = resp[f"row_seq{s}"][:n] == sub.seq
        if sub.lost:
            done[:] = False
        status = np.where(done, resp[f"status{s}"][:n], -1).astype(np.int8)
        reason_width = self.config.reason_bytes
        reasons = np.ascontiguousarray(resp[f"reasons{s}"][:n]).view(f"S{reason_width}").ravel().copy()
        reasons[~done] = b""
        keys = resp[f"keys{s}"][:n].copy()
        submitted = self._res.request[f"keys{s}"][:n]
        problems = answer_problems(status, resp[f"probs{s}"][:n], resp[f"confidence{s}"][:n], resp[f"action{s}"][:n],
                                   keys, submitted)
        invalid = problems != ""
        if invalid.any():
            status[invalid] = STATUS_PARSE_ERROR
            reasons[invalid] = [f"invalid answer: {why}".encode()[:reason_width] for why in problems[invalid]]
            keys[invalid] = submitted[invalid]
            self.counters["invalid_answers"] += int(invalid.sum())
        ok = status == STATUS_OK
        return Answers(
            seq=sub.seq,
            keys=keys,
            probs=np.where(ok[:, None], resp[f"probs{s}"][:n], np.float32(1.0 / NUM_ACTIONS)).astype(np.float32),
            action=np.where(ok, resp[f"action{s}"][:n], -1).astype(np.int8),
            confidence=np.where(ok, resp[f"confidence{s}"][:n], 0).astype(np.float32),
            status=status,
            reasons=reasons,
            version=resp[f"version{s}"][:n].astype(np.int32),
        )

    def _wait_signal(self, timeout_s: float) -> None:
        """Sleeps until the sidecar signals, exits, or timeout_s passes."""
        poller = select.poll()
        poller.register(self._res.response_signal.fd, select.POLLIN)
        if self._res.pidfd is not None:
            poller.register(self._res.pidfd, select.POLLIN)
        for fd, _ in poller.poll(max(0, int(timeout_s * 1000 + 0.999))):
            if fd == self._res.response_signal.fd:
                try:
                    os.eventfd_read(fd)
                except BlockingIOError:
                    pass

    # ---- outcomes and commands (the sidecar's learning) -----------------------------------------------

    def send_outcomes(self, rows: dict[str, np.ndarray], wait_s: float = 0.0) -> int:
        """Writes one batch of outcome rows (columns named as bridge.transport.OUTCOME_FIELDS) for the sidecar
        and signals it; never blocks longer than `wait_s`. If the sidecar has not yet taken the previous batch,
        or the rows exceed BridgeConfig.outcome_capacity, rows are dropped and counted. Returns rows sent."""
        if self._res.request is None:
            raise SidecarError("send_outcomes() after close()")
        missing = [name for name, _ in tp.OUTCOME_FIELDS if name not in rows]
        if missing:
            raise ValueError(f"outcome rows lack column(s) {missing}")
        n = len(rows["seq"])
        header, taken = self._res.request["header"], self._res.response["header"]
        deadline = time.monotonic() + wait_s
        while taken[tp.RESP_OUTCOMES_TAKEN] < self._outcome_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.alive:
                self.counters["outcomes_dropped"] += n
                return 0
            self._wait_signal(min(remaining, 0.5))
        keep = min(n, self.config.outcome_capacity)
        self.counters["outcomes_dropped"] += n - keep
        header[tp.REQ_OUTCOME_BATCH] = -1
        for name, dtype in tp.OUTCOME_FIELDS:
            self._res.request[f"outcome_{name}"][:keep] = np.asarray(rows[name][:keep], dtype=dtype)
        header[tp.REQ_OUTCOME_COUNT] = keep
        self._outcome_batch += 1
        header[tp.REQ_OUTCOME_BATCH] = self._outcome_batch
        self._res.request_signal.post()
        self.counters["outcomes_sent"] += keep
        return keep

    def command(self, op: str, timeout_s: float = 60.0, **args: Any) -> dict:
        """Sends a JSON command ({"op": op, **args}) and waits for the sidecar's JSON reply, which it gives
        between answering batches. Raises SidecarError if the sidecar is down, replies with an error, or is
        silent for timeout_s."""
        if self._res.request is None:
            raise SidecarError("command() after close()")
        data = json.dumps({"op": op, **args}).encode()
        if len(data) > tp.COMMAND_BYTES:
            raise ValueError(f"command {op!r} takes {len(data)} bytes, more than {tp.COMMAND_BYTES}")
        header, resp = self._res.request["header"], self._res.response["header"]
        self._command_id += 1
        header[tp.REQ_COMMAND_ID] = -1
        self._res.request["command"][: len(data)] = np.frombuffer(data, np.uint8)
        header[tp.REQ_COMMAND_LEN] = len(data)
        header[tp.REQ_COMMAND_ID] = self._command_id
        self._res.request_signal.post()
        deadline = time.monotonic() + timeout_s
        while resp[tp.RESP_REPLY_ID] != self._command_id:
            failure = self._down_reason()
            if failure:
                raise SidecarError(f"command {op!r}: {failure}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SidecarError(f"command {op!r}: no reply within {timeout_s:.0f} s")
            self._wait_signal(min(remaining, 0.5))
        reply = json.loads(bytes(self._res.response["reply"][: int(resp[tp.RESP_REPLY_LEN])]))
        if "error" in reply:
            raise SidecarError(f"command {op!r} failed in the sidecar: {reply['error']}")
        return reply

    def stats(self) -> dict[str, int]:
        """Client counters (rows per status, truncations, restarts) and the sidecar's (cache, tokens)."""
        header = self._res.response["header"]
        return {
            **self.counters,
            "cache_hits": int(header[tp.RESP_CACHE_HITS]),
            "cache_misses": int(header[tp.RESP_CACHE_MISSES]),
            "sidecar_answered": int(header[tp.RESP_ANSWERED]),
            "sidecar_parse_errors": int(header[tp.RESP_PARSE_ERRORS]),
            "sidecar_rejected": int(header[tp.RESP_REJECTED]),
            "prompt_tokens": int(header[tp.RESP_PROMPT_TOKENS]),
        }
