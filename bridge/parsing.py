"""Reads `ACTION | confidence | reason` answers out of generated text.

Language models wrap the protocol in markdown, JSON, prose and percentages. The parser accepts those, but
an answer naming no action, or two different ones, is a parse error: never a silent HOLD. An answer whose first
field is PASS says the advisor has no view (a status of its own, not an error). Chain-of-thought
answers (numbered steps ending in that line) are split into their steps by `parse_reasoning`.

The sidecar's transformers advisor decides by scoring the action labels (after any generated text), so there
these parsers only say whether the text also read as an answer (a counter) and give the reason its steps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bridge.protocol import ACTIONS, NO_VIEW_ANSWER, NUM_ACTIONS, STATUS_NO_VIEW, STATUS_OK, STATUS_PARSE_ERROR

DEFAULT_CONFIDENCE = 0.5  # used when an answer names an action but no confidence

# Phrases naming each action, longest forms first within an action. Matched on lower-cased text whose
# '_', '-' are spaces and from which negated words ("don't buy", "not go long") were removed.
_ACTION_PATTERNS: tuple[tuple[int, str], ...] = (
    (3, r"move (?:the )?(?:stop )?(?:loss )?to (?:be|break ?even)|breakeven|break even"),
    (5, r"disable (?:the )?trail(?:ing)?(?: stop)?|stop trailing|no trail(?:ing)?"),
    (4, r"enable (?:the )?trail(?:ing)?(?: stop)?|start trailing|trail(?:ing)? (?:the )?stop|trail"),
    (0, r"hold|wait|stay (?:flat|out)|no trade|do nothing|stand aside|neutral"),
    (1, r"buy(?:ing)?|go long|long"),
    (2, r"sell(?:ing)?|go short|short"),
)
_NEGATED = re.compile(r"\b(?:not|don't|do not|never|avoid|no need to)\s+(?:go\s+|to\s+)?\w+")
_ACTION_RE = re.compile(
    "|".join(rf"(?P<a{i}_{action}>\b(?:{pattern})\b)" for i, (action, pattern) in enumerate(_ACTION_PATTERNS))
)
_NUMBER = r"(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<pct>%|percent)?"
_LABELLED_CONFIDENCE = re.compile(r"(?:confidence|conf|certainty|probability|prob)\s*(?:[:=]|is|of)?\s*" + _NUMBER)
_ANY_NUMBER = re.compile(_NUMBER)
_WORD_CONFIDENCE = {"very high": 0.9, "high": 0.8, "medium": 0.5, "moderate": 0.5, "low": 0.3, "very low": 0.1}
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class ParsedAnswer:
    status: int  # STATUS_OK, STATUS_PARSE_ERROR or STATUS_NO_VIEW
    action: int  # -1 on a parse error or no view
    confidence: float  # 0 on a parse error or no view
    reason: str  # the model's reason, or why parsing failed


def _normalise(text: str) -> str:
    text = text.lower().replace("_", " ").replace("-", " ").replace("’", "'")
    text = re.sub(r"[*`#>\"]", " ", text)  # markdown emphasis, code and quote marks
    text = re.sub(r"\s+", " ", text).strip()
    return _NEGATED.sub(" ", text)


def _actions_in(text: str) -> list[int]:
    return [int(next(k for k, v in m.groupdict().items() if v).split("_")[1]) for m in _ACTION_RE.finditer(text)]


def _confidence_value(match: re.Match) -> float:
    value = float(match["num"])
    return value / 100.0 if match["pct"] or value > 1.0 else value


def _find_confidence(text: str, labelled_only: bool) -> float | None:
    """A labelled number ("confidence: 80%"); unless labelled_only, also the first number or a word like 'high'."""
    match = _LABELLED_CONFIDENCE.search(text) or (None if labelled_only else _ANY_NUMBER.search(text))
    if match is not None:
        return _confidence_value(match)
    if labelled_only:
        return None
    for words, value in _WORD_CONFIDENCE.items():
        if re.search(rf"\b{words}\b", text):
            return value
    return None


def _error(why: str) -> ParsedAnswer:
    return ParsedAnswer(STATUS_PARSE_ERROR, -1, 0.0, why)


def _from_json(raw: str) -> ParsedAnswer | None:
    match = _JSON_OBJECT.search(raw)
    if match is None:
        return None
    try:
        obj = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    lowered = {str(k).lower(): v for k, v in obj.items()}
    action_value = next((lowered[k] for k in ("action", "decision", "signal", "recommendation") if k in lowered), None)
    if action_value is None:
        return None
    actions = set(_actions_in(_normalise(str(action_value))))
    if len(actions) != 1:
        return _error(f"JSON action {action_value!r} names {len(actions)} actions")
    confidence_value = next((lowered[k] for k in ("confidence", "conf", "probability") if k in lowered), None)
    if confidence_value is None:
        confidence = DEFAULT_CONFIDENCE
    else:
        found = _find_confidence(_normalise(str(confidence_value)), labelled_only=False)
        if found is None:
            return _error(f"JSON confidence {confidence_value!r} is not a number")
        confidence = found
    reason = str(next((lowered[k] for k in ("reason", "rationale", "explanation") if k in lowered), ""))
    return _checked(actions.pop(), confidence, reason)


def _checked(action: int, confidence: float, reason: str) -> ParsedAnswer:
    if not 0.0 <= confidence <= 1.0:
        return _error(f"confidence {confidence:g} is outside 0..1 (and 0..100%)")
    return ParsedAnswer(STATUS_OK, action, float(confidence), reason.strip())


def parse_answer(raw: str) -> ParsedAnswer:
    """Parses one generated answer. Missing confidence → DEFAULT_CONFIDENCE; no or conflicting action → error;
    a first field of PASS → no view."""
    if not raw or not raw.strip():
        return _error("empty answer")
    first_line = raw.strip().splitlines()[0]
    first_field, _, reason = first_line.partition("|")
    if _normalise(first_field) == NO_VIEW_ANSWER.lower():
        return ParsedAnswer(STATUS_NO_VIEW, -1, 0.0, reason.strip())
    if "{" in raw:
        parsed = _from_json(raw)
        if parsed is not None:
            return parsed
    if "|" in first_line:
        raw_fields = first_line.split("|")
        fields = [_normalise(f) for f in raw_fields]
        action_field = next((i for i, f in enumerate(fields) if _actions_in(f)), None)
        if action_field is None:
            return _error(f"no action in {first_line[:80]!r}")
        actions = set(_actions_in(fields[action_field]))
        if len(actions) != 1:
            return _error(f"conflicting actions in {raw_fields[action_field].strip()!r}")
        rest = raw_fields[action_field + 1 :]
        confidence = _find_confidence(fields[action_field + 1], labelled_only=False) if rest else None
        if confidence is not None:
            rest = rest[1:]  # the field after the action held the confidence; the remainder is the reason
        return _checked(actions.pop(), DEFAULT_CONFIDENCE if confidence is None else confidence, "|".join(rest))
    text = _normalise(raw)
    # Prose: the first sentence that names an action decides; it must name only one.
    for sentence in re.split(r"(?<=[.!?;\n])\s+", text):
        actions = set(_actions_in(sentence))
        if len(actions) > 1:
            return _error(f"conflicting actions in {sentence!r}")
        if actions:
            confidence = _find_confidence(text, labelled_only=True)
            if confidence is None:
                # "80% sure"; other numbers in prose are indicator values, not confidences
                pct = re.search(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<pct>%|percent) (?:confident|confidence|sure|certain)", text)
                confidence = _confidence_value(pct) if pct else None
            return _checked(actions.pop(), DEFAULT_CONFIDENCE if confidence is None else confidence, raw.strip())
    return _error(f"no action in {raw.strip()[:80]!r}")


def answer_probabilities(action, confidence) -> np.ndarray:
    """A distribution for an answer: `confidence` on the named action, the rest spread evenly; float32 [6], or
    [n, 6] for arrays of n actions and confidences."""
    action, confidence = np.asarray(action), np.asarray(confidence, np.float64)
    return np.where(np.arange(NUM_ACTIONS) == action[..., None], confidence[..., None],
                    ((1.0 - confidence) / (NUM_ACTIONS - 1))[..., None]).astype(np.float32)


# ---- chain-of-thought answers ------------------------------------------------------------------------------

_MARKS = r"[ \t>#*_\-]*"  # markdown heading, quote, list and emphasis marks opening a heading line
_STEP_NUMBER = r"(?:step[ \t]*)?\d+[ \t]*[.):\-–—]?[ \t]*"  # "3.", "3)", "Step 3 -"


def _heading(step: str) -> re.Pattern:
    """Where `step`'s heading is written: "3. Risks:", "**Risks:**", "### Risks", "Step 3 - Risks", or mid-line
    after a step number ("... 3. Risks: ...") or a sentence ("... fine. Risks: ..."). Case does not matter."""
    name = r"[ \t_\-]+".join(re.escape(word) for word in step.split())
    label = rf"[*_]*[ \t]*{name}[ \t]*[*_]*[ \t]*"
    return re.compile(
        rf"^{_MARKS}(?:{_STEP_NUMBER})?{label}(?:[:\-–—][ \t]*[*_]*|$)"
        rf"|(?<=\s)(?:step[ \t]*)?\d+[ \t]*[.):][ \t]*{label}[:\-–—][ \t]*[*_]*"
        rf"|(?<=[.;!?]\s){label}:[ \t]*[*_]*",
        re.IGNORECASE | re.MULTILINE,
    )


def _shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to at most `limit` characters with '...' marking a cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 3].rstrip() + "..." if limit > 3 else text[: max(limit, 0)]


@dataclass(frozen=True)
class ReasonedAnswer:
    """A chain-of-thought answer: the text of each step found, by step name (steps not found are absent), and
    the answer read from the decision step."""

    steps: dict[str, str]
    answer: ParsedAnswer
    decision_step: str = "decision"  # the step that holds the `ACTION | confidence | reason` line

    def summary(self, max_chars: int = 480) -> str:
        """One line of at most `max_chars` characters for trade logs: "market analysis: ...; options: ...;
        risks: ...; decision: BUY | 0.70 | reason". The decision (or why none was read) always shows; the other
        steps share what room it leaves."""
        answer = self.answer
        if answer.status == STATUS_OK:
            outcome = f"{ACTIONS[answer.action]} | {answer.confidence:.2f} | {answer.reason}"
        else:
            outcome = f"parse error ({answer.reason})"
        decision = _shorten(f"{self.decision_step}: {outcome}", max_chars // 2)
        notes = [f"{name}: {text}" for name, text in self.steps.items() if name != self.decision_step]
        room = max_chars - len(decision) - len("; ") * len(notes)
        short = {}
        # Shortest first: the room a short note leaves goes to the longer ones.
        for i, note in sorted(enumerate(notes), key=lambda item: len(item[1])):
            short[i] = _shorten(note, room // (len(notes) - len(short)))
            room -= len(short[i])
        return _shorten("; ".join([short[i] for i in range(len(notes))] + [decision]), max_chars)


def parse_reasoning(text: str, steps: Sequence[str]) -> ReasonedAnswer:
    """Splits a chain-of-thought answer into its `steps` (the headings the prompt asked for; the last one is the
    decision) and parses the decision with `parse_answer`: the first line of the decision step holding a '|', else
    the whole step. Without a decision heading, the last line written as an answer (`ACTION | ...` or JSON)
    counts. Nothing readable is a parse error: prose in the other steps names actions too, so it never decides."""
    if not steps:
        raise ValueError("parse_reasoning needs at least one step name (the last one is the decision)")
    decision_step = steps[-1]
    found = []  # (heading start, heading end, step name)
    for step in steps:
        headings = list(_heading(step).finditer(text))
        if headings:
            # A decision the model revises is the last one it writes; other steps start at their first heading.
            heading = headings[-1] if step == decision_step else headings[0]
            found.append((heading.start(), heading.end(), step))
    found.sort()
    next_starts = [start for start, _, _ in found[1:]] + [len(text)]  # a step's text ends where the next begins
    bodies = {step: text[end:next_start].strip() for (_, end, step), next_start in zip(found, next_starts)}
    by_name = {step: bodies[step] for step in steps if step in bodies}
    if decision_step in by_name:
        decision = by_name[decision_step]
        answer = parse_answer(next((line for line in decision.splitlines() if "|" in line), decision))
    else:
        answer_lines = [line for line in text.splitlines() if "|" in line or "{" in line]
        parsed = (parse_answer(line) for line in reversed(answer_lines))
        answer = next((p for p in parsed if p.status == STATUS_OK),
                      _error(f"no {decision_step!r} step and no ACTION | confidence | reason line"))
    return ReasonedAnswer(steps=by_name, answer=answer, decision_step=decision_step)
