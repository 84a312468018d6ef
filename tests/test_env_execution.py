"""Fills, stops, targets, break-even, trailing stops, commissions and slippage, computed by hand.

NQ: tick 0.25 = $5, point $20, commission $2.14 per side. ES: tick 0.25 = $12.50, point $50.
Default config: 1 tick slippage, stop 1.5 ATR, target 3 ATR, trail 1 ATR; the hand markets have ATR 10 (NQ).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxenv.config import EnvConfig
from jaxenv.env import BUY, DISABLE_TRAIL, ENABLE_TRAIL, EXIT_REASONS, HOLD, MOVE_TO_BE, SELL, TradingEnv
from tests.conftest import HandMarket, bar_at

pytestmark = pytest.mark.nojit
T0 = bar_at(2, 10, 0)  # a decision bar in the third session, well inside trading hours


def play(market, actions, t0=T0, config=None, commission=None):
    env = TradingEnv(config or EnvConfig())
    params = env.make_params(market, (0, market.num_bars))
    if commission is not None:
        params = params.replace(commission_per_side=np.float32(commission))
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=t0)
    transition = jax.jit(env.transition)
    infos, terminated = [], False
    for a in actions:
        state, _, terminated, info = transition(state, a, params)
        infos.append(jax.tree.map(np.asarray, info))
    return state, infos, bool(terminated)


def closed_trades(infos):
    return [(EXIT_REASONS[int(i["exit_reason"])], float(i["exit_price"]), float(i["trade_pnl"])) for i in infos if i["exit_reason"] > 0]


def long_nq(bar2):
    """BUY at T0 (close 18000): fills at bar T0+1's open 18001 + 1 tick = 18001.25;
    stop 18001.25 − 15 = 17986.25, target 18001.25 + 30 = 18031.25. Bar T0+2 is the test's."""
    m = HandMarket("NQ")
    m.set_bar(T0 + 1, 18001, 18010, 17995, 18005)
    m.set_bar(T0 + 2, *bar2)
    return m.build()


def test_order_fills_at_next_open_plus_slippage():
    state, infos, _ = play(long_nq((18005, 18006, 18004, 18005)), [BUY])
    assert int(infos[0]["entry_side"]) == 1
    assert float(state.entry_price) == pytest.approx(18001.25)
    assert float(state.stop) == pytest.approx(17986.25)
    assert float(state.target) == pytest.approx(18031.25)
    assert float(state.balance) == pytest.approx(50_000 - 2.14, abs=1e-2)  # entry commission only
    # marked at T0+1's close 18005: (18005 − 18001.25) × 20 = 75
    assert float(state.equity) == pytest.approx(50_000 - 2.14 + 75.0, abs=1e-2)


def test_long_target_hit():
    state, infos, _ = play(long_nq((18005, 18035, 18004, 18030)), [BUY, HOLD])
    assert closed_trades(infos) == [("take_profit", 18031.25, pytest.approx(600 - 4.28, abs=1e-2))]
    assert float(state.balance) == pytest.approx(50_595.72, abs=1e-2)
    assert float(state.commissions) == pytest.approx(4.28, abs=1e-3)  # exactly two sides
    assert int(state.side) == 0 and int(state.trades) == 1 and int(state.wins) == 1


def test_long_stop_hit_slips_one_tick():
    _, infos, _ = play(long_nq((18000, 18004, 17980, 17990)), [BUY, HOLD])
    # stop 17986.25 − 0.25 slippage = 17986.00; (17986 − 18001.25) × 20 = −305
    assert closed_trades(infos) == [("stop_loss", 17986.0, pytest.approx(-305 - 4.28, abs=1e-2))]


def test_stop_counts_when_stop_and_target_in_one_bar():
    _, infos, _ = play(long_nq((18005, 18035, 17980, 18000)), [BUY, HOLD])
    assert closed_trades(infos) == [("stop_loss", 17986.0, pytest.approx(-309.28, abs=1e-2))]


