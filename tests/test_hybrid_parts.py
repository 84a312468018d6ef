"""Risk veto, fusion and query selection: the vectorised pieces of the hybrid loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.advice.fusion import TrustGate, fusion_features, masked_advice_probs, mix, rules_action
from agents.advice.risk_veto import VetoState, apply_veto
from agents.advice.table import SIDES, STATUS_ASKED, STATUS_NONE, AdviceTable, select_keys, view
from agents.config import QueryConfig, VetoConfig
from bridge.protocol import BUY, ENABLE_TRAIL, HOLD, SELL, STATUS_NO_VIEW, STATUS_OK
from jaxenv.config import EnvConfig
from jaxenv.env import TradingEnv
from tests.conftest import HandMarket, bar_at

ALL = jnp.ones((1, 6), bool)
K = 5  # the query interval of these tests' tables


APART = 8  # blocks between two envs' bars: more than max_age_intervals, so no env reads another's answer


def bars_of(n: int) -> jax.Array:
    """Env i decides at the first bar of block APART·(i + 1): the answer in force is its side's key of the block
    before."""
    return (jnp.arange(n, dtype=jnp.int32) + 1) * APART * K


def key_for(envs, sides) -> jax.Array:
    """The keys envs `envs` read at bars_of, for their sides `sides`."""
    return ((jnp.asarray(envs, jnp.int32) + 1) * APART - 1) * SIDES + jnp.asarray(sides, jnp.int32) + 1


def table_with(n: int, envs, probs, confidence, status, sides) -> AdviceTable:
    """A table for n envs at bars_of(n) in which env envs[j] has the answer (probs[j], confidence[j], status[j]) for
    its side `sides[envs[j]]`."""
    envs = jnp.asarray(envs, jnp.int32)
    keys = key_for(envs, jnp.asarray(sides, jnp.int32)[envs])
    m = envs.shape[0]
    return AdviceTable.create((n + 1) * APART * SIDES).write(keys, jnp.asarray(probs, jnp.float32),
                                                     jnp.asarray(confidence, jnp.float32),
                                                     jnp.asarray(status, jnp.int32), jnp.zeros(m, jnp.int32),
                                                     jnp.ones(m, bool))


def params_for(n: int):
    from jaxenv.env import EnvParams

    return EnvParams(bars=jnp.zeros(((n + 1) * APART * K, 8)))  # the record reads the decision bar's close


def state_of(side, t=None):
    import types

    side = jnp.asarray(side, jnp.int32)
    return types.SimpleNamespace(side=side, t=bars_of(side.shape[0]) if t is None else t)


def acting_with(fusion: str, query: QueryConfig, veto: VetoConfig):
    """The acting step of `fusion` for window-1 short observations (the trust gate's context read from them)."""
    from agents.advice.acting import CONTEXT_FEATURES, HybridActing

    env = TradingEnv(EnvConfig(window=1, extended_features=False))
    return HybridActing(fusion, query, veto, 0.3, tuple(env.observation_column(c) for c in CONTEXT_FEATURES))


def waiting(acting, carry, side, advice):
    """[N] bool: the flat envs the wait holds out of the market (the entry rules, on every action valid)."""
    rules = acting.rules.apply(carry.rule_state(), advice, state_of(side), None, jnp.ones((side.shape[0], 6), bool))
    return rules.waiting


def env_states(**overrides):
    market = HandMarket().build()
    env = TradingEnv()
    params = env.make_params(market, (0, market.num_bars))
    state = env.initial_state(jax.random.PRNGKey(0), params, bar=bar_at(2, 10, 0))
    state = state.replace(**{k: jnp.asarray(v, getattr(state, k).dtype) for k, v in overrides.items()})
    return jax.tree.map(lambda x: x[None], state), params


@pytest.mark.nojit
def test_veto_fires_on_consecutive_losses_blocks_entries_but_never_hold():
    """`auto`: a 1.5/3-ATR bracket breaks even at 1/3 wins, where 8 losses in a row have probability (2/3)^8 = 3.9%
    <= 5% and 7 have 5.9%: 8 fire, 7 do not. A fixed count fires at that count."""
    from agents.advice.risk_veto import losing_streak_limit

    state, params = env_states(consecutive_losses=8, trades=8)
    assert int(losing_streak_limit(VetoConfig(), params)) == 8
    mask, veto, fired, active = apply_veto(VetoConfig(), VetoState.create(1), state, params, ALL)
    assert fired[0].tolist() == [True, False, False] and bool(active[0])
    assert mask[0].tolist() == [True, False, False, True, False, True]  # BUY, SELL, ENABLE_TRAIL blocked
    seven = state.replace(consecutive_losses=state.consecutive_losses - 1)
    assert not bool(apply_veto(VetoConfig(), VetoState.create(1), seven, params, ALL)[2].any())
    three = state.replace(consecutive_losses=jnp.full_like(state.consecutive_losses, 3))
    assert apply_veto(VetoConfig(consecutive_losses=3), VetoState.create(1), three, params, ALL)[2][0].tolist() == [
        True, False, False]


@pytest.mark.nojit
def test_veto_rules_drawdown_buffer_and_win_rate_and_switches():
    low_buffer, params = env_states(equity=47_900.0)  # (47,900 − 47,500) / 2,500 = 0.16 < 0.2
    _, _, fired, _ = apply_veto(VetoConfig(), VetoState.create(1), low_buffer, params, ALL)
    assert fired[0].tolist() == [False, True, False]
    _, _, fired, _ = apply_veto(VetoConfig(min_drawdown_buffer=0.0), VetoState.create(1), low_buffer, params, ALL)
    assert not bool(fired.any())

    losing, params = env_states(trades=6, recent_wins=0b000001, recent_count=6)  # 1 win in 6 = 17%
    _, _, fired, _ = apply_veto(VetoConfig(win_rate_margin=0.1), VetoState.create(1), losing, params, ALL)
    assert fired[0].tolist() == [False, False, True]
    few, params = env_states(trades=4, recent_wins=0, recent_count=4)  # fewer than 5 trades: no verdict
    _, _, fired, _ = apply_veto(VetoConfig(), VetoState.create(1), few, params, ALL)
    assert not bool(fired.any())
    mask, *_ = apply_veto(VetoConfig(enabled=False), VetoState.create(1), losing, params, ALL)
    assert bool(mask.all())


@pytest.mark.nojit
def test_veto_expires_after_cooldown_and_at_new_session_and_does_not_lock_out():
    cfg = VetoConfig(cooldown_bars=30, consecutive_losses=3)
    state, params = env_states(consecutive_losses=3, trades=3)
    _, veto, _, _ = apply_veto(cfg, VetoState.create(1), state, params, ALL)
    later = state.replace(t=state.t + 29)
    assert bool(apply_veto(cfg, veto, later, params, ALL)[3][0])  # still active
    expired = state.replace(t=state.t + 30)
    mask, veto2, fired, active = apply_veto(cfg, veto, expired, params, ALL)
    # The losses are still 3 in a row, but no trade has closed since: the rule does not fire again.
    assert not bool(active[0]) and not bool(fired.any()) and bool(mask.all())
    next_session = state.replace(session=state.session + 1, t=state.t + 1)
    assert not bool(apply_veto(cfg, veto, next_session, params, ALL)[3][0])
    # Another losing trade re-arms it.
    assert bool(apply_veto(cfg, veto2, expired.replace(trades=expired.trades + 1, consecutive_losses=expired.consecutive_losses + 1), params, ALL)[3][0])


@pytest.mark.nojit
def test_advice_in_force_is_the_previous_blocks_decays_with_age_and_expires():
    """At bar t the flat key of block t // K − 1 is in force; where it has no answer (a parse error), the newest older
    answer holds until it is max_age bars old."""
    cfg = QueryConfig(interval=K, decay=0.8, max_age_intervals=2)
    probs = jnp.tile(jnp.array([0.1, 0.6, 0.1, 0.1, 0.05, 0.05]), (2, 1))
    flat_keys = jnp.array([0, 1]) * SIDES + 1  # blocks 0 (bars 0-4) and 1 (bars 5-9)
    table = AdviceTable.create(6 * SIDES).write(flat_keys, probs, jnp.full(2, 0.6), jnp.array([0, 1]),
                                                jnp.zeros(2, jnp.int32), jnp.ones(2, bool))
    bars = jnp.array([4, 5, 10, 14, 15])
    v = view(table, cfg, bars, jnp.zeros(5, jnp.int32))
    assert v.valid.tolist() == [False, True, True, True, False]  # bar 4: block 0's answer is not in force yet
    assert v.age[1:4].tolist() == [1, 6, 10]  # rendered at bar 4, the last of block 0; block 1 had a parse error
    np.testing.assert_allclose(v.confidence[1:4], 0.6 * 0.8 ** (np.array([1, 6, 10]) / K), rtol=1e-5)
    assert not bool(view(table, cfg, bars, jnp.ones(5, jnp.int32)).valid.any())  # nothing for a long env


@pytest.mark.nojit
def test_no_advice_in_force_was_rendered_from_a_bar_after_the_previous_block():
    """The latency contract, whatever the advisor's speed: for every fill of the table and every bar, the answer in
    force at bar t is about a block that ended before t's block began, for the env's own side."""
    cfg = QueryConfig(interval=K, max_age_intervals=6)
    rng = np.random.default_rng(0)
    n_keys = 40 * SIDES
    for trial in range(20):
        status = rng.choice([STATUS_NONE, STATUS_ASKED, STATUS_OK, STATUS_NO_VIEW, 2], n_keys)
        table = AdviceTable.create(n_keys).replace(status=jnp.asarray(status, jnp.int32))
        bar = jnp.asarray(rng.integers(0, 40 * K, 256), jnp.int32)
        side = jnp.asarray(rng.integers(-1, 2, 256), jnp.int32)
        v = view(table, cfg, bar, side)
        key = np.asarray(v.key)
        found = key >= 0
        rendered = (key // SIDES) * K + K - 1
        assert (rendered[found] < (np.asarray(bar)[found] // K) * K).all()
        assert (key[found] % SIDES - 1 == np.asarray(side)[found]).all()
        assert (np.asarray(v.age)[found] == np.asarray(bar)[found] - rendered[found]).all()
        assert not (np.asarray(v.valid) & ~found).any()


@pytest.mark.nojit
def test_query_steps_ask_the_keys_most_envs_will_read_missing_before_stale_and_never_twice():
    cfg = QueryConfig(interval=K)
    table = AdviceTable.create(10 * SIDES)
    # three flat envs in block 2, one long env in block 2, one flat env in block 6
    bar = jnp.array([10, 11, 12, 13, 30], jnp.int32)
    side = jnp.array([0, 0, 0, 1, 0], jnp.int32)
    keys, ok = select_keys(table, cfg, 3, bar, side, 0, 2)
    flat_2, flat_3 = 2 * SIDES + 1, 3 * SIDES + 1  # read during blocks 3 and 4, where they are next
    assert ok.tolist() == [True, True, True] and sorted(keys[:2].tolist()) == [flat_2, flat_3]
    asked = table.mark_asked(keys, ok)
    keys, ok = select_keys(asked, cfg, 8, bar, side, 0, 2)
    assert set(keys[ok].tolist()) == {2 * SIDES + 2, 3 * SIDES + 2, 6 * SIDES + 1, 7 * SIDES + 1} - set(
        np.asarray(asked.status == STATUS_ASKED).nonzero()[0].tolist())  # in flight: not asked again
    # a new advisor version: answered keys are stale, asked again after every missing one
    answered_all = table.write(jnp.arange(10 * SIDES), jnp.full((10 * SIDES, 6), 1 / 6), jnp.ones(10 * SIDES),
                               jnp.zeros(10 * SIDES, jnp.int32), jnp.zeros(10 * SIDES, jnp.int32),
                               jnp.arange(10 * SIDES) != flat_3)
    keys, ok = select_keys(answered_all.replace(current=jnp.int32(1)), cfg, 2, bar, side, 0, 2)
    assert keys.tolist() == [flat_3, flat_2]
    # entries_only: only flat envs' keys
    keys, ok = select_keys(table, QueryConfig(interval=K, entries_only=True), 8, bar, side, 0, 2)
    assert all(k % SIDES == 1 for k in keys[ok].tolist())
    # the flat keys the advice's record lacks (blocks [8, 10)): a quarter of the budget, at least one key, goes to the
    # earliest of them first, however many envs read other keys (a small budget never reached them before); the rest
    # come after the keys the envs read
    keys, ok = select_keys(table, cfg, 3, bar, side, 0, 2, wanted=jnp.array([8, 10]))
    assert ok.all() and keys[0] == 8 * SIDES + 1 and 9 * SIDES + 1 not in keys.tolist()
    keys, ok = select_keys(table, cfg, 20, bar, side, 0, 2, wanted=jnp.array([8, 10]))
    assert keys[:2].tolist() == [8 * SIDES + 1, 9 * SIDES + 1]
    asked = table.mark_asked(keys[:1], ok[:1])  # block 8's key in flight: the share goes to the next
    keys, ok = select_keys(asked, cfg, 3, bar, side, 0, 2, wanted=jnp.array([8, 10]))
    assert keys[0] == 9 * SIDES + 1


@pytest.mark.nojit
def test_advice_holds_only_for_the_position_side_it_was_asked_about():
    """A BUY answered for being flat is not in force for a long env at the same bar, and is again once it is flat."""
    cfg = QueryConfig(interval=K)
    flat = jnp.zeros(2, jnp.int32)
    probs = jnp.tile(jnp.array([0.05, 0.75, 0.05, 0.05, 0.05, 0.05]), (2, 1))
    table = table_with(2, [0, 1], probs, jnp.full(2, 0.75), jnp.zeros(2), flat)
    now = jnp.array([1, 0])  # env 0 is long now
    assert view(table, cfg, bars_of(2), now).valid.tolist() == [False, True]
    assert view(table, cfg, bars_of(2), flat).valid.tolist() == [True, True]


@pytest.mark.nojit
def test_learned_mixture_is_a_masked_distribution_and_gate_starts_low():
    pi_rl = jnp.array([[0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    advice = jnp.array([[0.0, 0.0, 0.9, 0.1, 0.0, 0.0]])
    mask = jnp.array([[True, True, False, True, False, False]])
    pi_llm = masked_advice_probs(advice, mask)
    np.testing.assert_allclose(pi_llm[0], [0, 0, 0, 1, 0, 0])  # SELL invalid: its mass is dropped
    p = mix(pi_rl, pi_llm, jnp.array([0.25]), mask)
    np.testing.assert_allclose(p[0], [0.375, 0.375, 0, 0.25, 0, 0], atol=1e-6)
    assert float(p.sum()) == pytest.approx(1.0)
    p0 = mix(pi_rl, pi_llm, jnp.array([0.0]), mask)
    np.testing.assert_allclose(p0, pi_rl)

    flat = jnp.zeros(1, jnp.int32)
    tbl = table_with(1, [0], advice, [0.9], [0], flat)
    features = fusion_features(pi_rl, view(tbl, QueryConfig(interval=K), bars_of(1), flat), jnp.zeros((1, 6)))
    gate = TrustGate()
    g = gate.apply(gate.init(jax.random.PRNGKey(0), features), features)
    assert 0.05 < float(g[0]) < 0.2


@pytest.mark.nojit
def test_an_advisor_with_no_view_leaves_the_policy_acting_alone_where_hold_would_pull_it_out():
    """The news advisor flat without news: its HOLD (status ok) is advice in force that moves probability onto HOLD;
    its PASS (no_view) is no advice: the gate is 0 and the acting distribution is the policy's."""
    from agents.advice.acting import trust_where_valid
    from llm_sidecar.backends import MockBackend

    quiet = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat"
    hold = MockBackend(answers="news").advise([quiet])
    no_view = MockBackend(answers="news_pass").advise([quiet])
    assert no_view.status.tolist() == [STATUS_NO_VIEW]
    cfg = QueryConfig(interval=K)
    flat = jnp.zeros(2, jnp.int32)
    table = table_with(2, [0, 1], np.concatenate([hold.probs, no_view.probs]),
                       np.concatenate([hold.confidence, no_view.confidence]),
                       np.concatenate([hold.status, no_view.status]), flat)
    advice = view(table, cfg, bars_of(2), flat)
    assert advice.valid.tolist() == [True, False] and advice.passed.tolist() == [False, True]
    pi_rl = jnp.tile(jnp.array([[0.2, 0.5, 0.3, 0.0, 0.0, 0.0]]), (2, 1))
    mask = jnp.tile(jnp.array([[True, True, True, False, False, False]]), (2, 1))
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    gate_half = constant_gate(0.5)
    gate = trust_where_valid(gate_half, None, fusion_features(pi_rl, advice, jnp.zeros((2, 6))), advice.valid)
    assert gate.tolist() == [0.5, 0.0]
    p = jnp.exp(acting.fused_log_probs(pi_rl, advice, gate, mask))
    assert float(p[0, HOLD]) > 0.2 + 0.1 and float(p[0, BUY]) < 0.5  # HOLD advice pulls the env out of the market
    np.testing.assert_allclose(p[1], pi_rl[1], atol=1e-6)  # no view: the policy alone


def constant_gate(g: float):
    """A stand-in network whose trust gate is `g` on every row (trust_where_valid calls network.apply)."""
    import types

    return types.SimpleNamespace(apply=lambda params, features, method=None: jnp.full(features.shape[:-1], g))


@pytest.mark.nojit
def test_rules_fusion_priorities():
    flat = jnp.zeros(1, jnp.int32)

    def advice_for(action, conf):
        tbl = table_with(1, [0], jax.nn.one_hot(jnp.array([action]), 6), [conf], [0], flat)
        return view(tbl, QueryConfig(interval=K), bars_of(1), flat)

    def pi(action, conf):
        rest = (1.0 - conf) / 5.0
        return jnp.full((1, 6), rest).at[0, action].set(conf)

    run = lambda rl, pol, adv: int(rules_action(jnp.array([rl]), pol, adv, ALL)[0])  # noqa: E731
    assert run(BUY, pi(BUY, 0.7), advice_for(BUY, 0.7)) == BUY  # agreement
    assert run(BUY, pi(BUY, 0.95), advice_for(SELL, 0.55)) == BUY  # RL confident, LLM not
    assert run(BUY, pi(BUY, 0.55), advice_for(SELL, 0.95)) == SELL  # LLM confident, RL not
    assert run(BUY, pi(BUY, 0.4), advice_for(SELL, 0.45)) == HOLD  # both unsure
    assert run(BUY, pi(BUY, 0.7), advice_for(SELL, 0.8)) == BUY  # 0.3·0.8 < 0.7·0.7
    no_sell = ALL.at[0, SELL].set(False)
    assert int(rules_action(jnp.array([BUY]), pi(BUY, 0.55), advice_for(SELL, 0.95), no_sell)[0]) == BUY  # invalid → RL
    invalid = view(AdviceTable.create(2 * APART * SIDES), QueryConfig(interval=K), bars_of(1), flat)
    assert run(ENABLE_TRAIL, pi(BUY, 0.3), invalid) == ENABLE_TRAIL  # no advice: the policy's sample


def test_switch_fusion_lets_valid_advice_act_and_the_policy_everywhere_else():
    """fusion switch: a flat env with a view in force takes the advice's action; one whose advisor passed, or that has
    no advice, takes the policy's. The steps the advice decided carry no policy gradient."""
    import dataclasses

    from agents.config import NetworkConfig
    from agents.rl.networks import make_network
    from jaxenv.env import N_BAR_FEATURES, N_POSITION
    from llm_sidecar.backends import MockBackend

    quiet = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat"
    no_view = MockBackend(answers="news_pass").advise([quiet])
    cfg = QueryConfig(interval=K, bind_on="always")
    acting = dataclasses.replace(acting_with("switch", cfg, VetoConfig(enabled=False)),
                                 greedy=True)
    flat = jnp.zeros(3, jnp.int32)
    probs = jnp.concatenate([jax.nn.one_hot(jnp.array([BUY]), 6) * 0.9 + 0.1 / 6, jnp.asarray(no_view.probs)])
    status = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.asarray(no_view.status, jnp.int32)])
    advice = table_with(3, [0, 1], probs, jnp.full(2, 0.8), status, flat)  # env 2 has no advice
    assert view(advice, cfg, bars_of(3), flat).valid.tolist() == [True, False, False]

    n_obs = N_BAR_FEATURES + N_POSITION
    network = make_network(NetworkConfig(), 6)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, n_obs)))
    policy_sells = jnp.tile(jnp.log(jnp.array([[0.1, 0.1, 0.8, 1e-9, 1e-9, 1e-9]])), (3, 1))
    action, learn_action, _, _, extras, _ = acting.act(
        network, params, acting.init_carry(3, params_for(3)).replace(advice=advice), policy_sells,
        jnp.ones((3, 6), bool), jnp.zeros((3, n_obs)), state_of(flat), None, jax.random.PRNGKey(1))
    assert action.tolist() == [BUY, SELL, SELL] and learn_action.tolist() == [SELL] * 3
    assert extras.pg_weight.tolist() == [0.0, 1.0, 1.0]
    assert acting.trust_gate() == (None, 0)  # nothing is learned about trust


@pytest.mark.nojit
def test_win_rate_rule_fires_below_the_brackets_break_even_less_the_margin():
    """A 1.5-ATR stop / 3-ATR target bracket breaks even at 1.5 / 4.5 = 33% wins: 3 wins in 10 (which the old fixed
    40% rule vetoed) is no verdict, 2 in 10 is below 33% − 10%; a margin as large as the break-even turns it off.
    `auto` (binomial, 5%): 1 win in 10 has probability 10.4% at 1/3 and is no verdict; 0 in 10 (1.7%) is, 0 in 7
    (5.9%) is not, 0 in 8 (3.9%) is."""
    from agents.advice.risk_veto import break_even_win_rate

    state, params = env_states(trades=10, recent_wins=0b0000000111, recent_count=10)
    assert float(break_even_win_rate(params)) == pytest.approx(1 / 3)
    auto = VetoConfig(consecutive_losses=0, min_drawdown_buffer=0.0)
    for wins, count, fires in ((1, 10, False), (0, 10, True), (0, 7, False), (0, 8, True)):
        case = state.replace(recent_wins=jnp.full_like(state.recent_wins, wins),
                             recent_count=jnp.full_like(state.recent_count, count))
        assert bool(apply_veto(auto, VetoState.create(1), case, params, ALL)[2][0, 2]) == fires, (wins, count)
    cfg = VetoConfig(consecutive_losses=0, min_drawdown_buffer=0.0, win_rate_margin=0.1)
    assert not bool(apply_veto(cfg, VetoState.create(1), state, params, ALL)[2].any())
    worse = state.replace(recent_wins=jnp.full_like(state.recent_wins, 0b0000000011))
    assert apply_veto(cfg, VetoState.create(1), worse, params, ALL)[2][0].tolist() == [False, False, True]
    off = VetoConfig(consecutive_losses=0, min_drawdown_buffer=0.0, win_rate_margin=1.0)
    assert not bool(apply_veto(off, VetoState.create(1), worse.replace(recent_wins=jnp.zeros_like(state.recent_wins)),
                               params, ALL)[2].any())


@pytest.mark.nojit
def test_a_flat_env_whose_key_is_in_flight_waits_for_the_answer():
    """query.wait_for_answer: a flat env with no answer in force may not enter while the key it reads now is in
    flight; once answered, in a position, or for the policy alone (rl_only ablation), nothing is held back. Bound on
    trust, an env whose running trust has fallen to min_trust or below does not wait."""
    import dataclasses

    cfg = QueryConfig(interval=K, wait_for_answer=True, bind_on="always")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    carry = acting.init_carry(3, params_for(3))
    side = jnp.array([0, 0, 1])
    keys = key_for([0, 2], side[jnp.array([0, 2])])  # envs 0 and 2's keys are asked, env 1's not
    advice = carry.advice.mark_asked(keys, jnp.ones(2, bool))
    carry = carry.replace(advice=advice)
    now = view(advice, cfg, bars_of(3), side)
    assert now.asked.tolist() == [True, False, True]
    assert waiting(acting, carry, side, now).tolist() == [True, False, False]  # env 2 is long: no entry to hold back
    assert not bool(waiting(dataclasses.replace(acting, fusion="none"), carry, side, now).any())
    answered_now = advice.write(keys, jnp.full((2, 6), 1 / 6), jnp.full(2, 0.8), jnp.zeros(2, jnp.int32),
                                jnp.zeros(2, jnp.int32), jnp.ones(2, bool))
    assert not bool(waiting(acting, carry, side, view(answered_now, cfg, bars_of(3), side)).any())
    gated = dataclasses.replace(acting, query=dataclasses.replace(cfg, bind_on="trust", min_trust=0.05))
    assert waiting(gated, carry.replace(trust=jnp.array([0.05, 1.0, 1.0])), side, now).tolist() == [False] * 3
    assert waiting(gated, carry, side, now).tolist() == [True, False, False]


def act_on_window_one(learned, n_envs: int):
    """`act(acting, carry, side) -> (mask, carry)`: an acting step with all actions valid, on a network with the
    trust gate of `learned`, for window-1 observations of zeros (the fusion context reads the bar's and the
    position's columns)."""
    from agents.config import NetworkConfig
    from agents.rl.networks import make_network
    from jaxenv.env import N_BAR_FEATURES, N_POSITION

    n_obs = N_BAR_FEATURES + N_POSITION
    network = make_network(NetworkConfig(), 6, *learned.trust_gate())
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, n_obs)))
    env_params = params_for(n_envs)

    def act(acting, carry, side):
        """`side`: the envs' position sides, or their whole env state (which the veto reads)."""
        state = side if hasattr(side, "side") else state_of(side)
        out = acting.act(network, params, carry, jnp.zeros((n_envs, 6)), jnp.ones((n_envs, 6), bool),
                         jnp.zeros((n_envs, n_obs)), state, env_params, jax.random.PRNGKey(1))
        return out[3], out[5]

    return act


