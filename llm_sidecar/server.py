"""The sidecar's main loop: take a submission, answer cached prompts at once, run the rest through the
backend in length-sorted micro-batches, and publish each micro-batch's answers as soon as it is done."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from bridge import peer
from bridge.protocol import STATUS_BACKEND_ERROR, STATUS_OK, STATUS_PARSE_ERROR
from bridge.transport import (
    PEER_FAILED, PEER_READY, PEER_STOPPED, RESP_CACHE_HITS, RESP_CACHE_MISSES, RESP_PARSE_ERRORS, RESP_PROMPT_TOKENS,
    PeerEndpoint, Request,
)  # fmt: skip
from llm_sidecar.backends import BackendAnswers
from llm_sidecar.models import log


@dataclass
class CachedAnswer:
    probs: np.ndarray
    action: int
    confidence: float
    reason: bytes
    hits: int = 0


class AnswerCache:
    """LRU cache of ok answers keyed by a 64-bit hash of the prompt bytes, with hit counts."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(prompt: bytes) -> bytes:
        return hashlib.blake2b(prompt, digest_size=8).digest()

    def get(self, key: bytes) -> CachedAnswer | None:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        entry.hits += 1
        self.hits += 1
        return entry

    def put(self, key: bytes, entry: CachedAnswer) -> None:
        if self.capacity <= 0:
            return
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


def answer_request(endpoint: PeerEndpoint, backend, cache: AnswerCache, request: Request, batch_size: int) -> None:
    """Answers one submission; stops early if the client abandons it (collect timed out)."""
    prompts = [bytes(row[:n]) for row, n in zip(request.prompts, request.lengths)]
    keys = [AnswerCache.key(p) for p in prompts]
    hits_before, misses_before = cache.hits, cache.misses
    cached_rows, todo = [], {}  # todo: key → rows with that prompt (identical prompts run once)
    for row, key in enumerate(keys):
        if key in todo:
            todo[key].append(row)
            continue
        entry = cache.get(key)
        if entry is None:
            todo[key] = [row]
        else:
            cached_rows.append((row, entry))
    endpoint.add_counter(RESP_CACHE_HITS, cache.hits - hits_before)
    endpoint.add_counter(RESP_CACHE_MISSES, cache.misses - misses_before)
    if cached_rows:
        rows = np.array([r for r, _ in cached_rows])
        endpoint.write_answers(
            request, rows,
            np.stack([e.probs for _, e in cached_rows]),
            np.array([e.action for _, e in cached_rows], dtype=np.int8),
            np.array([e.confidence for _, e in cached_rows], dtype=np.float32),
            np.full(len(rows), STATUS_OK, dtype=np.int8),
            [e.reason for _, e in cached_rows],
        )  # fmt: skip
    # Length-sorted micro-batches: similar lengths waste little compute on padding.
    unique = sorted(todo, key=lambda k: len(prompts[todo[k][0]]))
    for start in range(0, len(unique), batch_size):
        if endpoint.abandoned(request.seq) or endpoint.stop_requested:
            return
        batch_keys = unique[start : start + batch_size]
        texts = [prompts[todo[k][0]].decode("utf-8", errors="replace") for k in batch_keys]
        try:
            answers = backend.advise(texts)
        except Exception as error:  # a failing batch must not take the sidecar down
            log(f"backend error on a batch of {len(texts)}: {error!r}")
            answers = _error_answers(len(texts), f"backend error: {error!r}")
        for i, key in enumerate(batch_keys):
            if answers.status[i] == STATUS_OK:
                cache.put(key, CachedAnswer(answers.probs[i].copy(), int(answers.action[i]),
                                            float(answers.confidence[i]), answers.reasons[i]))
        counts = [len(todo[k]) for k in batch_keys]
        rows = np.concatenate([todo[k] for k in batch_keys])
        expand = np.repeat(np.arange(len(batch_keys)), counts)
        endpoint.add_counter(RESP_PARSE_ERRORS, int((answers.status[expand] == STATUS_PARSE_ERROR).sum()))
        endpoint.add_counter(RESP_PROMPT_TOKENS, answers.prompt_tokens)
        endpoint.write_answers(request, rows, answers.probs[expand], answers.action[expand],
                               answers.confidence[expand], answers.status[expand],
                               [answers.reasons[j] for j in expand])


def _error_answers(n: int, reason: str) -> BackendAnswers:
    return BackendAnswers(
        probs=np.full((n, 6), 1.0 / 6, dtype=np.float32),
        action=np.full(n, -1, dtype=np.int8),
        confidence=np.zeros(n, dtype=np.float32),
        status=np.full(n, STATUS_BACKEND_ERROR, dtype=np.int8),
        reasons=[reason.encode()[:200]] * n,
    )


def serve(args, make_backend) -> None:
    """Connects to the client's segments, loads the backend, reports ready, answers until told to stop."""
    peer.raise_system_exit_on_signals()
    endpoint = peer.connect(args)
    peer.start_heartbeat(endpoint, args.parent_pid, (args.request_shm, args.response_shm))
    try:
        static = json.loads(endpoint.static_text() or b"{}")
        try:
            backend = make_backend(args, static.get("system", ""), static.get("answer_prefix", "Action:"))
        except BaseException:
            endpoint.set_state(PEER_FAILED)
            endpoint.response_signal.post()
            raise
        cache = AnswerCache(args.cache_size)
        endpoint.set_state(PEER_READY)
        endpoint.response_signal.post()
        log(f"ready: backend={backend.name} batch_size={args.batch_size} cache_size={args.cache_size}")
        while not endpoint.stop_requested:
            request = endpoint.wait_request(timeout_s=0.5)
            if request is not None:
                t0 = time.perf_counter()
                answer_request(endpoint, backend, cache, request, args.batch_size)
                if args.verbose:
                    log(f"seq {request.seq}: {len(request)} prompts in {time.perf_counter() - t0:.3f} s")
    finally:
        endpoint.set_state(PEER_STOPPED)
        endpoint.close()
