"""Chain-of-thought ("thinking") answers: the advisor reasons in numbered steps before its one-line answer.

Why a separate path: a thought generates up to `reasoning.max_new_tokens` tokens per prompt (160 by default,
against one forward pass per batch in score mode), so the trainer asks for one only on a reasoning budget (rows
where its policy is uncertain, at most N per episode) and the sidecar answers every other row in score mode.
The steps are read back with bridge.parsing.parse_reasoning: a thought without a readable decision is a parse
error, never a silent HOLD, and the answer's reason is a one-line summary of the steps for the trade log.
"""

from __future__ import annotations

import re
import time

import numpy as np

from bridge.parsing import ReasonedAnswer, answer_probabilities, parse_reasoning
from bridge.prompts import check_reasoning
from bridge.protocol import ACTIONS, NUM_ACTIONS, STATUS_OK, STATUS_PARSE_ERROR
from llm_sidecar.backends import BackendAnswers, MockBackend, TransformersBackend

REASON_BYTES = 480  # the UTF-8 summary kept as each answer's reason

# What the mock's thoughts quote from the rendered context (configs/prompts.yaml's compact form).
_INDICATOR = re.compile(r"\b(ADX|RSI|VWAP|mom)\s*([-+]?\d+(?:\.\d+)?%?)")
_POSITION = re.compile(r"\b(long \d+|short \d+|flat)\b")
_PNL = re.compile(r"\b(?:pnl|P&L)\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)


class Reasoner:
    """Answers context prompts with chain-of-thought text from a MockBackend or a TransformersBackend.

    `reasoning` is the prompt file's `reasoning` mapping (see bridge.prompts.check_reasoning): its own system
    prompt, the step names the answer is split into, and the generated-token budget per thought.
    """

    def __init__(self, backend: MockBackend | TransformersBackend, reasoning: dict):
        if not isinstance(backend, (MockBackend, TransformersBackend)):
            raise TypeError(f"Reasoner needs a MockBackend or TransformersBackend, got {type(backend).__name__}")
        self.backend = backend
        self.reasoning = check_reasoning(reasoning, "Reasoner(reasoning=...)")
        self.steps = tuple(self.reasoning["steps"])
        self.counters = {"thoughts": 0, "parse_errors": 0, "tokens": 0}  # tokens: generated (the mock: words)
        if isinstance(backend, TransformersBackend):
            self.prefix_text, self.suffix_text = backend._split_chat_template(self.reasoning["system"])

    def think(self, contexts: list[str]) -> BackendAnswers:
        """One chain-of-thought answer per context; `reasons` hold each thought's summary."""
        if not contexts:
            return _answers([], prompt_tokens=0)
        if isinstance(self.backend, MockBackend):
            thoughts, prompt_tokens, generated = self._mock_thoughts(contexts)
        else:
            thoughts, prompt_tokens, generated = self._generated_thoughts(contexts)
        reasoned = [parse_reasoning(thought, self.steps) for thought in thoughts]
        answers = _answers(reasoned, prompt_tokens)
        self.counters["thoughts"] += len(contexts)
        self.counters["parse_errors"] += int((answers.status == STATUS_PARSE_ERROR).sum())
        self.counters["tokens"] += generated
        return answers

    def _generated_thoughts(self, contexts: list[str]) -> tuple[list[str], int, int]:
        """The model's thoughts, their prompt tokens and the tokens generated (padding after an early stop aside)."""
        backend = self.backend
        texts = [self.prefix_text + context + self.suffix_text for context in contexts]
        tokens = backend.tokenizer(texts, add_special_tokens=False).input_ids  # the prefix holds any BOS already
        ids, mask = backend._left_padded(tokens)
        sample = backend.options.sample
        with backend.torch.inference_mode(), backend.adapter_scope():
            out = backend.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.reasoning["max_new_tokens"],
                do_sample=sample,
                pad_token_id=backend.tokenizer.pad_token_id,
                # Greedy: unset the model's sampling defaults, which generate() would otherwise warn about.
                **({} if sample else {"temperature": None, "top_p": None, "top_k": None}),
            )
        new_tokens = out[:, ids.shape[1] :]
        thoughts = backend.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        generated = int((new_tokens != backend.tokenizer.pad_token_id).sum())
        return thoughts, int(mask.sum()), generated

    def _mock_thoughts(self, contexts: list[str]) -> tuple[list[str], int, int]:
        """The mock's one-line answers written out as thoughts in the configured steps.

        The one-line answers come from `advise`, so the mock's answer modes, injected garbage and crashes and its
        latency all apply; a thought then waits as long again (thinking costs more than answering)."""
        mock = self.backend
        one_line = mock.advise(contexts)
        if mock.latency_s:
            time.sleep(mock.latency_s * len(contexts))
        thoughts = []
        for i, context in enumerate(contexts):
            if one_line.status[i] == STATUS_OK:
                action, confidence = ACTIONS[one_line.action[i]], one_line.confidence[i]
                decision = f"{action} | {confidence:.2f} | {one_line.reasons[i].decode()}"
            else:
                decision = "undecided"  # the mock's garbage answer stays unreadable
            thoughts.append(self._mock_thought(context, decision))
        return thoughts, 0, sum(len(thought.split()) for thought in thoughts)

    def _mock_thought(self, context: str, decision: str) -> str:
        market = context.partition("News:")[0]  # the position and P&L are read before any headline
        indicators = ", ".join(f"{name} {value}" for name, value in _INDICATOR.findall(market))
        position, pnl = _POSITION.search(market), _PNL.search(market)
        notes = [
            f"read {indicators or 'no indicators'}.",
            "BUY, SELL or HOLD when flat; MOVE_TO_BE, ENABLE_TRAIL or DISABLE_TRAIL with a position.",
            f"position {position[1] if position else 'unknown'}, P&L {pnl[1] if pnl else 'unknown'}.",
        ]
        notes += ["nothing to add."] * (len(self.steps) - 1 - len(notes))  # steps beyond the three the mock knows
        lines = [f"{n}. {step.capitalize()}: {note}" for n, (step, note) in enumerate(zip(self.steps[:-1], notes), 1)]
        lines.append(f"{len(self.steps)}. {self.steps[-1].capitalize()}: {decision}")
        return "\n".join(lines)


def _reason_bytes(summary: str) -> bytes:
    """At most REASON_BYTES of UTF-8, cut at a character boundary (the model may write non-ASCII text)."""
    return summary.encode()[:REASON_BYTES].decode("utf-8", "ignore").encode()


def _answers(reasoned: list[ReasonedAnswer], prompt_tokens: int) -> BackendAnswers:
    """BackendAnswers for parsed thoughts: a parse error keeps uniform probabilities and confidence 0."""
    n = len(reasoned)
    answers = BackendAnswers(
        probs=np.full((n, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32),
        action=np.full(n, -1, dtype=np.int8),
        confidence=np.zeros(n, dtype=np.float32),
        status=np.array([r.answer.status for r in reasoned], dtype=np.int8),
        reasons=[_reason_bytes(r.summary(REASON_BYTES)) for r in reasoned],
        prompt_tokens=prompt_tokens,
    )
    for i, r in enumerate(reasoned):
        if r.answer.status == STATUS_OK:
            answers.action[i], answers.confidence[i] = r.answer.action, r.answer.confidence
            answers.probs[i] = answer_probabilities(r.answer.action, r.answer.confidence)
    return answers
