"""Chain-of-thought answers: the step parser, the prompt file's `reasoning` section, and the Reasoner on the mock
and on a tiny random-weight Phi-3."""

import json
import time

import numpy as np
import pytest

from bridge import STATUS_OK, STATUS_PARSE_ERROR, PromptRenderer
from bridge.parsing import parse_reasoning
from bridge.prompts import DEFAULT_REASONING_STEPS
from llm_sidecar.__main__ import example_fields
from llm_sidecar.backends import MockBackend
from llm_sidecar.reasoning import REASON_BYTES, Reasoner

HOLD, BUY, SELL, MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL = range(6)
STEPS = list(DEFAULT_REASONING_STEPS)
RENDERER = PromptRenderer.from_yaml()

WELL_FORMED = """1. Market analysis: ADX 31 shows a strong trend; RSI 58, price above VWAP, momentum +0.4.
2. Options: BUY with the trend, or HOLD until a pullback.
3. Risks: flat, so nothing open; three losses in a row argue for a smaller stake.
4. Decision: BUY | 0.72 | uptrend above VWAP"""


def test_well_formed_four_step_answer():
    reasoned = parse_reasoning(WELL_FORMED, STEPS)
    assert list(reasoned.steps) == STEPS
    assert reasoned.steps["options"] == "BUY with the trend, or HOLD until a pullback."
    assert reasoned.steps["decision"] == "BUY | 0.72 | uptrend above VWAP"
    assert (reasoned.answer.status, reasoned.answer.action, reasoned.answer.confidence) == (STATUS_OK, BUY, 0.72)
    assert reasoned.answer.reason == "uptrend above VWAP"


@pytest.mark.parametrize("text", [
    "**Market Analysis:** downtrend.\n\n**Options**\n- SELL\n- HOLD\n\n### RISKS\nshort squeeze.\n\n"
    "**Decision:** SELL | 65% | fade",
    "Step 1 - market analysis: downtrend.\nStep 2 - Options: sell.\nStep 3 - Risks: squeeze.\n"
    "Step 4 - Decision: SELL | 0.65 | fade",
    "Let me think.\n1) Market analysis - downtrend\n2) Options - sell\n3) Risks - squeeze\n"
    "4) Decision - SELL | 0.65 | fade\nDone.",
    "1. Market analysis: downtrend. 2. Options: sell. 3. Risks: squeeze. 4. Decision: SELL | 0.65 | fade",
])  # fmt: skip
def test_headings_in_markdown_case_step_numbers_and_prose(text):
    reasoned = parse_reasoning(text, STEPS)
    assert set(reasoned.steps) == set(STEPS), reasoned.steps
    assert "squeeze" in reasoned.steps["risks"].lower()
    assert (reasoned.answer.status, reasoned.answer.action, reasoned.answer.confidence) == (STATUS_OK, SELL, 0.65)


def test_a_missing_step_still_reads_the_decision():
    text = ("1. Market analysis: in profit, trend fading.\n2. Options: protect the gain.\n"
            "4. Decision: MOVE_TO_BE | 0.6 | lock it in")
    reasoned = parse_reasoning(text, STEPS)
    assert "risks" not in reasoned.steps and list(reasoned.steps) == ["market analysis", "options", "decision"]
    assert (reasoned.answer.status, reasoned.answer.action) == (STATUS_OK, MOVE_TO_BE)


@pytest.mark.parametrize("text", [
    "1. Market analysis: uptrend, so BUY looks good.\n2. Options: BUY or HOLD.\n3. Risks: a reversal",  # cut off
    "1. Market analysis: unclear.\n4. Decision: BUY or SELL | 0.5 | either",  # two actions
    "4. Decision:",
    "",
])  # fmt: skip
def test_no_readable_decision_is_a_parse_error_not_a_hold(text):
    reasoned = parse_reasoning(text, STEPS)
    assert (reasoned.answer.status, reasoned.answer.action) == (STATUS_PARSE_ERROR, -1)
    assert "parse error" in reasoned.summary(200)


def test_json_final_line_with_or_without_a_decision_heading():
    headed = parse_reasoning('1. Market analysis: up.\n4. Decision: {"action": "ENABLE_TRAIL", "confidence": 0.8}',
                             STEPS)
    bare = parse_reasoning('Market analysis: up. Risks: none.\n{"action": "BUY", "confidence": "70%", "reason": "x"}',
                           STEPS)
    assert (headed.answer.status, headed.answer.action, headed.answer.confidence) == (STATUS_OK, ENABLE_TRAIL, 0.8)
    assert (bare.answer.status, bare.answer.action, bare.answer.confidence) == (STATUS_OK, BUY, 0.7)
    assert "decision" not in bare.steps and bare.steps["risks"].startswith("none.")


def test_summary_is_one_bounded_line_that_always_shows_the_decision():
    long_text = WELL_FORMED.replace("strong trend;", "strong trend; " + "the tape is busy " * 40)
    reasoned = parse_reasoning(long_text, STEPS)
    for max_chars in (60, 120, 480):
        summary = reasoned.summary(max_chars)
        assert len(summary) <= max_chars and "\n" not in summary
    assert reasoned.summary(120).endswith("decision: BUY | 0.72 | uptrend above VWAP")
    full = parse_reasoning(WELL_FORMED, STEPS).summary(480)
    assert full.startswith("market analysis: ADX 31")
    assert "; options: BUY with the trend" in full and "; risks: flat" in full


