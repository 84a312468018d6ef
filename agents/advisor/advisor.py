"""The run's advisor on one market: the only object that talks to the model (docs/design.md, "The advisor").

    advisor = Advisor.open(hybrid, llm, env, data, market, capacity, adapter)  # template, fields, store, workers
    advisor.submit(keys)             # the keys' prompts (or their prompt fields, for the mock reading them) asked
    taken = advisor.collect(wait)    # the oldest submission's answers: kept in the host's copy of the table and the
                                     # store, counted and logged; `taken.rows` are the advice table's rows

Callers only decide which keys to ask and when: training's and walks' query steps (agents.advisor.pacer.QueryPacer),
live trading (agents.trading.advice.LivePacer) and advise.py's fill (`Advisor.fill`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.advice.table import SIDES, Rows, answered, key_side, num_blocks
from agents.advisor.prompt_fields import ACCOUNT_FIELDS, PromptFieldBuilder, prompt_instrument
from agents.advisor.sidecar import start_advisor
from agents.advisor.store import AdviceStore, KnownAdvice, identity, open_store, prompt_format_digest, store_root
from agents.advisor.workers import AdvisorPool, AdvisorWorkers
from agents.config import ConfigError, HybridConfig
from agents.runs.adapters import starting_adapter
from bridge import STATUS_NAMES, PromptRenderer
from bridge import Answers
from bridge.prompts import DEFAULT_PROMPTS_PATH
from bridge.protocol import NUM_ACTIONS, STATUS_BACKEND_ERROR
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.contracts import resolve_contract

MAX_IN_FLIGHT = 2  # submissions the advisor may have to answer; while it has this many, nobody more is asked
LATENCY_PERCENTILES = (50, 95, 99)


def latency_metrics(seconds) -> dict[str, float]:
    """llm_latency_pQ_s: percentiles of answer latencies (seconds from asking to the answer; 0 when none), one
    definition for training, walks and trading."""
    lat = np.asarray(list(seconds) or [0.0], np.float64)
    return {f"llm_latency_p{q}_s": float(np.nanpercentile(lat, q)) for q in LATENCY_PERCENTILES}



def prompt_template(hybrid: HybridConfig, data: DataConfig) -> tuple[PromptRenderer, str]:
    """The run's prompt renderer for the run's instrument and its template's text; refuses a template naming one
    account's fields."""
    path = Path(hybrid.link.prompts or DEFAULT_PROMPTS_PATH)
    renderer = PromptRenderer.from_yaml(path, prompt_instrument(resolve_contract(data.contract)))
    account = sorted(renderer.fields_used & set(ACCOUNT_FIELDS))
    if account:
        raise ConfigError(f"{path}: context names {', '.join(account)}: advice is keyed by market context (bar block "
                          "and position side) and shared by every account, so a prompt cannot hold one account's "
                          "figures; remove them from the template")
    return renderer, path.read_text()


@dataclass
class Submitted:
    """A submission of prompts not yet collected."""

    step: int  # the caller's clock when asked (training: its query step)
    at: float  # perf_counter() when submitted
    prompts: np.ndarray  # as submitted: rendered prompts, or prompt-field rows for an advisor reading them
    keys: np.ndarray  # the keys asked about
    version: int  # the advisor's version when asked, for an advisor that does not report its own with each answer


@dataclass
class Taken:
    """One collected submission: what was asked, what came back (the bridge's answers; none after an error), the
    advice table's rows (a key whose answer did not come set back to missing: asked again) and how long it took."""

    sent: Submitted
    answers: Answers
    rows: Rows
    latency_s: float


