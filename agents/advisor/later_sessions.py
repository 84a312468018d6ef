"""An advisor that learns, judged on later sessions only (docs/advisor-learning.md).

A round's own held-out examples are a share of the sessions it trained on, so its "held-out loss fell" can be memory
of those sessions. Here each advisor version (0: as the run started; each adopted round the next) answers a fixed
draw of keys, the flat side's (an entry's question), of the validation split's sessions, and only keys of sessions
that start after the last bar of every outcome sent so far count: a version is never scored on a session at or before a
bar it could have learned from. Its figures are the learner's, on those keys: the loss −w·log p(the side the market
took) + kl_coef · KL(version 0 ‖ version), w = |move| over their RMS move, clipped at move_clip, and the direction
accuracy (the share of keys whose top answer is BUY or SELL where the market then went that way).

The keys are asked through training's own advisor session, between its query steps; their outcomes lie outside the
training split, so the learner never learns from them (agents.advisor.outcomes gives them no move).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agents.advice.table import walk_keys
from agents.advisor.outcomes import outcome_rows
from bridge.learning import direction_accuracy, move_targets_of, move_weights_of, rms_move
from bridge.protocol import BUY, SELL

SPLIT = "val"  # the sessions after the training split: no outcome reaches them
LATER_SESSIONS_PLOT = "advisor_later_sessions.png"  # in the run folder, for a run whose advisor learns


def session_starts(session_id: np.ndarray, bars: np.ndarray) -> np.ndarray:
    """The first bar of the session each of `bars` lies in."""
    starts = np.flatnonzero(np.diff(session_id, prepend=session_id[0] - 1))
    return starts[np.searchsorted(starts, bars, side="right") - 1]


class LaterSessions:
    def __init__(self, market, fields, interval: int, learning, seed: int):
        """`fields`: the run's agents.advisor.prompt_fields.PromptFieldBuilder; `learning`: the run's
        agents.config.LearningConfig (judge_keys, move_bars, move_clip, kl_coef)."""
        split = market.split_range(SPLIT)
        keys = walk_keys(*split, interval, entries_only=True)
        moves = outcome_rows([(0, np.arange(len(keys)), keys)], fields.rendered_bar, market, split,
                             learning.move_bars)["move"]
        known = np.flatnonzero(np.isfinite(moves) & (moves != 0))
        chosen = np.sort(np.random.default_rng(seed).choice(known, size=min(learning.judge_keys, len(known)),
                                                            replace=False))
        self.keys, self.moves = keys[chosen], moves[chosen].astype(np.float64)
        self.session_start = session_starts(market.sessions.session_id, fields.rendered_bar(self.keys))
        self.options = learning
        # the last bar any outcome sent to the learner reached: an outcome's move lies in the training split
        # (agents.advisor.outcomes), so a resumed run's adapter learned nothing after it either
        self.learned_through = market.split_range("train")[1] - 1
        self.reference: np.ndarray | None = None  # version 0's answers on the keys
        self.judged: set[int] = set()

    def learned(self, last_bar: int) -> None:
        """Outcomes reaching `last_bar` went to the learner: later versions are scored after it only."""
        self.learned_through = max(self.learned_through, int(last_bar))

    @property
    def eligible(self) -> np.ndarray:
        """[keys] bool: the key's session starts after every bar an outcome sent so far reached."""
        return self.session_start > self.learned_through

    def due(self, known, version: int) -> np.ndarray:
        """The eligible keys `version` has not answered yet (none once it is judged)."""
        if version in self.judged:
            return self.keys[:0]
        keys = self.keys[self.eligible]
        return keys[~known.filled(version)[keys]]

    def figures(self, known, version: int) -> dict[str, float]:
        """`version`'s figures (lora_later_*) once it has answered every eligible key, and only once; else {}."""
        eligible = self.eligible
        keys = self.keys[eligible]
        if version in self.judged or not len(keys) or not known.filled(version)[keys].all():
            return {}
        if version == 0:
            self.reference = known.probs[self.keys].astype(np.float64)
        if self.reference is None:  # version 0 was never judged (a round came first): no KL term to compare with
            return {}
        self.judged.add(version)
        probs = known.probs[keys].astype(np.float64)
        moves = self.moves[eligible]
        logp, reference = np.log(np.clip(probs, 1e-12, 1.0)), self.reference[eligible]
        weights = move_weights_of(moves, rms_move(moves), self.options.move_clip)
        nll = -(weights * logp[np.arange(len(keys)), move_targets_of(moves)]).mean()
        kl = (reference * (np.log(np.clip(reference, 1e-12, 1.0)) - logp)).sum(-1).mean()
        top = probs.argmax(-1)
        return {"lora_later_version": float(version), "lora_later_loss": float(nll + self.options.kl_coef * kl),
                "lora_later_accuracy": direction_accuracy(moves, top),
                "lora_later_called": float(np.isin(top, (BUY, SELL)).mean()),
                "lora_later_keys": float(len(keys)), "lora_later_after_bar": float(self.learned_through)}


def plot_later_sessions(metrics_path: Path, out: Path) -> Path | None:
    """Draws each version's later-sessions loss and direction accuracy over the run (from metrics.jsonl's lora_later_*
    rows) into `out`; None when no version was judged."""
    import json

    rows = [m for m in map(json.loads, Path(metrics_path).read_text().splitlines()) if "lora_later_version" in m]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def values(key: str) -> list[float]:  # metrics.jsonl writes NaN as null (no version answered BUY or SELL)
        return [float("nan") if m.get(key) is None else float(m[key]) for m in rows]

    update, loss = [m["update"] for m in rows], values("lora_later_loss")
    fig, (loss_ax, acc_ax) = plt.subplots(2, 1, sharex=True, figsize=(7, 5))
    loss_ax.plot(update, loss, "o-")
    loss_ax.set_ylabel("loss")
    acc_ax.plot(update, values("lora_later_accuracy"), "o-")
    acc_ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    acc_ax.set_ylabel("direction accuracy")
    acc_ax.set_xlabel("update (the version judged first answered all its keys)")
    for m, x, y in zip(rows, update, loss):
        if np.isfinite(y):
            loss_ax.annotate(f"v{m['lora_later_version']:.0f}", (x, y), textcoords="offset points", xytext=(0, 5),
                             ha="center", fontsize=8)
    loss_ax.set_title("the advisor's versions on later sessions only (keys of sessions after every learned bar)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
