"""The mock sidecar through the whole text path: render → shared memory → mock advisor → parser → answers."""

import os

import numpy as np

from bridge import ACTIONS, STATUS_NO_VIEW, STATUS_OK, STATUS_PARSE_ERROR, BridgeConfig, PromptRenderer, SidecarClient
from llm_sidecar.__main__ import example_fields
from llm_sidecar.backends import MockBackend


def client_config() -> BridgeConfig:
    return BridgeConfig(name_prefix=f"jxfm{os.getpid()}_")


def test_mock_sidecar_answers_like_the_in_process_mock_and_caches_repeats():
    renderer = PromptRenderer.from_yaml()
    fields, texts = example_fields(300, seed=3)
    prompts = renderer.render(fields, texts)
    expected = MockBackend().advise([p.decode() for p in prompts])
    assert len(set(expected.action.tolist())) >= 4  # the rules really depend on the prompt
    with SidecarClient(client_config()) as client:
        client.start(backend="mock", prompts=renderer, batch_size=64)
        for _ in range(2):
            client.submit(np.arange(300), prompts)
            answers = client.collect(timeout_s=10.0)
            assert (answers.status == STATUS_OK).all()
            assert (answers.action == expected.action).all()
            assert np.allclose(answers.probs, expected.probs)
            assert answers.reasons.tolist() == [r[:128] for r in expected.reasons]
        stats = client.stats()
        unique = len(set(prompts.tolist()))
        assert stats["cache_misses"] == unique and stats["cache_hits"] == 300 + (300 - unique)


def test_mock_reads_compact_and_spelled_out_prompts():
    mock = MockBackend()
    assert mock.advise_text("10:00 ES 4500 ADX30 RSI50 VWAP+0.2 mom+0.5 long 1 pnl+100 win50% loss0 bal50k").startswith("ENABLE_TRAIL")
    assert mock.advise_text("ES 10:00 price 4500.00 ADX 30 RSI 50 VWAP +0.2% momentum +0.5% position long 1 "
                            "uPnL +100 win rate 50% losses 0 balance 50000").startswith("ENABLE_TRAIL")
    assert mock.advise_text("10:00 ES 4500 ADX20 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k").startswith("BUY")
    assert mock.advise_text("10:00 ES 4500 ADX10 RSI50 VWAP-0.2 mom-0.5 short 2 pnl-50 win50% loss0 bal50k "
                            "News: long rally").startswith("DISABLE_TRAIL")


def test_news_mock_trades_the_headline_alone_and_random_mock_ignores_the_prompt():
    flat = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k"
    news = MockBackend(answers="news").advise([
        flat + " News: Acme beats estimates, shares surge", flat + " News: Hawkish Fed remarks spark a selloff",
        flat,  # indicators alone (oversold RSI here) say nothing to it
        flat.replace("flat", "long 1") + " News: stocks rally",
    ])
    assert [ACTIONS[a] for a in news.action] == ["BUY", "SELL", "HOLD", "HOLD"]
    assert np.allclose(news.confidence, [0.8, 0.8, 0.6, 0.6])
    # news_pass: the same advisor, but flat without news it has no view (PASS) instead of saying HOLD
    passing = MockBackend(answers="news_pass").advise([flat + " News: stocks rally", flat, flat.replace("flat", "long 1")])
    assert passing.status.tolist() == [STATUS_OK, STATUS_NO_VIEW, STATUS_OK]
    assert ACTIONS[passing.action[0]] == "BUY" and passing.action[1] == -1 and np.allclose(passing.probs[1], 1 / 6)
    prompts = [flat.replace("RSI20", f"RSI{r}") for r in range(100)]
    coin = MockBackend(answers="random").advise(prompts)
    assert len(set(coin.action.tolist())) == 6 and (coin.confidence >= 0.5).all()
    assert (MockBackend(answers="random").advise(prompts).action == coin.action).all()  # seeded by the prompt


def test_no_view_answers_cross_the_bridge_counted_and_cached():
    """PASS answers reach the agent as no_view (not parse errors), are counted as such, and a repeated prompt is
    answered from the cache with its status."""
    quiet = b"10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k"
    prompts = [quiet, quiet + b" News: stocks rally"]
    with SidecarClient(client_config()) as client:
        client.start(backend="mock", answers="news_pass")
        for _ in range(2):
            client.submit(np.arange(2), prompts)
            answers = client.collect(timeout_s=10.0)
            assert answers.status.tolist() == [STATUS_NO_VIEW, STATUS_OK]
            assert ACTIONS[answers.action[1]] == "BUY"
        assert client.counters["no_view"] == 2 and client.counters["parse_error"] == 0
        assert client.stats()["cache_hits"] == 2


def test_garbage_answers_become_counted_parse_errors_never_hold():
    prompts = [b"RSI %d ADX 30" % i for i in range(200)]
    with SidecarClient(client_config()) as client:
        client.start(backend="mock", garbage_rate=0.3)
        client.submit(np.arange(200), prompts)
        answers = client.collect(timeout_s=10.0)
    bad = answers.status == STATUS_PARSE_ERROR
    assert 30 < bad.sum() < 90
    assert (answers.action[bad] == -1).all() and np.allclose(answers.probs[bad], 1 / 6)
    assert (answers.status[~bad] == STATUS_OK).all()
    assert client.counters["parse_error"] == bad.sum()
