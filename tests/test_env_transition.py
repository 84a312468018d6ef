"""The account bookkeeping of TradingEnv.transition that no fill test covers: a short's liquidation with several
contracts, the session fields across a session change, and the trade counters' recent-trades window."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxenv.config import EnvConfig
from jaxenv.env import BUY, EXIT_REASONS, HOLD, RECENT_TRADES, SELL, TradingEnv, record_trade, recent_win_rate
from tests.conftest import HandMarket, bar_at
from tests.test_env_execution import T0, play

pytestmark = pytest.mark.nojit


def test_a_short_of_three_contracts_is_liquidated_where_its_equity_meets_the_threshold():
    m = HandMarket("NQ")
    m.set_bar(T0 + 1, 18001, 18010, 17995, 18005)  # SELL fills at 18001; the low 17995 lifts the peak by 6 × $60
    m.set_bar(T0 + 2, 18006, 18100, 18000, 18090)
    config = EnvConfig(slippage_ticks=0.0, stop_atr_mult=20.0, contracts_per_trade=3)  # the stop 200 points away
    state, infos, terminated = play(m.build(), [SELL, HOLD], config=config, commission=0.0)
    # Peak $50,360, threshold $47,860, met by the short at 18001 + 2,140 / $60 = 18036.67.
    assert terminated
    assert [EXIT_REASONS[int(i["exit_reason"])] for i in infos] == ["none", "breach"]
    assert float(infos[-1]["exit_price"]) == pytest.approx(18001 + 2140 / 60, abs=1e-2)
    assert float(state.balance) == pytest.approx(47_860.0, abs=0.5)
    assert int(state.side) == 0


def test_a_new_session_restarts_the_day_count_and_start_equity_and_lifts_the_entry_lock():
    env = TradingEnv(EnvConfig(slippage_ticks=0.0))
    market = HandMarket("NQ").build()
    params = env.make_params(market, (0, market.num_bars))
    last_bar = bar_at(3, 9, 30) - 1  # session 2's last bar, where positions are closed
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=bar_at(2, 15, 40))
    transition = jax.jit(env.transition)
    state, *_ = transition(state, BUY, params)
    while int(state.t) < last_bar:
        state, *_ = transition(state, HOLD, params)
    assert int(state.side) == 0 and int(state.trades_today) == 1  # the session's close counts in its own day
    session_end_equity = float(state.equity)
    assert session_end_equity == pytest.approx(50_000.0 - 2 * 2.14, abs=1e-2)  # a flat market: both commissions
    locked = state.replace(entry_locked=jnp.ones((), bool))
    assert not bool(env.action_mask(locked, params)[BUY])
    state, *_ = transition(locked, HOLD, params)
    assert int(state.session) == int(locked.session) + 1
    assert int(state.trades_today) == 0
    assert float(state.session_start_equity) == session_end_equity
    assert not bool(state.entry_locked)


def test_the_trade_counters_keep_the_latest_outcomes_bit_zero_first():
    env = TradingEnv()
    state = env.initial_state(jax.random.PRNGKey(0), env.default_params)
    outcomes = [True, False, True, True] + [False] * 5 + [True, True, False, False]  # 13 closed trades
    yes, no = jnp.ones((), bool), jnp.zeros((), bool)
    for win in outcomes:
        unmoved = {k: int(v) for k, v in record_trade(state, no, yes if win else no).items()}
        assert unmoved == {k: int(getattr(state, k)) for k in unmoved}  # no exit: nothing moves
        state = state.replace(**record_trade(state, yes, yes if win else no))
    latest = outcomes[::-1][:RECENT_TRADES]
    assert int(state.trades) == len(outcomes) and int(state.wins) == sum(outcomes)
    assert int(state.recent_count) == RECENT_TRADES
    assert [(int(state.recent_wins) >> i) & 1 for i in range(RECENT_TRADES)] == [int(w) for w in latest]
    assert int(state.recent_wins) < 1 << RECENT_TRADES
    assert float(recent_win_rate(state)) == pytest.approx(np.mean(latest))
    assert int(state.consecutive_losses) == 2
