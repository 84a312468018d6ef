"""The sidecar's main loop: take a submission, answer cached prompts at once, run the rest through the
backend in length-sorted micro-batches, and publish each micro-batch's answers as soon as it is done."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge import peer
from bridge.protocol import NUM_ACTIONS, STATUS_BACKEND_ERROR, STATUS_NO_VIEW, STATUS_OK, STATUS_PARSE_ERROR
from bridge.transport import (
    PEER_FAILED,
    PEER_READY,
    PEER_STOPPED,
    RESP_CACHE_HITS,
    RESP_CACHE_MISSES,
    RESP_PARSE_ERRORS,
    RESP_PROMPT_TOKENS,
    RESP_STATE,
    PeerEndpoint,
    Request,
)  # fmt: skip
from llm_sidecar.backends import BackendAnswers
from llm_sidecar.models import log


@dataclass
class CachedAnswer:
    probs: np.ndarray
    action: int
    confidence: float
    reason: bytes
    status: int = STATUS_OK  # ok, or no view (the advisor's PASS is as repeatable as its advice)
    hits: int = 0


class AnswerCache:
    """LRU cache of ok and no-view answers keyed by a 64-bit hash of the prompt bytes, with hit counts."""

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


def answer_request(endpoint: PeerEndpoint, backend, cache: AnswerCache, request: Request, batch_size: int,
                   reasoner=None) -> np.ndarray:
    """Answers one submission; stops early if the client abandons it (collect timed out). Rows marked `think`
    get a chain-of-thought answer from `reasoner` (when there is one). Returns the answers' probabilities
    [n, 6] (NaN rows: not answered, failed or no view), which learning joins to outcomes."""
    prompts = [bytes(row[:n]) for row, n in zip(request.prompts, request.lengths)]
    answered = np.full((len(prompts), NUM_ACTIONS), np.nan, dtype=np.float32)
    if reasoner is not None and request.think.any():
        rows = np.flatnonzero(request.think)
        answers = _advise(reasoner.think, [prompts[r].decode("utf-8", errors="replace") for r in rows])
        _publish(endpoint, request, rows, answers, answered)
    keys = [AnswerCache.key(p) for p in prompts]
    hits_before, misses_before = cache.hits, cache.misses
    cached_rows, todo = [], {}  # todo: key → rows with that prompt (identical prompts run once)
    for row, key in enumerate(keys):
        if reasoner is not None and request.think[row]:
            continue
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
        entries = [e for _, e in cached_rows]
        cached = BackendAnswers(
            np.stack([e.probs for e in entries]),
            np.array([e.action for e in entries], dtype=np.int8),
            np.array([e.confidence for e in entries], dtype=np.float32),
            np.array([e.status for e in entries], dtype=np.int8),
            [e.reason for e in entries],
        )  # fmt: skip
        _publish(endpoint, request, np.array([r for r, _ in cached_rows]), cached, answered)
    # Length-sorted micro-batches: similar lengths waste little compute on padding.
    unique = sorted(todo, key=lambda k: len(prompts[todo[k][0]]))
    for start in range(0, len(unique), batch_size):
        if endpoint.abandoned(request.seq) or endpoint.stop_requested:
            return answered
        batch_keys = unique[start : start + batch_size]
        answers = _advise(backend.advise, [prompts[todo[k][0]].decode("utf-8", errors="replace") for k in batch_keys])
        for i, key in enumerate(batch_keys):
            if answers.status[i] in (STATUS_OK, STATUS_NO_VIEW):
                cache.put(key, CachedAnswer(answers.probs[i].copy(), int(answers.action[i]),
                                            float(answers.confidence[i]), answers.reasons[i], int(answers.status[i])))
        counts = [len(todo[k]) for k in batch_keys]
        rows = np.concatenate([todo[k] for k in batch_keys])
        expand = np.repeat(np.arange(len(batch_keys)), counts)
        _publish(endpoint, request, rows, _take(answers, expand), answered)
    return answered


def _advise(advise, texts: list[str]) -> BackendAnswers:
    try:
        return advise(texts)
    except Exception as error:  # a failing batch must not take the sidecar down
        log(f"backend error on a batch of {len(texts)}: {error!r}")
        return _error_answers(len(texts), f"backend error: {error!r}")


def _take(answers: BackendAnswers, index: np.ndarray) -> BackendAnswers:
    return BackendAnswers(answers.probs[index], answers.action[index], answers.confidence[index],
                          answers.status[index], [answers.reasons[j] for j in index], answers.prompt_tokens)


def _publish(endpoint: PeerEndpoint, request: Request, rows: np.ndarray, answers: BackendAnswers,
             answered: np.ndarray) -> None:
    """Writes answers for `rows` of the request, counts them, and keeps the ok ones' probabilities."""
    endpoint.add_counter(RESP_PARSE_ERRORS, int((answers.status == STATUS_PARSE_ERROR).sum()))
    endpoint.add_counter(RESP_PROMPT_TOKENS, answers.prompt_tokens)
    endpoint.write_answers(request, rows, answers.probs, answers.action, answers.confidence, answers.status,
                           answers.reasons)
    ok = answers.status == STATUS_OK
    answered[rows[ok]] = answers.probs[ok]


