"""A query step (docs/design.md, "One training update, as data flows"): in training one per update, before its
rollout; in an evaluation walk one every k bars.

1. on the host, collect the answers to earlier query steps' keys (strict: wait for the previous step's; async: take
   those that are ready, never waiting) and keep them in the host's copy of the advice table;
2. on device, one donated program writes them into the advice table and picks the keys to ask next: the missing or
   stale keys (agents.advice.table) the envs will read once they are answered, most read first, at most B;
3. once the device work that follows is dispatched (`send`), the host fetches the picked keys, renders their prompts
   and submits them to the advisor while the device runs.

An answer about block b is in force during block b + 1 whatever the advisor's speed: the latency contract is the
key's, not the query step's. A slow advisor leaves keys missing (lower coverage), never stale advice in force.

`AdvisorLink` drives an advisor session (agents.advisor.session: the one round trip of keys to the advisor's workers
and their answers back, into the host's copy of the table and the persistent store) for training and evaluation walks
alike; around it, the query step's own helpers: restarting a dead worker, sizing budget `auto`, the async lag,
llm_log, the multi-process gather, the outcomes kept for learning, and the counters.

Several processes (`shared`: training over agents.devices.parallel's multi-process mesh) run the same selection over
the one global table; process p asks its own workers about every P-th picked key, and the answers each collected are
gathered, so every process writes the same rows into its table and its host copy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from agents.advice.table import SIDES, WALK_AHEAD, key_side, num_blocks, query_program
from agents.advisor.prompt_fields import ACCOUNT_FIELDS, PromptFieldBuilder, prompt_instrument
from agents.advisor.session import MAX_IN_FLIGHT, AdvisorSession, table_rows
from agents.advisor.sidecar import learning_options, start_advisor
from agents.advisor.store import AdviceStore, Answers, identity, open_store, prompt_format_digest, store_root
from agents.advisor.workers import AdvisorPool
from agents.config import ConfigError, HybridConfig
from agents.devices.parallel import gather_processes, is_writer, to_host
from bridge import STATUS_NAMES, STATUS_OK, PromptRenderer, SidecarClient
from bridge.prompts import DEFAULT_PROMPTS_PATH
from bridge.protocol import STATUS_BACKEND_ERROR, STATUS_TIMEOUT
from jaxenv.contracts import resolve_contract

AUTO_START = 16  # budget `auto`: B of the first query step (async takes a submission once all of it is answered) ...
AUTO_MIN = 4  # ... and the least it shrinks to (a few prompts keep the rate measurable)
MAX_LAG = 16  # an async advisor is asked at most this many query steps further ahead
SAVE_EVERY_S = 60.0  # the advice store gets a query step's new answers at most this often (and at the end)


def latency_mode(cfg) -> str:
    """`hybrid.link.latency`, auto resolved: strict for the mock advisor (it answers in milliseconds, and tests need
    bit-reproducible runs), async for a model (on a CPU, waiting for it would cost most of the throughput)."""
    if cfg.hybrid.link.latency != "auto":
        return cfg.hybrid.link.latency
    return "strict" if cfg.llm == "mock" else "async"


def prompt_template(cfg) -> tuple[PromptRenderer, str]:
    """The run's prompt renderer for the run's instrument and its template's text; refuses a template naming one
    account's fields."""
    path = Path(cfg.hybrid.link.prompts or DEFAULT_PROMPTS_PATH)
    renderer = PromptRenderer.from_yaml(path, prompt_instrument(resolve_contract(cfg.data.contract)))
    account = sorted(renderer.fields_used & set(ACCOUNT_FIELDS))
    if account:
        raise ConfigError(f"{path}: context names {', '.join(account)}: advice is keyed by market context (bar block "
                          "and position side) and shared by every account, so a prompt cannot hold one account's "
                          "figures; remove them from the template")
    return renderer, path.read_text()


