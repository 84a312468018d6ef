"""Checkpoints of a training run with orbax `CheckpointManager`s, each carrying a manifest of content hashes.

    RUN_DIR/checkpoints/latest/<update>/   every N updates, at the end and on Ctrl-C; the last K are kept
    RUN_DIR/checkpoints/best/<update>/     the best validation-split score so far (one kept)
    RUN_DIR/checkpoints/damaged/           checkpoints set aside by `--resume --from-intact`, and saves that
                                           never finished (set aside by any resume)

Each checkpoint holds the whole `RunnerState` (params, optimiser state, normaliser, env states, RNG key, update
counter) as whole arrays, whatever devices the run shards it over (so a run saved on 2 devices resumes on 1, and
the reverse), a small JSON of host-side counters and, written last, `manifest.json` (agents.runs.integrity). orbax
writes into a temporary directory and renames it only once everything is on disk, and the manifest comes after
that, so a crash mid-save leaves no checkpoint a resume would pick: a checkpoint without its manifest (in a run
whose older ones have theirs) is an unfinished save.

A save is finished before `save_latest`/`save_best` return, so a failed one (disk full) stops the run at once
with `CheckpointWriteError`, its half-written files removed. A restore checks the manifest, that the checkpoint's
arrays have the shapes the config gives (`CheckpointMismatch` otherwise, naming the array), and that what was
restored is finite (`CheckpointDamaged` otherwise, naming the file or array).
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from agents.runs.integrity import (
    MANIFEST_FILE,
    CheckpointDamaged,
    check_finite,
    has_manifest,
    path_name,
    verify,
    write_manifest,
)  # fmt: skip
from agents.runs.storage import RunWriteError, allocated_bytes, format_bytes, free_bytes, free_space, reason

KINDS = ("latest", "best")
DAMAGED_DIR = "damaged"


class CheckpointWriteError(RunWriteError):
    """A checkpoint could not be written; the message says which, why, the free space and the last good one."""


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the current code, config or data; the message says what differs."""


