"""Reading a finished run folder (`scripts/train.py`'s output) for evaluation and transfer: its config and one
checkpoint's policy, i.e. the network parameters (the trust gate's included) and the observation normaliser.

The checkpoint is restored without a target tree, so it does not matter how the rest of the training state
(optimiser, env states, hybrid carry) was laid out; what is used is checked against the network the current
code builds from the run's config, and a mismatch fails with a message saying what differs.

    saved = restore_policy("runs/x", "best")              # or "latest", or an update number as text
    check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions)
    action = ppo.policy(saved.params, saved.obs_norm, obs, mask, key, True)
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from agents.config import RUN_CONFIG_FILE, ConfigError, TrainConfig, load_config
from agents.rl.normalization import RunningMeanStd
from agents.runs.adapters import checkpoint_adapter
from agents.runs.checkpoints import CheckpointMismatch, verify_step
from agents.runs.integrity import MANIFEST_FILE, CheckpointDamaged, check_finite
from agents.runs.storage import reason

KINDS = ("best", "latest")  # the run's two checkpoint managers (agents.runs.checkpoints.RunCheckpoints)


@dataclass
class SavedPolicy:
    run_dir: Path
    cfg: TrainConfig  # the run's config as saved
    kind: str  # best | latest
    step: int  # the update the checkpoint was taken after
    params: Any  # flax variables {"params": {...}}
    obs_norm: RunningMeanStd  # a run on several instruments: an AccountObs of normalisers (agents.rl.account)
    # hybrid.query.bind_on=record: the advice's track record at the checkpoint (as dicts; an account's: a list, one
    # per instrument)
    advice_record: Any = None

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.step}"

    @cached_property
    def digest(self) -> str:
        """The first 16 hex digits of a SHA-256 over the policy's arrays (parameters and observation normaliser):
        which weights act, whatever label (best, latest, a step) named them."""
        h = hashlib.sha256()
        for leaf in jax.tree.leaves((self.params, self.obs_norm)):
            h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
        return h.hexdigest()[:16]

    def identity(self) -> dict:
        """The checkpoint as a trading state records it: its label and its weights' digest."""
        return {"label": self.label, "digest": self.digest}

    @property
    def adapter(self) -> str | None:
        """The advisor's LoRA adapter as it answered at this checkpoint: the one it had learned by then (saved beside
        the checkpoint), else the one the run started from. Evaluation and trading both advise with it."""
        return checkpoint_adapter(self.cfg.hybrid, self.run_dir, self.step)

    @property
    def obs_dim(self) -> int:
        norm = getattr(self.obs_norm, "instruments", self.obs_norm)  # an account's: one instrument's row
        return int(norm.mean.shape[0])


def load_run_config(run_dir: str | Path) -> TrainConfig:
    path = Path(run_dir) / RUN_CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; is {run_dir} a run folder made by scripts/train.py?")
    try:
        return load_config(path)
    except ConfigError as e:
        raise ConfigError(f"{e} (the run's config does not fit the current code)") from None


def refuse_instrument_set(cfg: TrainConfig, run_dir: str | Path, why: str) -> None:
    """A ConfigError, one line, for a run trained on several instruments (data.instruments) where only runs on one are
    read (`why`: "trade.py does not trade it yet"): trade.py, --init-from, the Agent API, one instrument's walk, and
    what evaluate.py does not do for an account yet."""
    if cfg.data.instruments:
        symbols = ", ".join(getattr(i.contract, "symbol", str(i.contract)) for i in cfg.data.instruments)
        raise ConfigError(f"{run_dir}: a run on several instruments ({symbols}): {why}")


def _manager(run_dir: Path, kind: str) -> ocp.CheckpointManager | None:
    path = (run_dir / "checkpoints" / kind).absolute()
    if not path.is_dir():
        return None
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False), item_names=("state", "host"))


def restore_policy(run_dir: str | Path, which: str = "best", cfg: TrainConfig | None = None, *,
                   account: bool = False) -> SavedPolicy:
    """Params and observation normaliser of the run's `which` checkpoint: best, latest, or an update number
    (looked up among the latest checkpoints, then the best). `best` falls back to latest, with a note on stderr,
    for a run that never evaluated. `cfg`: the run's whole recorded config, kept with the policy (SavedPolicy.cfg),
    when the caller has read it already (None: read from the run folder). A run on several instruments is refused
    unless `account` (its reader walks an account: evaluate.py); its obs_norm is then an AccountObs of normalisers."""
    run_dir = Path(run_dir)
    cfg = cfg or load_run_config(run_dir)
    if not account:
        refuse_instrument_set(cfg, run_dir, "its policy is not one instrument's")
    managers = {kind: _manager(run_dir, kind) for kind in KINDS}
    steps = {kind: (m.all_steps() if m else []) for kind, m in managers.items()}
    try:
        if which == "best" and not steps["best"]:
            print(f"note: {run_dir} has no best checkpoint (no evaluation ran); using the latest", file=sys.stderr)
            which = "latest"
        if which in KINDS:
            kind, step = which, max(steps[which], default=None)
        elif which.isdigit():
            kind = next((k for k in ("latest", "best") if int(which) in steps[k]), None)
            step = int(which)
        else:
            raise ValueError(f"checkpoint {which!r}: use best, latest or an update number")
        if kind is None or step is None:
            listing = "; ".join(f"{k}: {', '.join(map(str, sorted(s))) or 'none'}" for k, s in steps.items())
            raise FileNotFoundError(f"{run_dir}: no finished checkpoint {which!r} (checkpoints: {listing})")
        restored = _restore_checked(run_dir, managers[kind], kind, step, steps)
    finally:
        for m in managers.values():
            if m:
                m.close()
    state = restored.state
    norm = lambda moments: RunningMeanStd(**{k: jnp.asarray(v) for k, v in moments.items()})  # noqa: E731
    if cfg.data.instruments:  # one normaliser per instrument feature and one for the account block
        from jaxenv.account_env import AccountObs

        obs_norm = AccountObs(**{k: norm(v) for k, v in state["obs_norm"].items()})
    else:
        obs_norm = norm(state["obs_norm"])
    hybrid = state.get("hybrid")
    if isinstance(hybrid, dict) and "0" in hybrid:  # an account's carries saved as a mapping by index
        hybrid = [hybrid[str(i)] for i in range(len(hybrid))]
    hybrid = list(hybrid) if isinstance(hybrid, tuple) else hybrid
    carries = hybrid if isinstance(hybrid, list) else [hybrid]  # an account's: one per instrument
    records = [carry.get("record") if isinstance(carry, dict) else None for carry in carries]
    if any(isinstance(record, dict) and "evidence" not in record for record in records):
        print(f"note: {run_dir} checkpoint {kind}/{step} holds an advice record of an earlier test (before the betting "
              "e-process over sessions): its walks start from an empty record", file=sys.stderr)
        records = [None] * len(records)
    record = records if isinstance(hybrid, list) else records[0]
    return SavedPolicy(run_dir, cfg, kind, step, state["params"], obs_norm, record)


