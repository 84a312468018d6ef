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

import dataclasses
import json
import shutil
import sys
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
from bridge import STATUS_NAMES, STATUS_OK, BridgeConfig, PromptRenderer, SidecarClient
from bridge.prompts import DEFAULT_PROMPTS_PATH
from bridge.transport import OUTCOME_FIELDS
from jaxenv.market import Market


def make_acting(cfg, env) -> HybridActing:
    h = cfg.hybrid
    return HybridActing(h.fusion, h.query, h.veto, h.llm_weight, env.window, env.extended)


ADAPTERS_DIR = "adapters"  # RUN_DIR/adapters/<update>/: the advisor's learned LoRA adapter at each checkpoint
FINISH_ROUND_TIMEOUT_S = 3600.0  # a round finished at the end of a run: SmolLM2 on a 2-core CPU takes ~8 s per step


def adapter_dir(run_dir: str | Path, update: int) -> Path:
    return Path(run_dir) / ADAPTERS_DIR / str(int(update))


def starting_adapter(cfg) -> str | None:
    """The LoRA adapter the advisor starts from (--llm-adapter), or None for the base model."""
    return cfg.hybrid.llm_adapter or None


def checkpoint_adapter(cfg, run_dir: str | Path, update: int) -> str | None:
    """The adapter the advisor answered with at checkpoint `update`: the one learned by then (saved beside the
    checkpoint), else the one it started from."""
    learned = adapter_dir(run_dir, update)
    if (learned / "adapter_config.json").exists():
        return str(learned)
    return starting_adapter(cfg)


def learning_options(cfg) -> dict | None:
    """What the sidecar's LoRA learner gets (llm_sidecar.learning.LearningOptions and a seed), or None."""
    learning = cfg.hybrid.learning
    if not learning.enabled:
        return None
    trainer_only = ("enabled", "every_updates", "move_bars")
    options = {k: v for k, v in dataclasses.asdict(learning).items() if k not in trainer_only}
    return {**options, "seed": cfg.seed}


def sidecar_options(cfg, adapter: str | None = None) -> tuple[str, dict]:
    """The backend and flags `SidecarClient.start` passes to `python -m llm_sidecar serve`; `adapter` replaces
    the run's starting adapter (a checkpoint's learned one)."""
    h = cfg.hybrid
    if cfg.llm == "mock":
        return "mock", {"latency_s": h.mock_latency_s or None, "mock_answers": h.mock_answers}
    model = "smollm2" if cfg.llm == "smollm2" else cfg.llm
    adapter = adapter or starting_adapter(cfg)
    if adapter and not Path(adapter).is_dir():
        raise ConfigError(f"hybrid.llm_adapter: no LoRA adapter directory at {adapter}")
    return "transformers", {
        "model": model,
        "mode": h.llm_mode,
        "quantize": None if h.quantization == "none" else h.quantization,
        "lora": adapter,
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
                 latency: str | None = None, learn: bool = False, adapter: str | None = None):
        """`learn`: the sidecar learns from outcomes (training's link; never a validation walk's). `adapter`: the
        LoRA adapter to start from instead of the run's (a resumed run's learned one)."""
        self.cfg = cfg
        self.h: HybridConfig = cfg.hybrid
        self.latency = latency or self.h.latency
        self.cap = min(self.h.max_budget, n_envs)
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
        self.client = client or self._start_client(adapter)
        self.written: list[tuple[int, np.ndarray, np.ndarray]] = []  # (seq, answer rows, env ids) written, ok only
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
            scalars = gather_state(carry.env_state, env_ids)
            scalars["top_prob"] = hy.top_prob[env_ids]
            scalars["episode_time"] = carry.env_state.time[env_ids]
            return carry.replace(hybrid=hy), env_ids, valid, scalars

        def write(carry, env_ids, probs, confidence, status, valid):
            hy = carry.hybrid
            return carry.replace(hybrid=hy.replace(advice=hy.advice.write(env_ids, probs, confidence, status, valid)))

        self._select = jax.jit(select)
        self._write = jax.jit(write)

    def _start_client(self, adapter: str | None) -> SidecarClient:
        backend, options = sidecar_options(self.cfg, adapter)
        client = SidecarClient(BridgeConfig(capacity=self.cap))
        try:
            client.start(backend=backend, prompts=self.renderer, learning=self.learning, **options)
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
        self.n_thoughts = 0

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
            self.client.submit(env_ids[take], prompts, self._think(env_ids[take], rows))
            self.pending.append((step, time.perf_counter(), prompts))
            self.n_prompts += len(take)
        # The answers to earlier query steps' prompts: one step of latency.
        while self.pending and self.pending[0][0] < step:
            carry = self._collect(carry, wait=self.latency == "strict", chunk_s=chunk_s)
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
        ok = np.flatnonzero(answers.status == STATUS_OK)
        if self.learning and len(ok):
            self.written.append((answers.seq, ok, answers.env_ids[ok]))
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
        if self.reasoning:
            out["llm_reasoned"] = self.n_thoughts
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