class _OrbaxErrors(logging.Filter):
    """While a save runs, keeps orbax's ERROR records (logged from its writer threads, tracebacks and all) off
    stderr; the first becomes the cause in the one message a failed save gives."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.messages.append(record.getMessage())
            return False
        return True

    def __enter__(self) -> "_OrbaxErrors":
        logging.getLogger("absl").addFilter(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("absl").removeFilter(self)


def _quiet_orbax_after_failure() -> None:
    """After a failed save orbax's writer threads, abandoned asyncio tasks and tensorstore callbacks into its closed
    event loop go on reporting the same failure, tracebacks and all, until the process ends. The run stops with
    one message saying it, so they are silenced from here on (nothing else of the run runs after it)."""
    if getattr(sys.unraisablehook, "quiet_orbax", False):
        return
    logging.getLogger("absl").addFilter(lambda record: record.levelno < logging.ERROR)
    logging.getLogger("asyncio").addFilter(
        lambda record: "exception was never retrieved" not in record.getMessage().split("\n")[0])
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not (isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value)):
            previous(unraisable)

    hook.quiet_orbax = True
    sys.unraisablehook = hook


def _manager(root: Path, kind: str, keep: int, create: bool = True) -> ocp.CheckpointManager:
    # With several processes each one's manager works alone: process 0 saves whole (gathered) arrays and every
    # process reads them back, so orbax must not wait for the others (agents/devices/parallel.py; docs/scale.md).
    alone = {}
    if jax.process_count() > 1:
        if create:
            (root / kind).mkdir(parents=True, exist_ok=True)  # orbax does not create it for a single active process
        alone = {"create": False, "multiprocessing_options": ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()})}
    return ocp.CheckpointManager(
        root / kind, options=ocp.CheckpointManagerOptions(**{"max_to_keep": keep, "create": create, **alone}),
        item_names=("state", "host"),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "host": ocp.JsonCheckpointHandler()},
    )


def unfinished(root: Path, kind: str, step: int) -> bool:
    """A checkpoint without a manifest in a run whose older checkpoints have one: its save never finished (the
    process died between orbax's rename and the manifest). Without older manifests, the run predates them."""
    if has_manifest(root / kind / str(step)):
        return False
    return any(p.name.isdigit() and int(p.name) < step and has_manifest(p)
               for k in KINDS if (root / k).is_dir() for p in (root / k).iterdir())


def verify_step(root: Path, kind: str, step: int) -> bool:
    """Checks checkpoint `kind/step` against its manifest: True if verified, False if the run predates manifests
    (none of its checkpoints up to this one has one); raises CheckpointDamaged otherwise."""
    step_dir = root / kind / str(step)
    if not has_manifest(step_dir) and not unfinished(root, kind, step):
        return False
    verify(step_dir, f"{kind}/{step} of {root.parent}")
    return True


def learned_parts(state: Any) -> Any:
    """What a restored state must hold finite: the networks, optimiser and normalisers (env states may not)."""
    names = ("params", "opt_state", "obs_norm", "ret_norm")
    if all(hasattr(state, n) for n in names):
        return {n: getattr(state, n) for n in names}
    if isinstance(state, dict) and "params" in state:
        return {n: state[n] for n in names if n in state}
    return state


class RunCheckpoints:
    def __init__(self, run_dir: str | Path, keep: int):
        self.root = Path(run_dir).absolute() / "checkpoints"
        self.latest = _manager(self.root, "latest", keep)
        # Saved only when the score improves, so keeping one keeps the best.
        self.best = _manager(self.root, "best", 1)

    def _save(self, kind: str, step: int, state: Any, host: dict) -> None:
        """Saves and waits for the save to finish, then writes the manifest; a failure removes what was
        half-written and raises CheckpointWriteError."""
        manager = getattr(self, kind)
        if step in manager.all_steps():
            return
        needed, (free, _) = self._space_needed(state), free_bytes(self.root)
        if free is not None and free < needed:  # refuse before orbax starts: its failures mid-write are noisy
            raise CheckpointWriteError(f"checkpoint {kind}/{step} was not saved: it needs about {format_bytes(needed)}"
                                       f" and there is {free_space(self.root)}; {self._last_good_text()}")
        cause: BaseException | str | None = None
        with _OrbaxErrors() as errors:
            try:
                saved = manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                                   host=ocp.args.JsonSave(host)))
                manager.wait_until_finished()
            except Exception as error:  # orbax and tensorstore raise many kinds; the message says which
                cause, saved = error, True
        if not saved:
            return  # orbax keeps steps increasing: an older step (after --from-intact) is not saved again
        step_dir = Path(manager.directory) / str(step)
        if cause is None and errors.messages:
            cause = errors.messages[0]
        if cause is None and not step_dir.is_dir():
            cause = "orbax did not finish it"
        if cause is None:
            try:
                write_manifest(step_dir)
            except OSError as error:
                cause = error
        if cause is not None:
            self._discard_unfinished(kind, step)
            _quiet_orbax_after_failure()
            why = reason(cause) if isinstance(cause, BaseException) else reason(RuntimeError(cause))
            raise CheckpointWriteError(
                f"checkpoint {kind}/{step} was not saved ({why}); {free_space(self.root)}; {self._last_good_text()}"
            ) from (cause if isinstance(cause, BaseException) else None)

    def _space_needed(self, state: Any) -> int:
        """Disk space a checkpoint will take: the newest one's, with a margin; before the first, twice the
        state's bytes with a block per array and some metadata."""
        newest = [self.root / kind / str(m.latest_step()) for kind, m in (("latest", self.latest), ("best", self.best))
                  if m.latest_step() is not None]
        newest = [p for p in newest if p.is_dir()]
        if newest:
            return int(max(allocated_bytes(p) for p in newest) * 1.1) + (64 << 10)
        leaves = jax.tree.leaves(state)
        return int(1.2 * sum(int(getattr(x, "nbytes", 0)) for x in leaves)) + (4 << 10) * len(leaves) + (128 << 10)

    def _last_good_text(self) -> str:
        good = self.latest_good()
        return f"the last good checkpoint is latest/{good}" if good is not None else "no checkpoint was saved yet"

    def _discard_unfinished(self, kind: str, step: int) -> None:
        """Removes a failed save's leftovers: orbax's temporary folders, and the checkpoint if it has no manifest."""
        folder = self.root / kind
        for path in folder.iterdir() if folder.is_dir() else ():
            if ".orbax-checkpoint-tmp" in path.name or (path.name == str(step) and not has_manifest(path)):
                shutil.rmtree(path, ignore_errors=True)
        getattr(self, kind).reload()

    def save_latest(self, step: int, state: Any, host: dict) -> None:
        self._save("latest", step, state, host)

    def save_best(self, step: int, state: Any, host: dict) -> None:
        self._save("best", step, state, host)

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def latest_good(self) -> int | None:
        """The newest latest checkpoint with its manifest (or any, for a run from before manifests)."""
        self.latest.reload()
        steps = sorted(self.latest.all_steps(), reverse=True)
        return next((s for s in steps if has_manifest(self.root / "latest" / str(s))), steps[0] if steps else None)

    def newest_intact(self, below: int | None = None) -> int | None:
        """The newest latest checkpoint (below `below`) whose files match its manifest."""
        for step in sorted(self.latest.all_steps(), reverse=True):
            if below is not None and step >= below:
                continue
            try:
                verify_step(self.root, "latest", step)
                return step
            except CheckpointDamaged:
                continue
        return None

    def restore(self, abstract_state: Any, step: int | None = None, best: bool = False,
                from_intact: bool = False) -> tuple[Any, dict]:
        """Restores (state, host) from the latest (or given) finished checkpoint, checked (see the module's
        docstring); `abstract_state` gives the tree structure, shapes and dtypes (e.g. `jax.eval_shape(ppo.init,
        key, env_params)`). With `from_intact`, a damaged latest checkpoint is set aside (checkpoints/damaged/) and the newest
        intact one below it is restored instead; without, the error names that one."""
        kind = "best" if best else "latest"
        manager = getattr(self, kind)
        if step is None and not best:
            self._set_aside_unfinished()
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint in {manager.directory}")
        try:
            return self._restore_checked(kind, step, abstract_state)
        except CheckpointDamaged as damaged:
            if best:
                raise
            intact = self.newest_intact(below=step)
            if not from_intact:
                hint = (f"the newest intact checkpoint is update {intact}: continue from it with --resume "
                        f"{self.root.parent} --from-intact" if intact is not None else
                        "no earlier checkpoint is intact; start the run again")
                raise CheckpointDamaged(f"{damaged}; {hint}") from None
            if intact is None:
                raise CheckpointDamaged(f"{damaged}; no earlier checkpoint is intact; start the run again") from None
            set_aside = self._set_aside([s for s in self.latest.all_steps() if s > intact])
            print(f"WARNING: {damaged}; continuing from update {intact}, the newest intact checkpoint "
                  f"(set aside: {', '.join(set_aside)})", file=sys.stderr)
            return self.restore(abstract_state, intact, from_intact=True)

    def _set_aside_unfinished(self) -> None:
        """Moves the newest latest checkpoints whose save never finished to checkpoints/damaged/, as orbax ignores
        its own unfinished saves: a resume continues from the last finished one."""
        gone = []
        for step in sorted(self.latest.all_steps(), reverse=True):
            if not unfinished(self.root, "latest", step):
                break
            gone.append(step)
        if gone:
            moved = self._set_aside(gone)
            print(f"note: checkpoint(s) latest/{', '.join(map(str, gone))} never finished saving (no {MANIFEST_FILE});"
                  f" set aside: {', '.join(moved)}", file=sys.stderr)

    def _set_aside(self, steps: list[int]) -> list[str]:
        """Moves latest checkpoints to checkpoints/damaged/ (kept for inspection, out of orbax's way)."""
        target = self.root / DAMAGED_DIR
        target.mkdir(exist_ok=True)
        moved = []
        for step in sorted(steps):
            destination = target / f"latest-{step}"
            n = 1
            while destination.exists():
                destination, n = target / f"latest-{step}.{n}", n + 1
            (self.root / "latest" / str(step)).rename(destination)
            moved.append(str(destination.relative_to(self.root.parent)))
        self.latest.reload()
        return moved

    def _restore_checked(self, kind: str, step: int, abstract_state: Any) -> tuple[Any, dict]:
        label = f"{kind}/{step} of {self.root.parent}"
        if not verify_step(self.root, kind, step):
            print(f"note: checkpoint {label} has no {MANIFEST_FILE} (made before manifests); restored unverified",
                  file=sys.stderr)
        manager = getattr(self, kind)
        try:
            stored = manager.item_metadata(step)["state"]
        except Exception as error:  # unreadable metadata: the file is named in orbax's message, if anywhere
            raise CheckpointDamaged(f"checkpoint {label} is damaged: its metadata cannot be read "
                                    f"({reason(error)})") from None
        check_shapes(stored, abstract_state, label)
        # Onto this process's first device, whatever devices saved it; the caller lays it out for its own.
        local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=local), abstract_state)
        try:
            out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                                host=ocp.args.JsonRestore()))
        except Exception as error:
            raise CheckpointDamaged(f"checkpoint {label} is damaged: {reason(error)}") from None
        check_finite(learned_parts(out.state), label)
        return out.state, out.host

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()


