"""Shared-memory slabs and eventfd semaphores between the trainer (client) and the sidecar (peer).

Two segments, both created and unlinked by the client:
  request  — header, the static text (system prompt, answer prefix, options), two request slots, the outcome
             slab (what happened after answered queries, for the sidecar's learning) and a command area;
  response — header (state, pid, heartbeat, counters), two answer slots and the reply to the last command.
Submission `seq` uses slot `seq % 2`, so the trainer can submit step q while step q-1 is still being answered
(docs/design.md's one-step latency). Each answer row carries the seq it answers: a row is taken by collect() only
when its seq matches, so an answer to an older submission is never taken for a newer one.

Signalling uses two Linux eventfds (a kernel counter that works as a semaphore): the client posts the request
fd after each submit, the peer posts the response fd after each answered micro-batch. They are handed to
the peer process as inherited file descriptors, so no named kernel objects can leak.

Slot writes follow a seqlock: the writer sets the slot's seq to -1, writes, then sets the real seq; the
reader copies the slot and accepts the copy only if the seq was the same before and after.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from bridge.protocol import NUM_ACTIONS

MAGIC = 0x4A58464252494447  # "JXFBRIDG"
VERSION = 4
NUM_SLOTS = 2
_ALIGN = 64

# Request header (int64 words).
REQ_MAGIC, REQ_VERSION, REQ_CAPACITY, REQ_PROMPT_BYTES, REQ_REASON_BYTES, REQ_STATIC_BYTES = range(6)
REQ_STATIC_LEN = 6  # bytes used in the static-text area
REQ_ABANDONED = 7  # submissions with seq <= this are no longer wanted (timed out or before a restart)
REQ_STOP = 8  # 1 = peer should exit
REQ_SLOT_SEQ = 9  # two words: the seq held by each slot (-1 while being written, 0 = empty)
REQ_SLOT_COUNT = 11  # two words: prompts in each slot
REQ_OUTCOME_CAPACITY = 13  # rows of the outcome slab
REQ_OUTCOME_BATCH = 14  # id of the outcome batch in the slab (-1 while being written, 0 = none yet)
REQ_OUTCOME_COUNT = 15  # rows in that batch
REQ_COMMAND_ID = 16  # id of the command in the command area (-1 while being written, 0 = none yet)
REQ_COMMAND_LEN = 17
REQ_HEADER_WORDS = 32
COMMAND_BYTES = 8192  # a JSON command, e.g. {"op": "save", "path": ...}
REPLY_BYTES = 65536  # the JSON reply (learning statistics can list many rounds)

# Response header (int64 words).
RESP_STATE = 0  # PEER_STARTING / PEER_READY / PEER_STOPPED / PEER_FAILED
RESP_PID = 1
RESP_HEARTBEAT_NS = 2  # time.monotonic_ns() of the peer's last heartbeat
RESP_CACHE_HITS = 3
RESP_CACHE_MISSES = 4
RESP_ANSWERED = 5  # rows answered since start, all statuses
RESP_PARSE_ERRORS = 6
RESP_PROMPT_TOKENS = 7  # tokens of prompts sent through the model (0 for backends without tokens)
RESP_OUTCOMES_TAKEN = 8  # id of the last outcome batch the peer copied out (the client may then overwrite it)
RESP_REPLY_ID = 9  # id of the command the reply answers (-1 while being written)
RESP_REPLY_LEN = 10
RESP_REJECTED = 11  # submissions refused because their header does not fit the slot (count or prompt lengths)
RESP_HEADER_WORDS = 16

PEER_STARTING, PEER_READY, PEER_STOPPED, PEER_FAILED = 0, 1, 2, 3


def _layout(fields: list[tuple[str, np.dtype, tuple[int, ...]]]) -> tuple[dict[str, tuple[int, np.dtype, tuple]], int]:
    """Offsets of named arrays laid out one after another, each aligned to a cache line."""
    offsets, offset = {}, 0
    for name, dtype, shape in fields:
        offset = -(-offset // _ALIGN) * _ALIGN
        offsets[name] = (offset, np.dtype(dtype), shape)
        offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return offsets, max(offset, 1)


def request_layout(capacity: int, prompt_bytes: int, static_bytes: int, outcome_capacity: int):
    fields = [("header", np.int64, (REQ_HEADER_WORDS,)), ("static", np.uint8, (static_bytes,))]
    for s in range(NUM_SLOTS):
        fields += [
            (f"keys{s}", np.int32, (capacity,)),
            (f"lengths{s}", np.int32, (capacity,)),
            (f"think{s}", np.int8, (capacity,)),  # 1 = answer this row with chain of thought
            (f"prompts{s}", np.uint8, (capacity, prompt_bytes)),
        ]
    fields += [(f"outcome_{name}", dtype, (outcome_capacity,)) for name, dtype in OUTCOME_FIELDS]
    fields += [("command", np.uint8, (COMMAND_BYTES,))]
    return _layout(fields)


# One row per answered query: which answer (submission seq and row), and the market's move after it.
OUTCOME_FIELDS = (
    ("seq", np.int64),
    ("row", np.int32),
    ("move", np.float32),  # the market's move over the following hybrid.learning.move_bars bars, in ATRs; NaN if
    # the rollout ended (or the env's episode did) before them
)


def response_layout(capacity: int, reason_bytes: int):
    fields = [("header", np.int64, (RESP_HEADER_WORDS,))]
    for s in range(NUM_SLOTS):
        fields += [
            (f"row_seq{s}", np.int64, (capacity,)),
            (f"keys{s}", np.int32, (capacity,)),
            (f"action{s}", np.int8, (capacity,)),
            (f"status{s}", np.int8, (capacity,)),
            (f"confidence{s}", np.float32, (capacity,)),
            (f"version{s}", np.int32, (capacity,)),  # the advisor version that answered (LoRA rounds adopted)
            (f"probs{s}", np.float32, (capacity, NUM_ACTIONS)),
            (f"reason_len{s}", np.int32, (capacity,)),
            (f"reasons{s}", np.uint8, (capacity, reason_bytes)),
        ]
    fields += [("reply", np.uint8, (REPLY_BYTES,))]
    return _layout(fields)


class Segment:
    """A shared-memory segment with named numpy views over it."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: dict, owner: bool):
        self.shm = shm
        self.name = shm.name
        self.owner = owner
        self.views = {
            name: np.ndarray(shape, dtype, buffer=shm.buf, offset=offset) for name, (offset, dtype, shape) in layout.items()
        }

    @classmethod
    def create(cls, name: str, layout_and_size) -> "Segment":
        layout, size = layout_and_size
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        np.frombuffer(shm.buf, np.uint8)[:] = 0
        return cls(shm, layout, owner=True)

    @classmethod
    def attach(cls, name: str, layout_and_size) -> "Segment":
        layout, _ = layout_and_size
        return cls(attach_untracked(name), layout, owner=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.views[name]

    def close(self) -> None:
        """Drops the views and the mapping; the owner (the client) also unlinks the name."""
        self.views = {}  # numpy views pin the buffer; they must go before the mapping can close
        try:
            self.shm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes when that view does
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


def attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attaches to an existing segment without letting this process's resource tracker unlink it at exit.

    Python < 3.13 registers attached segments with the resource tracker, which would unlink them when
    the peer exits — the client could then not restart a crashed peer on the same segments.
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    shm = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 — the public API has no switch before 3.13
    return shm


def unlink_by_name(name: str) -> None:
    """Removes a segment's name without attaching (used by a peer whose client died).

    POSIX shared memory lives in /dev/shm on Linux, the only platform the eventfd signalling supports.
    """
    try:
        os.unlink(os.path.join("/dev/shm", name.lstrip("/")))
    except FileNotFoundError:
        pass


class EventFd:
    """A Linux eventfd used as a counting signal: post() adds one, wait() drains the count or times out."""

    def __init__(self, fd: int | None = None):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if fd is None else fd
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)

    def post(self) -> None:
        os.eventfd_write(self.fd, 1)

    def wait(self, timeout_s: float | None) -> bool:
        """True if signalled within timeout_s (None = forever); consumes all pending posts."""
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999))
        if not self._poll.poll(ms):
            return False
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            return False  # another reader drained it first
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


