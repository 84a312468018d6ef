"""A query step (docs/design.md, "One training update, as data flows"), between two jitted chunks:

1. on device, pick at most B envs to ask and gather their prompt scalars;
2. on the host, render their prompts and submit them to the sidecar (never blocking);
3. collect the answers to the previous query step (strict: wait for them; async: take them once all are ready)
   and write them into the on-device advice table. Prompts sent at query step q are answered into the table
   at q+1: one query step of latency (async: at least one).

`AdvisorLink` owns the advisor workers (an `AdvisorPool` of sidecar processes) for training and evaluation walks
alike, restarts a dead one, sizes budget `auto`, and counts everything.

Several processes (`shared`: training over agents.devices.parallel's multi-process mesh) each run their own workers for
their own block of envs. Every decision that shapes the jitted program is agreed through host collectives: each
process's budget for the query step (0 where its advisor cannot take prompts), and the answers each collected,
which every process then writes into the one global advice table.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from agents.advice.table import select_queries
from agents.advisor.prompt_fields import PromptFieldBuilder, gather_state
from agents.advisor.sidecar import learning_options, worker_count, worker_options
from agents.advisor.workers import AdvisorPool
from agents.config import ConfigError, HybridConfig
from agents.devices.parallel import gather_processes, to_host
from bridge import STATUS_NAMES, STATUS_OK, BridgeConfig, PromptRenderer, SidecarClient
from bridge.prompts import DEFAULT_PROMPTS_PATH
from bridge.protocol import NUM_ACTIONS, STATUS_BACKEND_ERROR, STATUS_TIMEOUT

AUTO_START = 16  # budget `auto`: B of the first query step ...
AUTO_MIN = 4  # ... and the least it shrinks to (a few prompts keep the rate measurable)
MAX_IN_FLIGHT = 2  # submissions the advisor may have to answer; while it has this many, a query step asks nobody


def latency_mode(cfg) -> str:
    """`hybrid.latency`, auto resolved: strict for the mock advisor (it answers in milliseconds, and tests need
    bit-reproducible runs), async for a model (on a CPU, waiting for it would cost most of the throughput)."""
    if cfg.hybrid.latency != "auto":
        return cfg.hybrid.latency
    return "strict" if cfg.llm == "mock" else "async"


class AdvisorLink:
    """Query steps for any carry with `.env_state` and `.hybrid` (a RunnerState in training, a one-account walk
    in evaluation): select envs on device, render and submit their prompts, collect the previous query step's
    answers into the advice table. Owns the advisor workers, restarts a dead one, and counts everything."""

    def __init__(self, cfg, market, n_envs: int, run_dir: Path | None = None, client: SidecarClient | None = None,
                 latency: str | None = None, learn: bool = False, adapter: str | None = None,
                 log_stem: Path | None = None, shared: bool = False):
        """`learn`: the sidecar learns from outcomes (training's link; never a validation walk's). `adapter`: the
        LoRA adapter to start from instead of the run's (a resumed run's learned one). `client`: one started
        sidecar to use instead of starting the run's workers. `log_stem`: worker i logs to {log_stem}_w{i}.log
        (default RUN_DIR/advisor). `shared`: the carry is global over several processes (training); each
        process asks its own workers about its own block of envs, and B is per process."""
        self.cfg = cfg
        self.h: HybridConfig = cfg.hybrid
        self.latency = latency or latency_mode(cfg)
        self.processes = jax.process_count() if shared else 1
        self.rank = jax.process_index() if shared else 0
        if self.processes > 1 and learn:
            raise ConfigError("hybrid.learning: the advisor learns from outcomes in one process only; turn learning "
                              "off or train in one process (on all its local devices)")
        self.cap = min(self.h.max_budget, n_envs // self.processes)  # per process
        self.auto = self.h.budget == "auto"
        self.budget = min(AUTO_START, self.cap) if self.auto else min(int(self.h.budget), self.cap)
        self.renderer = PromptRenderer.from_yaml(self.h.prompts or DEFAULT_PROMPTS_PATH)
        self.fields = PromptFieldBuilder(market, list(self.renderer.markets), cfg.env.contracts_per_trade)
        self.texts = list(market.text_table) or None
        self.learning = learning_options(cfg) if learn else None
        r = self.h.reasoning
        self.reasoning = r.enabled and self.renderer.reasoning is not None
        self.think_used = np.zeros(n_envs, np.int32)  # reasoned answers this episode, per env
        self.episode_time = np.zeros(n_envs, np.int64)  # the env's episode step when last asked
        self.n_thoughts = 0
        self.client = AdvisorPool([client]) if client else self._start_workers(adapter, log_stem or (run_dir and run_dir / "advisor"))
        self.written: list[tuple[int, np.ndarray, np.ndarray]] = []  # (seq, answer rows, env ids) written, ok only
        self.pending: list[list] = []  # [query step, submit time, prompts, late] of submissions not yet collected
        self.query_steps_total = 0  # never reset: pending submissions are ordered by it across updates
        self.llm_log = open(run_dir / "llm_log.jsonl", "a") if (run_dir and self.h.log_llm) else None
        self.on_answers = None  # optional hook(answers) for callers that keep the answers (evaluation: reasons)
        self.reset_counters()

        def select(carry, budgets):
            """Picks and marks as asked at most budgets[p] envs of each process p's block (traced counts: one
            compiled selection for every B). Only envs that are really asked are marked: a marked env counts as
            waiting for an answer."""
            hy = carry.hybrid
            n = hy.changed.shape[0]
            side = carry.env_state.side.astype(jnp.int32)
            pi_top = jnp.stack([hy.top_prob, 1.0 - hy.top_prob], -1)  # only the top probability matters here
            env_ids, valid = select_queries(hy.advice, self.h.query, self.cap, pi_top, side, hy.changed,
                                            blocks=self.processes)
            valid &= (jnp.arange(self.cap)[None, :] < budgets[:, None]).reshape(-1)  # top_k sorted them by priority
            advice = hy.advice.mark_queried(env_ids, valid, side)
            hy = hy.replace(advice=advice, changed=hy.changed.at[jnp.where(valid, env_ids, n)].set(False, mode="drop"))
            scalars = gather_state(carry.env_state, env_ids)
            scalars["top_prob"] = hy.top_prob[env_ids]
            scalars["episode_time"] = carry.env_state.time[env_ids]
            return carry.replace(hybrid=hy), env_ids, valid, scalars

        def write(carry, env_ids, probs, confidence, status, valid):
            hy = carry.hybrid
            return carry.replace(hybrid=hy.replace(advice=hy.advice.write(env_ids, probs, confidence, status, valid)))

        self._select = jax.jit(select)
        self._write = jax.jit(write)

    def _start_workers(self, adapter: str | None, log_stem: Path | None) -> AdvisorPool:
        options = worker_options(self.cfg, worker_count(self.cfg, self.cap), adapter)
        return AdvisorPool.start(options, BridgeConfig(capacity=self.cap), log_stem, prompts=self.renderer,
                                 learning=self.learning)

    def close(self) -> None:
        if self.llm_log:
            self.llm_log.close()
        self.client.close()

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
        self.client.reset_counters()

    def query_step(self, carry, chunk_s: float | None = None):
        """`chunk_s`: how long the chunk since the previous query step ran (sizes budget `auto`)."""
        step = self.query_steps_total
        self.query_steps_total += 1
        self.n_query_steps += 1
        # Training goes on while a dead worker restarts (the others answer; its pending rows are backend errors).
        self.client.restart_dead()
        ready = self.client.alive and self.client.pending < MAX_IN_FLIGHT
        if not ready:
            self.n_busy += 1  # nobody asked: the advisor is busy with earlier prompts, or down
        budgets = np.array([self.budget if ready else 0], np.int32)
        if self.processes > 1:  # every process runs the same selection: on the budgets of all of them
            budgets = gather_processes(budgets).reshape(-1)
        if budgets.any():
            carry, env_ids, valid, scalars = self._select(carry, budgets)
            env_ids, valid, scalars = to_host((env_ids, valid, scalars)) if self.processes > 1 else \
                jax.device_get((env_ids, valid, scalars))
            mine = slice(self.rank * self.cap, (self.rank + 1) * self.cap)  # this process's block's picks
            take = np.flatnonzero(valid[mine]) + mine.start
            if len(take):
                rows = {k: v[take] for k, v in scalars.items()}
                prompts = self.renderer.render(self.fields.build(rows), self.texts)
                self.client.submit(env_ids[take], prompts, self._think(env_ids[take], rows))
                self.pending.append([step, time.perf_counter(), prompts, False])
                self.n_prompts += len(take)
        # The answers to earlier query steps' prompts: one step of latency. Async takes a submission once all its
        # answers are ready (never waiting): a slow advisor's answers arrive some query steps late, not never.
        taken = []
        while self.pending and self.pending[0][0] < step:
            if self.latency == "async" and not self.client.oldest_done:
                self.pending[0][3] = True  # late: the advisor was busy with it for at least a whole chunk
                break
            taken.append(self._collect(wait=self.latency == "strict", chunk_s=chunk_s))
        if self.processes == 1:
            for rows in taken:
                carry = self._write(carry, *rows) if rows is not None else carry
            return carry
        # Several processes write the same answers in the same order: each contributes one row block per slot
        for slot in range(MAX_IN_FLIGHT):
            rows = gather_processes(taken[slot] if slot < len(taken) and taken[slot] is not None else self._rows())
            rows = [x.reshape(-1, *x.shape[2:]) for x in rows]
            if rows[-1].any():
                carry = self._write(carry, *rows)
        return carry

    def _think(self, env_ids: np.ndarray, rows: dict) -> np.ndarray | None:
        """Which of the asked envs get chain of thought: the policy is unsure, and the env has reasoning left
        in this episode (an episode step below the last one seen means a new episode)."""
        if not self.reasoning:
            return None
        r = self.h.reasoning
        time_now = rows["episode_time"].astype(np.int64)
        new_episode = time_now < self.episode_time[env_ids]
        self.think_used[env_ids[new_episode]] = 0
        self.episode_time[env_ids] = time_now
        think = (rows["top_prob"] < r.policy_confidence) & (self.think_used[env_ids] < r.per_episode)
        self.think_used[env_ids[think]] += 1
        self.n_thoughts += int(think.sum())
        return think

    def take_written(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The (seq, answer rows, env ids) of ok answers written into the advice table since the last call."""
        written, self.written = self.written, []
        return written

    def drain(self, carry):
        """Collects every pending answer (waiting for them), e.g. at the end of an evaluation walk (one process)."""
        while self.pending:
            rows = self._collect(wait=True)
            carry = self._write(carry, *rows) if rows is not None else carry
        return carry

    def _collect(self, wait: bool, chunk_s: float | None = None):
        """The oldest submission's answers as advice-table rows (`_rows`), None when none came, with everything
        counted, logged and kept for learning."""
        t0 = time.perf_counter()
        answers = self.client.collect(timeout_s=self.h.strict_timeout_s if wait else 0.0)
        waited = time.perf_counter() - t0
        self.wait_s += waited
        _, submitted_at, prompts, late = self.pending.pop(0)
        if not len(answers):
            return None
        for name, count in answers.counts().items():
            self.n_answers[name] = self.n_answers.get(name, 0) + count
        latency = time.perf_counter() - submitted_at
        self.latencies.append(latency)
        if self.auto and chunk_s:
            self._resize(answers, latency, late or waited > 0.05 * chunk_s, chunk_s)
        self._log_llm(prompts, answers)
        if self.on_answers is not None:
            self.on_answers(answers)
        ok = np.flatnonzero(answers.status == STATUS_OK)
        if self.learning and len(ok):
            self.written.append((answers.seq, ok, answers.env_ids[ok]))
        return self._rows(answers)

    def _rows(self, answers=None) -> tuple[np.ndarray, ...]:
        """(env ids, probabilities, confidence, status, valid) padded to `cap` rows (fixed shapes: one compiled
        write for every answer count); no answers: all rows invalid."""
        n = len(answers) if answers is not None else 0
        pad = self.cap - n
        ids = np.zeros(pad, np.int32)
        probs = np.full((pad, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32)
        conf, status = np.zeros(pad, np.float32), np.zeros(pad, np.int32)
        if n:
            ids, probs = np.concatenate([answers.env_ids, ids]), np.concatenate([answers.probs, probs])
            conf, status = np.concatenate([answers.confidence, conf]), np.concatenate([answers.status, status])
        return (ids.astype(np.int32), probs.astype(np.float32), conf.astype(np.float32), status.astype(np.int32),
                np.arange(self.cap) < n)

    def _log_llm(self, prompts, answers) -> None:
        if not self.llm_log or self.logged >= self.h.log_llm:
            return
        def text(x) -> str:
            return x.decode(errors="replace") if isinstance(x, bytes) else str(x)

        for i in range(min(len(answers), self.h.log_llm - self.logged)):
            self.llm_log.write(json.dumps({
                "env": int(answers.env_ids[i]),
                "prompt": text(prompts[i]),
                "answer": text(answers.reasons[i]) if answers.reasons is not None else None,
                "probs": [round(float(x), 4) for x in answers.probs[i]],
                "confidence": float(answers.confidence[i]),
                "status": STATUS_NAMES[int(answers.status[i])],
            }) + "\n")
            self.logged += 1
        self.llm_log.flush()

    def _resize(self, answers, latency: float, busy: bool, chunk_s: float) -> None:
        """Budget `auto`: B such that answering one query step's prompts hides behind one chunk. Answers that
        kept the advisor `busy` until collected (strict: the loop waited for them; async: they were not ready a
        query step later) or were not all answered were its whole work since they were submitted, so their rate
        sizes B to 90% of the chunk; answers that were all ready let B grow by a quarter. A niced advisor's rate
        is what the trainer left idle: B uses only that."""
        answered = int(((answers.status != STATUS_TIMEOUT) & (answers.status != STATUS_BACKEND_ERROR)).sum())
        if busy or answered < len(answers):
            target = answered / max(latency, 1e-6) * chunk_s * 0.9
        else:
            target = max(self.budget * 1.25, self.budget + 1)
        self.budget = int(np.clip(target, AUTO_MIN, self.cap))

    def metrics(self) -> dict:
        """The query side's counters since reset_counters()."""
        client_stats = self.client.stats()
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
        }
        out.update(self.client.metrics())
        if self.reasoning:
            out["llm_reasoned"] = self.n_thoughts
        for name in STATUS_NAMES:
            out[f"llm_{name}"] = self.n_answers.get(name, 0)
        return out


