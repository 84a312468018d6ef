"""A query step (docs/design.md, "One training update, as data flows"): in training one per update, before its
rollout; in an evaluation walk one every k bars. The pacer decides which keys to ask and when; the advisor
(agents.advisor.advisor.Advisor) asks them.

1. on the host, collect the answers to earlier query steps' keys (strict: wait for the previous step's; async: take
   those that are ready, never waiting);
2. on device, one donated program writes them into the advice table and picks the keys to ask next: the missing or
   stale keys (agents.advice.table) the envs will read once they are answered, most read first, at most B;
3. once the device work that follows is dispatched (`send`), the host fetches the picked keys and the advisor submits
   their prompts while the device runs.

An answer about block b is in force during block b + 1 whatever the advisor's speed: the latency contract is the
key's, not the query step's. A slow advisor leaves keys missing (lower coverage), never stale advice in force.

Around the selection, the pacer sizes budget `auto`, measures the async lag, restarts a dead worker and keeps the
outcomes of the answers written (for an advisor that learns). Several processes (`shared`: training over
agents.devices.parallel's multi-process mesh) run the same selection over the one global table; process p asks its
own workers about every P-th picked key, and the answers each collected are gathered, so every process writes the
same rows into its table and its host copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from agents.advice.table import SIDES, WALK_AHEAD, num_blocks, query_program, table_rows
from agents.advisor.advisor import MAX_IN_FLIGHT, Advisor, Taken, ask_every
from agents.advisor.sidecar import at_full_rate, learning_options
from agents.config import ConfigError, HybridConfig
from agents.devices.parallel import gather_processes, is_writer, to_host
from bridge import STATUS_OK, SidecarClient
from bridge.protocol import STATUS_BACKEND_ERROR, STATUS_TIMEOUT
from jaxenv.config import DataConfig, EnvConfig

AUTO_START = 16  # budget `auto`: B of the first query step (async takes a submission once all of it is answered) ...
AUTO_MIN = 4  # ... and the least it shrinks to (a few prompts keep the rate measurable)
MAX_LAG = 16  # an async advisor is asked at most this many query steps further ahead
SAVE_EVERY_S = 60.0  # the advice store gets a query step's new answers at most this often (and at the end)


def latency_mode(hybrid: HybridConfig, llm: str) -> str:
    """`hybrid.link.latency`, auto resolved: strict for the mock advisor (it answers in milliseconds, and tests need
    bit-reproducible runs), async for a model (on a CPU, waiting for it would cost most of the throughput)."""
    if hybrid.link.latency != "auto":
        return hybrid.link.latency
    return "strict" if llm == "mock" else "async"


def query_capacity(h: HybridConfig, market, processes: int = 1) -> int:
    """The most keys one process asks in a query step: hybrid.link.max_budget, at most its share of the market's."""
    return min(h.link.max_budget, num_blocks(market.num_bars, h.query.interval) * SIDES // processes)


def training_pacer(hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, seed: int, market,
                   run_dir: Path | None, client: SidecarClient | None = None, learn: bool = False,
                   adapter: str | None = None, ahead: tuple[int, int] = (0, 2),
                   instruments: tuple[str, ...] = ()) -> QueryPacer:
    """Training's query steps and their advisor (at the run's niceness; `learn`: it learns from outcomes; `adapter`:
    a resumed run's learned one; `instruments`: Advisor.open's). Several processes: each asks its own workers about its share of the keys, only
    process 0 writes the run folder (`run_dir` None elsewhere: the others' workers log to their stderr)."""
    shared = jax.process_count() > 1
    if shared and learn:
        raise ConfigError("hybrid.learning: the advisor learns from outcomes in one process only; turn learning "
                          "off or train in one process (on all its local devices)")
    processes = jax.process_count() if shared else 1
    cap = query_capacity(hybrid, market, processes)
    own = f"_{market.contract.symbol}" if instruments else ""  # an account's advisors log apart
    advisor = Advisor.open(hybrid, llm, env, data, market, cap, adapter, log_stem=run_dir and run_dir / f"advisor{own}",
                           learning=learning_options(hybrid, seed) if learn else None, client=client,
                           llm_log=run_dir / f"llm_log{own}.jsonl" if run_dir else None, instruments=instruments)
    return QueryPacer(advisor, hybrid, market, latency_mode(hybrid, llm), shared=shared, ahead=ahead,
                      keep_written=learn)


def walk_pacer(hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market,
               client: SidecarClient | None = None, log_dir: Path | None = None) -> QueryPacer:
    """The query steps every advised walk asks through: one account, strict latency (a walk must be reproducible,
    whatever the run's training latency), its own sidecar at every core and normal priority (at_full_rate), logging
    to log_dir/advisor_eval_w0.log where a log_dir is given; it asks every key its account reads before reading it."""
    hybrid = at_full_rate(hybrid)
    advisor = Advisor.open(hybrid, llm, env, data, market, query_capacity(hybrid, market), None,
                           log_stem=log_dir and log_dir / "advisor_eval", client=client)
    return QueryPacer(advisor, hybrid, market, "strict", walk=True)


@dataclass
class Budget:
    """B, the keys a query step asks at most: fixed (hybrid.link.budget), or `auto`, sized from the advisor's measured
    rate so that answering one query step's prompts hides behind the time between query steps."""

    size: int
    cap: int  # the most B may be
    auto: bool = False

    def resize(self, answers, latency: float, busy: bool, since_s: float) -> None:
        """Answers that kept the advisor `busy` until collected (strict: the loop waited for them; async: they were
        not ready a query step later) or were not all answered were its whole work since they were submitted, so their
        rate sizes B to 90% of that time; answers that were all ready let B double."""
        got = int(((answers.status != STATUS_TIMEOUT) & (answers.status != STATUS_BACKEND_ERROR)).sum())
        if busy or got < len(answers):
            target = got / max(latency, 1e-6) * since_s * 0.9
        else:
            target = 2 * self.size
        self.size = int(np.clip(target, AUTO_MIN, self.cap))


@dataclass
class QueryCounts:
    """The query steps' counters since the pacer's reset_counters()."""

    steps: int = 0
    busy: int = 0  # query steps that asked nobody because the advisor could take no more prompts
    prompts: int = 0  # keys asked for the envs (not the caller's extra keys)
    wait_s: float = 0.0  # waiting for answers
    thoughts: int = 0  # prompts asked to think first (reasoning)


class QueryPacer:
    """Query steps for any carry with `.env_state` and `.hybrid` (a RunnerState in training, a one-account walk in
    evaluation): collect answers into the advice table, pick the keys to ask on device, have the advisor ask them."""

    def __init__(self, advisor: Advisor, h: HybridConfig, market, latency: str, shared: bool = False,
                 ahead: tuple[int, int] = (0, 2), walk: bool = False, keep_written: bool = False):
        """`shared`: the carry is global over several processes (training), and B is per process. `ahead`: (first
        block, how many) relative to each env's now whose keys a query step asks for (agents.advice.table.update_ahead
        in training), moved on by the measured lag of an async advisor. `walk`: an evaluation walk's pacer, which asks
        for every key its account will read before it reads it (WALK_AHEAD). `keep_written`: keeps the ok answers
        written, for an advisor that learns from their outcomes."""
        self.advisor, self.h, self.latency = advisor, h, latency
        self.processes = jax.process_count() if shared else 1
        self.rank = jax.process_index() if shared else 0
        self.num_keys = num_blocks(market.num_bars, h.query.interval) * SIDES
        cap = query_capacity(h, market, self.processes)  # per process
        # a walk asks every key it will read, a handful per query step: never fewer (budget auto could shrink B)
        auto = h.link.budget == "auto" and not walk
        self.budget = Budget(cap if walk else min(AUTO_START, cap) if auto else min(int(h.link.budget), cap), cap,
                             auto)
        self.first, self.count = WALK_AHEAD if walk else ahead
        self.lag = 0  # async: query steps its answers took beyond one (they are asked that much further ahead)
        self.keep_written = keep_written
        self.written: list[tuple[int, np.ndarray, np.ndarray]] = []  # (seq, answer rows, keys) written, ok only
        self.query_steps_total = 0  # never reset: pending submissions are ordered by it across updates
        self.picks = None  # the latest selection (device arrays), sent by send()
        self.last_step_at: float | None = None
        self.saved_at = time.perf_counter()
        self.late_steps: set[int] = set()  # async: query steps whose submission was not all answered a step later
        self.reasons: dict[int, str] | None = {} if walk else None  # a walk's: each key's reason, since reset
        self.reset_counters()
        # training asks the keys its record lacks too (a walk asks every key its account reads before it reads it)
        self._step = query_program(h.query, cap, self.processes, self.count, all_sides=walk,
                                   record_asks=not walk)

    def close(self) -> None:
        self.advisor.close(save=is_writer())  # only process 0 saves the store

    def reset_counters(self) -> None:
        self.counts = QueryCounts()
        self.advisor.reset_counters()
        if self.reasons is not None:
            self.reasons = {}

    def sync(self, carry):
        """The carry with its advice table holding the advisor's host copy (the store's answers and every answer
        collected), merged with what the table already had (a resumed run's). Once per table: at a training run's
        start, and at each walk's."""
        table = carry.hybrid.advice
        if table.num_keys != self.num_keys:
            raise ValueError(f"advice table of {table.num_keys} keys for a market of {self.num_keys}")
        table = table.holding(self.advisor.merged(to_host(table) if self.processes > 1 else jax.device_get(table)))
        # own buffers for every leaf: query steps donate the carry, and a carry built eagerly can share one
        return jax.tree.map(jnp.copy, carry.replace(hybrid=carry.hybrid.replace(advice=table)))

    def query_step(self, carry):
        """Collects answers into the table and picks the keys to ask (dispatched on device, not waited for); `send`
        asks them once the next chunk is dispatched."""
        advisor = self.advisor
        step = self.query_steps_total
        self.query_steps_total += 1
        self.counts.steps += 1
        now = time.perf_counter()
        since = None if self.last_step_at is None else now - self.last_step_at
        self.last_step_at = now
        # The answers to earlier query steps' prompts. Async takes a submission once all its answers are ready
        # (never waiting): a slow advisor's answers arrive some query steps late, not never.
        taken = []
        while advisor.pending and advisor.pending[0].step < step:
            if self.latency == "async" and not advisor.workers.oldest_done:
                self.late_steps.add(advisor.pending[0].step)  # the advisor was busy with it for at least a chunk
                break
            taken.append(self._collect(wait=self.latency == "strict", since_s=since))
        rows = table_rows(taken, MAX_IN_FLIGHT * self.budget.cap)  # padded: one compiled query step
        if now - self.saved_at > SAVE_EVERY_S and is_writer():  # a run killed later keeps what it was told until now
            advisor.save_store()
            self.saved_at = now
        # Training goes on while a dead worker restarts (the others answer; its pending rows are backend errors).
        advisor.workers.restart_dead()
        ready = advisor.can_take
        if not ready:
            self.counts.busy += 1  # nobody asked: the advisor is busy with earlier prompts, or down
        budgets = np.array([self.budget.size if ready else 0], np.int32)
        first = self.first + self.lag * max(self.count - 2, 1)  # a query step's envs move about count - 2 blocks
        if self.processes > 1:  # every process writes every process's answers, selects on all budgets, and asks
            # ahead by the largest lag
            shared = gather_processes(np.array([budgets[0], first], np.int32))
            budgets, first = shared[:, 0], int(shared[:, 1].max())
            rows = tuple(x.reshape(-1, *x.shape[2:]) for x in gather_processes(rows))
        carry, keys, valid = self._step(carry, rows, budgets, np.int32(advisor.version), np.int32(first))
        self.picks = (keys, valid) if budgets[self.rank] > 0 else None
        if self.picks is not None:
            for x in self.picks:
                x.copy_to_host_async()
        return carry

    def send(self, extra: np.ndarray | None = None) -> None:
        """Has the advisor ask about the keys the last query step picked for this process (the host's work while the
        device runs the chunk); then, if it can take another submission, up to B of `extra` (keys asked for the
        caller's own use, not the envs': later_sessions' judging), collected like the rest."""
        advisor = self.advisor
        if self.picks is not None:
            keys, valid = to_host(self.picks) if self.processes > 1 else jax.device_get(self.picks)
            self.picks = None
            take = np.flatnonzero(valid)
            take = take[take % self.processes == self.rank]
            if len(take):
                advisor.submit(keys[take], advisor.version, self.query_steps_total - 1)
                self.counts.thoughts += len(take) if advisor.reasoning else 0
                self.counts.prompts += len(take)
        if extra is not None and len(extra) and advisor.can_take:
            advisor.submit(np.asarray(extra)[:self.budget.cap], advisor.version, self.query_steps_total - 1)

    def ask_all(self, keys: np.ndarray, progress: bool = False) -> None:
        """Asks every one of `keys` not answered yet, in submissions of the pacer's capacity at the advisor's full
        rate, waiting for the answers (an evaluation walk's keys, asked ahead of it: a handful a query step would
        leave the advisor's batches nearly empty); the next sync puts them in the table."""
        from tqdm import tqdm

        keys = np.asarray(keys)
        missing = keys[~self.advisor.known.filled()[keys]]
        if not len(missing):
            return
        with tqdm(total=len(missing), desc="advisor: the walk's keys", unit="key", leave=False, position=1,
                  disable=not progress, mininterval=2.0) as bar:
            ask_every(self.advisor, missing, self.budget.cap, on_progress=lambda done: bar.update(done - bar.n),
                      save_every_s=SAVE_EVERY_S, on_collect=lambda taken: self._took(taken, 0.0, None))
        self.counts.prompts += len(missing)

    def take_written(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The (seq, answer rows, keys) of ok answers written into the advice table since the last call."""
        written, self.written = self.written, []
        return written

    def drain(self, carry):
        """Collects every pending answer (waiting for them), e.g. at the end of an evaluation walk (one process)."""
        self.send()
        taken = []
        while self.advisor.pending:
            taken.append(self._collect(wait=True))
        if taken:
            carry = carry.replace(hybrid=carry.hybrid.replace(
                advice=carry.hybrid.advice.write(*table_rows(taken, len(taken) * self.budget.cap))))
        return carry

    def _collect(self, wait: bool, since_s: float | None = None):
        """The oldest submission's rows for the table, with the pacer's bookkeeping."""
        t0 = time.perf_counter()
        taken = self.advisor.collect(wait, self.h.link.strict_timeout_s)
        self._took(taken, time.perf_counter() - t0, since_s)
        return taken.rows

    def _took(self, taken: Taken, waited: float, since_s: float | None) -> None:
        """The pacing after one collection (`waited` seconds for it): the async lag, budget `auto`, a walk's reasons,
        the outcomes kept for learning."""
        late = taken.sent.step in self.late_steps
        self.late_steps.discard(taken.sent.step)
        self.counts.wait_s += waited
        if not len(taken.answers):
            return
        if self.latency == "async" and since_s:  # answers taking L query steps serve the envs L - 1 steps on
            self.lag = int(np.clip(np.ceil(taken.latency_s / since_s) - 1, 0, MAX_LAG))
        if self.budget.auto and since_s:
            self.budget.resize(taken.answers, taken.latency_s, late or waited > 0.05 * since_s, since_s)
        if self.reasons is not None:
            self.reasons.update((int(key), reason.decode(errors="replace"))
                                for key, reason in zip(taken.answers.keys, taken.answers.reasons))
        ok = np.flatnonzero(taken.rows[3] == STATUS_OK)
        if self.keep_written and len(ok):
            self.written.append((taken.answers.seq, ok, taken.answers.keys[ok]))

    def metrics(self) -> dict:
        """The query steps' counters since reset_counters() and the advisor's."""
        c = self.counts
        out = {"llm_prompts": c.prompts, "llm_budget": self.budget.size,
               "llm_wait_s_per_query": c.wait_s / max(c.steps, 1), "llm_busy_rate": c.busy / max(c.steps, 1),
               "llm_lag": float(self.lag)}
        out.update(self.advisor.metrics())
        if self.advisor.reasoning:
            out["llm_reasoned"] = c.thoughts
        return out