def _restore_checked(run_dir: Path, manager: ocp.CheckpointManager, kind: str, step: int,
                     steps: dict[str, list[int]]) -> Any:
    """Restores checkpoint kind/step after checking it against its manifest, and checks that its policy is finite;
    a damaged one is a CheckpointDamaged error that lists the run's intact checkpoints."""
    root = (run_dir / "checkpoints").absolute()
    label = f"{kind}/{step} of {run_dir}"
    try:
        if not verify_step(root, kind, step):
            print(f"note: checkpoint {label} has no {MANIFEST_FILE} (made before manifests); restored unverified",
                  file=sys.stderr)
        try:
            restored = manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), host=ocp.args.JsonRestore()))
        except Exception as error:  # orbax and tensorstore raise many kinds; none may pass as a result
            raise CheckpointDamaged(f"checkpoint {label} is damaged: {reason(error)}") from None
        check_finite({"params": restored.state["params"], "obs_norm": restored.state["obs_norm"]}, label)
    except CheckpointDamaged as damaged:
        raise CheckpointDamaged(f"{damaged}; intact checkpoints: {_intact(root, steps) or 'none'}") from None
    return restored


def _intact(root: Path, steps: dict[str, list[int]]) -> str:
    """'latest 2, 3; best 4': the checkpoints whose files match their manifests (--checkpoint takes the number)."""
    def ok(kind: str, step: int) -> bool:
        try:
            verify_step(root, kind, step)
            return True
        except CheckpointDamaged:
            return False

    found = {kind: [str(s) for s in sorted(found) if ok(kind, s)] for kind, found in steps.items()}
    return "; ".join(f"{kind} {', '.join(s)}" for kind, s in found.items() if s)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def _outputs(shapes: dict[str, tuple[int, ...]], head: str) -> int | None:
    """Output width of a head (actor, critic): its last Dense layer's bias."""
    biases = sorted((p for p in shapes if p.startswith(f"params/{head}/Dense_") and p.endswith("/bias")),
                    key=lambda p: int(p.split("/")[2].split("_")[1]))
    return shapes[biases[-1]][0] if biases else None


def check_fits(saved: SavedPolicy, network: Any, obs_dim: int, num_actions: int, example: Any = None) -> None:
    """Raises CheckpointMismatch listing every difference between the checkpoint's policy and the network the
    current code builds from the run's config: observation size, action count, then any other layer. `example`: a
    batch of one observation the network takes (default: zeros [1, obs_dim]; an account's: an AccountObs)."""
    example = jnp.zeros((1, obs_dim)) if example is None else example
    expected = _shapes(jax.eval_shape(lambda: network.init(jax.random.PRNGKey(0), example)))
    stored = _shapes(saved.params)
    env = saved.cfg.env
    stored_actions = _outputs(stored, "actor")
    problems = []
    if saved.obs_dim != obs_dim:
        problems.append(f"observation size {saved.obs_dim} in the checkpoint, {obs_dim} with the current code and "
                        f"the run's config (env.extended_features={env.extended_features}, env.window={env.window})")
    if stored_actions != num_actions:
        problems.append(f"{stored_actions} actions in the checkpoint, {num_actions} in the current env")

    def explained(old: tuple[int, ...], new: tuple[int, ...]) -> bool:  # by the two differences above
        return (old[1:] == new[1:] and (old[:1], new[:1]) == ((saved.obs_dim,), (obs_dim,))) or (
            old[:-1] == new[:-1] and (old[-1:], new[-1:]) == ((stored_actions,), (num_actions,)))

    for path in sorted(set(stored) | set(expected)):
        if path not in expected:
            problems.append(f"{path} is in the checkpoint only")
        elif path not in stored:
            problems.append(f"{path} is in the current network only (network or hybrid.fusion config changed?)")
        elif stored[path] != expected[path] and not explained(stored[path], expected[path]):
            problems.append(f"{path}: shape {stored[path]} in the checkpoint, {expected[path]} now (network sizes?)")
    if problems:
        raise CheckpointMismatch(f"{saved.run_dir} checkpoint {saved.label} does not fit: " + "; ".join(problems))
