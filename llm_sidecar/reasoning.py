"""Chain-of-thought ("thinking") answers: reason, then score. The advisor writes a thought in numbered steps
(market analysis, options, risks, decision), then the six action labels are scored after it exactly as score mode
scores them, in the same forward state (TransformersBackend.reason_then_score reuses the thought's key/value
cache). The decision is that distribution, so a thought never loses the answer: a 135M-parameter model that does
not follow the step format (SmolLM2 parses ~0% of the time) still answers; the thought is kept as the answer's
reason (llm_log.jsonl, trades.csv), and whether its decision step could be read is a counter.

Why a separate path: a thought generates up to `reasoning.max_new_tokens` tokens per prompt (against one forward
pass per batch in score mode), so the trainer asks for one only on a reasoning budget (rows where its policy is
uncertain, at most N per episode) and the sidecar answers every other row in its usual mode. A query step's
thoughts run as one batched generation bounded by the token budget per prompt and `reasoning.max_time_s` for the
batch; a thought cut by either is scored on what it has.
"""

from __future__ import annotations

import numpy as np

from bridge.parsing import parse_reasoning
from bridge.prompts import check_reasoning
from bridge.protocol import ACTIONS, STATUS_OK
from llm_sidecar.backends import (
    REASON_BYTES,
    BackendAnswers,
    MockBackend,
    TransformersBackend,
    answers_from_text,
    reason_bytes,
)

DECISION_BYTES = 24  # "SELL 0.41; " and the like, before the thought's summary


class Reasoner:
    """Answers context prompts by reason-then-score from a MockBackend or a TransformersBackend.

    `reasoning` is the prompt file's `reasoning` mapping (see bridge.prompts.check_reasoning): its own system
    prompt, the step names the thought is asked for, and its budgets (tokens per thought, seconds per batch).
    """

    def __init__(self, backend: MockBackend | TransformersBackend, reasoning: dict):
        if not isinstance(backend, (MockBackend, TransformersBackend)):
            raise TypeError(f"Reasoner needs a MockBackend or TransformersBackend, got {type(backend).__name__}")
        self.backend = backend
        self.reasoning = check_reasoning(reasoning, "Reasoner(reasoning=...)")
        self.steps = tuple(self.reasoning["steps"])
        # thoughts: answered; parse_errors: thoughts whose decision step could not be read (their answer is the
        # scored one all the same); cut: thoughts the token or time budget ended; tokens: generated (mock: words).
        self.counters = {"thoughts": 0, "parse_errors": 0, "cut": 0, "tokens": 0}
        if isinstance(backend, TransformersBackend):
            self.prefix_text, self.suffix_text = backend._split_chat_template(self.reasoning["system"])

    def think(self, contexts: list[str]) -> BackendAnswers:
        """One reasoned answer per context: the scored distribution (always status ok), the thought's summary as
        the reason, and `text_ok` marking the thoughts whose decision step was readable."""
        if not contexts:
            return answers_from_text([])
        if isinstance(self.backend, MockBackend):
            thoughts, answers = self.backend.reason(contexts, self.steps)
            cut = 0
        else:
            thoughts, answers, cut = self._generated(contexts)
        reasoned = [parse_reasoning(thought, self.steps) for thought in thoughts]
        answers.text_ok = np.array([r.answer.status == STATUS_OK for r in reasoned], dtype=bool)
        answers.reasons = [
            reason_bytes(f"{ACTIONS[a]} {p[a]:.2f}; " + r.summary(REASON_BYTES - DECISION_BYTES))
            for a, p, r in zip(answers.action, answers.probs, reasoned)
        ]  # fmt: skip
        self.counters["thoughts"] += len(contexts)
        self.counters["parse_errors"] += int((~answers.text_ok).sum())
        self.counters["cut"] += cut
        self.counters["tokens"] += answers.generated_tokens
        return answers

    def _generated(self, contexts: list[str]) -> tuple[list[str], BackendAnswers, int]:
        """The model's thoughts, the labels scored after them, and how many thoughts a budget cut."""
        backend = self.backend
        with backend.torch.inference_mode(), backend.adapter_scope():
            answers, thoughts, ended = backend.reason_then_score(
                self.prefix_text, self.suffix_text, contexts, self.reasoning["max_new_tokens"],
                self.reasoning["max_time_s"],
            )  # fmt: skip
        return thoughts, answers, int((~ended).sum())
