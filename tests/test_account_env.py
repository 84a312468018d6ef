"""One account over several instruments (jaxenv.account_env, issue 77): one instrument trades as TradingEnv does, the
combined trailing drawdown computed by hand, the contract cap, correlated pairs, absent bars and no look-ahead.

Hand markets (tests.conftest): flat bars, ATR 10. NQ: point $20; ES: point $50; MNQ: point $2 (a micro, 0.1 mini).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from bridge.protocol import BUY, DISABLE_TRAIL, ENABLE_TRAIL, HOLD, MOVE_TO_BE, SELL
from jaxenv.account_env import ACCOUNT_FEATURES, INSTRUMENT_EXTRAS, AccountEnv, _computed_once, flatten_observation
from jaxenv.config import DataConfig, EnvConfig, PropFirmRules
from jaxenv.env import EXIT_REASONS, TradingEnv
from jaxenv.market_files import write_pair
from jaxenv.market_set import MarketSet, load_market_set
from tests.conftest import HandMarket, account_config, bar_at

T0 = bar_at(2, 10, 0)  # a decision bar in the third session, well inside trading hours
PRICES = {"NQ": 18_000.0, "ES": 5_000.0, "MNQ": 18_000.0}
NO_COSTS = EnvConfig(slippage_ticks=0.0, stop_atr_mult=20.0, target_atr_mult=50.0)  # stops 200, targets 500 points


def market_set_of(*markets, present: np.ndarray | None = None) -> MarketSet:
    """A set of hand-made markets on one timeline (the same stamps): every bar present unless `present` says."""
    first = markets[0]
    n = first.num_bars
    return MarketSet(
        symbols=tuple(m.contract.symbol for m in markets), sources=tuple(m.source for m in markets),
        markets=tuple(markets), present=np.ones((n, len(markets)), bool) if present is None else present,
        timestamps=first.timestamps, sessions=first.sessions, splits=first.splits,
        own_bars=tuple(m.num_bars for m in markets),
        own_spans=tuple((m.timestamps[0], m.timestamps[-1]) for m in markets),
    )


def hand(symbol: str, bars: dict[int, tuple[float, float, float, float]] | None = None):
    m = HandMarket(symbol, price=PRICES[symbol])
    for i, bar in (bars or {}).items():
        m.set_bar(i, *bar)
    return m.build()


def setup(market_set, config=NO_COSTS, commission=0.0, t0=T0, **limits):
    """The account on `market_set` under `config` with the prop firm's account `limits` (tests.conftest
    .account_config: no cap unless max_contracts is given), its params over every bar and a state at bar `t0`."""
    env = AccountEnv(account_config(config, **limits))
    params = env.make_params(market_set, (0, market_set.num_bars))
    if commission is not None:
        params = params.replace(inst=params.inst.replace(
            commission_per_side=jnp.full_like(params.inst.commission_per_side, commission)))
    return env, params, env.initial_state(jax.random.PRNGKey(0), params, bar=t0)


def play(env, params, state, actions):
    transition = jax.jit(env.transition)
    infos, terminated = [], False
    for a in actions:
        state, _, terminated, info = transition(state, jnp.asarray(a, jnp.int32), params)
        infos.append(jax.tree.map(np.asarray, info))
    return state, infos, bool(terminated)


# ------------------------------------------------------------------------------------------ one instrument
# The two walks (scans of hundreds of steps: the test below and the no-look-ahead one) are left out of the
# JAX_DISABLE_JIT=1 pass, where they take minutes.
@pytest.fixture(scope="module")
def one_nq():
    return load_market_set([("NQ", "synthetic:default")], DataConfig(synthetic_days=4))


@pytest.mark.parametrize("config", [
    EnvConfig(max_steps_in_episode=120),
    EnvConfig(max_steps_in_episode=120, contracts_per_trade=2, stop_atr_mult=6.0, trail_atr_mult=0.5,
              breach_penalty=50.0, prop_firm=PropFirmRules(trailing_drawdown=400.0, trail_stop_offset=50.0)),
], ids=["default", "tight_drawdown"])
def test_one_instrument_trades_as_trading_env(one_nq, config):
    """A few hundred steps of random actions (mostly valid, some not), auto-resets included: the same P&L, trades,
    rewards, exits, masks and observation as TradingEnv."""
    market = one_nq.markets[0]
    single, env = TradingEnv(config), AccountEnv(account_config(config))
    p1, p2 = single.make_params(market, (0, market.num_bars)), env.make_params(one_nq, (0, market.num_bars))
    key = jax.random.PRNGKey(7)
    o1, s1 = single.reset(key, p1)
    o2, s2 = env.reset(key, p2)

    def body(carry, key):
        s1, s2 = carry
        k_act, k_any, k_pick, k_step = jax.random.split(key, 4)
        mask = single.action_mask(s1, p1)
        valid = jax.random.categorical(k_act, jnp.where(mask, 0.0, -1e9))
        anything = jax.random.randint(k_any, (), 0, 6)
        a = jnp.where(jax.random.uniform(k_pick) < 0.15, anything, valid)
        o1, s1, r1, d1, t1, i1 = single.step(k_step, s1, a, p1)
        o2, s2, r2, d2, t2, i2 = env.step(k_step, s2, a[None], p2)
        out = dict(
            r=(r1, r2), terminated=(d1, d2), truncated=(t1, t2), balance=(s1.balance, s2.balance),
            equity=(s1.equity, s2.equity), peak=(s1.peak, s2.peak), obs=(o1, o2.instruments[0, : o1.shape[0]]),
            mask=(i1["action_mask"], i2["action_mask"][0]), side=(s1.side, s2.legs.side[0]),
            stop=(s1.stop, s2.legs.stop[0]), trades=(s1.trades, s2.trades), wins=(s1.wins, s2.wins),
            recent=(s1.recent_wins, s2.recent_wins), trades_today=(s1.trades_today, s2.trades_today),
            **{k: (i1[k], i2[k][0] if k in ("entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl",
                                             "invalid_action") else i2[k])
               for k in ("entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl", "invalid_action",
                         "episode_pnl", "episode_trades", "episode_commissions", "episode_breached")},
        )
        return (s1, s2), out

    _, out = jax.jit(lambda s1, s2: jax.lax.scan(body, (s1, s2), jax.random.split(key, 400)))(s1, s2)
    np.testing.assert_array_equal(np.asarray(o1), np.asarray(o2.instruments[0, : o1.shape[0]]))
    for name, (a, b) in out.items():  # bit for bit: the same float operations in the same order
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=name)
    exits = np.asarray(out["exit_reason"][0])
    assert np.asarray(out["entry_side"][0]).astype(bool).sum() > 20 and (exits > 0).sum() > 20
    assert np.asarray(out["invalid_action"][0]).any()
    if config.prop_firm.trailing_drawdown < 1000:
        assert (exits == EXIT_REASONS.index("breach")).sum() >= 1  # the liquidation path was taken


# ------------------------------------------------------------------------------------------ the combined drawdown
@pytest.mark.nojit
def test_a_breach_on_the_combined_equity_that_neither_position_reaches_alone():
    """NQ and ES bought at T0 (no costs, stops 200 points away) fill at 18000 and 5000. Bar T0+1 lifts the combined
    peak to both favourable extremes: 50,000 + 10 × $20 + 4 × $50 = 50,400 (threshold 47,900); equity 50,200 at the
    opens of T0+2. Bar T0+2's worst marks: NQ's low 17950 (−$1,000) and ES's low 4970 (−$1,500): 47,500 <= 47,900, a
    breach. Alone, NQ at its low with ES at its open is 49,100, ES at its low with NQ at its open 48,600: neither
    reaches the threshold. Both are liquidated where the sum meets it, each λ = 2,300 / 2,700 of the way from its open
    to its low: NQ at 18005 − 55λ, ES at 5002 − 32λ; the balance is then the threshold."""
    nq = hand("NQ", {T0 + 1: (18000, 18010, 17995, 18005), T0 + 2: (18005, 18006, 17950, 17960)})
    es = hand("ES", {T0 + 1: (5000, 5004, 4998, 5002), T0 + 2: (5002, 5003, 4970, 4975)})
    market_set = market_set_of(nq, es)
    env, params, state = setup(market_set)
    after_one, infos, terminated = play(env, params, state, [[BUY, BUY]])
    assert float(after_one.peak) == pytest.approx(50_400.0, abs=1e-2)
    assert float(after_one.equity) == pytest.approx(50_200.0, abs=1e-2)
    assert not terminated
    final, infos, terminated = play(env, params, after_one, [[HOLD, HOLD]])
    lam = 2_300 / 2_700
    assert terminated and bool(infos[0]["episode_breached"])
    assert [EXIT_REASONS[int(r)] for r in infos[0]["exit_reason"]] == ["breach", "breach"]
    np.testing.assert_allclose(infos[0]["exit_price"], [18005 - 55 * lam, 5002 - 32 * lam], atol=1e-2)
    assert float(final.balance) == pytest.approx(47_900.0, abs=0.2)
    assert final.legs.side.tolist() == [0, 0]

    # Each position alone, the other never entered: no breach; each is marked at T0+2's close.
    for entered, (mark, peak) in {0: (50_000 - 40 * 20, 50_200), 1: (50_000 - 25 * 50, 50_200)}.items():
        actions = [BUY if i == entered else HOLD for i in range(2)]
        alone, infos, terminated = play(env, params, state, [actions, [HOLD, HOLD]])
        assert not terminated and infos[-1]["exit_reason"].tolist() == [0, 0]
        assert float(alone.equity) == pytest.approx(mark, abs=1e-2) and float(alone.peak) == pytest.approx(peak)


@pytest.mark.nojit
def test_a_gap_below_the_threshold_liquidates_both_at_their_opens():
    """As above, but T0+2 opens with the sum at the threshold already (NQ 17960, ES 4970: 50,000 − 800 − 1,500 =
    47,700 <= 47,900): λ = 0, each fills at its open."""
    nq = hand("NQ", {T0 + 1: (18000, 18010, 17995, 18005), T0 + 2: (17960, 17962, 17950, 17955)})
    es = hand("ES", {T0 + 1: (5000, 5004, 4998, 5002), T0 + 2: (4970, 4971, 4960, 4965)})
    env, params, state = setup(market_set_of(nq, es))
    final, infos, terminated = play(env, params, state, [[BUY, BUY], [HOLD, HOLD]])
    assert terminated
    np.testing.assert_allclose(infos[-1]["exit_price"], [17960, 4970], atol=1e-3)
    assert float(final.balance) == pytest.approx(47_700.0, abs=0.05)


# ------------------------------------------------------------------------------------------ account limits
@pytest.mark.nojit
def test_the_contract_cap_counts_mini_equivalents_in_instrument_order():
    nq, es, mnq = hand("NQ"), hand("ES"), hand("MNQ")
    env, params, state = setup(market_set_of(nq, es), max_contracts=1.0)
    assert env.action_mask(state, params)[:, BUY].tolist() == [True, True]  # head 1's, head 0 holding
    assert not bool(env.sequential_mask(state, params, 1, jnp.array([BUY, HOLD]))[BUY])
    assert not bool(env.sequential_mask(state, params, 1, jnp.array([SELL, HOLD]))[SELL])
    assert bool(env.sequential_mask(state, params, 1, jnp.array([ENABLE_TRAIL, HOLD]))[BUY])
    masks, taken = env.sequential_masks(state, params, jnp.array([BUY, BUY]))
    assert taken.tolist() == [BUY, HOLD] and masks[1].tolist() == [True, False, False, False, False, False]
    after, infos, _ = play(env, params, state, [[BUY, BUY]])
    assert infos[0]["invalid_action"].tolist() == [False, True] and after.legs.side.tolist() == [1, 0]
    assert env.action_mask(after, params)[1, BUY].tolist() is False  # the open NQ fills the cap
    obs = env.get_obs(after, params)
    assert obs.account[ACCOUNT_FEATURES.index("minis_open")] == 1.0
    assert obs.account[ACCOUNT_FEATURES.index("minis_room")] == 0.0

    # a micro plus a mini: 1.1 minis
    for cap, fits in [(1.1, True), (1.0, False)]:
        env, params, state = setup(market_set_of(mnq, es), max_contracts=cap)
        assert params.entry_tenths.tolist() == [1, 10]
        assert bool(env.sequential_mask(state, params, 1, jnp.array([BUY, HOLD]))[SELL]) is fits
        after, _, _ = play(env, params, state, [[BUY, SELL]])
        assert after.legs.side.tolist() == [1, -1 if fits else 0]
        row = env.get_obs(after, params).instruments[0]
        assert float(row[env.single.obs_size + INSTRUMENT_EXTRAS.index("entry_minis")]) == pytest.approx(0.1)


@pytest.mark.nojit
def test_half_the_cap_until_the_threshold_locks():
    env, params, state = setup(market_set_of(hand("NQ"), hand("ES")),
                               max_contracts=2.0, half_size_until_threshold=True)
    assert not bool(env.sequential_mask(state, params, 1, jnp.array([BUY, HOLD]))[BUY])  # 1 of 2 minis
    locked = state.replace(peak=jnp.float32(50_000 + 2_500 + 100))  # the threshold stops trailing at 50,100
    assert bool(env.sequential_mask(locked, params, 1, jnp.array([BUY, HOLD]))[BUY])
    assert float(env.get_obs(state, params).account[ACCOUNT_FEATURES.index("half_size")]) == 1.0
    assert float(env.get_obs(locked, params).account[ACCOUNT_FEATURES.index("threshold_locked")]) == 1.0


@pytest.mark.nojit
def test_correlated_pairs_may_not_take_opposite_sides():
    env, params, state = setup(market_set_of(hand("NQ"), hand("ES")), correlated=[["ES", "NQ"]])
    assert env.sequential_mask(state, params, 1, jnp.array([BUY, HOLD]))[BUY:SELL + 1].tolist() == [True, False]
    assert env.sequential_mask(state, params, 1, jnp.array([SELL, HOLD]))[BUY:SELL + 1].tolist() == [False, True]
    short, infos, _ = play(env, params, state, [[SELL, BUY]])  # ES's BUY, opposite NQ's SELL, is taken as HOLD
    assert short.legs.side.tolist() == [-1, 0] and infos[0]["invalid_action"].tolist() == [False, True]
    assert env.action_mask(short, params)[1, BUY:SELL + 1].tolist() == [False, True]  # against the held short
    # a pair not in the set binds nothing
    env, params, state = setup(market_set_of(hand("NQ"), hand("ES")), correlated=[["NQ", "YM"]])
    assert bool(env.sequential_mask(state, params, 1, jnp.array([BUY, HOLD]))[SELL])


@pytest.mark.nojit
def test_sampling_head_by_head_gives_the_exact_log_probability():
    env, params, state = setup(market_set_of(hand("NQ"), hand("ES")), max_contracts=1.0)
    logits = jnp.zeros((2, 6))
    for seed in range(6):
        actions, log_prob = env.sample_actions(jax.random.PRNGKey(seed), state, params, logits)
        masks, taken = env.sequential_masks(state, params, actions)
        assert taken.tolist() == actions.tolist()  # every sampled action is valid under its head's mask
        expected = -np.log(np.asarray(masks).sum(axis=1)).sum()  # uniform over each head's valid actions
        assert float(log_prob) == pytest.approx(expected, abs=1e-5)
        assert float(env.log_prob(state, params, logits, actions)) == pytest.approx(expected, abs=1e-5)


# ------------------------------------------------------------------------------------------ absent bars
@pytest.mark.nojit
def test_an_absent_bar_fills_nothing_and_takes_no_entry():
    """ES has no bar of its own at A = T0+1 (its close carried) and at B = T0+3, whose high and low (never used)
    would cross both its stop and its target."""
    a, b = T0 + 1, T0 + 3
    nq = hand("NQ")
    es = hand("ES", {a: (5000, 5000, 5000, 5000), b: (5000, 5600, 4700, 5000)})
    present = np.ones((nq.num_bars, 2), bool)
    present[[a, b], 1] = False
    market_set = market_set_of(nq, es, present=present)
    env, params, state = setup(market_set, commission=2.14)
    after, infos, _ = play(env, params, state, [[BUY, BUY]])  # ES's order would fill at A: cancelled
    assert infos[0]["unfilled"].tolist() == [False, True] and infos[0]["entry_side"].tolist() == [1, 0]
    assert not infos[0]["invalid_action"].any()
    assert after.legs.side.tolist() == [1, 0] and float(after.commissions) == pytest.approx(2.14, abs=1e-4)
    assert env.action_mask(after, params)[1].tolist() == [True, False, False, False, False, False]  # A: no entry
    assert float(env.get_obs(after, params).instruments[1, env.single.obs_size]) == 0.0  # its present column

    # ES bought at T0-1 fills at T0's open and is held through A and B: nothing fills on them.
    env, params, state = setup(market_set, commission=2.14, t0=T0 - 1)
    held, infos, terminated = play(env, params, state, [[HOLD, BUY]] + [[HOLD, HOLD]] * 4)
    assert infos[0]["entry_side"].tolist() == [0, 1] and float(held.legs.entry_price[1]) == 5000.0
    assert held.legs.stop.tolist()[1] == 4800.0 and held.legs.target.tolist()[1] == 5500.0
    assert [int(r) for info in infos for r in info["exit_reason"]] == [0] * 10 and not terminated
    assert held.legs.side.tolist() == [0, 1] and int(held.t) == b + 1


# ------------------------------------------------------------------------------------------ no look-ahead
def test_rewriting_the_second_instrument_after_bar_t_changes_no_observation_up_to_t(tmp_path):
    nq, es = write_pair(tmp_path, "pair", ("NQ", "ES"), 4, 0)
    t0, t = 700, 900
    frame = pd.read_csv(es)
    for column in ("open", "high", "low", "close"):
        frame.loc[t + 1:, column] += 50.0
    frame.loc[t + 1:, "volume"] *= 3
    changed = tmp_path / "ES_changed.csv"
    frame.drop(index=[t + 5, t + 40]).to_csv(changed, index=False)
    base = DataConfig(synthetic_days=4, synthetic_seed=0)
    env = AccountEnv(account_config(max_contracts=1.5, correlated=[["NQ", "ES"]]))

    @jax.jit
    def walk(params):
        def body(state, key):
            actions, _ = env.sample_actions(key, state, params, jnp.zeros((2, 6)))
            state, reward, _, _ = env.transition(state, actions, params)
            return state, (flatten_observation(env.get_obs(state, params)), reward, state.legs.side)

        state = env.initial_state(jax.random.PRNGKey(0), params, bar=t0)
        return jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(3), t - t0))[1]

    runs = []
    for source in (es, changed):
        market_set = load_market_set([("NQ", str(nq)), ("ES", str(source))], base)
        runs.append(jax.tree.map(np.asarray, walk(env.make_params(market_set, (0, market_set.num_bars)))))
    (obs, rewards, sides), (obs2, rewards2, _) = runs
    assert obs.shape == (t - t0, 2 * env.instrument_obs_size + env.account_obs_size)
    np.testing.assert_array_equal(obs2, obs)
    np.testing.assert_array_equal(rewards2, rewards)
    assert (sides[:, 1] != 0).any() and (sides[:, 0] != 0).any()  # both instruments traded


@pytest.mark.nojit
def test_the_observation_layout():
    env, params, state = setup(market_set_of(hand("NQ"), hand("ES")), config=EnvConfig())
    obs = env.get_obs(state, params)
    assert obs.instruments.shape == (2, env.single.obs_size + len(INSTRUMENT_EXTRAS))
    assert obs.account.shape == (len(ACCOUNT_FEATURES),)
    single = TradingEnv(EnvConfig())
    alone = single.make_params(hand("ES"), (0, params.present.shape[0]))
    one = single.get_obs(single.initial_state(jax.random.PRNGKey(0), alone, bar=T0), alone)
    np.testing.assert_array_equal(np.asarray(obs.instruments[1, : single.obs_size]), np.asarray(one))
    assert flatten_observation(obs).shape == (2 * obs.instruments.shape[1] + obs.account.shape[0],)
    assert env.action_mask(state, params).shape == (2, 6)
    assert MOVE_TO_BE == 3 and DISABLE_TRAIL == 5


def test_positions_stored_once_are_unchanged():
    """The step stores each instrument's position and exit through a division by 1 (_computed_once, for XLA's sake):
    every value comes back exactly, integers over int32's whole range included, jitted and under vmap."""
    values = {"side": jnp.array([-1, 0, 1], jnp.int32),
              "entry_time": jnp.array([-2**31, -4097, 4095, 4096, 123_456_789, 2**31 - 1], jnp.int32),
              "exiting": jnp.array([True, False]),
              "price": jnp.array([21_345.25, -0.0, 1e-30, -3e38, jnp.inf], jnp.float32)}
    state = type("State", (), {"time": jnp.int32(7)})
    stored = jax.jit(lambda v: _computed_once(v, state))(values)
    batched = jax.vmap(lambda v, t: _computed_once(v, type("State", (), {"time": t})), in_axes=(None, 0))(
        values, jnp.arange(3, dtype=jnp.int32))
    for name, value in values.items():
        assert stored[name].dtype == value.dtype
        np.testing.assert_array_equal(np.asarray(stored[name]), np.asarray(value))
        np.testing.assert_array_equal(np.asarray(batched[name]), np.broadcast_to(np.asarray(value), (3, *value.shape)))

