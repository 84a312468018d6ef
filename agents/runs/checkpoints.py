"""Checkpoints of a training run with orbax `CheckpointManager`s.

    RUN_DIR/checkpoints/latest/<update>/   every N updates, at the end and on Ctrl-C; the last K are kept
    RUN_DIR/checkpoints/best/<update>/     the best validation-split score so far (one kept)

Each checkpoint holds the whole `RunnerState` (params, optimiser state, normaliser, env states, RNG key, update
counter) and a small JSON of host-side counters. orbax writes into a temporary directory and renames it only
once everything is on disk, so a crash mid-save leaves no checkpoint that `latest_step()` (and so a resume)
would pick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp


class RunCheckpoints:
    def __init__(self, run_dir: str | Path, keep: int):
        root = Path(run_dir).absolute() / "checkpoints"
        self.latest = ocp.CheckpointManager(
            root / "latest", options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
            item_names=("state", "host"),
        )
        # Saved only when the score improves, so keeping one keeps the best.
        self.best = ocp.CheckpointManager(
            root / "best", options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True),
            item_names=("state", "host"),
        )

    @staticmethod
    def _save(manager: ocp.CheckpointManager, step: int, state: Any, host: dict) -> None:
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host)))

    def save_latest(self, step: int, state: Any, host: dict) -> None:
        """Starts an asynchronous save (the device→host copy happens before this returns)."""
        if step not in self.latest.all_steps():
            self._save(self.latest, step, state, host)

    def save_best(self, step: int, state: Any, host: dict) -> None:
        self._save(self.best, step, state, host)

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def restore(self, abstract_state: Any, step: int | None = None, best: bool = False) -> tuple[Any, dict]:
        """Restores (state, host) from the latest (or given) finished checkpoint; `abstract_state` gives the
        tree structure, shapes and dtypes (e.g. `jax.eval_shape(ppo.init, key)`)."""
        manager = self.best if best else self.latest
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {manager.directory}")
        out = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), host=ocp.args.JsonRestore())
        )
        return out.state, out.host

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()