def outcome_rows(applied: list[tuple[int, int, list]], traj: dict[str, np.ndarray], market: Market,
                 move_bars: int) -> dict[str, np.ndarray]:
    """Outcome rows (bridge.transport.OUTCOME_FIELDS) of the answers written before each chunk.

    `applied`: (first step t0 of the chunk, its length k, [(seq, answer rows, env ids)]) per chunk; `traj`: [T, N]
    numpy arrays action, reward, advantage, advice_valid, entered, exited, trade_pnl and bar (the decision's bar).
    Every answer gets a row; `in_force` says whether its advice was still in force at t0 (the env may have
    changed side meanwhile). Its outcome is the action taken at t0, its advantage, the reward over [t0, t0 + k),
    when that action opened a trade the trade's P&L at its exit (NaN when still open at the rollout's end), and
    the market's move after t0 in ATRs: from the next bar's open (where an order placed at t0 fills) to the close
    `move_bars` bars on (prices from `market`), NaN unless the env lived through all of them in this rollout (no
    look-ahead: the rollout has already played those bars).
    """
    seqs, rows, envs, starts, lengths = [], [], [], [], []
    for t0, k, written in applied:
        for seq, answer_rows, env_ids in written:
            seqs.append(np.full(len(env_ids), seq, np.int64))
            rows.append(answer_rows)
            envs.append(env_ids)
            starts.append(np.full(len(env_ids), t0))
            lengths.append(np.full(len(env_ids), k))
    if not seqs:
        return {name: np.zeros(0, dtype) for name, dtype in OUTCOME_FIELDS}
    seq, row, env, t0, k = (np.concatenate(x) for x in (seqs, rows, envs, starts, lengths))
    in_force = traj["advice_valid"][t0, env]
    steps = np.arange(traj["reward"].shape[0])[:, None]
    window = (steps >= t0) & (steps < t0 + k)  # [T, R]
    reward = (traj["reward"][:, env] * window).sum(0)
    later_exit = traj["exited"][:, env] & (steps >= t0)
    closes = later_exit.any(0)
    exit_step = later_exit.argmax(0)
    trade_pnl = np.where(traj["entered"][t0, env] & closes, traj["trade_pnl"][exit_step, env], np.nan)
    move = np.full(len(seq), np.nan)
    last = t0 + move_bars - 1  # the step whose transition plays bar (decision bar + move_bars)
    lived = last < len(steps)
    bar = traj["bar"][t0, env].astype(np.int64)
    # No reset inside the window: the env's bar advanced one per step.
    lived[lived] &= traj["bar"][last[lived], env[lived]] == bar[lived] + move_bars - 1
    b = bar[lived]
    move[lived] = (market.close[b + move_bars] - market.open[b + 1]) / np.maximum(market.atr[b], 1e-9)
    return {"seq": seq, "row": row.astype(np.int32), "in_force": in_force.astype(np.int8),
            "action": traj["action"][t0, env].astype(np.int8), "reward": reward.astype(np.float32),
            "trade_pnl": trade_pnl.astype(np.float32), "advantage": traj["advantage"][t0, env].astype(np.float32),
            "move": move.astype(np.float32)}


class QueryLoop:
    """Runs hybrid updates: chunks with query steps between them, then one PPO learning step. With
    `hybrid.learning` on, it also sends each update's outcomes to the sidecar and starts a LoRA round every M
    updates (the sidecar learns between answering batches, so the rollout does not wait for it)."""

    def __init__(self, cfg, ppo, market, run_dir: Path | None, client: SidecarClient | None = None,
                 adapter: str | None = None):
        self.chunks = chunk_lengths(cfg.ppo.num_steps, cfg.hybrid.query.interval)
        self.learning = cfg.hybrid.learning if cfg.hybrid.learning.enabled else None
        self.market = market  # its prices measure the market's move after each answer (the outcomes' `move`)
        self.link = AdvisorLink(cfg, market, cfg.num_envs, run_dir, client, learn=self.learning is not None,
                                adapter=adapter)
        self._chunk = jax.jit(ppo.rollout_chunk, static_argnums=1)
        self._learn = jax.jit(ppo.learn)
        self._advantages = jax.jit(ppo.advantages)
        self.rounds_seen = 0

    @property
    def client(self) -> SidecarClient:
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
            applied.append((t0, k, self.link.take_written()))
            t = time.perf_counter()
            rs, traj = self._chunk(rs, k)
            jax.block_until_ready(traj.reward)
            chunk_s = time.perf_counter() - t
            trajs.append(traj)
            t0 += k
        traj = jax.tree.map(lambda *xs: jnp.concatenate(xs), *trajs)
        stats = jax.device_get(jax.tree.map(jnp.sum, traj.extras.stats))
        sent = self._send_outcomes(rs, traj, applied) if self.learning else 0
        rs, metrics = self._learn(rs, traj)
        metrics = dict(metrics)
        metrics["llm_query_rate"] = self.link.n_prompts / max(float(stats["decisions"]), 1.0)
        metrics.update(acting_metrics(stats))
        metrics.update(self.link.metrics())
        if self.learning:
            metrics.update(self._learning_step(int(rs.update), sent))
        return rs, metrics

    def _send_outcomes(self, rs, traj, applied) -> int:
        advantage = self._advantages(rs, traj)
        host = jax.device_get({
            "action": traj.action, "reward": traj.reward, "advantage": advantage,
            "advice_valid": traj.extras.advice.valid, **traj.extras.trade,
        })  # fmt: skip
        return self.client.send_outcomes(outcome_rows(applied, host, self.market, self.learning.move_bars), wait_s=1.0)

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
        print("finishing the advisor's LoRA round before the final checkpoint ...", file=sys.stderr, flush=True)
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


def prune_adapters(run_dir: Path, keep: set[int]) -> None:
    """Removes saved adapters whose checkpoint is gone (orbax keeps the last K and the best)."""
    root = Path(run_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.name.isdigit() and int(path.name) not in keep:
            shutil.rmtree(path, ignore_errors=True)
