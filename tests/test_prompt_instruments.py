"""The advisor speaks the run's instrument: every built-in and any declared instrument is in the prompt's market
field (before, anything outside the template's list of index futures crashed the default advisor at its first query
step), its price at the instrument's precision (EURUSD was written "1"), and the system prompt names its kind (every
run was told it advised a futures trader)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from agents.advisor.advisor import prompt_template
from agents.advisor.prompt_fields import prompt_instrument
from agents.config import load_config
from agents.training.loop import train
from bridge import PROMPT_FIELDS, PromptInstrument, PromptRenderer
from bridge.protocol import FIELD_INDEX
from jaxenv.contracts import CONTRACTS, KIND_WORDS, KINDS, price_decimals, resolve_contract
from tests.market_shapes import daily_equity, hourly_fx, write_csv
from tests.test_train import TINY

CUSTOM = {"symbol": "BTCUSD", "kind": "spot_fx", "tick_size": 0.5, "point_value": 1.0, "commission_per_side": 1.0,
          "timezone": "UTC", "session_open": "00:00", "session_close": "00:00", "weekends": True}
PRICES = {"future": 18234.37, "spot_fx": 1.087134, "equity": 801.374}


def rendered(renderer: PromptRenderer, symbol: str, price: float) -> str:
    fields = np.zeros((1, len(PROMPT_FIELDS)), np.float32)
    fields[0, FIELD_INDEX["headline"]] = -1
    fields[0, FIELD_INDEX["market"]] = renderer.markets.index(symbol)
    fields[0, FIELD_INDEX["price"]] = price
    return renderer.render(fields)[0].decode()


@pytest.mark.parametrize("spec", [*CONTRACTS.values(), resolve_contract(CUSTOM)], ids=lambda s: s.symbol)
def test_every_instrument_renders_its_symbol_its_price_at_its_precision_and_its_kind(spec):
    cfg = load_config(None, ["llm=smollm2", f"data.contract={spec.symbol}"] if spec.symbol in CONTRACTS else
                      ["llm=smollm2"])
    renderer = (prompt_template(cfg.hybrid, cfg.data)[0] if spec.symbol in CONTRACTS
                else PromptRenderer.from_yaml(instrument=prompt_instrument(spec)))
    assert spec.symbol in renderer.markets
    price = PRICES[spec.kind]
    text = rendered(renderer, spec.symbol, price)
    written = re.search(rf" {re.escape(spec.symbol)} (\S+) ", text).group(1)
    digits = written.replace(".", "")
    decimals = len(written.partition(".")[2])
    assert len(digits) <= 5 and decimals <= price_decimals(spec)  # 5 digits, never finer than the tick
    assert abs(float(written) - price) <= 0.5 * 10.0 ** -decimals + 1e-9
    assert decimals == min(price_decimals(spec), 5 - len(str(int(price))))  # no precision thrown away either
    assert f"automated {KIND_WORDS[spec.kind]} trader" in renderer.system and "{kind}" not in renderer.system
    assert "{kind}" not in renderer.reasoning["system"]


def test_the_kinds_all_have_words_and_the_index_futures_prompt_is_unchanged():
    assert set(KIND_WORDS) == set(KINDS)
    nq = PromptRenderer.from_yaml(instrument=prompt_instrument(CONTRACTS["NQ"]))
    # the default (a renderer built without a run, e.g. the sidecar's `ask`) is the default contract's
    assert prompt_instrument(CONTRACTS["NQ"]) == PromptInstrument("NQ", "futures", 2)
    assert rendered(nq, "NQ", 18234.37).startswith("00:00 NQ 18234 ADX0")  # as `{price:d}` wrote it before
    assert "EURUSD 1.0871 " in rendered(PromptRenderer.from_yaml(instrument=prompt_instrument(CONTRACTS["EURUSD"])),
                                         "EURUSD", 1.087134)
    shown = nq.shown(np.array([[*np.zeros(len(PROMPT_FIELDS))]], np.float32))
    assert shown.shape == (1, len(PROMPT_FIELDS))


@pytest.mark.parametrize("shape", ["hourly_fx", "daily_equity"])
def test_the_default_advisor_answers_on_fx_and_stocks(tmp_path, shape):
    """SmolLM2 as the main command runs it, on an FX and a stock file: before, the first query step raised
    "prompt field 'market' has value nan"."""
    if shape == "hourly_fx":
        path, settings, symbol = write_csv(hourly_fx(days=30), tmp_path / "eurusd.csv"), ["data.contract=EURUSD"], "EURUSD"
    else:
        path = write_csv(daily_equity(), tmp_path / "stock.csv", dates=True)
        settings, symbol = ["data.contract=EQUITY"], "EQUITY"
    cfg = load_config(None, [o for o in TINY if o != "llm=none"] + [
        f"data.source={path}", *settings, "llm=smollm2", "hybrid.store=", "hybrid.link.latency=strict",
        "hybrid.link.budget=8", "hybrid.link.log_llm=8", "total_steps=256", "checkpoint.eval_every_updates=0",
        "log.tensorboard=false"])
    train(cfg, tmp_path / "run")
    logged = [json.loads(line) for line in (tmp_path / "run" / "llm_log.jsonl").read_text().splitlines()]
    assert logged and all(row["status"] == "ok" for row in logged)
    price = re.compile(rf"^\d\d:\d\d {symbol} (\d+\.\d+) ADX")
    assert all(price.match(row["prompt"]) for row in logged), logged[0]["prompt"]
