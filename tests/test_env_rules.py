"""Prop-firm trailing drawdown (Apex 50K), action masks, and the gymnax API under many random steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bridge.protocol import BUY, ENABLE_TRAIL, HOLD, MOVE_TO_BE
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.env import EXIT_REASONS, TradingEnv
from jaxenv.market import load_market
from tests.conftest import HandMarket, bar_at
from tests.test_env_execution import play

NO_COSTS = dict(slippage_ticks=0.0)


def threshold(state):
    return min(float(state.peak) - 2500.0, 50_100.0)


@pytest.mark.nojit
def test_apex_closed_profit_raises_threshold_to_48000():
    m = HandMarket("NQ")
    t0 = bar_at(2, 10, 0)
    m.set_bar(t0 + 2, 18000, 18026, 17999, 18020)  # target 18000 + 2.5 × 10 = 18025 → +25 pts = +$500
    state, infos, _ = play(m.build(), [BUY, HOLD], config=EnvConfig(target_atr_mult=2.5, **NO_COSTS), commission=0.0)
    assert EXIT_REASONS[int(infos[-1]["exit_reason"])] == "take_profit"
    assert float(state.balance) == pytest.approx(50_500.0)
    assert threshold(state) == pytest.approx(48_000.0)


def apex_peak_market():
    """Long at 15:31's open 18000; 15:40 trades up to 18043.75 (+$875 open profit); the position is closed
    at 15:59's close 18005 (+$100). The next session: two +$2,000 winners (target 10 ATR = 100 points)."""
    m = HandMarket("NQ")
    m.set_bar(bar_at(2, 15, 40), 18000, 18043.75, 17999, 18010)
    m.set_bar(bar_at(2, 15, 59), 18005, 18006, 18004, 18005)
    m.set_bar(bar_at(3, 10, 1), 18000, 18101, 17999, 18050)
    m.set_bar(bar_at(3, 11, 1), 18000, 18101, 17999, 18050)
    return m.build()


@pytest.mark.nojit
def test_apex_open_profit_peak_sets_threshold_and_it_stops_at_start_plus_100():
    config = EnvConfig(target_atr_mult=10.0, **NO_COSTS)
    market = apex_peak_market()
    start = bar_at(2, 15, 30)
    state, infos, _ = play(market, [BUY] + [HOLD] * 28, t0=start, config=config, commission=0.0)
    assert [EXIT_REASONS[int(i["exit_reason"])] for i in infos if i["exit_reason"] > 0] == ["session_close"]
    assert float(state.balance) == pytest.approx(50_100.0)
    assert float(state.peak) == pytest.approx(50_875.0)
    assert threshold(state) == pytest.approx(48_375.0)

    # Continue into the next session with two +$2,000 trades: the threshold climbs, then freezes at $50,100.
    to_first = bar_at(3, 10, 0) - int(state.t)
    to_second = bar_at(3, 11, 0) - bar_at(3, 10, 1)
    actions = [BUY] + [HOLD] * 28 + [HOLD] * to_first + [BUY, HOLD] + [HOLD] * (to_second - 1) + [BUY, HOLD]
    state, infos, terminated = play(market, actions, t0=start, config=config, commission=0.0)
    assert not terminated
    assert float(state.balance) == pytest.approx(54_100.0)
    assert threshold(state) == pytest.approx(50_100.0)
    env = TradingEnv(config)
    params = env.make_params(market, (0, market.num_bars))
    assert float(env.risk_features(state, params)[0]) == pytest.approx((54_100 - 50_100) / 2_500)


@pytest.mark.nojit
def test_breach_liquidates_at_threshold_and_terminates():
    m = HandMarket("NQ")
    t0 = bar_at(2, 10, 0)
    m.set_bar(t0 + 2, 17990, 17991, 17800, 17850)  # far stop (20 ATR) so the drawdown rule acts first
    state, infos, terminated = play(m.build(), [BUY, HOLD], config=EnvConfig(stop_atr_mult=20.0, **NO_COSTS), commission=0.0)
    assert terminated
    # The fill bar's high 18001 lifted the peak to $50,020, so the threshold is $47,520, which equity
    # meets at 18000 − 2480 / 20 = 17876.
    assert closed_trades_reason(infos) == ["breach"]
    assert float(infos[-1]["exit_price"]) == pytest.approx(17876.0)
    assert float(state.balance) == pytest.approx(47_520.0)


@pytest.mark.nojit
def test_a_walk_after_a_breach_enters_nothing_until_the_next_session():
    """The fresh account a walk continues with after a breach takes no new entry in the breach's session (a prop firm's
    breached account trades no more that day), so a session loses at most its account's room plus a gap; entries
    come back at the next session's first bar."""
    from jaxenv.evaluate import advance_step

    m = HandMarket("NQ")
    t0 = bar_at(2, 10, 0)
    m.set_bar(t0 + 2, 17990, 17991, 17800, 17850)  # the breach of test_breach_liquidates_at_threshold_and_terminates
    market = m.build()
    env = TradingEnv(EnvConfig(stop_atr_mult=20.0, **NO_COSTS))
    params = env.make_params(market, (0, market.num_bars))
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=t0)
    advance = jax.jit(lambda s, a, k: advance_step(env, params, s, a, k))
    entries, breaches = [], []
    while int(state.t) < bar_at(3, 10, 0):  # BUY on every bar: an entry wherever the mask allows one
        state, row = advance(state, BUY, jax.random.PRNGKey(1))
        entries.append(int(row["entry_side"]))
        breaches.append(bool(row["breach"]))
    assert breaches.index(True) == 1 and entries[:2] == [1, 0]  # entered at t0, breached on t0 + 2
    assert not any(entries[2:bar_at(3, 9, 30) - t0])  # the rest of day 2: nothing entered
    assert entries[bar_at(3, 9, 30) - t0] == 1  # day 3's first bar: entries allowed again


