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
from agents.config import HybridConfig
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
        return "mock", {"latency_s": h.mock_latency_s or None}
    model = "smollm2" if cfg.llm == "smollm2" else cfg.llm
    return "transformers", {
        "model": model,
        "mode": h.llm_mode,
        "quantize": None if h.quantization == "none" else h.quantization,
        "threads": h.sidecar_threads,
        "batch_size": h.sidecar_batch_size,
    }


class QueryLoop:
    """Runs hybrid updates: chunks with query steps between them, then one PPO learning step."""

    def __init__(self, cfg, ppo, market, run_dir: Path | None, client: SidecarClient | None = None):
        self.cfg = cfg
        self.ppo = ppo
        self.h: HybridConfig = cfg.hybrid
        k, steps = self.h.query.interval, cfg.ppo.num_steps
        self.chunks = [k] * (steps // k) + ([steps % k] if steps % k else [])  # e.g. 64 steps, k=5: 12×5 + 4
        self.cap = min(self.h.max_budget, cfg.num_envs)
        self.budget = self.cap if self.h.budget == "auto" else min(int(self.h.budget), self.cap)
        self.renderer = PromptRenderer.from_yaml(self.h.prompts or DEFAULT_PROMPTS_PATH)
        self.fields = PromptFieldBuilder(market, list(self.renderer.markets), cfg.env.contracts_per_trade)
        self.texts = list(market.text_table) or None
        self.client = client or self._start_client()
        self.pending: list[tuple] = []  # (query step, submit time, prompts) of submissions not yet collected
        self.last_restart = -float("inf")
        self.llm_log = open(run_dir / "llm_log.jsonl", "a") if (run_dir and self.h.log_llm) else None
        self._reset_counters()

        def select(rs):
            hy = rs.hybrid
            flat = rs.env_state.side == 0
            pi_top = jnp.stack([hy.top_prob, 1.0 - hy.top_prob], -1)  # only the top probability matters here
            env_ids, valid = select_queries(hy.advice, self.h.query, self.cap, pi_top, flat, hy.changed)
            hy = hy.replace(advice=hy.advice.mark_queried(env_ids, valid), changed=hy.changed.at[env_ids].set(False))
            return rs.replace(hybrid=hy), env_ids, valid, gather_state(rs.env_state, env_ids)

        def write(rs, env_ids, probs, confidence, status, valid):
            hy = rs.hybrid
            return rs.replace(hybrid=hy.replace(advice=hy.advice.write(env_ids, probs, confidence, status, valid)))

        self._select = jax.jit(select)
        self._write = jax.jit(write)
        self._chunk = jax.jit(ppo.rollout_chunk, static_argnums=1)
        self._learn = jax.jit(ppo.learn)

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

    def _reset_counters(self) -> None:
        self.n_query_steps = 0
        self.n_prompts = 0
        self.n_answers = {name: 0 for name in STATUS_NAMES}
        self.wait_s = 0.0
        self.latencies: list[float] = []
        self.logged = 0

    # ------------------------------------------------------------------------------------------------
    def query_step(self, rs):
        rs, env_ids, valid, scalars = self._select(rs)
        env_ids, valid, scalars = jax.device_get((env_ids, valid, scalars))
        take = np.flatnonzero(valid)[: self.budget]  # top_k sorted them by priority
        step = self.n_query_steps
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
            rs = self._collect(rs, wait=self.h.latency == "strict")
        return rs

    def _collect(self, rs, wait: bool):
        t0 = time.perf_counter()
        answers = self.client.collect(timeout_s=self.h.strict_timeout_s if wait else 0.0)
        self.wait_s += time.perf_counter() - t0
        _, submitted_at, prompts = self.pending.pop(0)
        if not len(answers):
            return rs
        for name, count in answers.counts().items():
            self.n_answers[name] = self.n_answers.get(name, 0) + count
        self.latencies.append(time.perf_counter() - submitted_at)
        self._log_llm(prompts, answers)
        n = len(answers)
        pad = self.cap - n  # fixed shapes: one compiled write for every answer count
        ids = np.concatenate([answers.env_ids, np.zeros(pad, np.int32)]).astype(np.int32)
        probs = np.concatenate([answers.probs, np.full((pad, 6), 1 / 6, np.float32)])
        conf = np.concatenate([answers.confidence, np.zeros(pad, np.float32)])
        status = np.concatenate([answers.status, np.zeros(pad, np.int32)]).astype(np.int32)
        valid = np.arange(self.cap) < n
        return self._write(rs, ids, probs, conf, status, valid)

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

    def update(self, rs):
        """One PPO update: T/k chunks with query steps between them, then learning."""
        self._reset_counters()
        t_chunks = 0.0
        trajs = []
        for k in self.chunks:
            rs = self.query_step(rs)
            t0 = time.perf_counter()
            rs, traj = self._chunk(rs, k)
            jax.block_until_ready(traj.reward)
            t_chunks += time.perf_counter() - t0
            trajs.append(traj)
        traj = jax.tree.map(lambda *xs: jnp.concatenate(xs), *trajs)
        stats = jax.device_get(jax.tree.map(jnp.sum, traj.extras.stats))
        rs, metrics = self._learn(rs, traj)
        metrics = dict(metrics)
        metrics.update(self._llm_metrics(stats, t_chunks))
        return rs, metrics

    def _llm_metrics(self, stats: dict, t_chunks: float) -> dict:
        decisions = max(float(stats["decisions"]), 1.0)
        with_advice = max(float(stats["with_advice"]), 1.0)
        answered = sum(self.n_answers.values())
        client_stats = self.client.stats()
        hits, misses = client_stats.get("cache_hits", 0), client_stats.get("cache_misses", 0)
        lat = np.array(self.latencies) if self.latencies else np.array([0.0])
        chunk_s = t_chunks / max(self.n_query_steps, 1)
        if self.h.budget == "auto" and answered and self.latencies:
            # Size B so that answering one query step's prompts hides behind one chunk of env steps.
            rate = answered / max(float(np.sum(lat)), 1e-6)
            self.budget = int(np.clip(rate * chunk_s * 0.9, 8, self.cap))
        out = {
            "llm_query_rate": self.n_prompts / decisions,
            "llm_coverage": float(stats["with_advice"]) / decisions,
            "llm_advice_confidence": float(stats["advice_confidence"]) / with_advice,
            "llm_agreement": float(stats["agreement"]) / with_advice,
            "llm_override_rate": float(stats["overrides"]) / decisions,
            "llm_trust": float(stats["trust"]) / with_advice,
            "llm_prompts": self.n_prompts,
            "llm_budget": self.budget,
            "llm_wait_s_per_query": self.wait_s / max(self.n_query_steps, 1),
            "llm_latency_p50_s": float(np.nanpercentile(lat, 50)),
            "llm_latency_p95_s": float(np.nanpercentile(lat, 95)),
            "llm_cache_hit_rate": hits / max(hits + misses, 1),
            "veto_rate": float(stats["veto_active"]) / decisions,
            **{f"veto_fired_{r}": float(stats[f"veto_fired_{r}"]) for r in RULES},
        }
        for name in STATUS_NAMES:
            out[f"llm_{name}"] = self.n_answers.get(name, 0)
        return out
