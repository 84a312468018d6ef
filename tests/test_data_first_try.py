"""Data of the shapes a new user brings loads on the first try, or its first refusal names every setting it needs:
day-first stamps (01.02.2017 22:00:00.000) across a daylight-saving change. A built-in instrument takes field
changes (adjusted prices on a finer tick)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from agents.config import ConfigError, load_config
from jaxenv.config import DataConfig
from jaxenv.contracts import get_contract, resolve_contract
from jaxenv.data import DataValidationError, read_bars
from jaxenv.market import load_market
from tests.market_shapes import _ohlc, fx_session_stamps

NEW_YORK = "America/New_York"


# ------------------------------------------------------------------------------------------------ the shapes
def day_first_fx(path) -> str:
    """Hourly EURUSD stamped day-first in UTC as some platforms export it (01.02.2017 22:00:00.000), across the US
    daylight-saving change of 2017-03-12."""
    index = fx_session_stamps("2017-02-02", 40).tz_convert("UTC").tz_localize(None)  # from 01.02.2017 22:00
    frame = pd.DataFrame(_ohlc(np.random.default_rng(4), len(index), 1.0750, 0.0009, 0.00001), index=index)
    frame["volume"] = frame["volume"].astype(int)
    frame.insert(0, "Time", index.strftime("%d.%m.%Y %H:%M:%S.000"))
    frame.to_csv(path, index=False, float_format="%.5f")
    return str(path)


# ------------------------------------------------------------------------------ a built-in, some fields changed
def test_fields_set_on_a_built_in_instrument_change_only_those_and_what_follows_from_them(tmp_path):
    equity = get_contract("EQUITY")
    for overrides in (["data.contract=EQUITY", "data.contract.tick_size=0.000001"],
                      ["data.contract.tick_size=0.000001", "data.contract=EQUITY"]):  # in either order
        spec = load_config(None, overrides).data.contract
        assert spec.tick_size == 0.000001 and spec.point_value == equity.point_value  # a 1.0 move is worth the same
        assert spec.tick_value == pytest.approx(equity.point_value * 0.000001)
        assert (spec.symbol, spec.lot_size, spec.commission_per_side, spec.session_open) == (
            "EQUITY", equity.lot_size, equity.commission_per_side, equity.session_open)
    path = tmp_path / "cfg.yaml"
    path.write_text("data:\n  contract:\n    base: EQUITY\n    tick_size: 0.000001\n")
    assert load_config(path).data.contract == load_config(None, overrides).data.contract
    assert load_config(None, ["data.contract.tick_size=0.5"]).data.contract.symbol == "NQ"  # on the default
    one_share = resolve_contract({"base": "EQUITY", "lot_size": 1})
    assert (one_share.point_value, one_share.tick_value) == (1.0, 0.01)  # the lot's worth follows the lot
    assert resolve_contract({"base": "ES", "tick_value": 25.0}).point_value == 100.0


def test_a_bad_field_or_base_on_a_built_in_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'data.contract.tick_sze' \(no 'tick_sze' in data.contract"):
        load_config(None, ["data.contract=EQUITY", "data.contract.tick_sze=0.01"])
    with pytest.raises(ConfigError, match=r"data.contract.base: unknown instrument 'EQTY'"):
        load_config(None, ["data.contract={base: EQTY, tick_size: 0.01}"])
    with pytest.raises(ConfigError, match=r"data.contract.tick_size: must be > 0"):
        load_config(None, ["data.contract=EQUITY", "data.contract.tick_size=0"])


# ------------------------------------------------------------------------------------------ day or month first
def test_day_first_stamps_load_as_the_file_proves_and_an_ambiguous_file_names_both_formats(tmp_path):
    path = day_first_fx(tmp_path / "eurusd_h1.csv")
    market = load_market(DataConfig(source=path, contract="EURUSD", source_timezone="UTC"))
    assert market.stamps_note.startswith("read day-first as %d.%m.%Y %H:%M:%S.%f (row 171, 13.02.2017 00:00:00.000, "
                                         "reads no other way); naive, taken as UTC (data.source_timezone)")
    assert market.timestamps[0] == pd.Timestamp("2017-02-01 17:00", tz=NEW_YORK) and market.num_bars == 960
    assert market.sessions.num_sessions == 40  # one a weekday, across 2017-03-12
    # The first twelve days alone: no field above 12 says which is the day.
    first_days = tmp_path / "first_days.csv"
    first_days.write_text("".join(open(path).readlines()[:171]))
    message = r'--date-format "%d.%m.%Y %H:%M:%S.%f" \(day-first\) or --date-format "%m.%d.%Y %H:%M:%S.%f"'
    with pytest.raises(DataValidationError, match=rf"^{first_days}: column 'Time' reads both day-first and "
                                                  rf"month-first \(no field above 12 tells which\), .* {message}"):
        read_bars(first_days)
    day_first = read_bars(first_days, date_format="%d.%m.%Y %H:%M:%S.%f", source_timezone="UTC")
    assert day_first.index[-1] == pd.Timestamp("2017-02-12 23:00", tz="UTC")