def closed_trades_reason(infos):
    return [EXIT_REASONS[int(i["exit_reason"])] for i in infos if i["exit_reason"] > 0]


@pytest.mark.nojit
def test_masks_agree_with_state():
    m = HandMarket("NQ")
    t0 = bar_at(2, 10, 0)
    m.set_bar(t0 + 1, 18001, 18015, 18000, 18012)  # 1.075 ATR in profit after the fill
    m.set_bar(t0 + 2, 18012, 18020, 18010, 18016)
    m.set_bar(t0 + 3, 18016, 18020, 18012, 18018)
    market = m.build()
    env = TradingEnv()
    params = env.make_params(market, (0, market.num_bars))
    step = jax.jit(env.transition)
    mask = lambda s: np.asarray(env.action_mask(s, params)).astype(int).tolist()  # noqa: E731

    state = env.initial_state(jax.random.PRNGKey(0), params, bar=t0)
    assert mask(state) == [1, 1, 1, 0, 0, 0]  # flat in trading hours: entries only
    state, *_ = step(state, BUY, params)
    assert mask(state) == [1, 0, 0, 1, 1, 0]  # long and in profit: break-even and trail
    state, *_ = step(state, MOVE_TO_BE, params)
    assert mask(state) == [1, 0, 0, 0, 1, 0]  # the stop is no longer behind the entry
    state, *_ = step(state, ENABLE_TRAIL, params)
    assert mask(state) == [1, 0, 0, 0, 0, 1]  # trailing: only disabling it changes something

    late = env.initial_state(jax.random.PRNGKey(0), params, bar=bar_at(2, 15, 45))
    assert mask(late) == [1, 0, 0, 0, 0, 0]  # no entries in the last 15 minutes
    assert mask(env.initial_state(jax.random.PRNGKey(0), params, bar=bar_at(2, 15, 44)))[1] == 1
    validity = np.asarray(env.get_obs(state, params))[220 + 5 : 220 + 8]
    assert validity.tolist() == [0.0, 0.0, 1.0]  # in a position: no entry, no break-even, trailing on


@pytest.mark.nojit
def test_reset_and_step_follow_the_gymnax_api():
    m = HandMarket("NQ")
    market = m.build()
    env = TradingEnv(EnvConfig(max_steps_in_episode=3))
    params = env.make_params(market, "train")
    key = jax.random.PRNGKey(1)
    obs, state = env.reset(key, params)
    assert obs.shape == (261,) and obs.dtype == jnp.float32
    assert int(params.start_bar) <= int(state.t) < int(params.end_bar)
    for i in range(3):
        out = env.step(jax.random.fold_in(key, i), state, HOLD, params)
        assert len(out) == 6
        obs, state, reward, terminated, truncated, info = out
    assert bool(truncated) and not bool(terminated)
    assert int(state.time) == 0  # auto-reset after max_steps
    assert info["final_observation"].shape == (261,)
    assert TradingEnv(EnvConfig(extended_features=False)).obs_size == 228


def test_many_envs_random_valid_actions_stay_finite():
    market = load_market(DataConfig(source="synthetic:default", synthetic_days=20))
    env = TradingEnv()
    params = env.make_params(market, "train")
    n_envs, n_steps = 4096, 1000

    @jax.jit
    def run(key):
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n_envs), params)

        def body(carry, key):
            obs, state, bad = carry
            k_act, k_step = jax.random.split(key)
            mask = jax.vmap(env.action_mask, in_axes=(0, None))(state, params)
            action = jax.random.categorical(k_act, jnp.where(mask, 0.0, -jnp.inf))
            obs, state, reward, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, n_envs), state, action, params
            )
            bad = bad | ~jnp.isfinite(obs).all() | ~jnp.isfinite(reward).all() | info["invalid_action"].any()
            return (obs, state, bad), (obs.dtype == jnp.float32, info["exit_reason"] > 0)

        (obs, state, bad), (_, exits) = jax.lax.scan(body, (obs, state, False), jax.random.split(key, n_steps))
        return obs, state, bad, exits.sum()

    obs, state, bad, exits = run(jax.random.PRNGKey(0))
    assert obs.shape == (n_envs, 261) and obs.dtype == jnp.float32
    assert state.t.shape == (n_envs,) and state.t.dtype == jnp.int32
    assert not bool(bad)
    assert int(exits) > 10_000  # random trading closes many trades
    assert bool((state.t >= params.start_bar).all() & (state.t < params.end_bar).all())