# The config keys whose change alters an array's shape, by where the array lives in the training state.
_SHAPE_KEYS = (("params/params/actor", "network.actor_hidden or the observation (env.*)"),
               ("params/params/critic", "network.critic_hidden or the observation (env.*)"),
               ("params/params/gate", "hybrid.fusion"), ("opt_state", "network.*"), ("obs", "env.* (the observation)"),
               ("hybrid", "llm / hybrid.*"), ("", "num_envs"))


# Layouts of earlier versions of the training state that no config builds now: (an array only they hold, or "*" and
# the end of one only today's hold, the change)
LEGACY_LAYOUTS = (
    ("hybrid/advice/age", "advice was keyed by market context (its per-env advice cannot become the advice table)"),
    ("hybrid/record/calls/weight", "the advice record counted one call per key (its tally of every env's calls "
                                   "cannot become one of keys)"),
    # "*": an array the layouts of today have and earlier ones lacked, at the end of its path
    ("*/entry_locked", "a breached account's successor entered nothing until the next session (its env states lack "
                       "the flag)"),
)


def check_shapes(stored: Any, abstract_state: Any, label: str) -> None:
    """Raises CheckpointMismatch naming the first array whose shape (or presence) differs between the checkpoint
    and the state the config builds, and the config keys that decide it."""
    have = {path_name(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(stored)[0]
            if hasattr(m, "shape")}
    want = {path_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
    problems = []
    for path in sorted(set(have) | set(want), key=lambda p: (not p.startswith("params"), p)):
        if path not in want:
            problems.append((path, f"{path} is in the checkpoint only"))
        elif path not in have:
            problems.append((path, f"{path} is not in the checkpoint"))
        elif have[path] != want[path]:
            problems.append((path, f"{path} has shape {have[path]} in the checkpoint, {want[path]} with the config"))
    for path, change in LEGACY_LAYOUTS:
        if path in have and path not in want or path.startswith("*") and any(
                p.endswith(path[1:]) for p in set(want) - set(have)):
            raise CheckpointMismatch(f"checkpoint {label} was saved before {change}: it cannot be resumed; evaluate it "
                                     "(scripts/evaluate.py --run-dir RUN_DIR) or start a new run from its networks "
                                     "(scripts/train.py --init-from RUN_DIR)")
    if problems:
        path, first = problems[0]
        key = next(k for prefix, k in _SHAPE_KEYS if path.startswith(prefix))
        more = f" ({len(problems) - 1} more arrays differ)" if len(problems) > 1 else ""
        raise CheckpointMismatch(f"config.yaml does not match checkpoint {label}: {first}{more}; was {key} "
                                 "changed since the run started?")