def test_a_trade_entered_on_trusted_advice_keeps_its_bracket_until_it_closes():
    """query.keep_advised_bracket: the policy may not move the stop of a trade entered with (trusted) advice in force;
    it may in a trade it entered alone, or entered on advice whose running trust was too low, and after the exit."""
    import dataclasses

    from agents.advice.rules import STOP_MOVES
    from bridge.protocol import ACTIONS

    cfg = QueryConfig(interval=K, keep_advised_bracket=True, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    carry = acting.init_carry(3, params_for(3))
    flat = jnp.zeros(3, jnp.int32)
    advice = table_with(3, [0, 1], jnp.full((2, 6), 1 / 6), jnp.full(2, 0.8), jnp.zeros(2), flat)  # env 2: none
    carry = carry.replace(advice=advice, trust=jnp.array([1.0, 0.01, 1.0]))  # env 1's advisor is ignored by now
    assert view(advice, cfg, bars_of(3), flat).valid.tolist() == [True, True, False]
    act = act_on_window_one(acting, 3)

    # the three envs decide while flat and all enter
    _, carry = act(acting, carry, flat)
    assert carry.advised_trade.tolist() == [True, False, False]
    entered = carry
    mask, carry = act(acting, carry, jnp.ones(3, jnp.int32))
    moves = np.asarray(mask)[:, list(STOP_MOVES)]
    assert not moves[0].any() and moves[1].all() and moves[2].all()
    assert {ACTIONS[a] for a in STOP_MOVES} == {"MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL"}
    assert bool(np.asarray(mask)[0, 0])  # HOLD stays
    # the trades close; the next ones, entered with no advice in force, are the policy's to manage
    _, carry = act(acting, carry.replace(advice=AdviceTable.create(4 * APART * SIDES)), flat)
    mask, carry = act(acting, carry, jnp.ones(3, jnp.int32))
    assert np.asarray(mask)[:, list(STOP_MOVES)].all()
    # off (the default), or for the policy alone (rl_only ablation), nothing is held back
    for other in (dataclasses.replace(acting, query=dataclasses.replace(cfg, keep_advised_bracket=False)),
                  dataclasses.replace(acting, fusion="none")):
        mask, _ = act(other, entered, jnp.ones(3, jnp.int32))
        assert np.asarray(mask)[:, list(STOP_MOVES)].all()


def test_an_env_that_trusts_its_advice_enters_only_on_the_side_the_advice_names():
    """query.advised_entries_only: a flat env whose running trust is above min_trust may enter only on the side
    its valid advice names (not at all without advice, nor on HOLD advice); an env whose advisor the gate ignores
    enters as it likes, and so does every env with the option off or for the policy alone."""
    import dataclasses

    cfg = QueryConfig(interval=K, advised_entries_only=True, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(4, jnp.int32)
    probs = jax.nn.one_hot(jnp.array([BUY, SELL, HOLD]), 6) * 0.9 + 0.1 / 6
    advice = table_with(4, [0, 1, 3], probs, jnp.full(3, 0.8), jnp.zeros(3), flat)  # env 2 has no advice
    # env 1's advisor is ignored by now (running trust below min_trust)
    carry = acting.init_carry(4, params_for(4)).replace(advice=advice, trust=jnp.array([1.0, 0.01, 1.0, 1.0]))
    assert view(advice, cfg, bars_of(4), flat).valid.tolist() == [True, True, False, True]

    act = act_on_window_one(acting, 4)

    def entries(acting):
        mask, _ = act(acting, carry, flat)
        return np.asarray(mask)[:, [BUY, SELL]].tolist()

    assert entries(acting) == [[True, False], [True, True], [False, False], [False, False]]
    for other in (dataclasses.replace(acting, query=dataclasses.replace(cfg, advised_entries_only=False)),
                  dataclasses.replace(acting, fusion="none")):
        assert entries(other) == [[True, True]] * 4


def test_near_the_drawdown_limit_a_bound_env_enters_only_where_its_advice_names_the_side():
    """veto.advised_only_below: an account within that share of the trailing drawdown, bound to advice it has reason
    to trust (its running trust here), enters only on the side its valid advice names. Further from the limit,
    unbound, with the rule off, where every env is always bound (no trust kept), or for the policy alone, it enters
    as it likes."""
    import dataclasses

    state, params = env_states()
    # equity 48,500 against a threshold of 47,500: 0.4 of the 2,500 trailing drawdown left (the buffer rule fires
    # below 0.2); env 2 is at its peak, 1.0 left
    state = jax.tree.map(lambda x: jnp.repeat(x, 4, axis=0), state)
    state = state.replace(equity=jnp.array([48_500.0, 48_500.0, 50_000.0, 48_500.0]),
                          t=state.t + jnp.arange(4, dtype=state.t.dtype) * APART * K)  # apart: no env reads another's
    cfg = QueryConfig(interval=K, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig())
    assert acting.veto.advised_only_below == 0.5  # on by default
    env_0 = (state.t[0] // K - 1) * SIDES + 1  # env 0's flat key: BUY
    advice = AdviceTable.create(int(state.t[-1] // K + 2) * SIDES).write(
        env_0[None], jax.nn.one_hot(jnp.array([BUY]), 6) * 0.9 + 0.1 / 6, jnp.full(1, 0.8), jnp.zeros(1, jnp.int32),
        jnp.zeros(1, jnp.int32), jnp.ones(1, bool))
    carry = acting.init_carry(4, params).replace(advice=advice, trust=jnp.array([1.0, 1.0, 1.0, 0.01]))  # env 3 unbound
    network_act = act_on_window_one(acting, 4)

    def entries(acting):
        mask, _ = network_act(acting, carry, state)
        return np.asarray(mask)[:, [BUY, SELL]].tolist()

    assert entries(acting) == [[True, False], [False, False], [True, True], [True, True]]
    for other in (dataclasses.replace(acting, veto=VetoConfig(advised_only_below=0.0)),
                  dataclasses.replace(acting, query=dataclasses.replace(cfg, bind_on="always")),
                  dataclasses.replace(acting, fusion="none")):
        assert entries(other) == [[True, True]] * 4


def test_an_env_bound_to_its_advice_enters_alone_where_its_advisor_passes():
    """query.advised_entries_only with a PASS advisor: where the answer in force is PASS (no view) the policy may enter
    on its own; where no answer is in force it may not."""
    cfg = QueryConfig(interval=K, advised_entries_only=True, bind_on="always")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(2, jnp.int32)
    advice = table_with(2, [0], jnp.full((1, 6), 1 / 6), jnp.zeros(1), [STATUS_NO_VIEW], flat)  # env 1: none
    carry = acting.init_carry(2, params_for(2)).replace(advice=advice)
    mask, _ = act_on_window_one(acting, 2)(acting, carry, flat)
    assert np.asarray(mask)[:, [BUY, SELL]].tolist() == [[True, True], [False, False]]


@pytest.mark.nojit
@pytest.mark.parametrize("n_valid", [3, 40])  # 3 of 64 rows: the gathered block; 40: every row
def test_trust_gate_on_the_valid_rows_alone_equals_the_gate_on_every_row(n_valid):
    from agents.advice.acting import trust_where_valid
    from agents.config import NetworkConfig
    from agents.rl.networks import make_network

    n, width = 64, 23
    network = make_network(NetworkConfig(), 6, TrustGate(), width)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 10)))
    # a gate that is not constant, so that a row's value tells which features it saw
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(1), x.shape), params)
    features = jax.random.normal(jax.random.PRNGKey(2), (n, width))
    valid = jnp.zeros(n, bool).at[jax.random.permutation(jax.random.PRNGKey(3), n)[:n_valid]].set(True)

    def full(f):
        return jnp.where(valid, network.apply(params, f, method="trust"), 0.0)

    gate = trust_where_valid(network, params, features, valid)
    np.testing.assert_allclose(gate, full(features), rtol=1e-6, atol=1e-7)
    assert (np.asarray(gate)[~np.asarray(valid)] == 0).all() and (np.asarray(gate)[np.asarray(valid)] > 0).all()
    # gradients reach the features (the policy's probabilities are among them) the same way
    grad = jax.grad(lambda f: trust_where_valid(network, params, f, valid).sum())(features)
    np.testing.assert_allclose(grad, jax.grad(lambda f: full(f).sum())(features), rtol=1e-5, atol=1e-7)