def test_gap_through_stop_fills_at_open():
    _, infos, _ = play(long_nq((17970, 17975, 17960, 17965)), [BUY, HOLD])
    # open 17970 is below the stop: filled at 17970 − 0.25; (17969.75 − 18001.25) × 20 = −630
    assert closed_trades(infos) == [("stop_loss", 17969.75, pytest.approx(-634.28, abs=1e-2))]


def es_short(bar2):
    """ES at 5000, ATR 4: SELL fills at 5000 − 0.25 = 4999.75; stop 5005.75, target 4987.75."""
    m = HandMarket("ES", price=5000.0, atr=4.0)
    m.set_bar(T0 + 1, 5000, 5001, 4999, 5000)
    m.set_bar(T0 + 2, *bar2)
    return m.build()


def test_short_target_on_es():
    _, infos, _ = play(es_short((4995, 4996, 4985, 4990)), [SELL, HOLD])
    # (4999.75 − 4987.75) × 50 = 600
    assert closed_trades(infos) == [("take_profit", 4987.75, pytest.approx(600 - 4.28, abs=1e-2))]


def test_short_stop_on_es():
    _, infos, _ = play(es_short((5000, 5007, 4998, 5006)), [SELL, HOLD])
    # stop 5005.75 + 0.25 slippage = 5006.00; (4999.75 − 5006) × 50 = −312.5
    assert closed_trades(infos) == [("stop_loss", 5006.0, pytest.approx(-312.5 - 4.28, abs=1e-2))]


def test_move_to_break_even_then_stopped_at_entry():
    m = HandMarket("NQ")
    m.set_bar(T0 + 1, 18001, 18015, 18000, 18012)  # closes 1.075 ATR in profit
    m.set_bar(T0 + 2, 18010, 18011, 18000, 18005)  # comes back through the entry
    state, infos, _ = play(m.build(), [BUY, MOVE_TO_BE])
    assert closed_trades(infos) == [("breakeven_stop", 18001.0, pytest.approx(-5 - 4.28, abs=1e-2))]
    assert int(state.side) == 0


def test_trailing_stop_follows_close_and_exits():
    m = HandMarket("NQ")
    m.set_bar(T0 + 1, 18001, 18015, 18000, 18012)
    m.set_bar(T0 + 2, 18012, 18025, 18010, 18024)  # trail rises to 18024 − 10 = 18014
    m.set_bar(T0 + 3, 18020, 18021, 18010, 18012)  # low 18010 takes the 18014 trail
    state, infos, _ = play(m.build(), [BUY, ENABLE_TRAIL, HOLD])
    # enabling at T0+1's close moves the stop to 18012 − 10 = 18002; (18013.75 − 18001.25) × 20 = 250
    assert closed_trades(infos) == [("trailing_stop", 18013.75, pytest.approx(250 - 4.28, abs=1e-2))]
    assert int(state.side) == 0 and not bool(state.trailing)


def test_disable_trail_keeps_the_stop_where_it_is():
    m = HandMarket("NQ")
    m.set_bar(T0 + 1, 18001, 18015, 18000, 18012)
    m.set_bar(T0 + 2, 18012, 18025, 18010, 18024)
    state, _, _ = play(m.build(), [BUY, ENABLE_TRAIL, DISABLE_TRAIL])
    assert float(state.stop) == pytest.approx(18014.0)  # trailed once, then frozen
    assert not bool(state.trailing)


def test_position_closed_on_the_sessions_last_bar():
    m = HandMarket("NQ")
    start = bar_at(2, 15, 40)
    state, infos, _ = play(m.build(), [BUY] + [HOLD] * 18, t0=start)
    # fills at 15:41's open 18000.25, closed at 15:59's close 18000 − 0.25: −10 − 4.28
    assert closed_trades(infos) == [("session_close", 17999.75, pytest.approx(-14.28, abs=1e-2))]
    assert int(state.t) == bar_at(2, 15, 59)


def test_invalid_action_acts_as_hold_and_is_flagged():
    state, infos, _ = play(long_nq((18005, 18006, 18004, 18005)), [MOVE_TO_BE])
    assert bool(infos[0]["invalid_action"]) and int(state.side) == 0
