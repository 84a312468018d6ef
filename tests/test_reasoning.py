"""Chain-of-thought answers: the step parser, the prompt file's `reasoning` section, and the Reasoner on the mock
and on a tiny random-weight Phi-3."""

import json
import os
import time

import numpy as np
import pytest

from bridge import ACTIONS, STATUS_OK, STATUS_PARSE_ERROR, PromptRenderer
from bridge.parsing import parse_reasoning
from bridge.prompts import DEFAULT_REASONING_STEPS
from llm_sidecar.__main__ import example_fields
from llm_sidecar.backends import REASON_BYTES, MockBackend
from llm_sidecar.reasoning import Reasoner

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
    assert reasoning["steps"] == STEPS and reasoning["max_new_tokens"] == 160 and reasoning["max_time_s"] == 30.0
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
    ({"max_time_s": 0}, r"reasoning\.max_time_s must be a number > 0"),
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


def assert_distributions(answers, n):
    """What every reasoned answer carries: status ok and a 6-way distribution whose top is the action."""
    assert (answers.status == STATUS_OK).all() and answers.probs.shape == (n, 6)
    assert np.isfinite(answers.probs).all() and (answers.probs >= 0).all()
    assert np.allclose(answers.probs.sum(axis=1), 1.0, atol=1e-5)
    assert (answers.action == answers.probs.argmax(axis=1)).all()
    assert np.allclose(answers.confidence, answers.probs.max(axis=1))


@pytest.mark.parametrize("answers", ["rules", "news", "random"])
def test_mock_thoughts_end_in_the_mocks_one_line_answer(contexts, answers):
    reasoner = Reasoner(MockBackend(answers=answers), RENDERER.reasoning)
    thought = reasoner.think(contexts)
    one_line = MockBackend(answers=answers).advise(contexts)
    assert_distributions(thought, len(contexts))
    assert (thought.action == one_line.action).all() and np.allclose(thought.probs, one_line.probs)
    assert thought.text_ok.all()
    for reason, action in zip(thought.reasons, thought.action):
        assert len(reason) <= REASON_BYTES
        assert reason.decode().startswith(ACTIONS[action] + " ")  # the scored decision, then the thought
        assert all(f"{step}: " in reason.decode() for step in STEPS), reason
    assert reasoner.counters["thoughts"] == len(contexts) and reasoner.counters["parse_errors"] == 0
    assert reasoner.counters["tokens"] > 0


def test_unreadable_thoughts_are_counted_but_never_lose_the_decision(contexts):
    reasoner = Reasoner(MockBackend(garbage_rate=0.5), RENDERER.reasoning)
    thought = reasoner.think(contexts)
    garbage = MockBackend(garbage_rate=0.5).advise(contexts).status == STATUS_PARSE_ERROR
    assert garbage.any() and not garbage.all()
    assert_distributions(thought, len(contexts))  # unreadable or not, every thought ends in a decision
    assert (thought.action == MockBackend().advise(contexts).action).all()
    assert (thought.text_ok == ~garbage).all() and reasoner.counters["parse_errors"] == garbage.sum()
    assert all("parse error" in thought.reasons[i].decode() for i in np.flatnonzero(garbage))
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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llm_sidecar.models import build_tiny_phi3

    return str(build_tiny_phi3(tmp_path_factory.mktemp("tiny_phi3")))


def tiny_backend(model, mode="score"):
    from llm_sidecar.backends import TransformersBackend, TransformersOptions

    return TransformersBackend(TransformersOptions(model=model, mode=mode), RENDERER.system, RENDERER.answer_prefix)


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_transformers_reasoned_answers_always_carry_a_distribution(tiny_model, contexts, mode):
    """Random weights never write the steps: every thought is unreadable, every answer still a decision (scored
    after the thought), whatever mode the backend answers other rows in."""
    reasoner = Reasoner(tiny_backend(tiny_model, mode), {**RENDERER.reasoning, "max_new_tokens": 16})
    answers = reasoner.think(contexts[:3])
    assert_distributions(answers, 3)
    assert answers.probs.std(axis=0).max() > 1e-4  # scored per prompt and thought, not a constant
    assert answers.prompt_tokens > 0 and 0 < answers.generated_tokens <= 3 * 16
    assert reasoner.counters["cut"] == 3  # random weights do not stop by themselves: the token budget ends them
    assert reasoner.counters["parse_errors"] == (~answers.text_ok).sum() and reasoner.counters["thoughts"] == 3
    for reason, action in zip(answers.reasons, answers.action):
        assert reason.decode().startswith(ACTIONS[action] + " ") and "decision: parse error" in reason.decode()


