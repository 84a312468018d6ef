"""The advisor's learning options: one definition for both sides of the process boundary. The trainer's config
(agents.config.LearningConfig) extends it with what only the trainer uses; the sidecar's learner
(llm_sidecar.learning.LoraLearner) takes it, checked, from the `learning` dict the client sends at start.

The learner has one objective, the market's move after each answered prompt (llm_sidecar.learning); the
objectives that learned from the advice's own trades were removed (docs/findings.md). Its pieces on arrays of moves
(the weights, the targets, the direction accuracy) are defined here too, for the learner's rounds and for the trainer's
judging of each version on later sessions (agents.advisor.later_sessions) alike."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from bridge.protocol import BUY, SELL


def rms_move(moves: np.ndarray) -> float:
    """The root-mean-square move that scales the examples' weights (1 for no examples)."""
    moves = np.asarray(moves, np.float64)
    return float(np.sqrt(np.mean(moves ** 2))) if len(moves) else 1.0


def move_weights_of(moves: np.ndarray, rms: float, clip: float) -> np.ndarray:
    """Per-example weights w of the loss -w·log p(target): |move| over `rms`, clipped at `clip`."""
    return np.clip(np.abs(np.asarray(moves, np.float32)) / (rms + 1e-8), 0.0, clip)


def move_targets_of(moves: np.ndarray) -> np.ndarray:
    """The action each example's weight applies to: BUY where the market rose, SELL where it fell."""
    return np.where(np.asarray(moves) > 0, BUY, SELL).astype(np.int64)


def direction_accuracy(moves: np.ndarray, top_actions: np.ndarray) -> float:
    """Share of the examples whose top action is BUY or SELL (and whose move is known and nonzero) where the market then
    moved that way; NaN when none is."""
    moves = np.asarray(moves, np.float64)
    side = np.where(top_actions == BUY, 1.0, np.where(top_actions == SELL, -1.0, 0.0))
    called = (side != 0) & np.isfinite(moves) & (moves != 0)
    return float((np.sign(moves[called]) == side[called]).mean()) if called.any() else float("nan")


@dataclass
class LearningOptions:
    lr: float = 3e-4  # Adam step for the LoRA weights
    rank: int = 8  # LoRA rank of a new adapter (an adapter loaded with --lora keeps its own)
    alpha: int = 16  # LoRA scale of a new adapter: its update is scaled by alpha / rank
    batch_size: int = 16  # examples per learning step
    max_epochs: int = 1  # passes over the training share per round
    patience: int = 1  # epochs without a better validation loss before the round stops
    grad_clip: float = 1.0  # global gradient-norm clip
    kl_coef: float = 0.1  # weight of KL(base ‖ adapted) over the 6 actions
    move_clip: float = 3.0  # an example's weight, its move over the training share's RMS move, is clipped to this
    buffer_size: int = 4096  # experiences kept (the oldest go first)
    val_share: float = 0.2  # share of prompts (by hash) held out for validation
    min_examples: int = 64  # a round needs this many training examples (and 8 validation ones)

    def check(self) -> None:
        """Raises ValueError("FIELD: what is wrong") for the first option out of range."""
        problems = [
            (self.lr > 0, "lr", f"must be > 0, got {self.lr}"),
            (self.move_clip > 0, "move_clip", f"must be > 0, got {self.move_clip}"),
            (0.0 < self.val_share < 1.0, "val_share", f"must be between 0 and 1, got {self.val_share}"),
            *((getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
              for name in ("rank", "batch_size", "max_epochs", "buffer_size", "min_examples")),
        ]
        for ok, name, msg in problems:
            if not ok:
                raise ValueError(f"{name}: {msg}")

    @classmethod
    def from_dict(cls, data: dict) -> "LearningOptions":
        """The options the trainer sent (`data` holds LearningOptions fields only), checked."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown learning option(s) {sorted(unknown)}; known: {sorted(known)}")
        options = cls(**data)
        options.check()
        return options

    def options(self) -> dict:
        """The LearningOptions fields of this object (of a subclass too), as the client sends them."""
        return {f.name: getattr(self, f.name) for f in fields(LearningOptions)}
