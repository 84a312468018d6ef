"""The hybrid update: the rollout runs as T/k jitted chunks of k steps; between chunks the host runs a
query step (DESIGN.md, "One training update, as data flows"):

1. on device, pick at most B envs to ask and gather their prompt scalars;
2. on the host, render their prompts and submit them to the sidecar (never blocking);
3. collect the answers to the previous query step (strict: wait for them; async: take what is ready) and
   write them into the on-device advice table. Prompts sent at query step q are answered into the table
   at q+1: one query step of latency.

Then PPO learns from the concatenated chunks, through the fused distribution the actions were sampled from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from agents.acting import HybridActing
from agents.advice import select_queries
from agents.config import ConfigError, HybridConfig
from agents.prompt_fields import PromptFieldBuilder, gather_state
from agents.risk_veto import RULES
from bridge import STATUS_NAMES, BridgeConfig, PromptRenderer, SidecarClient
from bridge.prompts import DEFAULT_PROMPTS_PATH



def make_acting(cfg, env) -> HybridActing:
    h = cfg.hybrid
    return HybridActing(h.fusion, h.query, h.veto, h.llm_weight, env.window, env.extended)


def sidecar_options(cfg) -> tuple[str, dict]:
    """The backend and flags `SidecarClient.start` passes to `python -m llm_sidecar serve`."""
    h = cfg.hybrid
    if cfg.llm == "mock":
        return "mock", {"latency_s": h.mock_latency_s or None, "mock_answers": h.mock_answers}
    model = "smollm2" if cfg.llm == "smollm2" else cfg.llm
    if h.llm_adapter and not Path(h.llm_adapter).is_dir():
        raise ConfigError(f"hybrid.llm_adapter: no LoRA adapter directory at {h.llm_adapter}")
    return "transformers", {
        "model": model,
        "mode": h.llm_mode,
        "quantize": None if h.quantization == "none" else h.quantization,
        "lora": h.llm_adapter or None,
        "threads": h.sidecar_threads,
        "batch_size": h.sidecar_batch_size,
    }


def chunk_lengths(steps: int, k: int) -> list[int]:
    """Steps per chunk when `steps` env steps run k at a time, e.g. 64 steps, k=5: 12×5 + 4."""
    return [k] * (steps // k) + ([steps % k] if steps % k else [])


AUTO_START = 16  # budget `auto`: B of the first query step ...
AUTO_MIN = 4  # ... and the least it shrinks to (a few prompts keep the rate measurable)


class AdvisorLink:
    """Query steps for any carry with `.env_state` and `.hybrid` (a RunnerState in training, a one-account walk
    in evaluation): select envs on device, render and submit their prompts, collect the previous query step's
    answers into the advice table. Owns the sidecar client, restarts a dead sidecar, and counts everything."""

    def __init__(self, cfg, market, n_envs: int, run_dir: Path | None = None, client: SidecarClient | None = None,
                 latency: str | None = None):
        self.cfg = cfg
        self.h: HybridConfig = cfg.hybrid
        self.latency = latency or self.h.latency
        self.cap = min(self.h.max_budget, n_envs)
        self.auto = self.h.budget == "auto"
        self.budget = min(AUTO_START, self.cap) if self.auto else min(int(self.h.budget), self.cap)
        self.renderer = PromptRenderer.from_yaml(self.h.prompts or DEFAULT_PROMPTS_PATH)
        self.fields = PromptFieldBuilder(market, list(self.renderer.markets), cfg.env.contracts_per_trade)
        self.texts = list(market.text_table) or None
        self.client = client or self._start_client()
        self.pending: list[tuple] = []  # (query step, submit time, prompts) of submissions not yet collected
        self.query_steps_total = 0  # never reset: pending submissions are ordered by it across updates
        self.last_restart = -float("inf")
        self.llm_log = open(run_dir / "llm_log.jsonl", "a") if (run_dir and self.h.log_llm) else None
        self.on_answers = None  # optional hook(answers) for callers that keep the answers (evaluation: reasons)
        self.reset_counters()

        def select(carry):
            hy = carry.hybrid
            side = carry.env_state.side.astype(jnp.int32)
            pi_top = jnp.stack([hy.top_prob, 1.0 - hy.top_prob], -1)  # only the top probability matters here
            env_ids, valid = select_queries(hy.advice, self.h.query, self.cap, pi_top, side, hy.changed)
            advice = hy.advice.mark_queried(env_ids, valid, side)
            hy = hy.replace(advice=advice, changed=hy.changed.at[env_ids].set(False))
            return carry.replace(hybrid=hy), env_ids, valid, gather_state(carry.env_state, env_ids)

        def write(carry, env_ids, probs, confidence, status, valid):
            hy = carry.hybrid
            return carry.replace(hybrid=hy.replace(advice=hy.advice.write(env_ids, probs, confidence, status, valid)))

        self._select = jax.jit(select)
        self._write = jax.jit(write)

    def _start_client(self) -> SidecarClient:
        backend, options = sidecar_options(self.cfg)
        client = SidecarClient(BridgeConfig(capacity=self.cap))
        try:
            client.start(backend=backend, prompts=self.renderer, **options)
        except Exception:
            client.close()
            raise
        return client

    def close(self) -> None:
        if self.llm_log:
            self.llm_log.close()
        self.client.close()

    def reset_counters(self) -> None:
        self.n_query_steps = 0
        self.n_prompts = 0
        self.n_answers = {name: 0 for name in STATUS_NAMES}
        self.wait_s = 0.0
        self.latencies: list[float] = []
        self.logged = 0

    def query_step(self, carry, chunk_s: float | None = None):
        """`chunk_s`: how long the chunk since the previous query step ran (sizes budget `auto`)."""
        carry, env_ids, valid, scalars = self._select(carry)
        env_ids, valid, scalars = jax.device_get((env_ids, valid, scalars))
        take = np.flatnonzero(valid)[: self.budget]  # top_k sorted them by priority
        step = self.query_steps_total
        self.query_steps_total += 1
        self.n_query_steps += 1
        if not self.client.alive:
            # Training goes on without advice while a new sidecar starts; pending rows come back as backend_error.
            if time.monotonic() - self.last_restart > self.client.config.start_timeout_s:
                self.client.restart(wait=False)
                self.last_restart = time.monotonic()
        elif len(take) and self.client.pending < 2:
            rows = {k: v[take] for k, v in scalars.items()}
            prompts = self.renderer.render(self.fields.build(rows), self.texts)
            self.client.submit(env_ids[take], prompts)
            self.pending.append((step, time.perf_counter(), prompts))
            self.n_prompts += len(take)
        # The answers to earlier query steps' prompts: one step of latency.
        while self.pending and self.pending[0][0] < step:
            carry = self._collect(carry, wait=self.latency == "strict", chunk_s=chunk_s)
        return carry

    def drain(self, carry):
        """Collects every pending answer (waiting for them), e.g. at the end of an evaluation walk."""
        while self.pending:
            carry = self._collect(carry, wait=True)
        return carry

    def _collect(self, carry, wait: bool, chunk_s: float | None = None):
        t0 = time.perf_counter()
        answers = self.client.collect(timeout_s=self.h.strict_timeout_s if wait else 0.0)
        waited = time.perf_counter() - t0
        self.wait_s += waited
        _, submitted_at, prompts = self.pending.pop(0)
        if not len(answers):
            return carry
        for name, count in answers.counts().items():
            self.n_answers[name] = self.n_answers.get(name, 0) + count
        latency = time.perf_counter() - submitted_at
        self.latencies.append(latency)
        if self.auto and chunk_s:
            self._resize(len(answers), latency, waited, chunk_s)
        self._log_llm(prompts, answers)
        if self.on_answers is not None:
            self.on_answers(answers)
        n = len(answers)
        pad = self.cap - n  # fixed shapes: one compiled write for every answer count
        ids = np.concatenate([answers.env_ids, np.zeros(pad, np.int32)]).astype(np.int32)
        probs = np.concatenate([answers.probs, np.full((pad, 6), 1 / 6, np.float32)])
        conf = np.concatenate([answers.confidence, np.zeros(pad, np.float32)])
        status = np.concatenate([answers.status, np.zeros(pad, np.int32)]).astype(np.int32)
        valid = np.arange(self.cap) < n
        return self._write(carry, ids, probs, conf, status, valid)

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

    def _resize(self, answered: int, latency: float, waited: float, chunk_s: float) -> None:
        """Budget `auto`: B such that answering one query step's prompts hides behind one chunk. Answers that
        kept the loop waiting were the sidecar's whole work since they were submitted, so their rate sizes B to
        90% of the chunk; answers that were ready let B grow by a quarter."""
        if waited > 0.05 * chunk_s:
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
            "llm_budget": self.budget,
            "llm_wait_s_per_query": self.wait_s / max(self.n_query_steps, 1),
            "llm_latency_p50_s": float(np.nanpercentile(lat, 50)),
            "llm_latency_p95_s": float(np.nanpercentile(lat, 95)),
            "llm_cache_hit_rate": hits / max(hits + misses, 1),
        }
        for name in STATUS_NAMES:
            out[f"llm_{name}"] = self.n_answers.get(name, 0)
        return out


def acting_metrics(stats: dict) -> dict:
    """Rates from the acting step's per-step sums (agents.acting.HybridActing stats)."""
    decisions = max(float(stats["decisions"]), 1.0)
    with_advice = max(float(stats["with_advice"]), 1.0)
    return {
        "llm_coverage": float(stats["with_advice"]) / decisions,
        "llm_advice_confidence": float(stats["advice_confidence"]) / with_advice,
        "llm_agreement": float(stats["agreement"]) / with_advice,
        "llm_override_rate": float(stats["overrides"]) / decisions,
        "llm_trust": float(stats["trust"]) / with_advice,
        "veto_rate": float(stats["veto_active"]) / decisions,
        **{f"veto_fired_{r}": float(stats[f"veto_fired_{r}"]) for r in RULES},
    }


