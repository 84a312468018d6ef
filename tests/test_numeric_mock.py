"""The mock answering from numbers in the trainer's process (hybrid.mock.reads=fields, the default) answers every
key as the mock reading its rendered prompt in a sidecar (hybrid.mock.reads=text) does."""

import numpy as np
import pytest

from agents.advice.table import SIDES, num_blocks
from agents.advisor.advisor import prompt_template
from agents.advisor.numeric_mock import NumericMock
from agents.advisor.prompt_fields import PromptFieldBuilder
from agents.config import ConfigError, load_config
from bridge import PromptRenderer
from bridge.protocol import FIELD_INDEX, NUM_PROMPT_FIELDS, STATUS_NO_VIEW
from jaxenv import load_market
from llm_sidecar.backends import MockBackend


def every_key(data: str):
    """(keys, their prompt fields, renderer, text table) of every key of a 30-day market, k = 5."""
    cfg = load_config(None, ["llm=mock", f"data.source={data}", "data.synthetic_days=30"])
    market = load_market(cfg.data)
    renderer, _ = prompt_template(cfg.hybrid, cfg.data)
    keys = np.arange(num_blocks(market.num_bars, 5) * SIDES)
    fields = PromptFieldBuilder(market, list(renderer.markets), cfg.env.contracts_per_trade, 5).build(keys)
    return keys, fields, renderer, list(market.text_table) or None


@pytest.mark.parametrize("answers", ["rules", "news", "news_pass", "random"])
def test_answers_from_fields_are_the_text_mocks_on_every_key(answers):
    keys, fields, renderer, texts = every_key("synthetic:headlines")
    mock = NumericMock(answers, renderer, texts)
    mock.submit(keys, fields)
    got = mock.collect()
    want = MockBackend(answers=answers).advise([p.decode() for p in renderer.render(fields, texts)])
    assert len(np.unique(want.action)) >= {"rules": 4, "random": 6}.get(answers, 3)  # the answers depend on the key
    if answers == "news_pass":
        assert (want.status == STATUS_NO_VIEW).any()
    np.testing.assert_array_equal(got.keys, keys)
    for name in ("probs", "action", "confidence", "status", "reasons"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_the_numbers_shown_are_the_numbers_the_text_reads():
    renderer = PromptRenderer("s", "ADX{adx} VWAP{vwap_dist} win{win_rate} {position}",
                              formats={"adx": ".0f", "vwap_dist": "+.1f", "win_rate": ".0%"})
    fields = np.full((3, NUM_PROMPT_FIELDS), np.nan, np.float32)
    fields[:, FIELD_INDEX["adx"]] = [31.46, np.nan, 25.5]
    fields[:, FIELD_INDEX["vwap_dist"]] = [-0.04, 0.26, -1.25]
    fields[:, FIELD_INDEX["win_rate"]] = [0.5, 0.333, 1.0]
    fields[:, FIELD_INDEX["rsi"]] = 20.0  # not in the template: nobody reading it sees it
    fields[:, FIELD_INDEX["position"]] = [1, 0, -2]
    shown = renderer.shown(fields)
    assert renderer.render(fields).tolist()[:2] == [b"ADX31 VWAP+0.0 win50% long 1", b"ADXn/a VWAP+0.3 win33% flat"]
    assert shown[:, FIELD_INDEX["adx"]][[0, 2]].tolist() == [31.0, 26.0] and np.isnan(shown[1, FIELD_INDEX["adx"]])
    assert shown[:, FIELD_INDEX["vwap_dist"]].tolist() == [0.0, 0.3, -1.2]
    assert shown[:, FIELD_INDEX["win_rate"]].tolist() == [50.0, 33.0, 100.0]
    assert np.isnan(shown[:, FIELD_INDEX["rsi"]]).all() and shown[:, FIELD_INDEX["position"]].tolist() == [1, 0, -2]


def test_a_mock_with_latency_or_thoughts_runs_in_its_own_process():
    for key in ("hybrid.mock.latency_s=0.1", "hybrid.reasoning.enabled=true"):
        with pytest.raises(ConfigError, match="hybrid.mock.reads"):
            load_config(None, ["llm=mock", key])
        load_config(None, ["llm=mock", "hybrid.mock.reads=text", key])
    with pytest.raises(ConfigError, match="hybrid.mock.reads"):
        load_config(None, ["hybrid.mock.reads=numbers"])
