"""Per-update metrics: `metrics.jsonl`, TensorBoard events, and warnings for the ways PPO runs go wrong."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from agents.config import LogConfig
from agents.runs.storage import RunWriteError, append_line, free_space, reason, replace_text


def _clean(value):
    """JSON-safe scalar: NaN/inf become null."""
    value = float(value) if not isinstance(value, (int, str, list, type(None))) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def kept_lines(path: Path, resume_update: int) -> list[str]:
    """The lines of metrics.jsonl a run resumed at `resume_update` keeps: those up to that update. A line that is
    not JSON (torn by a crash or a full disk mid-write) is dropped with a warning naming it."""
    kept = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            print(f"WARNING: {path}:{number}: dropped a torn line (not JSON): {line[:60]!r}", file=sys.stderr)
            continue
        if record.get("update", 0) <= resume_update:
            kept.append(line)
    return kept


class MetricsLogger:
    """Appends one JSON object per update to RUN_DIR/metrics.jsonl and mirrors numbers to TensorBoard.

    On resume from update U, lines written after the checkpoint (update > U) are dropped first, so a run that
    crashed between checkpoints does not log those updates twice. Each line is written whole or not at all: a
    failed write is cut back off and stops the run (RunWriteError).
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool, resume_update: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        try:
            if resume_update is not None and self.path.exists():
                replace_text(self.path, "".join(line + "\n" for line in kept_lines(self.path, resume_update)))
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise RunWriteError(f"{self.path} could not be written ({reason(error)}); "
                                f"{free_space(self.path)}") from error
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            # purge_step hides events past the resumed update from an earlier, crashed attempt.
            self._tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_update)

    def log(self, record: dict) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        try:
            append_line(self._fd, json.dumps(record) + "\n")
        except OSError as error:
            raise RunWriteError(f"{self.path}: the line of update {record.get('update')} was not written "
                                f"({reason(error)}); {free_space(self.path)}") from error
        if self._tb is not None:
            step = record["env_steps"]
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("update", "env_steps"):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tb is not None:
            self._tb.close()


class HealthMonitor:
    """Checks each update's metrics for the failures earlier trading agents hit; returns warning texts.

    A warning is raised when its condition starts and again only after it has cleared, so a long run does not
    repeat it every update.
    """

    def __init__(self, cfg: LogConfig, num_actions: int, episode_limit: int | None):
        self.cfg = cfg
        self.max_entropy = math.log(num_actions) if num_actions > 1 else 1.0
        self.episode_limit = episode_limit
        self.low_kl_run = 0
        self.active: set[str] = set()

    def check(self, m: dict) -> list[str]:
        c = self.cfg
        kl = m.get("approx_kl")
        self.low_kl_run = self.low_kl_run + 1 if kl is not None and abs(kl) < c.frozen_kl else 0
        if m["update"] <= c.warmup_updates:
            return []
        conditions = {
            "frozen_policy": (
                self.low_kl_run >= c.frozen_updates,
                f"approx_kl < {c.frozen_kl:g} for {self.low_kl_run} updates: the policy is not changing "
                "(learning rate decayed to 0, all-but-one action masked, or zero advantages?)",
            ),
            "entropy_collapse": (
                m.get("entropy") is not None and m["entropy"] < c.min_entropy_frac * self.max_entropy,
                f"entropy {m.get('entropy', 0):.4f} < {c.min_entropy_frac:g} × log(num_actions): the policy has "
                "collapsed to (almost) one action; consider a larger ppo.ent_coef",
            ),
            "short_episodes": (
                self.episode_limit is not None
                and m.get("episodes", 0) > 0
                and m.get("episode_length") is not None
                and m["episode_length"] < c.short_episode_frac * self.episode_limit,
                f"episodes last {m.get('episode_length') or 0:.0f} steps on average, under "
                f"{c.short_episode_frac:g} × the limit of {self.episode_limit}: they end early (e.g. drawdown "
                "breaches) far more than expected",
            ),
        }
        fired = []
        for name, (bad, text) in conditions.items():
            if bad and name not in self.active:
                fired.append(f"{name}: {text}")
                self.active.add(name)
            elif not bad:
                self.active.discard(name)
        return fired
