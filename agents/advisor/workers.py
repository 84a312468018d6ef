"""Several advisor workers behind one client (docs/advisor.md, "Advisor workers"). Each worker is its own sidecar
process (`bridge.SidecarClient`) with its own torch device and shared-memory pair. A submission's prompts are split
across the workers that are up, in proportion to their measured rates; its answers come back merged in submission
order. A dead worker's rows come back as backend errors and it is restarted while the others keep answering; a
restarted worker is given prompts only once it has the pool's last `load`ed adapter again (it starts from its flags').

`AdvisorPool` offers what the advisor (agents.advisor.advisor.Advisor) uses of one `SidecarClient`: the
`AdvisorWorkers` protocol, which the numeric mock (agents.advisor.numeric_mock) keeps too; one worker behaves exactly as
one client did.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bridge import STATUS_OK, BridgeConfig, SidecarClient
from bridge.client import Answers, SidecarError
from bridge.protocol import NUM_ACTIONS, STATUS_BACKEND_ERROR, STATUS_TIMEOUT

RATE_EMA = 0.3  # weight of a worker's newest rate sample: a few query steps follow a change of load


def split_counts(n: int, weights: np.ndarray | list[float]) -> np.ndarray:
    """How many of `n` prompts each worker gets: in proportion to `weights` (a worker with weight 0 gets none),
    the rounding remainder going to the largest fractions."""
    w = np.asarray(weights, np.float64)
    if n == 0 or w.sum() <= 0:
        return np.zeros(len(w), np.int64)
    exact = n * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[: n - counts.sum()]] += 1
    return counts


class AdvisorWorkers(Protocol):
    """What the advisor asks of its workers: an AdvisorPool of sidecars, or the numeric mock answering in-process."""

    reads_fields: bool  # submissions are prompt-field rows (the mock), not rendered prompts
    alive: bool  # at least one worker is up
    oldest_done: bool  # the oldest submission is answered

    def submit(self, keys: np.ndarray, prompts: np.ndarray, think: np.ndarray | None = None) -> int: ...

    def collect(self, timeout_s: float | None = None) -> Answers: ...

    def command(self, op: str, timeout_s: float = 60.0, **args: Any) -> dict: ...

    def restart_dead(self) -> None: ...

    def reset_counters(self) -> None: ...

    def metrics(self) -> dict:
        """Counters since reset_counters(): the workers' cache_hits and cache_misses, then llm_* metrics."""
        ...

    def close(self) -> None: ...


@dataclass
class _Part:
    worker: int
    start: int  # rows [start, stop) of the pool's submission
    stop: int
    submitted_at: float


class WorkerShares:
    """Per worker: its measured rate (which sets its share of a submission), its ok answers since the counters were
    reset, when it was last restarted and whether it still needs the pool's last `load` (it may not answer yet)."""

    def __init__(self, count: int):
        self.rates = np.full(count, np.nan)  # EMA of answers/s per worker; nan until measured
        self.answered = np.zeros(count, np.int64)
        self.last_restart = np.full(count, -np.inf)
        self.reload = np.zeros(count, bool)  # restarted since the pool's last load: answers with its start adapter

    def up(self, workers: list[SidecarClient]) -> np.ndarray:
        """Per worker: it can answer, with the pool's adapter (a restarted one only once the load is replayed)."""
        return np.array([w.alive for w in workers]) & ~self.reload

    def weights(self, up: np.ndarray) -> np.ndarray:
        """Each worker's share of the next submission: its measured rate; a worker not yet measured gets the mean
        of the measured ones (all equal when none is); a worker that is down gets nothing."""
        measured = up & np.isfinite(self.rates) & (self.rates > 0)
        fill = self.rates[measured].mean() if measured.any() else 1.0
        return np.where(up, np.where(measured, self.rates, fill), 0.0)

    def measure(self, part: _Part, answers: Answers) -> None:
        """A worker's rate sample: rows answered ÷ time since submit. Exact when it was still busy when collected
        (the loop waited, or rows timed out); a lower bound when all was ready, which still moves prompts to it."""
        done = int(((answers.status != STATUS_TIMEOUT) & (answers.status != STATUS_BACKEND_ERROR)).sum())
        self.answered[part.worker] += int((answers.status == STATUS_OK).sum())
        if done:
            sample = done / max(time.perf_counter() - part.submitted_at, 1e-6)
            old = self.rates[part.worker]
            self.rates[part.worker] = sample if np.isnan(old) else (1 - RATE_EMA) * old + RATE_EMA * sample

    def restarted(self, worker: int, now: float, reload: bool) -> None:
        self.last_restart[worker] = now
        self.rates[worker] = np.nan  # a new process: measured afresh
        self.reload[worker] = reload

    def metrics(self, up: np.ndarray) -> dict:
        """Workers up now, and per worker its measured rate (answers/s, 0 until measured) and ok answers."""
        out = {"llm_workers_alive": int(up.sum())}
        for i in range(len(self.rates)):
            out[f"llm_rate_w{i}"] = 0.0 if np.isnan(self.rates[i]) else float(self.rates[i])
            out[f"llm_answered_w{i}"] = int(self.answered[i])
        return out


