"""Data of the shapes a new user brings loads on the first try, or its first refusal names every setting it needs:
a built-in instrument with some fields changed (adjusted prices on a finer tick)."""

from __future__ import annotations

import pytest

from agents.config import ConfigError, load_config
from jaxenv.contracts import get_contract, resolve_contract


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
