"""The answer parser against messy model output: every row must parse to the stated action and confidence,
or to a parse error — never to a silent HOLD."""

import numpy as np
import pytest

from bridge import DEFAULT_CONFIDENCE, STATUS_NO_VIEW, STATUS_OK, STATUS_PARSE_ERROR, answer_probabilities, parse_answer

HOLD, BUY, SELL, MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL = range(6)
D = DEFAULT_CONFIDENCE

MESSY_ANSWERS = [
    ("BUY | 0.8 | strong trend", BUY, 0.8),
    ("buy|85%|RSI oversold", BUY, 0.85),
    ("  Sell  |  0.6  ", SELL, 0.6),
    ("**HOLD** | 0.55 | choppy market", HOLD, 0.55),
    ("Action: MOVE_TO_BE | 0.9 | lock in profit", MOVE_TO_BE, 0.9),
    ("move stop to break-even | .7 | protect gains", MOVE_TO_BE, 0.7),
    ("enable trailing stop | high | trend intact", ENABLE_TRAIL, 0.8),
    ("DISABLE_TRAIL|0.4|", DISABLE_TRAIL, 0.4),
    ("disable-trail | 40 | trend faded", DISABLE_TRAIL, 0.4),
    ("BUY | RSI oversold below VWAP", BUY, D),
    ("SELL", SELL, D),
    ('{"action": "SELL", "confidence": "70%", "reason": "overbought"}', SELL, 0.7),
    ('```json\n{"Action": "buy", "Confidence": 0.65}\n```', BUY, 0.65),
    ('{"decision": "ENABLE_TRAIL", "reason": "trend"}', ENABLE_TRAIL, D),
    ("Recommendation: sell. I am 80% sure.", SELL, 0.8),
    ("I would not go long here, better to wait.", HOLD, D),
    ("Go long. Confidence: 0.75", BUY, 0.75),
    ("hold | confidence=0.3 | nothing to do", HOLD, 0.3),
    ("BUY | 0.72 | trend\nSELL | 0.9 | ignore this second line", BUY, 0.72),
    ("  b u y  ", None, None),  # letters apart are not a word
    ("banana", None, None),
    ("", None, None),
    ("BUY or SELL | 0.5", None, None),  # two actions: ambiguous
    ("BUY | 150 | too sure", None, None),  # confidence over 100%
    ('{"action": "maybe", "confidence": 0.9}', None, None),
    ("I am not sure what to do.", None, None),
]


@pytest.mark.parametrize("raw, action, confidence", MESSY_ANSWERS)
def test_messy_answers_parse_to_the_right_action_or_to_an_error(raw, action, confidence):
    parsed = parse_answer(raw)
    if action is None:
        assert parsed.status == STATUS_PARSE_ERROR, parsed
        assert parsed.action == -1 and parsed.confidence == 0.0
        assert parsed.reason  # says why
    else:
        assert parsed.status == STATUS_OK, parsed
        assert parsed.action == action
        assert parsed.confidence == pytest.approx(confidence)


@pytest.mark.parametrize("raw", ["PASS | no news", "pass", "**PASS** | nothing to go on\nBUY | 0.9"])
def test_pass_is_no_view_not_an_error_and_not_hold(raw):
    parsed = parse_answer(raw)
    assert parsed.status == STATUS_NO_VIEW and parsed.action == -1 and parsed.confidence == 0.0
    assert parse_answer("PASS | no news").reason == "no news"
    # a word that merely starts with it, or PASS later in the line, is read as usual
    assert parse_answer("Passing on it: HOLD | 0.6").status == STATUS_OK
    assert parse_answer("HOLD | 0.6 | pass").action == HOLD


def test_table_has_at_least_twenty_rows_and_both_outcomes():
    assert len(MESSY_ANSWERS) >= 20
    assert sum(a is None for _, a, _ in MESSY_ANSWERS) >= 5


def test_reason_keeps_the_models_casing():
    assert parse_answer("BUY | 0.8 | Strong Trend, RSI 40").reason == "Strong Trend, RSI 40"


def test_answer_probabilities_put_confidence_on_the_action():
    probs = answer_probabilities(SELL, 0.7)
    assert probs.sum() == pytest.approx(1.0)
    assert probs[SELL] == pytest.approx(0.7)
    assert np.allclose(np.delete(probs, SELL), 0.06)
