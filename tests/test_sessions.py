"""Bar intervals, sessions from the instrument's calendar, time zones, and trading on them: hourly 24x5 spot FX across
a daylight-saving change, daily equities with holidays, minute futures stamped in UTC, hourly 6E under the prop firm's
flat-by rule. Session membership and the last bar of a session follow from the calendar and each bar's own stamp:
rewriting or removing every bar after t changes nothing up to t."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from bridge.protocol import BUY, HOLD, SELL
from jaxenv.config import DataConfig, EnvConfig, PropFirmRules
from jaxenv.contracts import get_contract
from jaxenv.data import DataValidationError, read_bars
from jaxenv.env import CAN_ENTER, FLATTEN, SESSION, TradingEnv
from jaxenv.evaluate import buy_and_hold, walk_split
from jaxenv.features import FEATURES
from jaxenv.market import load_market, market_from_frame
from jaxenv.metrics import trades_table, walk_metrics
from jaxenv.sessions import DAILY, detect_interval
from tests.conftest import HandMarket, bar_at
from tests.market_shapes import daily_equity, hourly_6e, hourly_fx, minute_futures, to_utc, write_csv
from tests.test_config import cli_main

NEW_YORK = "America/New_York"
CONTEXT = [f.name for f in FEATURES if f.group != "bar"]
# No stop, target or drawdown limit in reach: a position is held until a session rule closes it.
WIDE = EnvConfig(stop_atr_mult=1000.0, target_atr_mult=1000.0, prop_firm=PropFirmRules(trailing_drawdown=1e9))


@pytest.fixture(scope="module")
def fx():
    return market_from_frame(to_utc(hourly_fx()), "fx", DataConfig(contract="EURUSD"))


@pytest.fixture(scope="module")
def stock():
    return market_from_frame(daily_equity(), "stock", DataConfig(contract="EQUITY"))


@pytest.fixture(scope="module")
def e6():
    return market_from_frame(hourly_6e(), "6e", DataConfig(contract="6E"))


def flags(market, rules=None):
    env = TradingEnv(EnvConfig(prop_firm=rules or PropFirmRules()))
    bars = np.asarray(env.make_params(market, (0, market.num_bars)).bars)
    return bars[:, CAN_ENTER] > 0, bars[:, FLATTEN] > 0


def at(market, stamp: str) -> int:
    return int(market.timestamps.get_loc(pd.Timestamp(stamp, tz=market.contract.timezone)))


def always(side, obs, mask, key):
    """BUY (or SELL) whenever the mask allows it."""
    return jnp.where(mask[side], side, HOLD)


def play(market, t0, actions, config=None):
    """Steps from bar t0; returns the states after each step and each step's info."""
    env = TradingEnv(config or EnvConfig())
    params = env.make_params(market, (0, market.num_bars))
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=t0)
    step = jax.jit(env.transition)
    states, infos = [], []
    for action in actions:
        state, _, _, info = step(state, action, params)
        states.append(state)
        infos.append(jax.tree.map(np.asarray, info))
    return states, infos


# ------------------------------------------------------------------------------------------ intervals
@pytest.mark.parametrize("freq, minutes", [("1min", 1), ("5min", 5), ("15min", 15), ("30min", 30), ("60min", 60)])
def test_the_bar_interval_is_detected_from_the_stamps(freq, minutes):
    days = [pd.date_range(f"2024-03-0{d} 09:30", f"2024-03-0{d} 15:59", freq=freq, tz=NEW_YORK) for d in (4, 5, 6)]
    assert detect_interval(days[0].append(days[1:]), "f") == minutes


def test_daily_bars_and_stamps_that_are_not_bars_of_one_interval():
    assert detect_interval(pd.bdate_range("2024-01-01", "2024-06-30", tz=NEW_YORK), "f") == DAILY
    with pytest.raises(DataValidationError, match=r"f: bars are mostly 30 seconds apart; bars must be whole minutes"):
        detect_interval(pd.date_range("2024-03-04 09:30", periods=50, freq="30s", tz=NEW_YORK), "f")
    with pytest.raises(DataValidationError, match=r"mostly 7 days apart; the longest bar interval supported is daily"):
        detect_interval(pd.date_range("2024-01-01", periods=50, freq="7D", tz=NEW_YORK), "f")
    mixed = pd.date_range("2024-03-04 09:30", periods=50, freq="5min", tz=NEW_YORK).insert(3, "2024-03-04 09:41")
    with pytest.raises(DataValidationError, match=r"closer to the previous row's than the 5 minutes interval of most "
                                                  r"bars at rows 4, 5; one file holds bars of one interval"):
        detect_interval(mixed, "f")


