"""The hybrid update (docs/design.md, "One training update, as data flows"): the rollout runs as T/k jitted chunks
of k steps with a query step (`AdvisorLink.query_step`) between chunks, then PPO learns from the concatenated
chunks through the fused distribution the actions were sampled from. With `hybrid.learning` on, each update's
outcomes go to the sidecar and a LoRA round starts every M updates."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from agents.advice.usage import advice_metrics
from agents.advisor.adapters import adapter_dir
from agents.advisor.link import AdvisorLink
from agents.advisor.outcomes import outcome_rows
from agents.advisor.workers import AdvisorPool
from agents.devices.parallel import gather_processes, is_writer
from bridge import STATUS_NAMES, SidecarClient

FINISH_ROUND_TIMEOUT_S = 3600.0  # a round finished at the end of a run: a CPU advisor's round can take many minutes


def chunk_lengths(steps: int, k: int) -> list[int]:
    """Steps per chunk when `steps` env steps run k at a time, e.g. 64 steps, k=5: 12×5 + 4."""
    return [k] * (steps // k) + ([steps % k] if steps % k else [])


class QueryLoop:
    """Runs hybrid updates: chunks with query steps between them, then one PPO learning step. With
    `hybrid.learning` on, it also sends each update's outcomes to the sidecar and starts a LoRA round every M
    updates (the sidecar learns between answering batches, so the rollout does not wait for it)."""

    def __init__(self, cfg, ppo, market, run_dir: Path | None, client: SidecarClient | None = None,
                 adapter: str | None = None):
        self.num_steps, self.interval = cfg.ppo.num_steps, cfg.hybrid.query.interval
        self.max_stretch = cfg.hybrid.query.max_stretch
        self.stretch = 1  # query steps every interval × stretch env steps (async: see _restretch)
        self.learning = cfg.hybrid.learning if cfg.hybrid.learning.enabled else None
        self.market = market  # its prices measure the market's move after each answer (the outcomes' `move`)
        # Several processes: each asks its own workers about its own envs (agents.advisor.link); only process 0
        # writes the run folder, the others' workers log to their stderr.
        self.link = AdvisorLink(cfg, market, cfg.num_envs, run_dir if is_writer() else None, client,
                                learn=self.learning is not None, adapter=adapter, shared=jax.process_count() > 1)
        self._chunk = jax.jit(ppo.rollout_chunk, static_argnums=1)
        self._learn = jax.jit(ppo.learn)
        self.rounds_seen = 0

    @property
    def query_interval(self) -> int:
        """Env steps between query steps in the next update."""
        return self.interval * self.stretch

    @property
    def chunks(self) -> list[int]:
        return chunk_lengths(self.num_steps, self.query_interval)

    @property
    def client(self) -> AdvisorPool:
        return self.link.client

    def close(self) -> None:
        self.link.close()

    def update(self, rs):
        """One PPO update: T/k chunks with query steps between them, then learning."""
        self.link.reset_counters()
        chunk_s = None  # the first query step follows learning, not a chunk
        trajs, applied, t0 = [], [], 0
        for k in self.chunks:
            rs = self.link.query_step(rs, chunk_s)
            applied.append((t0, self.link.take_written()))
            t = time.perf_counter()
            rs, traj = self._chunk(rs, k)
            jax.block_until_ready(traj.reward)
            chunk_s = time.perf_counter() - t
            trajs.append(traj)
            t0 += k
        traj = jax.tree.map(lambda *xs: jnp.concatenate(xs), *trajs)
        stats = jax.device_get(jax.tree.map(jnp.sum, traj.extras.stats))
        sent = self._send_outcomes(traj, applied) if self.learning else 0
        rs, metrics = self._learn(rs, traj)
        metrics = dict(metrics)
        metrics["llm_query_rate"] = self.link.n_prompts / max(float(stats["decisions"]), 1.0)
        metrics.update(advice_metrics(stats))
        metrics.update(self._link_metrics())
        metrics["llm_query_interval"] = self.query_interval
        self._restretch(metrics["llm_busy_rate"])
        if self.learning:
            metrics.update(self._learning_step(int(rs.update), sent))
        return rs, metrics

    def _link_metrics(self) -> dict:
        """The advisor's counters; with several processes, every process's combined (the same on each, so the
        stretch below is agreed): counts and rates summed, the rest averaged, and each process's rate."""
        own = self.link.metrics()
        processes = self.link.processes
        if processes == 1:
            return own
        keys = sorted(own)
        table = gather_processes(np.array([float(own[k]) for k in keys]))  # [processes, keys]
        summed = ("llm_prompts", "llm_rate", "llm_budget", "llm_workers_alive", "llm_reasoned",
                  *(f"llm_{name}" for name in STATUS_NAMES))
        out = {k: float(table[:, i].sum() if k in summed else table[:, i].mean()) for i, k in enumerate(keys)}
        out.update({f"llm_rate_p{p}": float(table[p, keys.index("llm_rate")]) for p in range(processes)})
        return out

    def _restretch(self, busy_rate: float) -> None:
        """Async latency: after an update in which most query steps asked nobody (the advisor still had two
        submissions to answer), the interval doubles, up to interval × max_stretch and the rollout's length.
        Such a query step buys nothing and costs a chunk boundary and a device round trip; the advisor answers as
        many prompts either way (budget `auto` sizes B to the longer chunk). It never shrinks within a run, so
        the rollout compiles for a few chunk lengths at most; strict latency always asks every interval."""
        if self.link.latency != "async" or busy_rate <= 0.5:
            return
        if 2 * self.stretch <= self.max_stretch and 2 * self.query_interval <= self.num_steps:
            self.stretch *= 2

    def _send_outcomes(self, traj, applied) -> int:
        bars = np.asarray(jax.device_get(traj.extras.trade["bar"]))
        return self.client.send_outcomes(outcome_rows(applied, bars, self.market, self.learning.move_bars), wait_s=1.0)

    def _learning_step(self, update: int, sent: int) -> dict:
        """Starts a LoRA round every M updates; the metrics of rounds finished since the last update."""
        out = {"lora_outcomes_sent": float(sent)}
        if update % self.learning.every_updates == 0:
            started = self.client.command("learn")
            out["lora_round_started"] = float(started.get("started", False))
        out.update(self._round_metrics())
        return out

    def finish_round(self) -> dict:
        """Runs a LoRA round still in progress to its end (after the run's last update, so that the adapter saved
        with the final checkpoint has learned from it); that round's metrics."""
        if not self.learning or not self.client.command("stats")["busy"]:
            return {}
        # through the progress bar's writer, so the bar is not broken
        tqdm.write("finishing the advisor's LoRA round before the final checkpoint ...", file=sys.stderr)
        self.client.command("finish", timeout_s=FINISH_ROUND_TIMEOUT_S)
        return self._round_metrics()

    def _round_metrics(self) -> dict:
        """The learner's counters, and the figures of the latest round finished since the last call."""
        stats = self.client.command("stats")
        out = {"lora_buffer": float(stats["buffer_train"] + stats["buffer_val"]),
               "lora_learn_s_total": float(stats["learn_s"]), "lora_rounds": float(len(stats["rounds"]))}
        for record in stats["rounds"][self.rounds_seen:]:  # the latest finished round's figures
            out.update({f"lora_{k}": float(v) for k, v in record.items() if k != "round"})
        self.rounds_seen = len(stats["rounds"])
        return out

    def save_adapter(self, run_dir: Path, update: int) -> str | None:
        """Writes the advisor's serving adapter beside checkpoint `update` (once); None when nothing learns."""
        if not self.learning:
            return None
        path = adapter_dir(run_dir, update)
        if not (path / "adapter_config.json").exists():
            staging = path.with_name(path.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            self.client.command("save", path=str(staging), timeout_s=600.0)
            staging.replace(path)  # a crash mid-save leaves no half-written adapter under the checkpoint's name
        return str(path)
