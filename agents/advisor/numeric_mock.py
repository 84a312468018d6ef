"""The mock advisor answering from numbers (`llm: mock`, hybrid.mock.reads=fields, the default): its rules
(bridge.mock_rules) applied to the keys' prompt fields as the prompt would show them, in the trainer's
process. No prompt is sent or parsed, nor rendered but for the random answers' seeds, so an empty table costs a query
step microseconds per key; the answers equal those of the mock reading the rendered text in a sidecar
(hybrid.mock.reads=text), which is the one that exercises the bridge. It stands where the advisor keeps an AdvisorPool (AdvisorWorkers)."""

from __future__ import annotations

from collections import deque

import numpy as np

from agents.config import HybridConfig
from bridge import Answers, answer_probabilities
from bridge.protocol import FIELD_INDEX, NUM_ACTIONS, STATUS_NO_VIEW, STATUS_OK
from bridge.prompts import PromptRenderer
from bridge import mock_rules


def reads_fields(hybrid: HybridConfig, llm: str) -> bool:
    """Whether the run's advisor is the mock answering from the prompt fields in the trainer's process."""
    return llm == "mock" and hybrid.mock.reads == "fields"


class NumericMock:
    """Answers each submission when it is submitted; collect() returns them in order. Never down, never busy."""

    reads_fields = True  # the advisor submits prompt-field rows, not rendered prompts (AdvisorWorkers)
    workers: list = []  # no processes
    alive, oldest_done = True, True

    def __init__(self, answers: str, renderer: PromptRenderer, texts: list[str] | None):
        self.answers = answers
        self.renderer = renderer
        self.texts = texts
        self._sentiment = np.zeros(1, np.int64)  # per text, then [-1]: none
        self._pending: deque[Answers] = deque()
        self._next_seq = 1

    @property
    def sentiment(self) -> np.ndarray:
        """Each text's sentiment, [-1] for none; `texts` may grow (agents.trading's feed adds headlines)."""
        texts = self.texts or []
        if len(self._sentiment) != len(texts) + 1:
            self._sentiment = np.array([mock_rules.sentiment(t) for t in texts] + [0], np.int64)
        return self._sentiment

    def submit(self, keys: np.ndarray, fields: np.ndarray, think: np.ndarray | None = None) -> int:
        n = len(keys)
        if self.answers == "random":  # a coin per prompt, seeded by its text's hash as in the sidecar's mock
            draws = [mock_rules.coin(prompt) for prompt in self.renderer.render(fields, self.texts).tolist()]
            action = np.array([a for a, _ in draws], np.int64).reshape(n)
            confidence = np.array([c for _, c in draws]).reshape(n)
            reasons = np.full(n, b"a coin flip", "S16")
        else:
            shown = self.renderer.shown(fields)
            position = shown[:, FIELD_INDEX["position"]]
            side = np.sign(np.where(np.isfinite(position), np.rint(position), 0)).astype(np.int64)
            headline = shown[:, FIELD_INDEX["headline"]]
            headline = np.where(np.isfinite(headline) & (headline >= 0), headline, -1).astype(np.int64)
            adx, rsi = shown[:, FIELD_INDEX["adx"]], shown[:, FIELD_INDEX["rsi"]]
            action, confidence, rule = mock_rules.decide(
                self.answers, side, self.sentiment[headline], rsi, adx, shown[:, FIELD_INDEX["vwap_dist"]],
                shown[:, FIELD_INDEX["momentum"]], shown[:, FIELD_INDEX["unrealized_pnl"]])
            cases, where = np.unique(np.stack([rule, side, adx, rsi], axis=1), axis=0, return_inverse=True)
            reasons = np.array([mock_rules.reason(int(r), int(s), a, b).encode() for r, s, a, b in cases], "S")
            reasons = reasons[where.reshape(-1)]
        no_view = action == mock_rules.PASS
        confidence = np.where(no_view, 0.0, confidence)
        probs = answer_probabilities(action, confidence)
        probs[no_view] = 1.0 / NUM_ACTIONS
        self._pending.append(Answers(self._next_seq, np.asarray(keys, np.int32), probs, action.astype(np.int8),
                                     confidence.astype(np.float32),
                                     np.where(no_view, STATUS_NO_VIEW, STATUS_OK).astype(np.int8), reasons))
        self._next_seq += 1
        return self._next_seq - 1

    def collect(self, timeout_s: float | None = None) -> Answers:
        return self._pending.popleft()

    def restart_dead(self) -> None:
        pass

    def reset_counters(self) -> None:
        pass

    def metrics(self) -> dict:
        return {}

    def command(self, op: str, timeout_s: float = 60.0, **args) -> dict:
        raise ValueError(f"the mock answering from numbers takes no command ({op!r}): use hybrid.mock.reads=text")

    def close(self) -> None:
        self._pending.clear()
