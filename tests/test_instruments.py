"""Instruments: the built-in table, a full specification from YAML or the command line, the scale checks that stop
data of another instrument, and the one-line errors (exit 2) a user sees for files that cannot be bars."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from agents.config import ConfigError, load_config, save_config
from jaxenv.config import DataConfig
from jaxenv.contracts import CONTRACTS, InstrumentError, describe, get_contract, resolve_contract
from jaxenv.data import DataValidationError
from jaxenv.market import load_market
from tests.market_shapes import daily_equity, hourly_fx, minute_futures, to_utc, write_csv
from tests.test_config import cli_main


# ------------------------------------------------------------------------------------------- the table
def test_the_built_in_table_holds_the_instruments_researchers_bring():
    e6 = get_contract("6E")
    assert (e6.kind, e6.tick_size, e6.tick_value) == ("future", 0.00005, 6.25)
    assert e6.point_value == pytest.approx(125_000.0) and (e6.session_open, e6.session_close) == ("18:00", "17:00")
    zn = get_contract("zn")  # any case
    assert (zn.tick_size, zn.tick_value, zn.point_value) == (1 / 64, 15.625, 1000.0)
    mbt = get_contract("MBT")
    assert (mbt.tick_size, mbt.tick_value, mbt.point_value) == (5.0, 0.50, 0.1)
    fx = get_contract("EURUSD")
    assert (fx.kind, fx.lot_size, fx.point_value, fx.session_open, fx.session_close) == (
        "spot_fx", 100_000.0, 100_000.0, "17:00", "17:00")  # 24 hours, the New York 17:00 roll
    assert fx.tick_value * 10 == pytest.approx(10.0) and fx.commission_per_side == pytest.approx(0.5 * 10.0)  # 0.5 pip
    stock = get_contract("EQUITY")
    assert (stock.kind, stock.lot_size, stock.point_value, stock.session_open, stock.session_close) == (
        "equity", 100.0, 100.0, "09:30", "16:00")
    assert stock.commission_per_side / stock.lot_size == pytest.approx(0.005)  # per share
    for symbol, spec in CONTRACTS.items():  # the table passes its own checks, unchanged
        assert resolve_contract(spec) == spec, symbol
    assert "0.5 pip" in describe(fx) and "$0.005 a share" in describe(stock)
    assert describe(get_contract("NQ")) == ("NQ (E-mini Nasdaq-100, future): tick 0.25 = $5, point $20 per contract; "
                                            "$2.14 per side")


def test_a_mapping_declares_an_instrument_and_bad_fields_are_named():
    stock = resolve_contract({"symbol": "AAPL", "kind": "equity", "tick_size": 0.01, "lot_size": 50,
                              "commission_per_side": 0.25, "session_open": "09:30", "session_close": "16:00"})
    assert (stock.point_value, stock.tick_value, stock.name) == (50.0, 0.5, "AAPL")  # a $1 move of 50 shares
    fdax = resolve_contract({"symbol": "FDAX", "tick_size": 0.5, "point_value": 25, "currency": "EUR",
                             "timezone": "Europe/Berlin", "session_open": "01:10", "session_close": "22:00"})
    assert fdax.tick_value == 12.5 and "EUR 12.5" in describe(fdax)
    bad = [
        ({"symbol": "X", "tick_size": 0.25}, "tick_value: give tick_value or point_value"),
        ({"symbol": "X", "tick_size": 0.25, "tick_value": 5, "point_value": 25}, "tick_value: 5.0 is not point_value"),
        ({"symbol": "X", "tick_size": 0, "point_value": 1}, "tick_size: must be > 0"),
        ({"symbol": "X", "tick_size": 1, "point_value": 1, "timezone": "Mars/Base"}, "timezone: unknown time zone"),
        ({"symbol": "X", "tick_size": 1, "point_value": 1, "session_open": "9:30"}, "session_open: expected HH:MM"),
        ({"symbol": "X", "tick_size": 1, "point_value": 1, "kind": "option"}, "kind: must be one of future"),
        ({"symbol": "X", "tick_size": 1, "point_value": 1, "rth_open": "07:00", "rth_close": "19:00",
          "session_open": "08:00", "session_close": "16:00"}, "rth_open: regular hours 07:00-19:00 must lie inside"),
        ({"symbol": "X", "tick_sise": 1}, "tick_sise: not a field of an instrument"),
    ]
    for mapping, message in bad:
        with pytest.raises(InstrumentError, match=message):
            resolve_contract(mapping)


def test_the_config_takes_a_name_or_a_mapping_and_the_run_config_keeps_the_values(tmp_path):
    path = tmp_path / "fx.yaml"
    path.write_text("data:\n  contract:\n    symbol: USDCHF\n    kind: spot_fx\n    tick_size: 0.00001\n"
                    "    commission_per_side: 6.0\n    currency: CHF\n    session_open: '17:00'\n"
                    "    session_close: '17:00'\n")
    cfg = load_config(path)
    assert cfg.data.contract.symbol == "USDCHF" and cfg.data.contract.point_value == 100_000.0
    flow = "data.contract={symbol: MYM, tick_size: 1.0, tick_value: 0.5, commission_per_side: 0.52}"
    assert load_config(None, [flow]).data.contract.point_value == 0.5
    named = load_config(None, ["data.contract=6E"])
    assert named.data.contract == get_contract("6E")  # a name becomes its full specification ...
    save_config(named, tmp_path / "run.yaml")
    saved = yaml.safe_load((tmp_path / "run.yaml").read_text())["data"]["contract"]
    assert saved["symbol"] == "6E" and saved["tick_value"] == 6.25 and saved["session_open"] == "18:00"  # ... saved
    assert load_config(tmp_path / "run.yaml") == named
    with pytest.raises(ConfigError, match=r"data.contract: unknown instrument 'XYZ'; built-in: 6E, CL, EQUITY"):
        load_config(None, ["data.contract=XYZ"])
    with pytest.raises(ConfigError, match=r"data.contract.tick_size: must be > 0"):
        load_config(None, ["data.contract={symbol: X, tick_size: 0, point_value: 1}"])
    with pytest.raises(ConfigError, match=r"unknown key 'data.contract.tick_sze'"):
        load_config(None, ["data.contract={symbol: X, tick_sze: 1}"])
    path.write_text("data:\n  contract:\n    symbol: X\n    tick_size: 1\n    point_value: 1\n"
                    "    session_open: 18:00\n")
    with pytest.raises(ConfigError, match=r"data.contract.session_open: expected str, got int 1080 \(quote times"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"data.source_timezone: unknown time zone 'Mars/Base'"):
        load_config(None, ["data.source_timezone=Mars/Base"])
    with pytest.raises(ConfigError, match=r"unknown key 'data.timezone'"):
        load_config(None, ["data.timezone=Europe/London"])
    with pytest.raises(ConfigError, match=r"env.prop_firm.flat_by: expected HH:MM"):
        load_config(None, ["env.prop_firm.flat_by=4pm"])


# ------------------------------------------------------------------------------------------- the scale
def test_hourly_fx_declared_as_nq_stops_with_the_range_in_ticks_and_the_fix(tmp_path):
    path = write_csv(to_utc(hourly_fx()), tmp_path / "eurusd_h1.csv")
    with pytest.raises(DataValidationError) as error:
        load_market(DataConfig(source=path))  # the default instrument, NQ
    message = str(error.value)
    assert message.startswith(f"{path}: prices around 1.0")
    assert "median bar range of 0.005" in message and "ticks of NQ (tick 0.25)" in message
    assert "bars move less than 2 ticks" in message and "100% of prices are off its tick grid" in message
    assert "--set data.contract=EURUSD (built-in instruments whose tick fits these prices: EURUSD, GBPUSD)" in message
    assert load_market(DataConfig(source=path, contract="EURUSD")).scale.median_range_ticks > 50


def test_stock_prices_off_the_nq_grid_and_quiet_bars_are_errors(tmp_path):
    path = write_csv(daily_equity(), tmp_path / "stock.csv", dates=True)
    with pytest.raises(DataValidationError, match=r"stock.csv: prices around .* ticks of NQ \(tick 0.25\): 9\d% of "
                                                  r"prices are off its tick grid \(first at row \d+\)"):
        load_market(DataConfig(source=path))
    market = load_market(DataConfig(source=path, contract="EQUITY"))
    assert market.scale.off_grid_share == 0.0
    # On the grid but barely moving: ES minute bars whose range is mostly one tick.
    quiet = minute_futures(days=2)
    mid = quiet["close"]
    quiet["high"], quiet["low"], quiet["open"] = mid + 0.25, mid, mid
    path = write_csv(quiet, tmp_path / "quiet.csv")
    with pytest.raises(DataValidationError, match=r"median bar range of 1 ticks of ES .* lower data.min_range_ticks"):
        load_market(DataConfig(source=path, contract="ES"))
    assert load_market(DataConfig(source=path, contract="ES", min_range_ticks=1.0)).scale.median_range_ticks == 1.0


# ------------------------------------------------------------------------------------ errors, exit 2
def parquet_bytes(tmp_path) -> bytes:
    minute_futures(days=2).to_parquet(tmp_path / "good.parquet")
    return (tmp_path / "good.parquet").read_bytes()


@pytest.mark.parametrize("name, content, message", [
    ("empty.csv", b"", "the file is empty"),
    ("blank.csv", b"\n\n", "has no columns (an empty or blank CSV file)"),
    ("header.csv", b"timestamp,open,high,low,close,volume\n", "has columns but no rows of bars"),
    ("garbage.csv", bytes(range(256)) * 40, "not a UTF-8 text CSV file (binary content"),
    ("garbage.csv.gz", b"\x1f\x8b\x08" + bytes(range(200)), "not a UTF-8 text CSV file (binary content"),
    ("notparquet.parquet", b"timestamp,open\n1,2\n", "not a readable Parquet file (truncated, or another format"),
    ("truncated.parquet", None, "not a readable Parquet file (truncated"),
])
def test_files_that_cannot_be_bars_fail_with_one_line_and_exit_2(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if content is not None else parquet_bytes(tmp_path)[:-300])
    assert cli_main()(["--data", str(path), "--llm", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and "Traceback" not in err and err.count("\n") == 1


def test_unknown_contract_and_a_folder_exit_2(tmp_path, capsys):
    assert cli_main()(["--set", "data.contract=EURUSDX", "--llm", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: data.contract: unknown instrument 'EURUSDX'; built-in: 6E") and "EURUSD" in err
    assert cli_main()(["--data", str(tmp_path), "--llm", "none"]) == 2
    assert f"error: {tmp_path}: is a folder" in capsys.readouterr().err


def test_row_errors_name_a_setting_that_exists(tmp_path, capsys):
    frame = minute_futures(days=2)
    frame.iloc[7, frame.columns.get_loc("low")] = frame["high"].iloc[7] + 1
    path = write_csv(frame, tmp_path / "bad.csv")
    assert cli_main()(["--data", path, "--llm", "none"]) == 2
    err = capsys.readouterr().err
    assert "column 'high' is below low at row 8 (--set data.drop_invalid_rows=true drops such rows instead)" in err
    assert cli_main()(["--data", path, "--llm", "none", "--set", "data.drop_invalid_rows=true",
                       "--set", "data.contract=NOPE"]) == 2  # the setting exists: only the contract is refused
    assert "data.contract: unknown instrument 'NOPE'" in capsys.readouterr().err


def test_train_prints_the_load_report_before_training(tmp_path, capsys, monkeypatch):
    from agents.training import loop

    class Stopped:  # what train returns after Ctrl-C
        interrupted = True
        stop_signal = None

    seen = {}

    def fake_train(cfg, run_dir, env_setup=None, **_):
        seen["market"] = env_setup.market
        return Stopped()

    monkeypatch.setattr(loop, "train", fake_train)
    path = write_csv(to_utc(hourly_fx()), tmp_path / "eurusd.csv", naive=True)
    argv = ["--data", path, "--llm", "none", "--set", "data.contract=EURUSD", "--set", "data.source_timezone=UTC"]
    assert cli_main()(argv) == 130  # the stub stops as Ctrl-C would
    report = capsys.readouterr().err
    for line in [f"data        {path}: 960 bars, 2024-02-11 17:00 to 2024-04-05 16:00",
                 "interval    60 minutes (detected); episodes of 120 bars by default (five sessions of 24 bars",
                 "instrument  EURUSD (Euro / US dollar, spot, 100,000 lot, spot_fx): tick 0.00001 = $1, point $100,000",
                 "scale       median bar range",
                 "time zones  stamps naive, taken as UTC (data.source_timezone), converted to America/New_York",
                 ("sessions    40 sessions (session 17:00-17:00 America/New_York, Monday to Friday); positions may "
                  "be held across sessions"),
                 "splits      train 672 bars / 28 sessions, val 144 bars / 6 sessions, test 144 bars / 6 sessions",
                 "dropped     0 rows"]:
        assert line in report, line
    assert len(report.splitlines()) <= 12 and seen["market"].contract.symbol == "EURUSD"
    assert "advisor     " not in report  # no advisor, no keys to ask
    # a model advisor's walks ask every key they read: the first advised run says so up front, with how many
    advised = [a if a != "none" else "smollm2" for a in argv] + ["--run-dir", str(tmp_path / "advised")]
    assert cli_main()(advised) == 130
    report = capsys.readouterr().err
    assert ("advisor     the walks ask smollm2 up to 90 validation keys (the first validation walk, training waits) "
            "and 87 test keys (the end-of-run comparison)") in report
    assert np.all(np.bincount(seen["market"].sessions.session_id) == 24)