# ------------------------------------------------------------------------------------------- sessions
def test_hourly_fx_in_utc_across_a_dst_change_groups_into_24_hour_sessions_closing_at_17_new_york(fx):
    assert fx.interval_minutes == 60 and fx.sessions.num_sessions == 40 and fx.episode_bars == 5 * 24
    starts = np.flatnonzero(np.diff(fx.sessions.session_id, prepend=-1))
    assert (np.diff(np.append(starts, fx.num_bars)) == 24).all()  # every session: 24 hourly bars
    opens = fx.timestamps[starts]
    assert (opens.hour == 17).all()  # in New York time, before and after the change
    utc = opens.tz_convert("UTC")
    assert utc[0].hour == 22 and utc[-1].hour == 21  # the session's clock moved in UTC on 2024-03-10
    time_of_day = fx.bar_features[:, [f.name for f in FEATURES if f.group == "bar"].index("time_of_day")]
    np.testing.assert_allclose(np.unique(time_of_day), np.arange(24) / 24, atol=1e-6)
    session_range = fx.context_features[:, CONTEXT.index("session_range_atr")]
    assert (session_range[starts[1:]] < session_range[starts[1:] + 12]).all()  # session aggregates grow in a session


def test_naive_fx_stamps_in_utc_need_data_source_timezone(tmp_path, fx):
    path = write_csv(to_utc(hourly_fx()), tmp_path / "fx.csv", naive=True)
    with pytest.raises(DataValidationError, match=r"fx.csv: 36 of 960 bars fall outside EURUSD's sessions "
                                                  r"\(17:00-17:00 America/New_York, Monday to Friday\) .* naive, "
                                                  r"taken as America/New_York .* --set data.source_timezone=UTC"):
        load_market(DataConfig(source=path, contract="EURUSD"))
    named = load_market(DataConfig(source=path, contract="EURUSD", source_timezone="UTC"))
    assert (named.timestamps == fx.timestamps).all()
    np.testing.assert_array_equal(named.sessions.session_id, fx.sessions.session_id)
    np.testing.assert_array_equal(named.bar_features, fx.bar_features)


def test_daily_equity_bars_are_one_session_each_and_their_session_features_run_by_the_week(stock):
    assert stock.interval_minutes == DAILY and stock.sessions.num_sessions == stock.num_bars == 1200
    assert pd.Timestamp("2019-07-04", tz=NEW_YORK) not in stock.timestamps  # holidays are just missing
    np.testing.assert_allclose(np.unique(stock.sessions.time_of_day), [0, 0.2, 0.4, 0.6, 0.8])
    per_week = np.bincount(stock.sessions.period_id)
    assert per_week.max() == 5 and (per_week == 4).any()  # holiday weeks have four bars
    week_range = stock.context_features[:, CONTEXT.index("session_range_atr")]
    later = np.diff(stock.sessions.period_id, prepend=-1) == 0
    assert (week_range[later] > 0).mean() > 0.99  # the week's range so far, not one bar's
    can_enter, flatten = flags(stock)
    assert can_enter.all() and not flatten.any()  # equities may be held across sessions
    assert stock.episode_bars == 252


def test_minute_futures_stamped_in_utc_load_as_their_new_york_original(tmp_path):
    original = minute_futures(days=3)
    reference = market_from_frame(original, "ny", DataConfig())
    zoned = load_market(DataConfig(source=write_csv(to_utc(original), tmp_path / "zoned.csv")))
    naive = write_csv(to_utc(original), tmp_path / "naive.csv", naive=True)
    with pytest.raises(DataValidationError, match=r"naive.csv: 180 of 1170 bars fall outside NQ's sessions "
                                                  r"\(18:00-17:00 America/New_York, Monday to Friday\) at rows 151, "
                                                  r"152"):
        load_market(DataConfig(source=naive))
    named = load_market(DataConfig(source=naive, source_timezone="UTC"))
    for market in (zoned, named):
        assert (market.timestamps == reference.timestamps).all()
        np.testing.assert_array_equal(market.sessions.session_id, reference.sessions.session_id)
        np.testing.assert_array_equal(market.bar_features, reference.bar_features)
        np.testing.assert_array_equal(market.context_features, reference.context_features)
    assert "naive, taken as UTC (data.source_timezone), converted to America/New_York" in named.stamps_note
    assert zoned.stamps_note == "with UTC offsets, converted to America/New_York"


