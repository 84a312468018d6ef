"""Loading bars as common tools export them, validation errors that name file/row/column, causal features,
splits and synthetic markets."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pandas as pd
import pytest

from bridge.protocol import BUY, HOLD
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.contracts import get_contract
from jaxenv.data import DataValidationError, read_bars, validate_bars
from jaxenv.env import TradingEnv
from jaxenv.features import FEATURES, N_BAR_FEATURES, N_CONTEXT_FEATURES, feature_table_markdown
from jaxenv.market import load_market, market_from_frame
from jaxenv.synthetic import BARS_PER_SESSION, NEWS_BARS, PRESETS, generate_bars, headline_sentiment
from tests.conftest import bar_at, flat_frame


def small_frame(n=5):
    f = flat_frame(1).iloc[:n].copy()
    f["close"] = f["close"] + np.arange(n)
    f["high"] = f[["open", "close"]].max(axis=1) + 1
    return f


# ------------------------------------------------------------------------------------------- loading
def test_csv_with_named_datetime_column_in_any_case(tmp_path):
    f = small_frame()
    out = f.reset_index().rename(columns={"timestamp": "DateTime", "open": "Open", "close": "CLOSE"})
    out["DateTime"] = out["DateTime"].dt.tz_localize(None)
    out["extra"] = "ignored"
    out.to_csv(tmp_path / "bars.csv", index=False)
    got = read_bars(tmp_path / "bars.csv")
    assert list(got.columns) == ["open", "high", "low", "close", "volume"]
    assert str(got.index.tz) == "America/New_York"
    assert got.index[0] == f.index[0]
    np.testing.assert_allclose(got["close"].values, f["close"].values)


def test_csv_with_separate_date_and_time_columns_and_a_date_format(tmp_path):
    f = small_frame()
    naive = f.index.tz_localize(None)
    out = f.reset_index(drop=True)
    out.insert(0, "Date", naive.strftime("%d/%m/%Y"))
    out.insert(1, "Time", naive.strftime("%H:%M"))
    out.to_csv(tmp_path / "bars.csv", index=False)
    got = read_bars(tmp_path / "bars.csv", date_format="%d/%m/%Y %H:%M")
    assert (got.index == f.index).all()


def test_csv_with_unnamed_index_column_in_utc_is_converted(tmp_path):
    f = small_frame()
    out = f.copy()
    out.index = out.index.tz_convert("UTC")
    out.index.name = None
    out.to_csv(tmp_path / "bars.csv")
    got = read_bars(tmp_path / "bars.csv")
    assert str(got.index.tz) == "America/New_York"
    assert got.index[0].hour == 9 and got.index[0].minute == 30


def test_parquet_with_datetime_index_and_headline_text(tmp_path):
    f = small_frame()
    f["Headline"] = ["a", "b", "c", "d", "e"]
    f.to_parquet(tmp_path / "bars.parquet")
    got = read_bars(tmp_path / "bars.parquet")
    assert got["headline"].tolist() == ["a", "b", "c", "d", "e"]
    assert (got.index == f.index).all()


def test_missing_column_is_named(tmp_path):
    small_frame().drop(columns=["volume"]).to_csv(tmp_path / "bars.csv")
    with pytest.raises(DataValidationError, match=r"bars\.csv: missing column\(s\) volume"):
        read_bars(tmp_path / "bars.csv")


def test_unparseable_timestamp_names_row_and_hints_date_format(tmp_path):
    out = small_frame().reset_index()
    out["timestamp"] = out["timestamp"].astype(str)
    out.loc[2, "timestamp"] = "not a time"
    out.to_csv(tmp_path / "bars.csv", index=False)
    with pytest.raises(DataValidationError, match=r"column 'timestamp' has unparseable timestamps at row 3.*--date-format"):
        read_bars(tmp_path / "bars.csv")


# ---------------------------------------------------------------------------------------- validation
def corrupt(column, row, value):
    f = small_frame(8)
    f.iloc[row, f.columns.get_loc(column)] = value
    return f


@pytest.mark.parametrize(
    "frame, message",
    [
        (corrupt("close", 3, np.nan), r"bars: column 'close' is NaN or infinite at row 4"),
        (corrupt("volume", 1, np.inf), r"column 'volume' is NaN or infinite at row 2"),
        (corrupt("open", 5, -1.0), r"column 'open' is not positive at row 6"),
        (corrupt("high", 2, 17_000.0), r"column 'high' is below low at row 3"),
        (corrupt("high", 4, 18_002.0), r"column 'high' is below open or close at row 5"),
        (corrupt("low", 6, 18_003.0), r"column 'low' is above open or close at row 7"),
    ],
)
def test_each_value_rule_names_file_row_and_column(frame, message):
    with pytest.raises(DataValidationError, match=message):
        validate_bars(frame, "bars", min_bars=1)


def test_duplicate_and_decreasing_timestamps_are_errors():
    f = small_frame(6)
    dup = f.copy()
    dup.index = dup.index[[0, 1, 2, 2, 4, 5]]
    with pytest.raises(DataValidationError, match=r"column 'timestamp' is a duplicate of the previous row's at row 4"):
        validate_bars(dup, "bars", min_bars=1)
    dec = f.iloc[[0, 1, 3, 2, 4, 5]]
    with pytest.raises(DataValidationError, match=r"column 'timestamp' is earlier than the previous row's at row 4"):
        validate_bars(dec, "bars", min_bars=1)


def test_too_few_bars_for_one_window():
    with pytest.raises(DataValidationError, match=r"bars: 8 bars is fewer than the 466"):
        validate_bars(small_frame(8), "bars", min_bars=466)


def test_every_failing_rule_is_named_at_once_and_drop_invalid_rows_counts_without_a_python_warning():
    f = small_frame(8)
    f.iloc[3, f.columns.get_loc("close")] = np.nan
    f.iloc[5, f.columns.get_loc("low")] = 99_999.0
    with pytest.raises(DataValidationError, match=r"bars: column 'close' is NaN or infinite at row 4; column 'high' is "
                                                  r"below low at row 6 \(--set data.drop_invalid_rows=true"):
        validate_bars(f, "bars", min_bars=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the count goes to the load report, not to Python's warnings
        loaded = validate_bars(f, "bars", min_bars=1, drop_invalid_rows=True)
    assert loaded.dropped_rows == 2 and len(loaded.frame) == 6


def test_load_market_reads_a_file_end_to_end(tmp_path):
    frame = generate_bars("default", get_contract("ES"), days=4, seed=3)
    frame.to_csv(tmp_path / "es.csv")
    market = load_market(DataConfig(source=str(tmp_path / "es.csv"), contract="ES"))
    assert market.num_bars == 4 * 390 and market.contract.symbol == "ES"
    assert market.bar_features.shape == (market.num_bars, N_BAR_FEATURES)
    assert market.context_features.shape == (market.num_bars, N_CONTEXT_FEATURES)
    assert market.bar_features.dtype == np.float32


# -------------------------------------------------------------------------------------- no look-ahead
@pytest.mark.nojit
def test_changing_every_bar_after_t_changes_nothing_up_to_t():
    base = generate_bars("signal", get_contract("NQ"), days=5, seed=1)
    t = bar_at(3, 11, 17)
    rng = np.random.default_rng(0)
    altered = base.copy()
    scale = np.exp(rng.normal(0, 0.01, len(base) - t - 1))
    for col in ("open", "high", "low", "close"):
        altered.iloc[t + 1 :, altered.columns.get_loc(col)] = np.round(base[col].values[t + 1 :] * scale * 4) / 4
    altered.iloc[t + 1 :, altered.columns.get_loc("volume")] = rng.integers(1, 5000, len(base) - t - 1)
    altered["high"] = altered[["open", "high", "low", "close"]].max(axis=1)
    altered["low"] = altered[["open", "high", "low", "close"]].min(axis=1)

    cfg = DataConfig(contract="NQ")
    a, b = market_from_frame(base, "base", cfg), market_from_frame(altered, "altered", cfg)
    np.testing.assert_array_equal(a.bar_features[: t + 1], b.bar_features[: t + 1])
    np.testing.assert_array_equal(a.context_features[: t + 1], b.context_features[: t + 1])
    np.testing.assert_array_equal(a.atr[: t + 1], b.atr[: t + 1])
    assert not np.array_equal(a.bar_features[t + 1 :], b.bar_features[t + 1 :])

    # The environment's observations up to t agree too, along the same action sequence.
    env = TradingEnv(EnvConfig())
    start = t - 30
    actions = [BUY] + [HOLD] * 29
    for market, trace in ((a, []), (b, [])):
        params = env.make_params(market, (0, market.num_bars))
        state = env.initial_state(jax.random.PRNGKey(0), params, bar=start)
        trace.append(np.asarray(env.get_obs(state, params)))
        for act in actions:
            state, *_ = env.transition(state, act, params)
            trace.append(np.asarray(env.get_obs(state, params)))
        if market is a:
            obs_a = trace
        else:
            obs_b = trace
    assert int(state.t) == t
    np.testing.assert_array_equal(np.stack(obs_a), np.stack(obs_b))


@pytest.mark.nojit
def test_entry_fills_at_next_bars_open_not_this_close():
    frame = generate_bars("default", get_contract("NQ"), days=4, seed=2)
    t = bar_at(2, 10, 0)
    market = market_from_frame(frame, "f", DataConfig())
    env = TradingEnv(EnvConfig(slippage_ticks=0.0))
    params = env.make_params(market, (0, market.num_bars))
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=t)
    state, *_ = env.transition(state, BUY, params)
    assert float(state.entry_price) == pytest.approx(market.open[t + 1])
    assert market.open[t + 1] != market.close[t] or market.open[t + 1] != market.close[t + 1]


# ------------------------------------------------------------------------------------ splits, presets
def test_splits_do_not_overlap_and_follow_fractions():
    market = load_market(DataConfig(source="synthetic:default", synthetic_days=40))
    (a0, a1), (b0, b1), (c0, c1) = (market.splits[s] for s in ("train", "val", "test"))
    assert a0 == 0 and a1 == b0 and b1 == c0 and c1 == market.num_bars
    assert a1 == 28 * 390 and b1 == 34 * 390  # 70 / 15 / 15 of 40 sessions, on session starts
    # splits named by session (a walk-forward's fold): the purged sessions are in none
    named = load_market(DataConfig(source="synthetic:default", synthetic_days=40, splits="train=0:20,val=20:25,"
                                                                                          "test=27:40"))
    assert named.splits == {"train": (0, 20 * 390), "val": (20 * 390, 25 * 390), "test": (27 * 390, 40 * 390)}
    with pytest.raises(DataValidationError, match="the data holds 40 sessions, the splits reach session 41"):
        load_market(DataConfig(source="synthetic:default", synthetic_days=40, splits="train=0:20,val=20:25,"
                                                                                     "test=27:41"))


def test_synthetic_presets_are_seeded_and_realistic():
    nq = get_contract("NQ")
    a = generate_bars("default", nq, days=3, seed=7)
    b = generate_bars("default", nq, days=3, seed=7)
    pd.testing.assert_frame_equal(a, b)
    assert not generate_bars("default", nq, days=3, seed=8).equals(a)
    assert (a.index.hour * 60 + a.index.minute).min() == 9 * 60 + 30
    assert (a.index.hour * 60 + a.index.minute).max() == 15 * 60 + 59
    prices = a[["open", "high", "low", "close"]].values
    np.testing.assert_allclose(prices / nq.tick_size, np.round(prices / nq.tick_size))  # on the tick grid
    assert set(PRESETS) >= {"default", "signal", "headlines"}
    h = generate_bars("headlines", nq, days=3, seed=7)
    assert h["headline"].str.len().min() > 10


def test_headline_sentiment_tracks_future_drift_in_headlines_preset():
    frame = generate_bars("headlines", get_contract("NQ"), days=60, seed=0)
    sentiment = np.array([headline_sentiment(h) for h in frame["headline"]])
    assert (sentiment != 0).all()  # every headline reads as bullish or bearish
    positive = sentiment > 0
    fwd = np.log(frame["close"]).diff(30).shift(-30).values  # test-only: future returns as the label
    ok = np.isfinite(fwd)
    assert fwd[ok & positive].mean() > fwd[ok & ~positive].mean()


def test_headlines_then_trend_adds_an_afternoon_price_trend_the_headlines_do_not_name():
    """`headlines_then_trend` keeps the news edge in the morning and adds trends that past prices reveal in the
    afternoon: there an hour's return predicts the next hour's far better than on the `default` market."""
    def afternoon_momentum(preset: str) -> float:
        frame = generate_bars(preset, get_contract("NQ"), days=60, seed=0)
        log_close = np.log(frame["close"]).values
        minute = np.tile(np.arange(BARS_PER_SESSION), 60)
        t = np.flatnonzero((minute >= NEWS_BARS + 60) & (minute < BARS_PER_SESSION - 60))  # both hours in the afternoon
        past, fwd = log_close[t] - log_close[t - 60], log_close[t + 60] - log_close[t]  # test-only: future returns
        return np.corrcoef(past, fwd)[0, 1]

    assert afternoon_momentum("headlines_then_trend") > afternoon_momentum("default") + 0.15


# bars 0, 500 and the last of 3 days, seed 4: deleting presets and unused preset fields left these bars as they were
PINNED_CLOSES = {"headlines_then_trend": [17990.25, 18254.75, 18888.5], "signal": [17991.0, 18784.0, 20142.25]}


def test_presets_keep_their_bars():
    for preset, closes in PINNED_CLOSES.items():
        frame = generate_bars(preset, get_contract("NQ"), days=3, seed=4)
        np.testing.assert_allclose(frame["close"].iloc[[0, 500, -1]].values, closes)


def test_headlines_then_trend_has_news_in_the_morning_only():
    """`headlines_then_trend`: the morning's headlines name the news drift; the afternoon's carry almost no sentiment
    (a 5% untruthful one, or a morning story still the latest) and say nothing of future returns."""
    frame = generate_bars("headlines_then_trend", get_contract("NQ"), days=60, seed=0)
    sentiment = np.array([headline_sentiment(h) for h in frame["headline"]])
    minute = np.tile(np.arange(BARS_PER_SESSION), 60)
    morning, afternoon = minute < NEWS_BARS, minute >= NEWS_BARS
    assert (sentiment[morning] != 0).mean() > 0.9
    assert (sentiment[afternoon] != 0).mean() < 0.15
    fwd = np.log(frame["close"]).diff(30).shift(-30).values  # test-only: future returns as the label
    in_session = np.isfinite(fwd) & (minute % NEWS_BARS < NEWS_BARS - 30)  # the label ends in the same half

    def spread(half: np.ndarray) -> float:  # bullish minus bearish future return, in units of its spread
        ok = in_session & half
        return (fwd[ok & (sentiment > 0)].mean() - fwd[ok & (sentiment < 0)].mean()) / fwd[ok].std()

    assert spread(morning) > 0.3
    assert abs(spread(afternoon)) < 0.15


def test_feature_table_documents_every_feature():
    table = feature_table_markdown()
    assert len(FEATURES) == 11 + 28
    for f in FEATURES:
        assert f"`{f.name}`" in table
