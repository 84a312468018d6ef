"""The advisor's part of a training update (docs/design.md, "One training update, as data flows"; the update itself is
agents.training.update's): before the update's program, a query step (`QueryPacer.query_step`) collects the answers
that came since the last update into the advice table and picks the keys the envs will read in the next update;
while the program runs, the advisor submits the picked keys' prompts (`QueryPacer.send`). With `hybrid.learning` on, each update's outcomes go to the sidecar, a LoRA round starts every
M updates, and each finished round is a new advisor version whose answers replace the older ones by demand."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from tqdm import tqdm

from agents.advice.record import record_metrics
from agents.advice.table import update_ahead
from agents.advice.usage import advice_metrics
from agents.advisor.instrument_set import instrument_data
from agents.advisor.later_sessions import LaterSessions
from agents.advisor.outcomes import outcome_rows, permuted_across_sessions
from agents.advisor.pacer import training_pacer
from agents.config import HybridConfig
from agents.devices.parallel import gather_processes, is_writer
from agents.runs.adapters import adapter_dir, prune_adapters
from bridge import STATUS_NAMES, SidecarClient
from jaxenv.config import DataConfig, EnvConfig

FINISH_ROUND_TIMEOUT_S = 3600.0  # a round finished at the end of a run: a CPU advisor's round can take many minutes
# The advisor figures that add up over advisors (several processes' or several instruments'); the others average.
SUMMED = ("llm_prompts", "llm_rate", "llm_budget", "llm_workers_alive", "llm_reasoned", "llm_query_rate",
          *(f"llm_{name}" for name in STATUS_NAMES))


class QueryLoop:
    """The advisor plugged into a training update (agents.training.update.Update): a query step before the rollout
    and learning program, the prompts sent while it runs, the figures after. With `hybrid.learning` on, it also
    sends each update's outcomes to the sidecar and starts a LoRA round every M updates (the sidecar learns between
    answering batches, so the rollout does not wait for it)."""

    def __init__(self, hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market,
                 run_dir: Path | None, client: SidecarClient | None = None, adapter: str | None = None, *,
                 seed: int, num_steps: int, instruments: tuple[str, ...] = ()):
        """`num_steps`: ppo.num_steps, the rollout's length. `instruments`: the set's symbols where `market` is one
        instrument of an account (InstrumentQueryLoops)."""
        self.num_steps, self.interval = num_steps, hybrid.query.interval
        self.learning = hybrid.learning if hybrid.learning.enabled else None
        self.market = market  # its prices measure the market's move after each answer (the outcomes' `move`)
        self.pacer = training_pacer(hybrid, llm, env, data, seed, market, run_dir if is_writer() else None, client,
                                    learn=self.learning is not None, adapter=adapter,
                                    ahead=update_ahead(self.num_steps, self.interval), instruments=instruments)
        self.advisor = self.pacer.advisor
        self.mock = llm == "mock"
        self.rounds_seen = 0
        self.synced = False  # the run's advice table holds the store's answers (after the first query step)
        self.sent = 0  # outcomes sent during the update
        self.placebo_rng = np.random.default_rng(seed + 7)  # hybrid.learning.placebo's permutations
        # each advisor version judged on sessions after every bar it could have learned from
        self.later = (LaterSessions(market, self.advisor.fields, self.interval, self.learning, seed)
                      if self.learning and self.learning.judge_keys > 0 and is_writer() else None)

    def close(self) -> None:
        self.pacer.close()

    def checkpoint(self, run_dir: Path, update: int, kept: set[int]) -> None:
        """With a checkpoint of `update`: the answers so far into the store (a later run, seed or evaluation starts
        from them) and, for an advisor that learns, its adapter beside the checkpoint (those of checkpoints no longer
        `kept` removed)."""
        if is_writer():
            self.advisor.save_store()
        if self.learning:
            self.save_adapter(run_dir, update)
            prune_adapters(run_dir, kept | {update})

    def before(self, rs):
        """The query step before an update's program: the answers that came in, the keys to ask next."""
        self.pacer.reset_counters()
        if not self.synced:
            rs, self.synced = self.pacer.sync(rs), True
        return self.pacer.query_step(rs)

    def during(self) -> None:
        """While the device runs the update: the picked keys' prompts rendered and submitted, outcomes sent."""
        extra = None if self.later is None else self.later.due(self.advisor.known, self.advisor.version)
        self.pacer.send(extra)
        self.sent = self._send_outcomes() if self.learning else 0

    def after(self, rs, stats: dict) -> dict:
        """The update's advice figures: how the advice was used (the rollout's sums), the record, the advisor's
        counters and, with learning, the LoRA rounds'."""
        out = {"llm_query_rate": self.pacer.counts.prompts / max(float(stats["decisions"]), 1.0)}
        out.update(advice_metrics(stats))
        if rs.hybrid.record is not None:  # the record as this update's rollout read it
            out.update(record_metrics(rs.hybrid.record))
        out.update(self._advisor_metrics())
        if self.learning:
            out.update(self._learning_step(int(rs.update), self.sent))
        if self.later is not None:
            out.update(self.later.figures(self.advisor.known, self.advisor.version))
        return out

    def _advisor_metrics(self) -> dict:
        """The advisor's counters; with several processes, every process's combined: counts and rates summed, the
        rest averaged, and each process's rate."""
        own = self.pacer.metrics()
        processes = self.pacer.processes
        if processes == 1:
            return own
        keys = sorted(own)
        table = gather_processes(np.array([float(own[k]) for k in keys]))  # [processes, keys]
        out = {k: float(table[:, i].sum() if k in SUMMED else table[:, i].mean()) for i, k in enumerate(keys)}
        out.update({f"llm_rate_p{p}": float(table[p, keys.index("llm_rate")]) for p in range(processes)})
        return out

    def _send_outcomes(self) -> int:
        written = self.pacer.take_written()
        rows = outcome_rows(written, self.advisor.fields.rendered_bar, self.market, self.market.split_range("train"),
                            self.learning.move_bars)
        known = np.isfinite(rows["move"])
        if known.any() and (self.later is not None or self.learning.placebo):
            bars = self.advisor.fields.rendered_bar(np.concatenate([keys for _, _, keys in written]))
            if self.later is not None:  # the last bar the learner may learn from
                self.later.learned(int(bars[known].max()) + self.learning.move_bars)
            if self.learning.placebo:
                rows["move"] = permuted_across_sessions(rows["move"], self.market.sessions.session_id[bars],
                                                        self.placebo_rng)
        return self.advisor.workers.send_outcomes(rows, wait_s=1.0)

    def _learning_step(self, update: int, sent: int) -> dict:
        """Starts a LoRA round every M updates; the metrics of rounds finished since the last update."""
        out = {"lora_outcomes_sent": float(sent)}
        if update % self.learning.every_updates == 0:
            started = self.advisor.workers.command("learn")
            out["lora_round_started"] = float(started.get("started", False))
        out.update(self._round_metrics())
        return out

    def finish_round(self) -> dict:
        """Runs a LoRA round still in progress to its end (after the run's last update, so that the adapter saved
        with the final checkpoint has learned from it); that round's metrics."""
        if not self.learning or not self.advisor.workers.command("stats")["busy"]:
            return {}
        # through the progress bar's writer, so the bar is not broken
        tqdm.write("finishing the advisor's LoRA round before the final checkpoint ...", file=sys.stderr)
        self.advisor.workers.command("finish", timeout_s=FINISH_ROUND_TIMEOUT_S)
        return self._round_metrics()

    def _round_metrics(self) -> dict:
        """The learner's counters, and the figures of the latest round finished since the last call."""
        stats = self.advisor.workers.command("stats")
        out = {"lora_buffer": float(stats["buffer_train"] + stats["buffer_val"]),
               "lora_learn_s_total": float(stats["learn_s"]), "lora_rounds": float(len(stats["rounds"]))}
        for record in stats["rounds"][self.rounds_seen:]:  # the latest finished round's figures
            out.update({f"lora_{k}": float(v) for k, v in record.items() if k != "round"})
        self.rounds_seen = len(stats["rounds"])
        # an adopted round is a new advisor version: its answers replace the older ones, most read keys first
        self.advisor.adopt(int(stats.get("version", 0)))
        out["lora_version"] = float(self.advisor.version)
        return out

    def save_adapter(self, run_dir: Path, update: int) -> str | None:
        """Writes the advisor's serving adapter beside checkpoint `update` (once); None when nothing learns."""
        if not self.learning:
            return None
        path = adapter_dir(run_dir, update)
        if not (path / "adapter_config.json").exists():
            staging = path.with_name(path.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            self.advisor.workers.command("save", path=str(staging), timeout_s=600.0)
            staging.replace(path)  # a crash mid-save leaves no half-written adapter under the checkpoint's name
        return str(path)


@struct.dataclass
class _Sides:
    t: jax.Array  # [N] the account's bar
    side: jax.Array  # [N] one instrument's position side


@struct.dataclass
class _InstrumentCarry:
    """What a query step reads and writes of one instrument of an account (QueryPacer's carry): the envs' bars and
    that instrument's sides, its acting carry."""

    env_state: _Sides
    hybrid: Any


class InstrumentQueryLoops:
    """QueryLoop's interface for an account of several instruments (agents.advice.account_acting): one QueryLoop per
    instrument, each with its own advisor (the one-market advisor on its instrument, its store's identity naming the
    set: agents.advisor.instrument_set), asking the keys of that instrument's advice table. Every advisor is open for
    the whole run (a model's sidecar each). The figures: the advice's use over every head, the advisors' counters
    summed or averaged (SUMMED), and each instrument's record under its symbol (record_calls_NQ, ...)."""

    def __init__(self, hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, market_set,
                 run_dir: Path | None, *, seed: int, num_steps: int):
        self.symbols = tuple(market_set.symbols)
        self.loops: list[QueryLoop] = []
        try:
            for market in market_set.markets:  # each logs to RUN/advisor_SYMBOL_w*.log, RUN/llm_log_SYMBOL.jsonl
                self.loops.append(QueryLoop(hybrid, llm, env, instrument_data(data, market.contract), market, run_dir,
                                            seed=seed, num_steps=num_steps, instruments=self.symbols))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for loop in self.loops:
            loop.close()

    def checkpoint(self, run_dir: Path, update: int, kept: set[int]) -> None:
        for loop in self.loops:
            loop.checkpoint(run_dir, update, kept)

    @staticmethod
    def _view(rs, i: int) -> _InstrumentCarry:
        # own buffers for t: the query step donates its carry, and rs keeps its bars
        return _InstrumentCarry(_Sides(jnp.copy(rs.env_state.t), rs.env_state.legs.side[:, i]), rs.hybrid[i])

    def before(self, rs):
        return rs.replace(hybrid=tuple(loop.before(self._view(rs, i)).hybrid for i, loop in enumerate(self.loops)))

    def during(self) -> None:
        for loop in self.loops:
            loop.during()

    def after(self, rs, stats: dict) -> dict:
        each = [loop.after(self._view(rs, i), stats) for i, loop in enumerate(self.loops)]
        out = {}
        for key in each[0]:
            values = [figures[key] for figures in each]
            if key.startswith("record_"):
                out.update({f"{key}_{symbol}": v for symbol, v in zip(self.symbols, values)})
            else:
                out[key] = float(np.sum(values) if key in SUMMED else np.mean(values))
        return out

    def finish_round(self) -> dict:
        return {}  # no advisor of an account learns (hybrid.learning is refused on a set)

    def save_adapter(self, run_dir: Path, update: int) -> None:
        return None