class AdvisorPool:
    """N advisor workers that look like one SidecarClient to the advisor (AdvisorWorkers). At most two submissions
    await collect()."""

    reads_fields = False  # its workers answer rendered prompts (agents.advisor.numeric_mock reads prompt fields)

    def __init__(self, workers: list[SidecarClient]):
        self.workers = workers
        self.config = workers[0].config
        self.shares = WorkerShares(len(workers))
        self._load: tuple[dict, float] | None = None  # the last `load` command's arguments and timeout
        self._pending: deque[tuple[int, list[_Part]]] = deque()
        self._next_seq = 1

    @classmethod
    def start(cls, options: list[tuple[str, dict]], config: BridgeConfig, log_stem: Path | None = None,
              **start_kwargs: Any) -> AdvisorPool:
        """Starts one worker per (backend, flags) in `options`, all loading at once; waits until every one is ready.
        With `log_stem` (e.g. RUN_DIR/advisor), worker i's stderr goes to {log_stem}_w{i}.log, not through the
        progress bar."""
        workers: list[SidecarClient] = []
        try:
            for i, (backend, flags) in enumerate(options):
                log_file = f"{log_stem}_w{i}.log" if log_stem else ""
                client = SidecarClient(dataclasses.replace(config, log_file=log_file))
                workers.append(client)
                client.start(backend=backend, wait=False, **start_kwargs, **flags)
            for client in workers:
                client.wait_ready()
        except BaseException:
            for client in workers:
                client.close()
            raise
        return cls(workers)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    # ---- health ------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """At least one worker can answer."""
        return bool(self.shares.up(self.workers).any())

    def restart_dead(self) -> None:
        """Restarts (without waiting) each dead worker, at most once per start timeout: a worker still loading
        is not up yet either. A restarted worker that is ready again first gets the pool's last `load` (waiting
        for its reply): it started with its start flags' adapter, and its answers count as the loaded one's."""
        for i in np.flatnonzero(self.shares.reload):
            if self.workers[i].alive:
                args, timeout_s = self._load
                try:
                    self.workers[i].command("load", timeout_s=timeout_s, **args)
                    self.shares.reload[i] = False
                except SidecarError:  # down again, or the load failed: it stays out of the split and is retried
                    pass
        now = time.monotonic()
        for i, worker in enumerate(self.workers):
            if not worker.alive and now - self.shares.last_restart[i] > self.config.start_timeout_s:
                worker.restart(wait=False)
                self.shares.restarted(i, now, reload=self._load is not None)

    # ---- prompts and answers -----------------------------------------------------------------------------

    @property
    def oldest_done(self) -> bool:
        """collect() would not wait: every worker's share of the oldest submission is answered (or it is down)."""
        return all(self.workers[part.worker].oldest_done for part in self._pending[0][1])

    def submit(self, keys: np.ndarray, prompts: np.ndarray, think: np.ndarray | None = None) -> int:
        """Splits the prompts (contiguous runs, in order) across the workers that are up, in proportion to their
        measured rates (WorkerShares.weights); never waits. Returns the pool's seq of this submission."""
        counts = split_counts(len(keys), self.shares.weights(self.shares.up(self.workers)))
        parts, start, now = [], 0, time.perf_counter()
        for i, count in enumerate(counts):
            if count:
                stop = start + int(count)
                self.workers[i].submit(keys[start:stop], prompts[start:stop],
                                       None if think is None else think[start:stop])
                parts.append(_Part(i, start, stop, now))
                start = stop
        seq = self._next_seq
        self._next_seq += 1
        self._pending.append((seq, parts))
        return seq

    def collect(self, timeout_s: float | None = None) -> Answers:
        """Answers to the oldest pending submission in submission order, waiting at most timeout_s in all (None:
        until answered). Rows of a worker that died are backend errors; rows not answered in time, timeouts."""
        seq, parts = self._pending.popleft()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        merged = []
        for part in parts:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            answers = self.workers[part.worker].collect(remaining)
            self.shares.measure(part, answers)
            merged.append(answers)
        if len(merged) == 1:  # one worker answered it all: its seq names the answers (learning joins outcomes by it)
            return merged[0]
        if not merged:
            return Answers(seq, np.zeros(0, np.int32), np.zeros((0, NUM_ACTIONS), np.float32), np.zeros(0, np.int8),
                           np.zeros(0, np.float32), np.zeros(0, np.int8), np.zeros(0, "S1"), np.zeros(0, np.int32))
        versions = [a.version if a.version is not None else np.zeros(len(a), np.int32) for a in merged]
        return Answers(seq, *(np.concatenate([getattr(a, f) for a in merged])
                              for f in ("keys", "probs", "action", "confidence", "status", "reasons")),
                       np.concatenate(versions))

    # ---- commands, outcomes, counters --------------------------------------------------------------------

    def command(self, op: str, timeout_s: float = 60.0, **args: Any) -> dict:
        """Sends the command to every worker (e.g. `load` an adapter: all answer with it); worker 0's reply. A `load`
        is remembered: restart_dead() replays it on a worker restarted later."""
        replies = [w.command(op, timeout_s=timeout_s, **args) for w in self.workers]
        if op == "load":
            self._load = (args, timeout_s)
            self.shares.reload[:] = False  # every worker has it now
        return replies[0]

    def send_outcomes(self, rows: dict[str, np.ndarray], wait_s: float = 0.0) -> int:
        """Outcomes for the learning advisor, which is one worker (a config rule: hybrid.sidecar.workers)."""
        return self.workers[0].send_outcomes(rows, wait_s=wait_s)

    def reset_counters(self) -> None:
        self.shares.answered[:] = 0

    def metrics(self) -> dict:
        """The workers' client and sidecar counters, summed (cache_hits, cache_misses, ...), then the shares'
        metrics (WorkerShares.metrics)."""
        out: dict = {}
        for worker in self.workers:
            for key, value in worker.stats().items():
                out[key] = out.get(key, 0) + value
        return out | self.shares.metrics(self.shares.up(self.workers))