class QueryLoop:
    """Runs hybrid updates: chunks with query steps between them, then one PPO learning step."""

    def __init__(self, cfg, ppo, market, run_dir: Path | None, client: SidecarClient | None = None):
        self.chunks = chunk_lengths(cfg.ppo.num_steps, cfg.hybrid.query.interval)
        self.link = AdvisorLink(cfg, market, cfg.num_envs, run_dir, client)
        self._chunk = jax.jit(ppo.rollout_chunk, static_argnums=1)
        self._learn = jax.jit(ppo.learn)

    @property
    def client(self) -> SidecarClient:
        return self.link.client

    def close(self) -> None:
        self.link.close()

    def update(self, rs):
        """One PPO update: T/k chunks with query steps between them, then learning."""
        self.link.reset_counters()
        chunk_s = None  # the first query step follows learning, not a chunk
        trajs = []
        for k in self.chunks:
            rs = self.link.query_step(rs, chunk_s)
            t0 = time.perf_counter()
            rs, traj = self._chunk(rs, k)
            jax.block_until_ready(traj.reward)
            chunk_s = time.perf_counter() - t0
            trajs.append(traj)
        traj = jax.tree.map(lambda *xs: jnp.concatenate(xs), *trajs)
        stats = jax.device_get(jax.tree.map(jnp.sum, traj.extras.stats))
        rs, metrics = self._learn(rs, traj)
        metrics = dict(metrics)
        metrics["llm_query_rate"] = self.link.n_prompts / max(float(stats["decisions"]), 1.0)
        metrics.update(acting_metrics(stats))
        metrics.update(self.link.metrics())
        return rs, metrics