def test_a_daylight_saving_gap_or_overlap_in_naive_stamps_says_how_to_fix_it(tmp_path, capsys):
    def write(name, stamps):
        frame = pd.DataFrame({"timestamp": stamps, "open": 1.1, "high": 1.2, "low": 1.0, "close": 1.1, "volume": 1})
        frame.to_csv(tmp_path / name, index=False)
        return tmp_path / name

    gap = write("gap.csv", pd.date_range("2024-03-10 00:00", periods=5, freq="h").astype(str))
    with pytest.raises(DataValidationError, match=r"gap.csv: column 'timestamp' has times that do not exist in "
                                                  r"America/New_York \(the clocks jump forward at a daylight-saving "
                                                  r"change\) at row 3 \(2024-03-10 02:00:00\); naive stamps are "
                                                  r"taken as America/New_York \(the instrument's exchange zone\). If "
                                                  r"the file is in another zone, name it: --set "
                                                  r"data.source_timezone=UTC"):
        read_bars(gap)
    assert read_bars(gap, source_timezone="UTC").index[2] == pd.Timestamp("2024-03-09 21:00", tz=NEW_YORK)
    overlap = write("overlap.csv", ["2024-11-03 00:00", "2024-11-03 01:00", "2024-11-03 01:00", "2024-11-03 02:00"])
    with pytest.raises(DataValidationError, match=r"occur twice in America/New_York \(the clocks go back at a "
                                                  r"daylight-saving change\) at rows 2, 3"):
        read_bars(overlap)
    assert cli_main()(["--data", str(gap), "--llm", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {gap}: ") and err.count("\n") == 1  # with the other problems of these 5 bars
    assert "column 'timestamp' has times that do not exist in America/New_York" in err


def test_bars_outside_the_instruments_hours_are_dropped_only_when_asked(e6):
    frame = hourly_6e()
    extra = pd.DataFrame(frame.iloc[[22]].to_numpy(), columns=frame.columns,
                         index=[frame.index[22] + pd.Timedelta(hours=1)])  # a 17:00 bar, in CME's daily break
    frame = pd.concat([frame.iloc[:23], extra, frame.iloc[23:]])
    with pytest.raises(DataValidationError, match=r"1 of 921 bars fall outside 6E's sessions \(18:00-17:00"):
        market_from_frame(frame, "6e", DataConfig(contract="6E"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the drop is told in the load report, not as a Python warning
        market = market_from_frame(frame, "6e", DataConfig(contract="6E", drop_invalid_rows=True))
    assert market.dropped_rows == 1 and (market.timestamps == e6.timestamps).all()
    assert market.dropped_note.startswith("1 of 921 bars fall outside 6E's sessions (18:00-17:00 America/New_York, "
                                          "Monday to Friday) at row 24 (Monday 17:00)")


def test_episode_length_defaults_per_interval(fx, stock):
    env = TradingEnv()
    assert int(env.make_params(fx, "train").max_steps_in_episode) == 120  # five 24-hour sessions
    assert int(env.make_params(stock, "train").max_steps_in_episode) == 252  # a trading year
    assert int(env.make_params(load_market(DataConfig(synthetic_days=10)), "train").max_steps_in_episode) == 1950
    assert int(TradingEnv(EnvConfig(max_steps_in_episode=50)).make_params(fx, "train").max_steps_in_episode) == 50


# ---------------------------------------------------------------------------------------------- trading
def test_with_the_right_instrument_trades_hold_and_long_differs_from_short(fx, stock, e6):
    """Every shape walked always-long and always-short over all its bars after the warm-up."""
    env = TradingEnv()
    for market in (fx, stock, e6):
        bars = (market.first_decision_bar, market.num_bars)
        walks = {}
        for side in (BUY, SELL):  # the side is the policy's state: one compiled walk serves both
            trace = walk_split(env, market, bars, always, jax.random.PRNGKey(0), policy_state=jnp.int32(side))
            walks[side] = walk_metrics(trace, market.timestamps, env.config.prop_firm, market.sessions.day)
            trades = trades_table(trace, market.timestamps)
            assert len(trades) >= 5 and trades["bars_held"].median() > 1, market.source
            assert trades["pnl"].round(2).nunique() > len(trades) // 2, market.source  # not one stop-out price
        assert walks[BUY]["net_pnl"] != pytest.approx(walks[SELL]["net_pnl"], abs=1.0), market.source
        start, end = bars
        spec, slip = market.contract, env.config.slippage_ticks * market.contract.tick_size
        move = (market.close[end - 1] - slip - (market.open[start + 1] + slip)) * spec.point_value
        assert buy_and_hold(env, market, bars)["pnl"].sum() == pytest.approx(move - 2 * spec.commission_per_side)


@pytest.mark.nojit
def test_buy_and_hold_in_the_env_earns_the_price_move_times_the_point_value(fx, stock):
    for market, steps in ((stock, 25), (fx, 30)):  # across sessions: weekly periods, a 17:00 roll
        t0 = market.first_decision_bar + 3
        states, infos = play(market, t0, [BUY] + [HOLD] * (steps - 1), WIDE)
        assert all(int(s.side) == 1 for s in states) and not any(int(i["exit_reason"]) for i in infos)
        assert len(np.unique(market.sessions.session_id[t0 + 1: t0 + steps + 1])) > 1
        spec = market.contract
        fill = market.open[t0 + 1] + spec.tick_size  # one tick of slippage
        expected = (market.close[t0 + steps] - fill) * spec.point_value - spec.commission_per_side
        assert float(states[-1].equity) - 50_000.0 == pytest.approx(expected, rel=1e-4, abs=0.05)


@pytest.mark.nojit
def test_6e_positions_close_on_the_last_hourly_bar_ending_by_16_59_new_york(e6):
    can_enter, flatten = flags(e6)
    day = "2024-03-13"
    assert can_enter[at(e6, f"{day} 14:00")] and not flatten[at(e6, f"{day} 14:00")]
    for last in ("15:00", "16:00"):  # 15:00-16:00 is the last bar ending by 16:59; 16:00-17:00 ends past it
        assert flatten[at(e6, f"{day} {last}")] and not can_enter[at(e6, f"{day} {last}")]
    assert can_enter[at(e6, "2024-03-13 18:00")]  # the next session
    t0 = at(e6, f"{day} 10:00")
    states, infos = play(e6, t0, [BUY] + [HOLD] * 4, WIDE)
    reasons = [int(i["exit_reason"]) for i in infos]
    assert reasons == [0, 0, 0, 0, 3] and int(states[-1].t) == at(e6, f"{day} 15:00")  # session_close at 15:00's close
    assert float(infos[-1]["exit_price"]) == pytest.approx(e6.close[at(e6, f"{day} 15:00")] - 0.00005)
    no_rule = flags(e6, PropFirmRules(flat_by=""))
    assert no_rule[0].all() and not no_rule[1].any()  # without the prop firm's rule a future may be held


@pytest.mark.nojit
def test_a_position_carried_past_a_missing_last_bar_is_closed_at_the_next_sessions_open():
    m = HandMarket("NQ")
    m.set_bar(bar_at(3, 9, 30), 18_040.0, 18_041.0, 18_039.0, 18_040.0)  # the next session opens 40 points higher
    missing = [bar_at(2, 15, 50) + k for k in range(10)]  # the data ends early on day 2: no 15:59 bar
    m.frame = m.frame.drop(m.frame.index[missing])
    market = m.build()
    t0 = at(market, "2024-03-06 15:40")
    states, infos = play(market, t0, [BUY] + [HOLD] * 9, EnvConfig(slippage_ticks=0.0))
    assert [int(i["exit_reason"]) for i in infos] == [0] * 9 + [3]  # session_close, on the next session's first bar
    assert int(states[-1].t) == at(market, "2024-03-07 09:30")
    assert float(infos[-1]["exit_price"]) == 18_040.0  # its open: the first price a position could be closed at
    no_rule = EnvConfig(slippage_ticks=0.0, stop_atr_mult=100.0, target_atr_mult=100.0,
                        prop_firm=PropFirmRules(flat_by=""))
    held, _ = play(market, t0, [BUY] + [HOLD] * 9, no_rule)
    assert int(held[-1].side) == 1  # without a flat rule the position stays open across the gap


# ------------------------------------------------------------------------------------------ look-ahead
def rewritten_after(frame: pd.DataFrame, t: int, decimals: int, seed: int = 0) -> pd.DataFrame:
    """Every bar after t moved by up to a few percent (on the price grid) with new volumes."""
    rng = np.random.default_rng(seed)
    out = frame.copy()
    n = len(frame) - t - 1
    scale = np.exp(rng.normal(0, 0.01, n))
    prices = ["open", "high", "low", "close"]
    for col in prices:
        out.iloc[t + 1:, out.columns.get_loc(col)] = np.round(frame[col].to_numpy()[t + 1:] * scale, decimals)
    out.iloc[t + 1:, out.columns.get_loc("volume")] = rng.integers(1, 5000, n)
    out["high"], out["low"] = out[prices].max(axis=1), out[prices].min(axis=1)
    return out


@pytest.mark.nojit
@pytest.mark.parametrize("shape, contract, t", [
    ("fx", "EURUSD", 600),  # mid-session
    ("fx", "EURUSD", 599),  # the session's last bar (16:00 New York)
    ("stock", "EQUITY", 700),
    ("nq", "NQ", bar_at(1, 15, 40)),  # a session used to end where the data did: flat at t
])
def test_nothing_up_to_t_depends_on_the_bars_after_t(shape, contract, t):
    frame = {"fx": lambda: to_utc(hourly_fx()), "stock": daily_equity, "nq": lambda: minute_futures(days=3)}[shape]()
    base = market_from_frame(frame, "base", DataConfig(contract=contract))
    others = [market_from_frame(frame.iloc[: t + 1], "cut", DataConfig(contract=contract))]  # the data ends at t
    if contract != "NQ":  # prices rewritten after t (NQ's is tests/test_data.py's look-ahead test)
        decimals = {"EURUSD": 5, "EQUITY": 2}[contract]
        others.append(market_from_frame(rewritten_after(frame, t, decimals), "altered", DataConfig(contract=contract)))
    env = TradingEnv()
    base_bars = np.asarray(env.make_params(base, (0, base.num_bars)).bars)
    for other in others:
        bars = np.asarray(env.make_params(other, (0, other.num_bars)).bars)
        for column in (CAN_ENTER, FLATTEN, SESSION):
            np.testing.assert_array_equal(bars[: t + 1, column], base_bars[: t + 1, column])
        np.testing.assert_array_equal(other.bar_features[: t + 1], base.bar_features[: t + 1])
        np.testing.assert_array_equal(other.context_features[: t + 1], base.context_features[: t + 1])
        np.testing.assert_array_equal(other.atr[: t + 1], base.atr[: t + 1])
    # The observations along one action sequence agree up to t too.
    start = t - 6
    traces = []
    for market in (base, others[-1]):
        params = env.make_params(market, (0, market.num_bars))
        state = env.initial_state(jax.random.PRNGKey(0), params, bar=start)
        trace = [np.asarray(env.get_obs(state, params))]
        for action in [BUY] + [HOLD] * 5:
            state, *_ = env.transition(state, action, params)
            trace.append(np.asarray(env.get_obs(state, params)))
        traces.append(np.stack(trace))
    np.testing.assert_array_equal(traces[0], traces[1])


# --------------------------------------------------------------------------------------- gymnax wrappers
def test_gymnax_wrappers_that_read_default_params_wrap_the_env():
    from gymnax.wrappers.purerl import LogWrapper, StickyActionWrapper

    env = TradingEnv()
    assert int(env.default_params.end_bar) > int(env.default_params.start_bar)  # the default market, built lazily
    sticky = StickyActionWrapper(env, sticky_action_prob=0.5)
    key = jax.random.PRNGKey(0)
    obs, state = sticky.reset(key)
    obs, state, reward, *_ = sticky.step(key, state, BUY)
    assert obs.shape == (env.obs_size,) and np.isfinite(float(reward))
    logged = LogWrapper(env)
    _, log_state = logged.reset(key)
    _, log_state, *_ = logged.step(key, log_state, HOLD)
    assert int(log_state.episode_lengths) == 1
    assert get_contract("NQ").symbol == "NQ"