def test_prompt_file_has_a_json_ready_reasoning_section():
    reasoning = RENDERER.reasoning
    assert reasoning["steps"] == STEPS and reasoning["max_new_tokens"] == 160
    assert json.loads(json.dumps(reasoning)) == reasoning  # it travels to the sidecar in a JSON blob
    for heading in ("1. Market analysis:", "2. Options:", "3. Risks:", "4. Decision: ACTION | confidence"):
        assert heading in reasoning["system"]
    assert all(action in reasoning["system"] for action in RENDERER.action_labels)
    assert PromptRenderer.from_dict({"system": "s", "context": "c"}).reasoning is None  # optional
    defaults = PromptRenderer.from_dict({"system": "s", "context": "c", "reasoning": {"system": reasoning["system"]}})
    assert defaults.reasoning == reasoning


@pytest.mark.parametrize("change, message", [
    ({"steps": "market analysis, decision"}, r"reasoning\.steps must be a non-empty list"),
    ({"steps": []}, r"reasoning\.steps must be a non-empty list"),
    ({"steps": ["market analysis", "outlook", "decision"]}, r"reasoning\.steps \['outlook'\] do not appear"),
    ({"max_new_tokens": 0}, r"reasoning\.max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": "160"}, r"reasoning\.max_new_tokens must be an integer >= 1"),
    ({"system": "Steps: market analysis, options, risks, decision. Say BUY or SELL."}, "must list the actions"),
    ({"budget": 3}, r"reasoning has unknown key\(s\) \['budget'\]"),
])  # fmt: skip
def test_bad_reasoning_sections_fail_naming_the_file_and_key(change, message):
    data = {"system": "s", "context": "c", "reasoning": {**RENDERER.reasoning, **change}}
    with pytest.raises(ValueError, match=rf"^prompts\.yaml: .*{message}"):
        PromptRenderer.from_dict(data, source="prompts.yaml")
    with pytest.raises(ValueError, match="reasoning must be a mapping"):
        PromptRenderer.from_dict({"system": "s", "context": "c", "reasoning": ["system"]}, source="prompts.yaml")


@pytest.fixture(scope="module")
def contexts():
    fields, texts = example_fields(12, seed=3)
    return [prompt.decode() for prompt in RENDERER.render(fields, texts)]


@pytest.mark.parametrize("answers", ["rules", "news", "random"])
def test_mock_thoughts_end_in_the_mocks_one_line_answer(contexts, answers):
    reasoner = Reasoner(MockBackend(answers=answers), RENDERER.reasoning)
    thought = reasoner.think(contexts)
    one_line = MockBackend(answers=answers).advise(contexts)
    assert (thought.status == STATUS_OK).all()
    assert (thought.action == one_line.action).all() and np.allclose(thought.confidence, one_line.confidence)
    assert np.allclose(thought.probs, one_line.probs)
    for reason in thought.reasons:
        assert len(reason) <= REASON_BYTES
        assert all(f"{step}: " in reason.decode() for step in STEPS), reason
    assert reasoner.counters["thoughts"] == len(contexts) and reasoner.counters["parse_errors"] == 0
    assert reasoner.counters["tokens"] > 0


def test_mock_thoughts_quote_the_context_and_keep_garbage_unreadable(contexts):
    reasoner = Reasoner(MockBackend(garbage_rate=0.5), RENDERER.reasoning)
    thought = reasoner.think(contexts)
    garbage = MockBackend(garbage_rate=0.5).advise(contexts).status == STATUS_PARSE_ERROR
    assert garbage.any() and not garbage.all()
    assert (thought.status == np.where(garbage, STATUS_PARSE_ERROR, STATUS_OK)).all()
    assert reasoner.counters["parse_errors"] == garbage.sum()
    reason = thought.reasons[int(np.argmin(garbage))].decode()
    assert "ADX" in reason and "RSI" in reason and "position " in reason and "P&L" in reason


def test_mock_thinking_takes_twice_the_mocks_latency(contexts):
    reasoner = Reasoner(MockBackend(latency_s=0.01), RENDERER.reasoning)
    start = time.perf_counter()
    reasoner.think(contexts[:5])
    assert time.perf_counter() - start >= 2 * 0.01 * 5


def test_reasoner_rejects_other_backends_and_answers_empty_batches():
    with pytest.raises(TypeError, match="MockBackend or TransformersBackend"):
        Reasoner(object(), RENDERER.reasoning)
    empty = Reasoner(MockBackend(), RENDERER.reasoning).think([])
    assert empty.probs.shape == (0, 6) and empty.reasons == []


def test_transformers_reasoner_on_a_tiny_random_phi3(contexts, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_sidecar.backends import TransformersBackend, TransformersOptions
    from llm_sidecar.models import build_tiny_phi3

    model = str(build_tiny_phi3(tmp_path / "tiny_phi3"))
    backend = TransformersBackend(TransformersOptions(model=model, mode="generate"), RENDERER.system,
                                  RENDERER.answer_prefix)
    reasoner = Reasoner(backend, {**RENDERER.reasoning, "max_new_tokens": 24})
    answers = reasoner.think(contexts[:2])
    assert answers.probs.shape == (2, 6) and np.allclose(answers.probs.sum(axis=1), 1.0, atol=1e-5)
    assert set(answers.status.tolist()) <= {STATUS_OK, STATUS_PARSE_ERROR}  # random weights: mostly parse errors
    assert answers.prompt_tokens > 0 and len(answers.reasons) == 2 and all(answers.reasons)
    assert 0 < reasoner.counters["tokens"] <= 2 * 24 and reasoner.counters["thoughts"] == 2