def test_a_thought_cut_by_the_time_budget_is_scored_on_what_it_has(tiny_model, contexts):
    backend = tiny_backend(tiny_model)
    reasoner = Reasoner(backend, {**RENDERER.reasoning, "max_new_tokens": 1500, "max_time_s": 0.3})
    start = time.perf_counter()
    answers = reasoner.think(contexts[:2])
    assert time.perf_counter() - start < 10.0  # 1500 tokens take far longer
    assert_distributions(answers, 2)
    assert 0 < answers.generated_tokens < 2 * 1500 and reasoner.counters["cut"] == 2


def test_unreadable_thoughts_still_answer_through_the_sidecar_and_their_reason_reaches_llm_log(tmp_path):
    """A mock whose every text is garbage: rows marked `think` still come back ok (the scored decision) with the
    thought as their reason, and the trainer's llm_log.jsonl records that reason; the other rows stay parse errors."""
    from types import SimpleNamespace

    from agents.advisor.advisor import LlmLog
    from bridge import BridgeConfig, SidecarClient

    fields, texts = example_fields(4, seed=4)
    prompts = RENDERER.render(fields, texts)
    with SidecarClient(BridgeConfig(name_prefix=f"jxft{os.getpid()}_")) as client:
        client.start(backend="mock", prompts=RENDERER, garbage_rate=1.0)
        client.submit(np.arange(4), prompts, think=[True, False, True, False])
        answers = client.collect(timeout_s=10.0)
    assert answers.status.tolist() == [STATUS_OK, STATUS_PARSE_ERROR, STATUS_OK, STATUS_PARSE_ERROR]
    assert (answers.action[[0, 2]] == MockBackend().advise([prompts[i].decode() for i in (0, 2)]).action).all()
    blocks = SimpleNamespace(rendered_bar=lambda keys: np.asarray(keys) // 3 * 5 + 4)  # a key's block's last bar
    log = LlmLog(tmp_path / "llm_log.jsonl", 8, RENDERER, texts, blocks)
    log.write(prompts, answers)
    log.close()
    logged = [json.loads(line) for line in (tmp_path / "llm_log.jsonl").read_text().splitlines()]
    for row in (logged[0], logged[2]):
        assert row["status"] == "ok" and row["answer"].startswith(ACTIONS[int(np.argmax(row["probs"]))])
        assert "market analysis: read ADX" in row["answer"] and "decision: parse error" in row["answer"]


def test_reasoned_answers_reach_the_learner_as_the_prompt_and_its_scored_decision(contexts):
    """Learning joins outcomes to the answered rows: a reasoned row with an unreadable thought is answered (its
    scored distribution), and the experience holds the prompt alone, which is what the learner scores."""
    from types import SimpleNamespace

    from llm_sidecar.learning import PromptMemory
    from llm_sidecar.server import AnswerCache, answer_request

    class Endpoint:  # the transport's side of answer_request, recorded
        stop_requested = False

        def abandoned(self, seq):
            return False

        def add_counter(self, name, value):
            pass

        def write_answers(self, request, rows, probs, action, confidence, status, reasons):
            pass

    think = np.arange(len(contexts)) % 2 == 0
    encoded = [c.encode() for c in contexts]
    request = SimpleNamespace(seq=7, prompts=encoded, lengths=[len(c) for c in encoded], think=think)
    mock = MockBackend(garbage_rate=0.5)
    answered = answer_request(Endpoint(), mock, AnswerCache(0), request, 4, Reasoner(mock, RENDERER.reasoning))
    garbage = MockBackend(garbage_rate=0.5).advise(contexts).status == STATUS_PARSE_ERROR
    assert (garbage & think).any() and (garbage & ~think).any()
    assert np.isfinite(answered[think]).all() and np.isnan(answered[~think & garbage]).all()
    memory = PromptMemory()
    memory.remember(7, contexts, answered)
    n = len(contexts)
    experiences, unknown = memory.join({"seq": np.full(n, 7), "row": np.arange(n), "move": np.ones(n)})
    assert unknown == (~think & garbage).sum()
    by_prompt = {e.prompt: e for e in experiences}
    for i in np.flatnonzero(think):
        assert np.allclose(by_prompt[contexts[i]].advice, answered[i])  # the prompt alone, no thought text
