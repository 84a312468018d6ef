"""Prompt rendering: the vectorised formatter must write exactly what Python's formatting would."""

import re
import time

import numpy as np
import pytest

from bridge import PROMPT_FIELDS, PromptRenderer
from bridge.prompts import NumberFormat, format_numbers

FIELD = {name: i for i, name in enumerate(PROMPT_FIELDS)}


def render_numbers(values, spec):
    pieces = format_numbers(np.asarray(values, dtype=np.float32), NumberFormat.parse(spec, "test"))
    matrix = np.concatenate(pieces, axis=1)
    return [bytes(row).replace(b"\x00", b"").decode() for row in matrix]


@pytest.mark.parametrize("spec", ["d", ".0f", ".1f", ".2f", "+.2f", ".3f", ".4f", ".0%", "+.1%", ".0k", "+.1k"])
def test_numbers_match_python_formatting(spec):
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(0, 10, 300), rng.uniform(-1e6, 1e6, 300), [0.0, -0.0, 1e-7, -1e-7, 9999.995]])
    values = values.astype(np.float32)
    python_spec = spec.replace("d", ".0f").replace("k", "f")
    expected = []
    for v in values.astype(np.float64):
        text = format(v / 1000, python_spec) + "k" if spec.endswith("k") else format(v, python_spec)
        if text.lstrip("+-").strip("0.%k") == "":  # Python writes -0.00; the renderer drops the minus
            text = text.replace("-", "+" if spec.startswith("+") else "")
        expected.append(text)
    got = render_numbers(values, spec)
    mismatches = [(v, e, g) for v, e, g in zip(values, expected, got) if e != g]
    assert not mismatches, mismatches[:5]


def test_non_finite_numbers_render_as_na():
    assert render_numbers([np.nan, np.inf, 1.5], ".1f") == ["n/a", "n/a", "1.5"]


def fields_row(**values):
    row = np.zeros(len(PROMPT_FIELDS), dtype=np.float32)
    row[FIELD["headline"]] = -1
    for name, value in values.items():
        row[FIELD[name]] = value
    return row


def test_default_template_renders_the_market_and_the_side():
    renderer = PromptRenderer.from_yaml()
    row = fields_row(market=1, minute_of_day=14 * 60 + 5, price=4521.25, adx=27.4, rsi=61.6, vwap_dist=-0.123,
                     momentum=0.8, position=-2, unrealized_pnl=125.4, win_rate=0.55, consecutive_losses=3,
                     balance=50210.7, headline=1)
    text = renderer.render(row[None], ["ignored", "Fed cuts rates"])[0].decode()
    # Compact: every digit is a token for SmolLM2, so units and meanings live in the shared system prompt.
    # An advice key's prompt: the market and the position side, no account's figures (shared by every account).
    # the price at the instrument's precision: 5 digits, never finer than its tick (NQ: 0.25), halves to even
    assert text == "14:05 NQ 4521.2 ADX27 RSI62 VWAP-0.1 mom+0.8 short 2 News: Fed cuts rates"
    assert "system" not in text and renderer.system.startswith("You advise")
    for meaning in ("time", "symbol", "price", "ADX", "RSI", "VWAP", "momentum", "position", "headline"):
        assert meaning in renderer.system  # the system prompt says what each compact field is
    assert renderer.action_labels == ("HOLD", "BUY", "SELL", "MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL")
    assert all(label in renderer.system for label in renderer.action_labels)


def test_flat_position_and_missing_headline():
    renderer = PromptRenderer.from_dict({"system": "s", "context": "{position}{headline}|"})
    rows = np.stack([fields_row(position=0), fields_row(position=3, headline=np.nan)])
    assert renderer.render(rows).tolist() == [b"flat|", b"long 3|"]


def test_headlines_index_the_text_table():
    renderer = PromptRenderer.from_dict({"system": "s", "context": "{rsi:d}{headline}", "headline": " [{text}]"})
    rows = np.stack([fields_row(rsi=10, headline=2), fields_row(rsi=20), fields_row(rsi=30, headline=0)])
    assert renderer.render(rows, ["a", "b", "c"]).tolist() == [b"10 [c]", b"20", b"30 [a]"]


def test_bad_inputs_fail_loudly_naming_the_problem():
    renderer = PromptRenderer.from_yaml()
    with pytest.raises(ValueError, match="shape"):
        renderer.render(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="'market'"):
        renderer.render(fields_row(market=99)[None])
    with pytest.raises(ValueError, match="headline.*refers to text 5"):
        renderer.render(fields_row(headline=5)[None], ["only one"])
    with pytest.raises(ValueError, match=r"unknown field \{volume\}"):
        PromptRenderer.from_dict({"system": "s", "context": "{volume}"})
    with pytest.raises(ValueError, match="context field rsi: format .x."):
        PromptRenderer(system="s", context="{rsi}", formats={"rsi": "x"}).render(fields_row()[None])
    with pytest.raises(ValueError, match="unknown key"):
        PromptRenderer.from_dict({"system": "s", "context": "c", "sytem": "typo"})
    with pytest.raises(ValueError, match="'context' is required"):
        PromptRenderer.from_dict({"system": "s"})
    with pytest.raises(ValueError, match="action_labels must be 6 distinct"):
        PromptRenderer.from_dict({"system": "s", "context": "c", "action_labels": ["A", "B", "C", "D", "E", "E"]})


def test_4096_prompts_render_in_milliseconds():
    from llm_sidecar.__main__ import example_fields  # numpy-only helper; does not import torch

    renderer = PromptRenderer.from_yaml()
    fields, texts = example_fields(4096)
    renderer.render(fields, texts)
    best = min(_timed(lambda: renderer.render(fields, texts)) for _ in range(5))
    prompts = renderer.render(fields, texts)
    assert len(prompts) == 4096 and all(re.match(rb"\d\d:\d\d (ES|NQ|YM|RTY) \d+(\.\d)? ADX", p) for p in prompts)
    assert best < 0.05, f"rendering 4096 prompts took {best * 1e3:.1f} ms"  # ~5 ms measured; loose for shared CPUs


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
