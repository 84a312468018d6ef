"""One advisor's round trip for sets of keys (agents.advice.table's keys: a bar block and a position side), the one
place prompts are submitted and answers collected:

    keys → their prompt fields (agents.advisor.prompt_fields), or prompts rendered from them → the advisor's workers
    (at most MAX_IN_FLIGHT submissions awaiting collection) → answers → the host's copy of the advice table (`known`,
    every answer under the advisor version that gave it) and rows for the device's table → the advice store (the
    answers of the advisor the store's identity names: version 0)

Training's query steps (agents.advisor.link.AdvisorLink), an evaluation walk's keys asked ahead of it, live trading
(agents.trading.advice.LiveAdvisor) and advise.py's fill (agents.advisor.fill) all drive one of these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agents.advice.table import STATUS_NONE, answered
from agents.advisor.store import AdviceStore, Answers
from bridge import Answers as Collected
from bridge.protocol import NUM_ACTIONS, STATUS_BACKEND_ERROR

MAX_IN_FLIGHT = 2  # submissions the advisor may have to answer; while it has this many, nobody more is asked

Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # keys, probs, confidence, status, version


@dataclass
class Submitted:
    """A submission of prompts not yet collected."""

    step: int  # the caller's clock when asked (training: its query step)
    at: float  # perf_counter() when submitted
    prompts: np.ndarray  # as submitted: rendered prompts, or prompt-field rows for an advisor reading them
    keys: np.ndarray  # the keys asked about
    version: int  # the advisor's version when asked, for an advisor that does not report its own with each answer
    late: bool = False  # async: not all answered a query step later


class AdvisorSession:
    """The advisor's workers (an AdvisorPool, or the mock reading prompt fields), what is pending with them, the
    host's copy of the table, and the store."""

    def __init__(self, client, fields, renderer, texts: list[str] | None, known: Answers | None,
                 store: AdviceStore | None = None, reasoning: bool = False):
        """`fields`: anything that builds keys' prompt fields (the market's agents.advisor.prompt_fields
        .PromptFieldBuilder); `known`: the host's copy of the table it keeps (None: the caller keeps none); `store`:
        the store of the advisor as it started. close() stops the workers."""
        self.client, self.fields, self.renderer, self.texts = client, fields, renderer, texts
        self.known, self.store, self.reasoning = known, store, reasoning
        self.pending: list[Submitted] = []  # oldest first

    def close(self) -> None:
        if self.store is not None:
            self.store.save()
        self.client.close()

    @property
    def can_take(self) -> bool:
        """The advisor is up and has fewer than MAX_IN_FLIGHT submissions to answer."""
        return self.client.alive and self.client.pending < MAX_IN_FLIGHT

    def submit(self, keys: np.ndarray, version: int = 0, step: int = 0) -> Submitted:
        """Asks about `keys` (never waits): their prompt fields to an advisor that reads them, else the prompts
        rendered from them (each with a thought first where reasoning is on)."""
        rows = self.fields.build(keys)
        prompts = rows if self.client.reads_fields else self.renderer.render(rows, self.texts)
        think = np.ones(len(keys), bool) if self.reasoning else None
        self.client.submit(keys, prompts, think)
        sent = Submitted(step, time.perf_counter(), prompts, np.asarray(keys), version)
        self.pending.append(sent)
        return sent

    def collect(self, wait: bool, timeout_s: float | None = None) -> tuple[Submitted, Collected, Rows]:
        """The oldest submission's answers (waiting up to `timeout_s` with `wait`, else taking what is there): kept in
        the host's copy (each under its version) and, version 0's, in the store; returned with rows for the table, a
        key whose answer did not come (an error, a timeout, a dead worker) set back to missing there, to be asked
        again."""
        answers = self.client.collect(timeout_s=timeout_s if wait else 0.0)
        sent = self.pending.pop(0)
        if not len(answers):
            n = len(sent.keys)
            return sent, answers, (sent.keys.astype(np.int32), np.full((n, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32),
                                   np.zeros(n, np.float32), np.full(n, STATUS_BACKEND_ERROR, np.int32),
                                   np.full(n, sent.version, np.int32))
        status = answers.status.astype(np.int32)
        if self.known is not None:
            self.known.keep(answers, sent.version)
        versions = answers.version if answers.version is not None else np.full(len(answers), sent.version, np.int32)
        if self.store is not None:  # the store holds the answers of the advisor its identity names: version 0
            own = np.asarray(answered(status)) & (versions == 0)
            self.store.keep(answers.env_ids[own], answers.probs[own], answers.confidence[own], status[own])
        return sent, answers, (answers.env_ids.astype(np.int32), answers.probs.astype(np.float32),
                               answers.confidence.astype(np.float32), status, versions.astype(np.int32))

    def fill(self, keys: np.ndarray, batch: int, on_progress: Callable[[int], None] | None = None,
             stop: Callable[[], bool] | None = None, save_every_s: float | None = None,
             on_collect: Callable[[Submitted, Collected, Rows], None] | None = None) -> int:
        """Asks every one of `keys` in submissions of `batch`, MAX_IN_FLIGHT at a time, waiting as long as the
        advisor takes, into the host's copy and the store (saved every `save_every_s`); how many got an answer.
        `on_progress(done)` after each collection, `on_collect` with what each brought (the caller's bookkeeping);
        `stop()` ends it after the submissions in flight."""
        done, saved_at = 0, time.perf_counter()

        def take() -> None:
            nonlocal done, saved_at
            sent, answers, rows = self.collect(wait=True, timeout_s=None)
            if on_collect is not None:
                on_collect(sent, answers, rows)
            done += int(np.asarray(answered(rows[3])).sum())
            if on_progress is not None:
                on_progress(done)
            if self.store is not None and save_every_s and time.perf_counter() - saved_at > save_every_s:
                self.store.save()
                saved_at = time.perf_counter()

        for start in range(0, len(keys), batch):
            if stop is not None and stop():
                break
            self.submit(keys[start:start + batch])
            while len(self.pending) >= MAX_IN_FLIGHT:
                take()
        while self.pending:
            take()
        return done


def table_rows(collected: list[Rows], size: int) -> tuple[np.ndarray, ...]:
    """AdvisorTable.write's arguments from collected rows, padded to `size` (fixed shapes: one compiled write for every
    answer count): a key whose answer did not come is missing again (asked again)."""
    parts = list(zip(*collected)) if collected else [[np.zeros(0, np.int32)], [np.zeros((0, NUM_ACTIONS), np.float32)],
                                                     [np.zeros(0, np.float32)], [np.zeros(0, np.int32)],
                                                     [np.zeros(0, np.int32)]]
    keys, probs, conf, status, version = (np.concatenate(p) for p in parts)
    n, pad = len(keys), size - len(keys)
    status = np.where(np.asarray(answered(status)), status, STATUS_NONE)
    return (np.concatenate([keys, np.zeros(pad, np.int32)]).astype(np.int32),
            np.concatenate([probs, np.full((pad, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32)]).astype(np.float32),
            np.concatenate([conf, np.zeros(pad, np.float32)]).astype(np.float32),
            np.concatenate([status, np.zeros(pad, np.int32)]).astype(np.int32),
            np.concatenate([version, np.zeros(pad, np.int32)]).astype(np.int32),
            np.arange(size) < n)