class Advisor:
    """The advisor's workers (agents.advisor.workers), what is in flight with them, the prompt template and fields
    of the market's keys, the host's copy of the advice table (every answer under the advisor version that gave it),
    the store of the advisor's own answers (version 0), its counters and its LLM log."""

    def __init__(self, workers: AdvisorWorkers | Callable[[], AdvisorWorkers], fields, renderer: PromptRenderer,
                 texts: list[str] | None, known: KnownAdvice | None, store: AdviceStore | None, reasoning: bool = False,
                 open_store_of: Callable[[str | None], AdviceStore | None] | None = None,
                 llm_log: Path | None = None, log_limit: int = 0):
        """Built by `open`: `workers`, or what starts them at the first submission; `known` None keeps no host copy
        (live trading reads the table it writes); `open_store_of(adapter)` opens the store of the advisor with another
        adapter (use_adapter)."""
        self.workers = None if callable(workers) else workers
        self._start_workers = workers if callable(workers) else None
        self.fields, self.renderer, self.texts = fields, renderer, texts
        self.known, self.store, self.reasoning = known, store, reasoning  # read by the pacers, written here only
        self._open_store_of = open_store_of
        self._log = LlmLog(llm_log, log_limit, renderer, texts, fields) if llm_log is not None and log_limit else None
        self.version = 0  # LoRA rounds adopted since the advisor started (`adopt`)
        self.pending: list[Submitted] = []  # oldest first
        self.answered = {name: 0 for name in STATUS_NAMES}  # answers collected per status since reset_counters()
        self.latencies: list[float] = []
        self.counting_since = time.perf_counter()

    @classmethod
    def open(cls, hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market, capacity: int,
             adapter: str | None, *,
             fields: Callable[[PromptRenderer], Any] | None = None, texts: list[str] | None = None,
             log_stem: Path | None = None, learning: dict | None = None, client=None, keep_known: bool = True,
             llm_log: Path | None = None, start: bool = True, instruments: tuple[str, ...] = ()) -> Advisor:
        """The one set-up of the run's advisor on `market`: the prompt template and `market`'s prompt fields (or
        `fields(renderer)`'s, e.g. a growing feed's, with its `texts`), the store of this advisor's answers on
        `market`'s keys (none without hybrid.store or without a market), the host's copy (`keep_known`) and the
        workers (`client`: one started sidecar instead), answering submissions of up to `capacity` keys with LoRA
        `adapter` (None: the run's starting one). `learning`: the sidecar learns from outcomes (training's). `start`
        False: the workers start at the first submission (a fill that may find every key answered asks nobody).
        `instruments`: the symbols of the set whose joint timeline `market` is one instrument of (its store's identity
        names them; agents.advisor.instrument_set opens one advisor per instrument)."""
        renderer, template = prompt_template(hybrid, data)
        h = hybrid
        adapter = adapter or starting_adapter(hybrid)
        if fields is None:
            fields = PromptFieldBuilder(market, list(renderer.markets), env.contracts_per_trade, h.query.interval,
                                        h.shuffled)
            texts = list(market.text_table) or None
        else:
            fields = fields(renderer)
        num_keys = num_blocks(market.num_bars, h.query.interval) * SIDES if market is not None else 0
        root = store_root(hybrid, llm) if market is not None else None
        open_store_of = None
        if root is not None:
            builder = fields if isinstance(fields, PromptFieldBuilder) else PromptFieldBuilder(
                market, list(renderer.markets), env.contracts_per_trade, h.query.interval, h.shuffled)
            prompt_format = prompt_format_digest(builder, renderer, list(market.text_table) or None, num_keys)

            def open_store_of(with_adapter: str | None) -> AdviceStore:
                return open_store(root, identity(hybrid, llm, env, market, template, with_adapter, prompt_format, root,
                                                 instruments), num_keys)

        store = open_store_of(adapter) if open_store_of is not None else None
        known = None
        if keep_known:
            known = store.answers.copy() if store is not None else KnownAdvice.empty(num_keys)
            fields.without_past(known)
        def started() -> AdvisorWorkers:
            return AdvisorPool([client]) if client else start_advisor(hybrid, llm, renderer, texts, capacity, adapter,
                                                                      log_stem, learning)

        workers = started() if start else started
        reasoning = h.reasoning.enabled and renderer.reasoning is not None
        return cls(workers, fields, renderer, texts, known, store, reasoning, open_store_of, llm_log,
                   h.link.log_llm)

    def close(self, save: bool = True) -> None:
        """Stops the workers; the store gets the answers it has not saved yet (`save`: this process keeps it)."""
        if self._log is not None:
            self._log.close()
        if save:
            self.save_store()
        if self.workers is not None:
            self.workers.close()

    # ------------------------------------------------------------------------------------------- asking
    @property
    def can_take(self) -> bool:
        """The advisor is up and has fewer than MAX_IN_FLIGHT submissions to answer."""
        return self.workers is None or (self.workers.alive and len(self.pending) < MAX_IN_FLIGHT)

    def submit(self, keys: np.ndarray, version: int = 0, step: int = 0) -> Submitted:
        """Asks about `keys` (never waits): their prompt fields to an advisor that reads them, else the prompts
        rendered from them (each with a thought first where reasoning is on)."""
        if self.workers is None:
            self.workers = self._start_workers()
        rows = self.fields.build(keys)
        prompts = rows if self.workers.reads_fields else self.renderer.render(rows, self.texts)
        think = np.ones(len(keys), bool) if self.reasoning else None
        self.workers.submit(keys, prompts, think)
        sent = Submitted(step, time.perf_counter(), prompts, np.asarray(keys), version)
        self.pending.append(sent)
        return sent

    def collect(self, wait: bool, timeout_s: float | None = None) -> Taken:
        """The oldest submission's answers (waiting up to `timeout_s` with `wait`, else taking what is there): kept in
        the host's copy (each under its version) and, version 0's, in the store; counted and logged."""
        answers = self.workers.collect(timeout_s=timeout_s if wait else 0.0)
        sent = self.pending.pop(0)
        if not len(answers):
            n = len(sent.keys)
            rows = (sent.keys.astype(np.int32), np.full((n, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32),
                    np.zeros(n, np.float32), np.full(n, STATUS_BACKEND_ERROR, np.int32),
                    np.full(n, sent.version, np.int32))
            return Taken(sent, answers, rows, time.perf_counter() - sent.at)
        status = answers.status.astype(np.int32)
        if self.known is not None:
            self.known.keep(answers, sent.version)
        versions = answers.version if answers.version is not None else np.full(len(answers), sent.version, np.int32)
        if self.store is not None:  # the store holds the answers of the advisor its identity names: version 0
            own = np.asarray(answered(status)) & (versions == 0)
            self.store.keep(answers.keys[own], answers.probs[own], answers.confidence[own], status[own])
        taken = Taken(sent, answers, (answers.keys.astype(np.int32), answers.probs.astype(np.float32),
                                      answers.confidence.astype(np.float32), status, versions.astype(np.int32)),
                      time.perf_counter() - sent.at)
        for name, count in answers.counts().items():
            self.answered[name] = self.answered.get(name, 0) + count
        self.latencies.append(taken.latency_s)
        if self._log is not None:
            self._log.write(sent.prompts, answers)
        return taken

    # ---------------------------------------------------------------------------------- what it knows
    def merged(self, table: KnownAdvice) -> KnownAdvice:
        """The host's copy with what the store's other holders added since and `table`'s answers (a resumed run's
        table) taken where it has none: what a fresh advice table is given."""
        if self.store is not None:
            self.store.refresh()
            self.known.take_missing(self.store.answers)
        self.known.take_missing(table)
        return self.known

    def save_store(self) -> None:
        """Adds the answers of the advisor as it started, new since the last save, to its store."""
        if self.store is not None:
            self.store.save()

    def use_adapter(self, path: str | None) -> None:
        """The advisor answers with LoRA adapter `path` (None: the base model) from now on: its answers are another
        advisor's, so the host's copy becomes that adapter's store (or empty)."""
        self.workers.command("load", path=path, timeout_s=600.0)
        self.save_store()
        self.store = self._open_store_of(path) if self._open_store_of is not None else None
        known = self.store.answers.copy() if self.store is not None else KnownAdvice.empty(self.known.num_keys)
        self.fields.without_past(known)
        self.known = known

    def adopt(self, version: int) -> None:
        """A LoRA round the sidecar adopted: its answers are version `version`'s and replace the older ones."""
        self.version = int(version)

    # ---------------------------------------------------------------------------------------- counters
    def reset_counters(self) -> None:
        self.answered = {name: 0 for name in STATUS_NAMES}
        self.latencies = []
        self.counting_since = time.perf_counter()
        if self._log is not None:
            self._log.restart()  # each update logs its first hybrid.link.log_llm answers
        if self.workers is not None:
            self.workers.reset_counters()

    def metrics(self) -> dict:
        """The advisor's counters since reset_counters(), and how much of the host's copy is filled."""
        workers = self.workers.metrics() if self.workers is not None else {}
        hits, misses = workers.get("cache_hits", 0), workers.get("cache_misses", 0)
        out = {"llm_rate": self.answered.get("ok", 0) / max(time.perf_counter() - self.counting_since, 1e-9),
               **latency_metrics(self.latencies), "llm_cache_hit_rate": hits / max(hits + misses, 1)}
        if self.known is not None:
            out["advice_keys_filled"] = float(self.known.filled().mean())
            out["advice_keys_filled_current"] = float(self.known.filled(self.version).mean())
        out.update({name: value for name, value in workers.items() if name.startswith("llm_")})
        for name in STATUS_NAMES:
            out[f"llm_{name}"] = self.answered.get(name, 0)
        return out


class LlmLog:
    """RUN/llm_log.jsonl: the first `limit` prompts and answers since the advisor's counters were reset, each with its
    key, the bar its prompt was rendered from and its side."""

    def __init__(self, path: Path, limit: int, renderer: PromptRenderer, texts: list[str] | None, fields):
        self.file, self.limit, self.renderer, self.texts, self.fields = open(path, "a"), limit, renderer, texts, fields
        self.logged = 0

    def restart(self) -> None:
        """Logs the first `limit` answers from now on (each update's)."""
        self.logged = 0

    def close(self) -> None:
        self.file.close()

    def write(self, prompts, answers: Answers) -> None:
        if self.logged >= self.limit:
            return

        def text(x) -> str:
            return x.decode(errors="replace") if isinstance(x, bytes) else str(x)

        n = min(len(answers), self.limit - self.logged)
        if np.asarray(prompts).dtype.kind == "f":  # prompt-field rows (the mock reading them): the prompts they mean
            prompts = self.renderer.render(prompts[:n], self.texts)
        bars = self.fields.rendered_bar(answers.keys[:n])  # the bar each prompt was rendered from
        for i in range(n):
            key = int(answers.keys[i])
            self.file.write(json.dumps({
                "key": key,
                "bar": int(bars[i]),
                "side": int(key_side(key)),
                "prompt": text(prompts[i]),
                "answer": text(answers.reasons[i]) if answers.reasons is not None else None,
                "probs": [round(float(x), 4) for x in answers.probs[i]],
                "confidence": float(answers.confidence[i]),
                "status": STATUS_NAMES[int(answers.status[i])],
            }) + "\n")
            self.logged += 1
        self.file.flush()


def ask_every(advisor: Advisor, keys: np.ndarray, batch: int, on_progress: Callable[[int], None] | None = None,
              stop: Callable[[], bool] | None = None, save_every_s: float | None = None,
              on_collect: Callable[[Taken], None] | None = None) -> int:
    """The fill's pacing (advise.py, a walk's keys asked ahead of it): asks every one of `keys` in submissions of
    `batch`, MAX_IN_FLIGHT at a time, waiting as long as the advisor takes, into the host's copy and the store (saved
    every `save_every_s`); how many got an answer. `on_progress(done)` after each collection, `on_collect` with what
    each brought (the caller's bookkeeping); `stop()` ends it after the submissions in flight."""
    done, saved_at = 0, time.perf_counter()

    def take() -> None:
        nonlocal done, saved_at
        taken = advisor.collect(wait=True, timeout_s=None)
        if on_collect is not None:
            on_collect(taken)
        done += int(np.asarray(answered(taken.rows[3])).sum())
        if on_progress is not None:
            on_progress(done)
        if save_every_s and time.perf_counter() - saved_at > save_every_s:
            advisor.save_store()
            saved_at = time.perf_counter()

    for start in range(0, len(keys), batch):
        if stop is not None and stop():
            break
        advisor.submit(keys[start:start + batch])
        while len(advisor.pending) >= MAX_IN_FLIGHT:
            take()
    while advisor.pending:
        take()
    return done