def test_the_advice_record_counts_one_call_per_key_held_for_the_advice_lifetime():
    """query.bind_on=record: a call is a flat key's answer naming BUY or SELL (status OK), counted once however many
    envs read it. It is held on paper from the close of the first bar of the block after its own for the advice's
    lifetime (or to its session's last bar), less a round trip's costs; PASS answers, other sides' keys and calls not
    yet settled at a walk's bar do not count. Sessions are counted whole and in time order: one with a key not yet
    answered, or a call not yet settled, stops the count there."""
    from agents.advice.record import market_calls, session_evidence
    from jaxenv.env import CAN_ENTER, SESSION

    env = TradingEnv()
    market = HandMarket(days=3).build()
    market.close = 18_000.0 + np.arange(market.num_bars, dtype=np.float64)  # +1 point a bar
    params = env.make_params(market, (20, market.num_bars))
    session, can_enter = (np.asarray(params.bars[:, c]) for c in (SESSION, CAN_ENTER))
    blocks = -(-market.num_bars // K)
    horizon = 30
    b0 = int(params.start_bar) // K + 1  # the split's first blocks (after the features' warm-up)
    first_end = int(np.flatnonzero(np.diff(session))[1])  # the split's first session's last bar
    b_long, b_short, b_pass, b_side, b_next = b0, b0 + 1, b0 + 2, b0 + 3, first_end // K + 2
    b_cut = int(np.flatnonzero([can_enter[(b + 1) * K] > 0 and (b + 1) * K + horizon > first_end
                                for b in range(first_end // K)])[0])  # its lifetime crosses the session's end
    every_flat = jnp.arange(blocks) * SIDES + 1  # every flat key answered PASS (no call), then the calls
    table = AdviceTable.create(blocks * SIDES).write(every_flat, jnp.full((blocks, 6), 1 / 6), jnp.zeros(blocks),
                                                     jnp.full(blocks, STATUS_NO_VIEW), jnp.zeros(blocks, jnp.int32),
                                                     jnp.ones(blocks, bool))
    keys = jnp.array([b * SIDES + 1 for b in (b_long, b_short, b_pass, b_next, b_cut)] + [b_side * SIDES])
    probs = jax.nn.one_hot(jnp.array([BUY, SELL, HOLD, BUY, BUY, BUY]), 6)
    status = jnp.array([STATUS_OK, STATUS_OK, STATUS_NO_VIEW, STATUS_OK, STATUS_OK, STATUS_OK])
    table = table.write(keys, probs, jnp.ones(6), status, jnp.zeros(6, jnp.int32), jnp.ones(6, bool))
    calls = jax.device_get(market_calls(table, params, K, horizon))
    value, cost = 20.0, 2 * (2.14 + 0.25 * 20.0)  # NQ: $20 a point; commission and a tick's slippage a side
    assert np.flatnonzero(calls.made).tolist() == sorted([b_long, b_short, b_cut, b_next])
    assert calls.pnl[b_long] == pytest.approx(horizon * value - cost)
    assert calls.pnl[b_short] == pytest.approx(-horizon * value - cost)
    assert calls.settled_at[b_long] == (b_long + 1) * K + horizon
    assert calls.settled_at[b_cut] == first_end
    assert calls.pnl[b_cut] == pytest.approx((first_end - (b_cut + 1) * K) * value - cost)
    # a walk counts a session once all its calls are settled; training (every call of the split) counts them all
    scale = 2_500.0

    def counted(calls, upto):
        evidence, n, _ = jax.device_get(session_evidence(calls, jnp.asarray(upto), scale))
        return float(evidence.sessions), int(n), float(evidence.pnl)

    first = float(calls.pnl[[b_long, b_short, b_cut]].sum())
    assert counted(calls, first_end - 1) == (0, 0, 0.0)  # b_cut settles at the session's last bar
    assert counted(calls, first_end) == (1, 3, pytest.approx(first))
    assert counted(calls, 10_000) == (2, 4, pytest.approx(first + float(calls.pnl[b_next])))  # b_next: next session
    # a key of the first session not answered yet: nothing is counted, not even the complete session after it
    hole = jax.device_get(market_calls(table.replace(status=table.status.at[b_pass * SIDES + 1].set(STATUS_NONE)),
                                       params, K, horizon))
    assert counted(hole, 10_000) == (0, 0, 0.0)
    # ... and the record wants that key: training asks it where no env does
    assert np.asarray(session_evidence(hole, jnp.asarray(10_000), scale)[2]).tolist() == [b_pass, b_pass + 1]
    assert np.asarray(session_evidence(calls, jnp.asarray(10_000), scale)[2]).tolist() == [blocks, 0]  # none


def test_the_record_binds_on_a_betting_e_process_over_sessions_and_lets_go_without_evidence():
    """query.bind_on=record: the envs are bound once the betting e-process over the sessions' P&L reaches
    E >= 1/ALPHA, and let go once E < 1. However strong the sessions, it takes eleven of them. A walk from a
    checkpoint starts from the record saved in it, bound."""
    from agents.advice.record import AdviceRecord
    from agents.evidence.eprocess import Evidence, passes

    scale = 100.0

    def evidence(session_pnl) -> Evidence:
        return Evidence.zero().add(np.asarray(session_pnl, np.float32), scale)

    spread = np.array([-50.0, 50.0])
    assert not bool(passes(evidence([1_000.0] * 10), False))  # 10 sessions at the range's top: not yet ...
    assert bool(passes(evidence([1_000.0] * 11), False))  # ... the eleventh binds
    weak = evidence(np.tile(spread, 20) + 10.0)  # mean 0.1 of the range, spread 0.5
    assert not bool(passes(weak, False))
    strong = evidence(np.tile(spread, 40) + 40.0)
    assert bool(passes(strong, False))
    assert bool(passes(weak, True))  # bound stays bound while there is evidence left (E >= 1) ...
    assert not bool(passes(evidence(np.tile(spread, 20) - 20.0), True))  # ... and lets go without it

    cfg = QueryConfig(interval=K, advised_entries_only=True, bind_on="record")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(2, jnp.int32)
    advice = table_with(2, [0], jax.nn.one_hot(jnp.array([BUY]), 6), jnp.ones(1), [STATUS_OK], flat)
    start = acting.init_carry(2, params_for(2)).replace(advice=advice)

    def entries_allowed(carry) -> list:
        mask, _ = act_on_window_one(acting, 2)(acting, carry, flat)
        return np.asarray(mask)[:, [BUY, SELL]].tolist()

    bound_record = AdviceRecord(Evidence.zero(), strong, jnp.zeros(()), jnp.asarray(True), jnp.zeros(2, jnp.int32))
    assert entries_allowed(start) == [[True, True], [True, True]]  # no record yet
    # bound: env 0 may enter only on the advised side, env 1 (no advice) not on its own
    assert entries_allowed(start.replace(record=bound_record)) == [[True, False], [False, False]]
    # a walk from a checkpoint (restored as dicts) starts bound, its evidence carried
    saved = jax.tree.map(np.asarray, bound_record)
    walk = acting.carry_for_walk(params_for(1), {"carried": vars(saved.carried), "evidence": vars(saved.evidence),
                                                 "calls": saved.calls, "bound": saved.bound,
                                                 "wanted": saved.wanted})
    assert bool(walk.record.bound) and float(walk.record.carried.pnl) == float(strong.pnl)
    # a record of an earlier test (a tally of calls) is not read: the walk starts from none
    assert not bool(acting.carry_for_walk(params_for(1), {"tally": {}, "bound": True}).record.bound)
