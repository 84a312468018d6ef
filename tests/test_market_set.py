"""Several instruments on one timeline (jaxenv.market_set): each loaded as one market, joined without look-ahead."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jaxenv.config import DataConfig
from jaxenv.contracts import get_contract
from jaxenv.data import DataValidationError
from jaxenv.market import Market, load_market
from jaxenv.market_files import write_pair
from jaxenv.market_set import load_market_set
from jaxenv.synthetic import generate_bars, generate_pair

ROOT = Path(__file__).resolve().parents[1]
DAYS = 4  # 1,560 bars a leg: past the 466 one market needs, with room to cut
BASE = DataConfig(synthetic_days=DAYS, synthetic_seed=0)
ARRAYS = ("open", "high", "low", "close", "volume", "bar_features", "context_features", "atr", "text_index")
FEATURES = ("bar_features", "context_features", "atr")


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory) -> tuple[Path, Path]:
    """NQ.csv and ES.csv of synthetic:pair, DAYS days, seed 0."""
    return write_pair(tmp_path_factory.mktemp("pair"), "pair", ("NQ", "ES"), DAYS, 0)


def rewrite(source: Path, target: Path, edit) -> str:
    frame = pd.read_csv(source)
    edit(frame).to_csv(target, index=False)
    return str(target)


def assert_same_market(a: Market, b: Market) -> None:
    for field in dataclasses.fields(Market):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name
            np.testing.assert_array_equal(x, y, err_msg=field.name)
        elif isinstance(x, pd.DatetimeIndex):
            assert x.equals(y) and x.tz == y.tz and x.dtype == y.dtype and x.name == y.name, field.name
        elif field.name == "indicators":
            assert x.keys() == y.keys()
            for name in x:
                np.testing.assert_array_equal(x[name], y[name], err_msg=name)
        elif field.name == "sessions":
            for part in dataclasses.fields(x):
                u, v = getattr(x, part.name), getattr(y, part.name)
                if isinstance(u, np.ndarray):
                    assert u.dtype == v.dtype, part.name
                    np.testing.assert_array_equal(u, v, err_msg=part.name)
                else:
                    assert u == v, part.name
        else:
            assert x == y, field.name


# ------------------------------------------------------------------------------------------------ one instrument
@pytest.mark.parametrize("source", ["synthetic:default", "file"])
def test_one_instrument_is_load_market_field_for_field(source, pair_files):
    source = str(pair_files[1]) if source == "file" else source
    alone = load_market(dataclasses.replace(BASE, contract="ES", source=source))
    market_set = load_market_set([("ES", source)], BASE)
    assert_same_market(market_set.markets[0], alone)
    assert market_set.present.shape == (alone.num_bars, 1) and market_set.present.all()
    assert market_set.splits == alone.splits and market_set.num_bars == alone.num_bars


# ------------------------------------------------------------------------------------------------ the join
def test_a_bar_missing_in_one_file_is_absent_and_carried(pair_files, tmp_path):
    nq, es = pair_files
    gone = 700
    holey = rewrite(es, tmp_path / "ES.csv", lambda f: f.drop(index=[gone]))
    full = load_market_set([("NQ", str(nq)), ("ES", str(es))], BASE)
    market_set = load_market_set([("NQ", str(nq)), ("ES", holey)], BASE)
    assert market_set.num_bars == full.num_bars and market_set.timestamps.equals(full.timestamps)
    assert market_set.present[:, 0].all()
    assert np.flatnonzero(~market_set.present[:, 1]).tolist() == [gone]
    b = market_set.markets[1]
    previous = b.close[gone - 1]
    assert b.close[gone] == b.open[gone] == b.high[gone] == b.low[gone] == previous and b.volume[gone] == 0
    for name in FEATURES:
        np.testing.assert_array_equal(getattr(b, name)[gone], getattr(b, name)[gone - 1])
    for name, values in b.indicators.items():
        assert values[gone] == values[gone - 1], name
    assert b.text_index[gone] == -1
    assert market_set.coverage[1] == pytest.approx(1 - 1 / market_set.num_bars)
    assert any("ES" in line and "1 absent" in line for line in market_set.report)
    for name in ARRAYS:  # the other instrument is untouched
        np.testing.assert_array_equal(getattr(market_set.markets[0], name), getattr(full.markets[0], name))


def test_rewriting_the_second_file_after_bar_t_changes_nothing_up_to_t(pair_files, tmp_path):
    nq, es = pair_files
    t = 900

    def later(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        for column in ("open", "high", "low", "close"):
            frame.loc[t + 1:, column] += 50.0
        frame.loc[t + 1:, "volume"] *= 3
        return frame.drop(index=[t + 5, t + 40, t + 41])  # bars gone after t (the last bar stays)

    changed = rewrite(es, tmp_path / "ES.csv", later)
    before = load_market_set([("NQ", str(nq)), ("ES", str(es))], BASE)
    after = load_market_set([("NQ", str(nq)), ("ES", changed)], BASE)
    assert after.timestamps.equals(before.timestamps)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(after.markets[0], name), getattr(before.markets[0], name))
    np.testing.assert_array_equal(after.present[: t + 1], before.present[: t + 1])
    assert not after.present[t + 5, 1] and before.present[t + 5, 1]
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(after.markets[1], name)[: t + 1], getattr(before.markets[1], name)[: t + 1])
    for name, values in after.markets[1].indicators.items():
        np.testing.assert_array_equal(values[: t + 1], before.markets[1].indicators[name][: t + 1])
    assert not np.array_equal(after.markets[1].bar_features[t + 1 :], before.markets[1].bar_features[t + 1 :])


def test_the_timeline_is_the_union_within_the_overlap(pair_files, tmp_path):
    nq, es = pair_files
    late = rewrite(es, tmp_path / "ES.csv", lambda f: f.iloc[200:])  # ES starts 200 bars later
    early = rewrite(nq, tmp_path / "NQ.csv", lambda f: f.iloc[:-100].drop(index=[600]))  # NQ ends 100 bars earlier
    market_set = load_market_set([("NQ", early), ("ES", late)], BASE)
    stamps = load_market(dataclasses.replace(BASE, contract="NQ", source=str(nq))).timestamps
    assert market_set.timestamps.equals(stamps[200:-100])
    assert market_set.present[:, 1].all() and np.flatnonzero(~market_set.present[:, 0]).tolist() == [400]
    # NQ's features at the overlap's start were computed on its own earlier bars, before the join
    alone = load_market(dataclasses.replace(BASE, contract="NQ", source=early))
    np.testing.assert_array_equal(market_set.markets[0].bar_features[0], alone.bar_features[200])


# ------------------------------------------------------------------------------------------------ refusals
def test_different_intervals_are_refused_naming_the_file(pair_files, tmp_path):
    nq, es = pair_files
    coarse = rewrite(es, tmp_path / "ES.csv", lambda f: f.iloc[::2])
    with pytest.raises(DataValidationError) as error:
        load_market_set([("NQ", str(nq)), ("ES", coarse)], BASE)
    assert str(error.value).startswith(f"{coarse}: ") and "2 minutes" in str(error.value)


def test_no_overlap_is_refused(pair_files, tmp_path):
    nq, es = pair_files
    first = rewrite(nq, tmp_path / "NQ.csv", lambda f: f.iloc[:780])
    second = rewrite(es, tmp_path / "ES.csv", lambda f: f.iloc[780:])
    with pytest.raises(DataValidationError, match="do not overlap") as error:
        load_market_set([("NQ", first), ("ES", second)], BASE)
    assert str(error.value).startswith(f"{second}: ")


def test_a_symbol_given_twice_is_refused(pair_files):
    nq, es = pair_files
    with pytest.raises(DataValidationError, match="given twice") as error:
        load_market_set([("NQ", str(nq)), ("nq", str(es))], BASE)
    assert str(error.value).startswith(f"{es}: ")


def test_another_exchange_zone_is_refused():
    london = dataclasses.replace(get_contract("ES"), timezone="Europe/London")
    with pytest.raises(DataValidationError, match="Europe/London") as error:
        load_market_set([("NQ", "synthetic:default"), (london, "synthetic:signal")], BASE)
    assert str(error.value).startswith("synthetic:signal: ")


def test_a_stock_fits_only_where_the_sessions_coincide(pair_files, tmp_path):
    nq, es = pair_files
    regular = load_market_set([("NQ", str(nq)), ("EQUITY", str(es))], BASE)  # 09:30-16:00 both
    assert regular.present.all() and regular.sessions.schedule.text() == "09:30-16:00"
    evening = rewrite(nq, tmp_path / "NQ.csv",  # NQ's full session: 21:30-03:59 New York
                      lambda f: f.assign(timestamp=(pd.to_datetime(f["timestamp"], utc=True)
                                                    - pd.Timedelta(hours=12)).dt.tz_convert("America/New_York")))
    with pytest.raises(DataValidationError, match="do not coincide") as error:
        load_market_set([("NQ", evening), ("EQUITY", str(es))], BASE)
    assert str(error.value).startswith(f"{es}: ")


# ------------------------------------------------------------------------------------------------ synthetic pairs
def test_the_single_presets_are_unchanged():
    digests = {"default": "19e011d72187dddffb213b07888182f9b0b7b66381283084d7dc47780fa45f14",
               "signal": "997928d7329525548f48e9da8c19d74746d86011078e270fcc3e07e3743c1682"}
    for preset, digest in digests.items():
        frame = generate_bars(preset, get_contract("NQ"), 5, 0)
        data = frame[["open", "high", "low", "close", "volume"]].to_numpy().tobytes() + frame.index.asi8.tobytes()
        assert hashlib.sha256(data).hexdigest() == digest, preset


def returns(frame: pd.DataFrame) -> np.ndarray:
    return np.diff(np.log(frame["close"].to_numpy()))


def lagged_correlation(a: np.ndarray, b: np.ndarray, lag: int) -> float:
    """corr(a[t], b[t - lag])."""
    return float(np.corrcoef(a[lag:], b[: len(b) - lag])[0, 1]) if lag else float(np.corrcoef(a, b)[0, 1])


def test_pair_signal_leads_and_pair_does_not():
    contracts = (get_contract("NQ"), get_contract("ES"))
    a, b = map(returns, generate_pair("pair_signal", contracts, 20, 1))
    assert lagged_correlation(a, b, 3) > 0.2  # the second leg leads the first by three bars
    assert abs(lagged_correlation(a, b, 0)) < 0.1
    for series in (a, b):  # each alone a random walk
        assert max(abs(lagged_correlation(series, series, lag)) for lag in range(1, 6)) < 0.05
    a, b = map(returns, generate_pair("pair", contracts, 20, 1))
    assert lagged_correlation(a, b, 0) > 0.7
    assert max(abs(lagged_correlation(a, b, lag)) for lag in range(1, 6)) < 0.05


def test_pair_levels_and_ticks():
    nq, es = generate_pair("pair", (get_contract("NQ"), get_contract("ES")), 3, 0)
    assert nq.index.equals(es.index) and 15_000 < nq["close"].median() < 21_000 and 4_000 < es["close"].median() < 5_600
    for frame in (nq, es):
        prices = frame[["open", "high", "low", "close"]].to_numpy()
        assert np.allclose(prices / 0.25, np.round(prices / 0.25))


def test_a_pair_preset_needs_both_instruments():
    with pytest.raises(DataValidationError, match="load_market_set"):
        load_market(dataclasses.replace(BASE, source="synthetic:pair"))
    with pytest.raises(DataValidationError, match="exactly two") as error:
        load_market_set([("NQ", "synthetic:pair")], BASE)
    assert str(error.value).startswith("synthetic:pair: ")


def write_market_main():
    """scripts/write_market.py's main(), in-process."""
    spec = importlib.util.spec_from_file_location("write_market", ROOT / "scripts" / "write_market.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_write_market_pair_files_load_as_the_synthetic_set(tmp_path, capsys):
    out = tmp_path / "pair"
    assert write_market_main()(["--preset", "pair_signal", "--days", str(DAYS), "--seed", "2", "--out", str(out)]) == 0
    assert "load_market_set" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["ES.csv", "NQ.csv", "market.json"]
    base = dataclasses.replace(BASE, synthetic_seed=2)
    files = load_market_set([("NQ", str(out / "NQ.csv")), ("ES", str(out / "ES.csv"))], base)
    synthetic = load_market_set([("NQ", "synthetic:pair_signal"), ("ES", "synthetic:pair_signal")], base)
    assert files.symbols == synthetic.symbols == ("NQ", "ES") and files.timestamps.equals(synthetic.timestamps)
    np.testing.assert_array_equal(files.present, synthetic.present)
    assert files.splits == synthetic.splits
    for mine, theirs in zip(files.markets, synthetic.markets):
        for name in ARRAYS:
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name), err_msg=name)
    assert write_market_main()(["--preset", "pair", "--contract", "NQ", "--out", str(tmp_path / "one")]) == 2
    assert "two instruments" in capsys.readouterr().err


def test_an_instrument_off_its_tick_grid_is_told_how_a_set_declares_it(tmp_path):
    """A set's file whose prices are not on its instrument's ticks gets the mend in the set's own terms: its item of
    data.instruments with a contract mapping, not the single instrument's --set data.contract."""

    from jaxenv.data import DataValidationError
    from jaxenv.market_set import load_market_set
    from jaxenv.synthetic import generate_bars
    from jaxenv.contracts import get_contract

    frame = generate_bars("default", get_contract("NQ"), 3, 0)
    for column in ("open", "high", "low", "close"):
        frame[column] = frame[column] / 7.0  # off the 0.25 grid
    path = tmp_path / "odd.csv"
    frame.to_csv(path)
    with pytest.raises(DataValidationError) as error:
        load_market_set([("NQ", str(path)), ("ES", "synthetic:default")])
    message = str(error.value)
    assert message.startswith(str(path)) and "its item of data.instruments with contract:" in message
    assert "--set data.contract" not in message