def _error_answers(n: int, reason: str) -> BackendAnswers:
    return BackendAnswers(
        probs=np.full((n, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32),
        action=np.full(n, -1, dtype=np.int8),
        confidence=np.zeros(n, dtype=np.float32),
        status=np.full(n, STATUS_BACKEND_ERROR, dtype=np.int8),
        reasons=[reason.encode()[:200]] * n,
    )


def serve(args, make_backend) -> None:
    """Connects to the client's segments, loads the backend, reports ready, answers until told to stop."""
    peer.exit_on_sigterm_only()
    endpoint = peer.connect(args)
    peer.start_heartbeat(endpoint, args.parent_pid, (args.request_shm, args.response_shm))
    try:
        static = json.loads(endpoint.static_text() or b"{}")
        try:
            backend = make_backend(args, static.get("system", ""), static.get("answer_prefix", "Action:"))
        except BaseException as error:
            endpoint.set_state(PEER_FAILED)
            endpoint.response_signal.post()
            if args.verbose or not isinstance(error, Exception):
                raise
            # One line for the user (a wrong model path gives four chained tracebacks); --verbose shows them.
            first_line = (str(error).splitlines() or [""])[0]
            log(f"cannot start the {args.backend} backend: {type(error).__name__}: {first_line}")
            raise SystemExit(1) from None
        cache = AnswerCache(args.cache_size)
        learner = make_learner(backend, static.get("learning"))
        reasoner = make_reasoner(backend, static.get("reasoning"))
        endpoint.set_state(PEER_READY)
        endpoint.response_signal.post()
        log(f"ready: backend={backend.name} batch_size={args.batch_size} cache_size={args.cache_size}"
            f"{' learning' if learner else ''}{' reasoning' if reasoner else ''}")
        version = endpoint.version = learner.version if learner else 0
        while not endpoint.stop_requested:
            # While a learning round runs, look for prompts between its steps without waiting.
            request = endpoint.wait_request(timeout_s=0.0 if learner and learner.busy else 0.5)
            if request is not None:
                t0 = time.perf_counter()
                answered = answer_request(endpoint, backend, cache, request, args.batch_size, reasoner)
                if learner:  # a reasoned answer's labels were scored after its thought, not the prompt's score head
                    reasoned = request.think if reasoner is not None else np.zeros(len(request), bool)
                    from_base = learner.answers_are_base & ~reasoned
                    learner.memory.remember(request.seq, request.texts(), answered, from_base)
                if args.verbose:
                    log(f"seq {request.seq}: {len(request)} prompts in {time.perf_counter() - t0:.3f} s")
            outcomes = endpoint.take_outcomes()
            if outcomes is not None and learner:
                learner.add_outcomes(outcomes)
            command = endpoint.take_command()
            if command is not None:
                endpoint.reply(command[0], run_command(command[1], backend, learner))
                if command[1].get("op") == "load":
                    cache.entries.clear()
            if learner:
                learner.step()
                if learner.version != version:  # the serving adapter changed: cached answers are stale
                    version = endpoint.version = learner.version
                    cache.entries.clear()
    finally:
        if endpoint.response["header"][RESP_STATE] != PEER_FAILED:  # a failed start stays failed for the client
            endpoint.set_state(PEER_STOPPED)
        endpoint.close()


def make_learner(backend, options: dict | None):
    """A LoraLearner when the client asked for learning; only a transformers model can learn."""
    if not options:
        return None
    from llm_sidecar.learning import LearningOptions, LoraLearner

    if backend.name != "transformers":
        raise ValueError(f"LoRA learning needs the transformers backend, not {backend.name!r}")
    options = dict(options)
    seed = int(options.pop("seed", 0))
    return LoraLearner(backend, LearningOptions.from_dict(options), seed)


def make_reasoner(backend, reasoning: dict | None):
    """A chain-of-thought Reasoner when the prompt templates define `reasoning`."""
    if not reasoning:
        return None
    from llm_sidecar.reasoning import Reasoner

    return Reasoner(backend, reasoning)


def run_command(command: dict, backend, learner) -> dict:
    """The sidecar's side of SidecarClient.command: learn, stats, save, load, threads. Errors become {"error": ...}."""
    op = command.get("op")
    try:
        if op == "invalid":  # the transport could not read it
            return {"error": command.get("error", "invalid command")}
        if op == "stats":
            return learner.stats() if learner else {"learning": False}
        if op == "learn":
            return learner.start_round() if learner else {"started": False, "why": "learning is off"}
        if op == "finish":  # run the current round to its end now (the end of a training run, tests)
            if learner:
                learner.finish()
            return {"done": True}
        if op == "save":
            if learner is None:
                return {"error": "save: this sidecar has no learning adapter"}
            return {"saved": learner.save(command["path"])}
        if op == "load":
            loaded = load_adapter(backend, command.get("path"))
            if learner:
                learner.adapter_loaded(command.get("path"))
            return loaded
        return {"error": f"unknown command {op!r}"}
    except Exception as error:  # a bad command must not take the sidecar down
        log(f"command {op!r} failed: {error!r}")
        return {"error": repr(error)}


def load_adapter(backend, path: str | None) -> dict:
    """Answers with the LoRA adapter at `path` from now on (loaded as the serving adapter), or with the base
    model for path None. Validation walks use it to follow the training sidecar's learning."""
    if backend.name != "transformers":
        return {"error": f"load: the {backend.name} backend has no adapters"}
    backend.use_adapter = path is not None
    if path is not None:
        from peft import PeftModel
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        if isinstance(backend.model, PeftModel):
            weights = load_file(str(Path(path) / "adapter_model.safetensors"))
            set_peft_model_state_dict(backend.model, weights, adapter_name="default")
        else:
            backend.model = PeftModel.from_pretrained(backend.model, path).eval()
    backend.refresh_prefix_cache()
    return {"loaded": path}