class AdvisorLink:
    """Query steps for any carry with `.env_state` and `.hybrid` (a RunnerState in training, a one-account walk in
    evaluation): collect answers into the advice table, pick the keys to ask on device, render and submit their
    prompts. Owns the advisor workers and the advice store."""

    def __init__(self, cfg, market, n_envs: int, run_dir: Path | None = None, client: SidecarClient | None = None,
                 latency: str | None = None, learn: bool = False, adapter: str | None = None,
                 log_stem: Path | None = None, shared: bool = False, ahead: tuple[int, int] = (0, 2),
                 walk: bool = False):
        """`learn`: the sidecar learns from outcomes (training's link; never a validation walk's). `adapter`: the
        LoRA adapter to start from instead of the run's (a resumed run's learned one). `client`: one started
        sidecar to use instead of starting the run's workers. `log_stem`: worker i logs to
        {log_stem}_w{i}.log
        (default RUN_DIR/advisor). `shared`: the carry is global over several processes (training); each
        process asks its own workers about its share of the keys, and B is per process. `ahead`: (first block, how
        many) relative to each env's now whose keys a query step asks for (agents.advice.table.update_ahead in
        training), moved on by the measured lag of an async advisor. `walk`: an evaluation walk's link, which asks for
        every key its account will read before it reads it (WALK_AHEAD)."""
        from agents.runs.adapters import starting_adapter

        self.cfg = cfg
        self.h: HybridConfig = cfg.hybrid
        self.latency = latency or latency_mode(cfg)
        self.processes = jax.process_count() if shared else 1
        self.rank = jax.process_index() if shared else 0
        if self.processes > 1 and learn:
            raise ConfigError("hybrid.learning: the advisor learns from outcomes in one process only; turn learning "
                              "off or train in one process (on all its local devices)")
        self.interval = self.h.query.interval
        self.num_keys = num_blocks(market.num_bars, self.interval) * SIDES
        self.cap = min(self.h.link.max_budget, self.num_keys // self.processes)  # per process
        # a walk asks every key it will read, a handful per query step: never fewer (budget auto could shrink B)
        self.auto = self.h.link.budget == "auto" and not walk
        self.budget = self.cap if walk else min(AUTO_START, self.cap) if self.auto else min(int(self.h.link.budget), self.cap)
        self.renderer, template = prompt_template(cfg)
        self.fields = PromptFieldBuilder(market, list(self.renderer.markets), cfg.env.contracts_per_trade,
                                         self.interval, self.h.shuffled)
        self.texts = list(market.text_table) or None
        self.learning = learning_options(cfg) if learn else None
        self.reasoning = self.h.reasoning.enabled and self.renderer.reasoning is not None
        self.market, self.template = market, template
        self.store_root = store_root(cfg)
        self.adapter = adapter or starting_adapter(cfg)
        self.prompt_format = (prompt_format_digest(self.fields, self.renderer, self.texts, self.num_keys)
                              if self.store_root else "")
        store = self._open_store(self.adapter)
        self.saved_at = time.perf_counter()
        self.version = 0  # the advisor's version: LoRA rounds finished since it started (QueryLoop sets it)
        self.first, self.count = WALK_AHEAD if walk else ahead
        self.lag = 0  # async: query steps its answers took beyond one (they are asked that much further ahead)
        log_stem = log_stem or (run_dir and run_dir / "advisor")
        # the advisor's workers (an AdvisorPool, or the mock reading prompt fields)
        self.workers = AdvisorPool([client]) if client else start_advisor(
            cfg, self.renderer, self.texts, self.cap, adapter, log_stem, self.learning)
        # the one round trip of keys to the advisor and back; the host's copy holds answers of every advisor version
        self.session = AdvisorSession(self.workers, self.fields, self.renderer, self.texts, self._known(store), store,
                                      self.reasoning)
        self.written: list[tuple[int, np.ndarray, np.ndarray]] = []  # (seq, answer rows, keys) written, ok only
        self.query_steps_total = 0  # never reset: pending submissions are ordered by it across updates
        self.picks = None  # the latest selection (device arrays), sent by send()
        self.last_step_at: float | None = None
        self.llm_log = open(run_dir / "llm_log.jsonl", "a") if (run_dir and self.h.link.log_llm) else None
        self.on_answers = None  # optional hook(answers) for callers that keep the answers (evaluation: reasons)
        self.reset_counters()
        # training asks the keys its record lacks too (a walk asks every key its account reads before it reads it)
        self._step = query_program(self.h.query, self.cap, self.processes, self.count, all_sides=walk,
                                   record_asks=not walk)

    def close(self) -> None:
        if self.llm_log:
            self.llm_log.close()
        if not is_writer():  # only process 0 saves the store
            self.session.store = None
        self.session.close()

    def _open_store(self, adapter: str | None) -> AdviceStore | None:
        """This process's holder of the store of the advisor with `adapter` (None without a store)."""
        if self.store_root is None:
            return None
        ident = identity(self.cfg, self.market, self.template, adapter, self.prompt_format, self.store_root)
        return open_store(self.store_root, ident, self.num_keys)

    def _known(self, store: AdviceStore | None) -> Answers:
        """A fresh host copy of the table: the store's answers (version 0), the shuffled control's PASS keys."""
        known = store.answers.copy() if store is not None else Answers.empty(self.num_keys)
        self.fields.without_past(known)
        return known

    def save_store(self) -> None:
        """Adds the answers of the advisor as it started, new since the last save, to the advice store (process 0)."""
        if self.session.store is not None and is_writer():
            self.session.store.save()
            self.saved_at = time.perf_counter()

    def use_adapter(self, path: str | None) -> None:
        """The advisor answers with LoRA adapter `path` (None: the base model) from now on: its answers are another
        advisor's, so the host's copy becomes that adapter's store (or empty)."""
        self.workers.command("load", path=path, timeout_s=600.0)
        self.save_store()
        self.adapter = path
        self.session.store = self._open_store(path)
        self.session.known = self._known(self.session.store)

    def reset_counters(self) -> None:
        self.n_query_steps = 0
        self.n_busy = 0  # query steps that asked nobody because the advisor could take no more prompts
        self.n_prompts = 0
        self.n_answers = {name: 0 for name in STATUS_NAMES}
        self.wait_s = 0.0
        self.latencies: list[float] = []
        self.logged = 0
        self.n_thoughts = 0
        self.counting_since = time.perf_counter()
        self.workers.reset_counters()

    def sync(self, carry):
        """The carry with its advice table holding the host's copy (the store's answers and every answer this link
        collected), merged with what the table already had (a resumed run's). Once per table: at a training run's
        start, and at each walk's."""
        table = carry.hybrid.advice
        if table.num_keys != self.num_keys:
            raise ValueError(f"advice table of {table.num_keys} keys for a market of {self.num_keys}")
        if self.session.store is not None:  # what other holders added since: this run's other links, other processes
            self.session.store.refresh()
            self.session.known.take_missing(self.session.store.answers)
        self.session.known.take_missing(to_host(table) if self.processes > 1 else jax.device_get(table))
        k = self.session.known
        table = table.replace(probs=jnp.asarray(k.probs), confidence=jnp.asarray(k.confidence),
                              status=jnp.asarray(k.status), version=jnp.asarray(k.version))
        # own buffers for every leaf: query steps donate the carry, and a carry built eagerly can share one
        return jax.tree.map(jnp.copy, carry.replace(hybrid=carry.hybrid.replace(advice=table)))

    def query_step(self, carry):
        """Collects answers into the table and picks the keys to ask (dispatched on device, not waited for); `send`
        asks them once the next chunk is dispatched."""
        step = self.query_steps_total
        self.query_steps_total += 1
        self.n_query_steps += 1
        now = time.perf_counter()
        since = None if self.last_step_at is None else now - self.last_step_at
        self.last_step_at = now
        # The answers to earlier query steps' prompts. Async takes a submission once all its answers are ready
        # (never waiting): a slow advisor's answers arrive some query steps late, not never.
        taken = []
        while self.session.pending and self.session.pending[0].step < step:
            if self.latency == "async" and not self.workers.oldest_done:
                self.session.pending[0].late = True  # the advisor was busy with it for at least a whole chunk
                break
            taken.append(self._collect(wait=self.latency == "strict", since_s=since))
        rows = self._rows(taken)
        if now - self.saved_at > SAVE_EVERY_S:  # a run killed later keeps what it was told until now
            self.save_store()
        # Training goes on while a dead worker restarts (the others answer; its pending rows are backend errors).
        self.workers.restart_dead()
        ready = self.session.can_take
        if not ready:
            self.n_busy += 1  # nobody asked: the advisor is busy with earlier prompts, or down
        budgets = np.array([self.budget if ready else 0], np.int32)
        first = self.first + self.lag * max(self.count - 2, 1)  # a query step's envs move about count - 2 blocks
        if self.processes > 1:  # every process writes every process's answers, selects on all budgets, and asks
            # ahead by the largest lag
            shared = gather_processes(np.array([budgets[0], first], np.int32))
            budgets, first = shared[:, 0], int(shared[:, 1].max())
            rows = tuple(x.reshape(-1, *x.shape[2:]) for x in gather_processes(rows))
        carry, keys, valid = self._step(carry, rows, budgets, np.int32(self.version), np.int32(first))
        self.picks = (keys, valid) if budgets[self.rank] > 0 else None
        if self.picks is not None:
            for x in self.picks:
                x.copy_to_host_async()
        return carry

    def send(self, extra: np.ndarray | None = None) -> None:
        """Renders and submits the prompts of the keys the last query step picked for this process (the host's work
        while the device runs the chunk); then, if the advisor can take another submission, up to B of `extra`
        (keys asked for the caller's own use, not the envs': later_sessions' judging), collected like the rest."""
        if self.picks is not None:
            keys, valid = to_host(self.picks) if self.processes > 1 else jax.device_get(self.picks)
            self.picks = None
            take = np.flatnonzero(valid)
            take = take[take % self.processes == self.rank]
            if len(take):
                self.session.submit(keys[take], self.version, self.query_steps_total - 1)
                self.n_thoughts += len(take) if self.reasoning else 0
                self.n_prompts += len(take)
        if extra is not None and len(extra) and self.session.can_take:
            self.session.submit(np.asarray(extra)[:self.cap], self.version, self.query_steps_total - 1)

    def ask_all(self, keys: np.ndarray, progress: bool = False) -> None:
        """Asks every one of `keys` not answered yet, in submissions of the link's capacity at the advisor's full rate,
        waiting for the answers (an evaluation walk's keys, asked ahead of it: a handful a query step would leave the
        advisor's batches nearly empty); the next sync puts them in the table."""
        from tqdm import tqdm

        keys = np.asarray(keys)
        missing = keys[~self.session.known.filled()[keys]]
        if not len(missing):
            return
        with tqdm(total=len(missing), desc="advisor: the walk's keys", unit="key", leave=False, position=1,
                  disable=not progress, mininterval=2.0) as bar:
            self.session.fill(missing, self.cap, on_progress=lambda done: bar.update(done - bar.n),
                              save_every_s=SAVE_EVERY_S,
                              on_collect=lambda sent, answers, rows: self._took(sent, answers, rows, 0.0, None))
        self.n_prompts += len(missing)

    def take_written(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The (seq, answer rows, keys) of ok answers written into the advice table since the last call."""
        written, self.written = self.written, []
        return written

    def drain(self, carry):
        """Collects every pending answer (waiting for them), e.g. at the end of an evaluation walk (one process)."""
        self.send()
        taken = []
        while self.session.pending:
            taken.append(self._collect(wait=True))
        if taken:
            carry = carry.replace(hybrid=carry.hybrid.replace(
                advice=carry.hybrid.advice.write(*table_rows(taken, len(taken) * self.cap))))
        return carry

    def _collect(self, wait: bool, since_s: float | None = None):
        """The oldest submission's answers as rows for the table (agents.advisor.session), with everything counted,
        logged and kept for learning."""
        t0 = time.perf_counter()
        sent, answers, rows = self.session.collect(wait, self.h.link.strict_timeout_s)
        self._took(sent, answers, rows, time.perf_counter() - t0, since_s)
        return rows

    def _took(self, sent, answers, rows, waited: float, since_s: float | None) -> None:
        """The bookkeeping of one collection (`waited` seconds for it): counters, latency, the async lag, budget
        `auto`, llm_log, the caller's hook, the outcomes kept for learning."""
        self.wait_s += waited
        if not len(answers):
            return
        for name, count in answers.counts().items():
            self.n_answers[name] = self.n_answers.get(name, 0) + count
        latency = time.perf_counter() - sent.at
        self.latencies.append(latency)
        if self.latency == "async" and since_s:  # answers taking L query steps serve the envs L - 1 steps on
            self.lag = int(np.clip(np.ceil(latency / since_s) - 1, 0, MAX_LAG))
        if self.auto and since_s:
            self._resize(answers, latency, sent.late or waited > 0.05 * since_s, since_s)
        self._log_llm(sent.prompts, answers)
        if self.on_answers is not None:
            self.on_answers(answers)
        ok = np.flatnonzero(rows[3] == STATUS_OK)
        if self.learning and len(ok):
            self.written.append((answers.seq, ok, answers.env_ids[ok]))

    def _rows(self, taken: list) -> tuple[np.ndarray, ...]:
        """The collected answers as the table's rows, padded to MAX_IN_FLIGHT × cap (one compiled query step)."""
        return table_rows(taken, MAX_IN_FLIGHT * self.cap)

    def _log_llm(self, prompts, answers) -> None:
        if not self.llm_log or self.logged >= self.h.link.log_llm:
            return
        def text(x) -> str:
            return x.decode(errors="replace") if isinstance(x, bytes) else str(x)

        n = min(len(answers), self.h.link.log_llm - self.logged)
        if np.asarray(prompts).dtype.kind == "f":  # prompt-field rows (the mock reading them): the prompts they stand for
            prompts = self.renderer.render(prompts[:n], self.texts)
        bars = self.fields.rendered_bar(answers.env_ids[:n])  # the bar each prompt was rendered from
        for i in range(n):
            key = int(answers.env_ids[i])
            self.llm_log.write(json.dumps({
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
        self.llm_log.flush()

    def _resize(self, answers, latency: float, busy: bool, since_s: float) -> None:
        """Budget `auto`: B such that answering one query step's prompts hides behind the time between query steps.
        Answers that kept the advisor `busy` until collected (strict: the loop waited for them; async: they were not
        ready a query step later) or were not all answered were its whole work since they were submitted, so their
        rate sizes B to 90% of that time; answers that were all ready let B double."""
        got = int(((answers.status != STATUS_TIMEOUT) & (answers.status != STATUS_BACKEND_ERROR)).sum())
        if busy or got < len(answers):
            target = got / max(latency, 1e-6) * since_s * 0.9
        else:
            target = 2 * self.budget
        self.budget = int(np.clip(target, AUTO_MIN, self.cap))

    def metrics(self) -> dict:
        """The query side's counters since reset_counters(), and how much of the table is filled."""
        client_stats = self.workers.stats()
        hits, misses = client_stats.get("cache_hits", 0), client_stats.get("cache_misses", 0)
        lat = np.array(self.latencies) if self.latencies else np.array([0.0])
        out = {
            "llm_prompts": self.n_prompts,
            "llm_rate": self.n_answers.get("ok", 0) / max(time.perf_counter() - self.counting_since, 1e-9),
            "llm_budget": self.budget,
            "llm_wait_s_per_query": self.wait_s / max(self.n_query_steps, 1),
            "llm_busy_rate": self.n_busy / max(self.n_query_steps, 1),
            "llm_latency_p50_s": float(np.nanpercentile(lat, 50)),
            "llm_latency_p95_s": float(np.nanpercentile(lat, 95)),
            "llm_cache_hit_rate": hits / max(hits + misses, 1),
            "advice_keys_filled": float(self.session.known.filled().mean()),
            "advice_keys_filled_current": float(self.session.known.filled(self.version).mean()),
            "llm_lag": float(self.lag),
        }
        out.update(self.workers.metrics())
        if self.reasoning:
            out["llm_reasoned"] = self.n_thoughts
        for name in STATUS_NAMES:
            out[f"llm_{name}"] = self.n_answers.get(name, 0)
        return out