@dataclass
class Request:
    """One submission as copied out of shared memory by the peer."""

    seq: int
    slot: int
    keys: np.ndarray  # int32 [n]
    lengths: np.ndarray  # int32 [n]
    prompts: np.ndarray  # uint8 [n, prompt_bytes], NUL padded
    think: np.ndarray  # bool [n]: answer with chain of thought

    def texts(self) -> list[str]:
        return [bytes(row[:length]).decode("utf-8", errors="replace") for row, length in zip(self.prompts, self.lengths)]

    def __len__(self) -> int:
        return len(self.keys)


class PeerEndpoint:
    """The sidecar's side of the bridge: take requests, write answers, heartbeat."""

    def __init__(self, request_name: str, response_name: str, request_fd: int, response_fd: int):
        probe = attach_untracked(request_name)
        header = np.ndarray((REQ_HEADER_WORDS,), np.int64, buffer=probe.buf)
        if header[REQ_MAGIC] != MAGIC or header[REQ_VERSION] != VERSION:
            raise RuntimeError(f"shared memory {request_name!r} is not a bridge request segment of version {VERSION}")
        self.capacity, self.prompt_bytes = int(header[REQ_CAPACITY]), int(header[REQ_PROMPT_BYTES])
        self.reason_bytes, static_bytes = int(header[REQ_REASON_BYTES]), int(header[REQ_STATIC_BYTES])
        outcome_capacity = int(header[REQ_OUTCOME_CAPACITY])
        del header
        probe.close()
        self.request = Segment.attach(request_name,
                                      request_layout(self.capacity, self.prompt_bytes, static_bytes, outcome_capacity))
        self.response = Segment.attach(response_name, response_layout(self.capacity, self.reason_bytes))
        self.request_signal = EventFd(request_fd)
        self.response_signal = EventFd(response_fd)
        self.last_taken = int(self.request["header"][REQ_ABANDONED])
        self.last_outcomes = int(self.response["header"][RESP_OUTCOMES_TAKEN])
        self.last_command = int(self.response["header"][RESP_REPLY_ID])
        self.version = 0  # the advisor version answering now: written with every answer (the server keeps it)
        self.response["header"][RESP_PID] = os.getpid()
        self.heartbeat()

    def static_text(self) -> bytes:
        return bytes(self.request["static"][: self.request["header"][REQ_STATIC_LEN]])

    def heartbeat(self) -> None:
        """Stamps the heartbeat; a no-op once the endpoint is closed (the heartbeat thread may outlive it)."""
        header = self.response.views.get("header")
        if header is not None:
            header[RESP_HEARTBEAT_NS] = time.monotonic_ns()

    def set_state(self, state: int) -> None:
        self.response["header"][RESP_STATE] = state

    def add_counter(self, word: int, amount: int) -> None:
        self.response["header"][word] += amount

    @property
    def stop_requested(self) -> bool:
        return bool(self.request["header"][REQ_STOP])

    def abandoned(self, seq: int) -> bool:
        return seq <= self.request["header"][REQ_ABANDONED]

    def wait_request(self, timeout_s: float | None) -> Request | None:
        """The oldest submission not yet taken and still wanted; None after timeout_s without one, or as soon as
        the client signals something else (outcomes, a command), so the caller can look at it."""
        request = self._take_next()
        if request is None and not self.stop_requested and self.request_signal.wait(timeout_s):
            request = self._take_next()
        return request

    def _take_next(self) -> Request | None:
        header = self.request["header"]
        floor = max(self.last_taken, int(header[REQ_ABANDONED]))
        candidates = sorted((int(header[REQ_SLOT_SEQ + s]), s) for s in range(NUM_SLOTS))
        for seq, slot in candidates:
            if seq <= floor:
                continue
            n = int(header[REQ_SLOT_COUNT + slot])
            # Never trust a count or length read from shared memory to index the slot: check the copies.
            request = None if not 0 <= n <= self.capacity else Request(
                seq=seq,
                slot=slot,
                keys=self.request[f"keys{slot}"][:n].copy(),
                lengths=self.request[f"lengths{slot}"][:n].copy(),
                prompts=self.request[f"prompts{slot}"][:n].copy(),
                think=self.request[f"think{slot}"][:n] != 0,
            )
            if header[REQ_SLOT_SEQ + slot] != seq:  # rewritten while we copied: look again
                return self._take_next()
            self.last_taken = seq
            problem = self._header_problem(n, request)
            if problem:
                self.response["header"][RESP_REJECTED] += 1
                print(f"[sidecar] rejected submission {seq}: {problem}", file=sys.stderr, flush=True)
                continue
            return request
        return None

    def _header_problem(self, n: int, request: Request | None) -> str:
        """Why a submission's header does not fit its slot ('' if it does)."""
        if request is None:
            return f"count {n} is outside the slot's 0..{self.capacity}"
        bad = np.flatnonzero((request.lengths < 0) | (request.lengths > self.prompt_bytes))
        if len(bad):
            return (f"prompt {bad[0]} has length {request.lengths[bad[0]]}, outside the slot's "
                    f"0..{self.prompt_bytes} bytes")
        return ""

    def write_answers(
        self,
        request: Request,
        rows: np.ndarray | slice,
        probs: np.ndarray,
        action: np.ndarray,
        confidence: np.ndarray,
        status: np.ndarray,
        reasons: list[bytes] | np.ndarray | None = None,
    ) -> None:
        """Writes answers for `rows` (indices into the request, or a slice) and signals the client."""
        s = request.slot
        r = self.response
        r[f"keys{s}"][rows] = request.keys[rows]
        r[f"probs{s}"][rows] = probs
        r[f"action{s}"][rows] = action
        r[f"confidence{s}"][rows] = confidence
        r[f"status{s}"][rows] = status
        r[f"version{s}"][rows] = self.version
        if reasons is None:
            r[f"reason_len{s}"][rows] = 0
        else:
            packed = np.array(reasons, dtype=f"S{self.reason_bytes}")  # truncates long reasons
            r[f"reasons{s}"][rows] = packed.view(np.uint8).reshape(len(packed), self.reason_bytes)
            r[f"reason_len{s}"][rows] = np.strings.str_len(packed)
        r[f"row_seq{s}"][rows] = request.seq  # last: marks the rows above as complete
        r["header"][RESP_ANSWERED] += len(request.keys[rows])
        self.response_signal.post()

    def take_outcomes(self) -> dict[str, np.ndarray] | None:
        """The outcome batch the client wrote since the last call (a copy), or None."""
        header = self.request["header"]
        batch = int(header[REQ_OUTCOME_BATCH])
        if batch <= self.last_outcomes:  # nothing new, or -1: being written
            return None
        n = int(header[REQ_OUTCOME_COUNT])
        capacity = len(self.request["outcome_seq"])
        rows = {name: self.request[f"outcome_{name}"][:max(0, n)].copy() for name, _ in OUTCOME_FIELDS}
        if header[REQ_OUTCOME_BATCH] != batch:  # rewritten while we copied
            return self.take_outcomes()
        self.last_outcomes = batch
        self.response["header"][RESP_OUTCOMES_TAKEN] = batch
        self.response_signal.post()
        if not 0 <= n <= capacity:
            self.response["header"][RESP_REJECTED] += 1
            print(f"[sidecar] rejected outcome batch {batch}: count {n} is outside 0..{capacity}", file=sys.stderr,
                  flush=True)
            return None
        return rows

    def take_command(self) -> tuple[int, dict] | None:
        """The client's newest unanswered command as (id, parsed JSON), or None."""
        header = self.request["header"]
        command_id = int(header[REQ_COMMAND_ID])
        if command_id <= self.last_command:
            return None
        length = int(header[REQ_COMMAND_LEN])
        text = bytes(self.request["command"][: max(0, length)])
        if header[REQ_COMMAND_ID] != command_id:
            return self.take_command()
        self.last_command = command_id
        if not 0 <= length <= COMMAND_BYTES:
            self.response["header"][RESP_REJECTED] += 1
            return command_id, {"op": "invalid", "error": f"command length {length} is outside 0..{COMMAND_BYTES}"}
        try:
            command = json.loads(text)
        except json.JSONDecodeError as error:
            command = {"op": "invalid", "error": str(error)}
        return command_id, command if isinstance(command, dict) else {"op": "invalid"}

    def reply(self, command_id: int, reply: dict) -> None:
        """Answers command `command_id` with a JSON object (shortened to an error if it does not fit)."""
        data = json.dumps(reply, default=float).encode()
        if len(data) > REPLY_BYTES:
            data = json.dumps({"error": f"reply of {len(data)} bytes exceeds {REPLY_BYTES}"}).encode()
        header = self.response["header"]
        header[RESP_REPLY_ID] = -1
        self.response["reply"][: len(data)] = np.frombuffer(data, np.uint8)
        header[RESP_REPLY_LEN] = len(data)
        header[RESP_REPLY_ID] = command_id
        self.response_signal.post()

    def close(self) -> None:
        self.request.close()
        self.response.close()
