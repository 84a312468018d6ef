"""Data of the shapes a new user brings loads on the first try, or its first refusal names every setting it needs:
a broker's hourly spot FX with naive UTC stamps and two bars at the Friday close, day-first stamps
(01.02.2017 22:00:00.000), adjusted daily stock prices with six decimals; each with a gap, a holiday or a
daylight-saving change. A built-in instrument takes field changes (adjusted prices on a finer tick)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest

from agents.config import ConfigError, load_config
from agents.training.loop import train
from jaxenv.config import DataConfig
from jaxenv.contracts import get_contract, resolve_contract
from jaxenv.data import DataValidationError, raw_bars, read_raw_bars, read_table
from jaxenv.load_report import load_report
from jaxenv.market import load_market
from jaxenv.sessions import DAILY
from tests.market_shapes import _ohlc, fx_session_stamps, hourly_fx, minute_futures, trading_days, write_csv
from tests.test_config import cli_main
from tests.test_train import TINY

NEW_YORK = "America/New_York"


# ------------------------------------------------------------------------------------------------ the shapes
def broker_fx(path, friday_close_bars: int = 2) -> str:
    """A broker's hourly EURUSD export: naive UTC stamps, 5 decimals, 24x5 across the US daylight-saving change of
    2024-03-10, a five-hour gap (a feed outage), Good Friday missing, and bars stamped at two Friday closes."""
    frame = hourly_fx().tz_convert("UTC")
    outage = (frame.index >= "2024-02-21 03:00") & (frame.index < "2024-02-21 08:00")
    holiday = (frame.index >= "2024-03-28 21:00") & (frame.index < "2024-03-29 21:00")
    frame = frame[~outage & ~holiday]
    fridays = pd.DatetimeIndex([pd.Timestamp(f"{day} 17:00", tz=NEW_YORK) for day in ("2024-02-16", "2024-03-15")])
    extra = frame.iloc[:friday_close_bars].set_axis(fridays[:friday_close_bars].tz_convert("UTC"))
    frame = pd.concat([frame, extra]).sort_index()
    out = frame.set_axis(frame.index.tz_localize(None)).rename_axis("Date").reset_index()
    out.columns = ["Date", "Open", "High", "Low", "Close", "Volume"]
    out["Volume"] = out["Volume"].astype(int)
    out.to_csv(path, index=False, float_format="%.5f")
    return str(path)


def day_first_fx(path) -> str:
    """Hourly EURUSD stamped day-first in UTC as some platforms export it (01.02.2017 22:00:00.000), across the US
    daylight-saving change of 2017-03-12."""
    index = fx_session_stamps("2017-02-02", 40).tz_convert("UTC").tz_localize(None)  # from 01.02.2017 22:00
    frame = pd.DataFrame(_ohlc(np.random.default_rng(4), len(index), 1.0750, 0.0009, 0.00001), index=index)
    frame["volume"] = frame["volume"].astype(int)
    frame.insert(0, "Time", index.strftime("%d.%m.%Y %H:%M:%S.000"))
    frame.to_csv(path, index=False, float_format="%.5f")
    return str(path)


def adjusted_stock(path) -> str:
    """A free daily-price download of a stock: Date, Open, High, Low, Close, Adj Close, Volume; prices adjusted for
    splits and dividends, so six decimals off the cent grid; US holidays missing."""
    days = trading_days("2019-01-02", 1200)
    bars = _ohlc(np.random.default_rng(8), len(days), 160.0, 0.015, 0.01)
    factor = 0.872_413  # the split and dividend adjustment
    frame = pd.DataFrame({"Date": days.strftime("%Y-%m-%d")})
    for name in ("open", "high", "low", "close"):
        frame[name.title()] = np.round(bars[name] * factor, 6)
    frame["Adj Close"] = frame["Close"]
    frame["Volume"] = bars["volume"].astype(int)
    frame.to_csv(path, index=False, float_format="%.6f")
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


# ------------------------------------------------------------------------------- the first message, then training
def named_settings(message: str) -> list[str]:
    """The `--set key=value` settings a message names, in order, without placeholders (NAME, ZONE)."""
    found = [(key, value.rstrip(".")) for key, value in re.findall(r"--set (data\.[\w.]+)=([^\s,;)]+)", message)]
    assert len(dict(found)) == len(set(found)), f"a key named with two values: {found}"
    return [f"{key}={value}" for key, value in dict(found).items() if value not in ("NAME", "ZONE")]


def first_message(capsys, run_dir, argv: list[str]) -> str:
    """What train.py says first: one line, exit 2, no traceback, no run folder."""
    assert cli_main()(["--llm", "none", "--run-dir", str(run_dir), *argv]) == 2
    assert not run_dir.exists()
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def loads(monkeypatch, capsys, run_dir, argv: list[str]):
    """train.py up to training: the market it built and the load report it printed (and no Python warning)."""
    from agents.training import loop

    class Stopped:  # what train returns after Ctrl-C
        interrupted = True
        stop_signal = None

    seen = {}

    def fake_train(cfg, run_dir, env_setup=None, lock=None, **_):
        seen["market"] = env_setup.market
        lock.release(discard=True)
        return Stopped()

    monkeypatch.setattr(loop, "train", fake_train)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli_main()(["--llm", "none", "--run-dir", str(run_dir), *argv]) == 130  # stopped as by Ctrl-C
    assert not [w for w in caught if issubclass(w.category, UserWarning)], [str(w.message) for w in caught]
    return seen["market"], capsys.readouterr().err


def trains(tmp_path, path: str, settings: list[str]) -> None:
    """One tiny PPO update on the file with `settings`."""
    cfg = load_config(None, TINY + [f"data.source={path}", "total_steps=128", "checkpoint.eval_every_updates=0",
                                    "log.tensorboard=false", *settings])
    assert train(cfg, tmp_path / "trained").last_metrics["update"] == 1


def test_broker_fx_is_refused_once_naming_the_instrument_the_zone_and_the_friday_bars_then_trains(tmp_path, capsys):
    path = broker_fx(tmp_path / "eurusd_h1.csv")
    err = first_message(capsys, tmp_path / "refused", ["--data", path])  # as NQ, the default instrument
    assert f"error: {path}: 2 problems, all to fix before it loads: (1) prices around 1.0" in err
    assert ("(2) as EURUSD, 34 of 933 bars fall outside EURUSD's sessions (17:00-17:00 America/New_York, Monday to "
            "Friday)") in err and "the stamps are naive, taken as America/New_York" in err
    assert ("They fit UTC best: as UTC, 2 of 933 bars fall outside EURUSD's sessions (17:00-17:00 America/New_York, "
            "Monday to Friday) at rows 121, 597 (Friday 17:00)") in err
    settings = named_settings(err)
    assert settings == ["data.contract=EURUSD", "data.source_timezone=UTC", "data.drop_invalid_rows=true"]
    trains(tmp_path, path, settings)


def test_broker_fx_keeps_its_gap_holiday_and_daylight_saving_change_and_auto_finds_its_zone(tmp_path):
    path = broker_fx(tmp_path / "eurusd_h1.csv")
    named = load_market(DataConfig(source=path, contract="EURUSD", source_timezone="UTC", drop_invalid_rows=True))
    auto = load_market(DataConfig(source=path, contract="EURUSD", source_timezone="auto", drop_invalid_rows=True))
    assert (auto.timestamps == named.timestamps).all() and auto.dropped_rows == named.dropped_rows == 2
    assert auto.stamps_note.startswith("naive, taken as UTC (data.source_timezone=auto: the best fit of the likely "
                                       "zones, 2 bars outside; the next best, ")
    report = load_report(auto)
    assert "time zones  stamps naive, taken as UTC (data.source_timezone=auto" in report
    assert ("dropped     2 rows (data.drop_invalid_rows): 2 of 933 bars fall outside EURUSD's sessions (17:00-17:00 "
            "America/New_York, Monday to Friday) at rows 121, 597 (Friday 17:00)") in report
    sessions = auto.sessions
    assert sessions.num_sessions == 39  # 40 weekdays less Good Friday
    per_session = np.bincount(sessions.session_id)
    assert sorted(set(per_session)) == [19, 24]  # the session with the five-hour outage, and every other
    opens = auto.timestamps[np.flatnonzero(np.diff(sessions.session_id, prepend=-1))]
    assert (opens.hour == 17).all() and {21, 22} == set(opens.tz_convert("UTC").hour)  # across 2024-03-10
    # The default zone with drop_invalid_rows would drop 34 bars that a better zone keeps: refused, not dropped.
    with pytest.raises(DataValidationError, match=r"34 of 933 bars fall outside .* They fit UTC best"):
        load_market(DataConfig(source=path, contract="EURUSD", drop_invalid_rows=True))


def test_day_first_stamps_load_as_the_file_proves_and_an_ambiguous_file_names_both_formats(tmp_path, capsys,
                                                                                           monkeypatch):
    path = day_first_fx(tmp_path / "eurusd_h1.csv")
    err = first_message(capsys, tmp_path / "refused", ["--data", path, "--set", "data.contract=EURUSD"])
    assert "They fit UTC best: as UTC, every bar lies inside a session" in err
    settings = named_settings(err)
    assert settings == ["data.source_timezone=UTC"]
    market, report = loads(monkeypatch, capsys, tmp_path / "run", ["--data", path, "--set", "data.contract=EURUSD",
                                                 *[arg for s in settings for arg in ("--set", s)]])
    assert ("time zones  stamps read day-first as %d.%m.%Y %H:%M:%S.%f (row 171, 13.02.2017 00:00:00.000, reads no "
            "other way); naive, taken as UTC (data.source_timezone)") in report
    assert market.timestamps[0] == pd.Timestamp("2017-02-01 17:00", tz=NEW_YORK) and market.num_bars == 960
    assert market.sessions.num_sessions == 40  # one a weekday, across 2017-03-12
    # The first twelve days alone: no field above 12 says which is the day.
    first_days = tmp_path / "first_days.csv"
    first_days.write_text("".join(open(path).readlines()[:171]))
    message = r'--date-format "%d.%m.%Y %H:%M:%S.%f" \(day-first\) or --date-format "%m.%d.%Y %H:%M:%S.%f"'
    with pytest.raises(DataValidationError, match=rf"^{first_days}: column 'Time' reads both day-first and "
                                                  rf"month-first \(no field above 12 tells which\), .* {message}"):
        read_raw_bars(first_days)
    day_first = read_raw_bars(first_days, date_format="%d.%m.%Y %H:%M:%S.%f")
    assert day_first.frame.index[-1] == pd.Timestamp("2017-02-12 23:00")


def test_adjusted_daily_stock_prices_load_on_the_tick_the_first_refusal_names(tmp_path, capsys, monkeypatch):
    path = adjusted_stock(tmp_path / "stock.csv")
    err = first_message(capsys, tmp_path / "refused", ["--data", path, "--set", "data.contract=EQUITY"])
    assert "100% of prices are off its tick grid" in err
    settings = named_settings(err)
    assert settings == ["data.contract.tick_size=0.000001"]
    args = ["--data", path, "--set", "data.contract=EQUITY", "--set", settings[0]]
    market, report = loads(monkeypatch, capsys, tmp_path / "run", args)
    assert market.contract.tick_size == 0.000001 and market.contract.point_value == 100.0
    assert market.scale.off_grid_share == 0.0 and market.interval_minutes == DAILY and market.num_bars == 1200
    assert pd.Timestamp("2019-07-04", tz=NEW_YORK) not in market.timestamps  # a holiday: just missing
    assert "instrument  EQUITY (US cash equity, 100 shares, equity): tick 0.000001 = $0.0001" in report
    trains(tmp_path, path, ["data.contract=EQUITY", *settings])


# --------------------------------------------------------------------------- never a guess, every problem at once
def test_a_zone_tie_under_auto_is_an_error(tmp_path):
    path = broker_fx(tmp_path / "fx.csv", friday_close_bars=0)
    every_day = {"base": "EURUSD", "weekends": True}  # a 24x7 market: every zone puts every bar in a session
    with pytest.raises(DataValidationError, match=r"data.source_timezone=auto: the naive stamps fit America/New_York, "
                                                  r"UTC, .* equally \(0 bars outside EURUSD's sessions under each\) "
                                                  r"but read as different instants: name the file's zone"):
        load_market(DataConfig(source=path, contract=every_day, source_timezone="auto"))
    assert load_market(DataConfig(source=path, contract=every_day, source_timezone="UTC")).num_bars == 931


def test_one_refusal_names_bad_rows_stray_stamps_and_the_zone_at_once(tmp_path):
    frame = minute_futures(days=3).tz_convert("UTC")
    frame.iloc[7, frame.columns.get_loc("low")] = frame["high"].iloc[7] + 1  # a bad row
    stray = frame.iloc[[400]].set_axis([frame.index[400] + pd.Timedelta(seconds=30)])  # 30 s after a bar
    path = write_csv(pd.concat([frame, stray]).sort_index(), tmp_path / "nq.csv", naive=True)
    with pytest.raises(DataValidationError) as error:
        load_market(DataConfig(source=path))
    message = str(error.value)
    assert message.startswith(f"{path}: 3 problems, all to fix before it loads: (1) column 'high' is below low at "
                              "row 8 (--set data.drop_invalid_rows=true drops such rows instead); (2) column "
                              "'timestamp' is closer to the previous row's than the 1 minute interval of most bars "
                              "at rows 402, 403; one file holds bars of one interval; (3) 180 of 1170 bars fall "
                              "outside NQ's sessions (18:00-17:00 America/New_York, Monday to Friday) at rows 151, "
                              "152, 153, 154, 155 and 175 more (Tuesday 17:00-17:59 (60), Wednesday 17:00-17:59 (60), "
                              "Thursday 17:00-17:59 (60))")
    assert "They fit UTC best: as UTC, every bar lies inside a session: --set data.source_timezone=UTC" in message


def test_stamps_whose_first_field_is_a_day_above_12_load_without_a_pandas_warning(tmp_path):
    """19/04/2017 09:00: pandas' format guess warns that it read the stamp day-first; the loader reads both orders
    itself, so a first try (train.py, trade.py) shows its own report and no library's warning."""
    path = tmp_path / "day_first.csv"
    stamps = pd.date_range("2017-04-19 09:00", periods=48, freq="h").strftime("%d/%m/%Y %H:%M")
    pd.DataFrame({"time": stamps, "open": 1.07, "high": 1.08, "low": 1.06, "close": 1.07, "volume": 1}).to_csv(
        path, index=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = read_raw_bars(path).frame
        raw_bars(path, read_table(path), refuse_rows=True)  # as trade.py reads a file, bad rows refused one by one
    assert [str(w.message) for w in caught] == []
    assert frame.index[0] == pd.Timestamp("2017-04-19 09:00") and frame.index[-1] == pd.Timestamp("2017-04-21 08:00")
