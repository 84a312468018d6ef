"""Risk veto, fusion and query selection: the vectorised pieces of the hybrid loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.advice.fusion import TrustGate, fusion_features, masked_advice_probs, mix, rules_action
from agents.advice.risk_veto import VetoState, apply_veto
from agents.advice.table import AdviceTable, select_queries, view
from agents.config import QueryConfig, VetoConfig
from bridge.protocol import BUY, ENABLE_TRAIL, HOLD, SELL
from jaxenv.config import EnvConfig
from jaxenv.env import TradingEnv
from tests.conftest import HandMarket, bar_at

ALL = jnp.ones((1, 6), bool)


def acting_with(fusion: str, query: QueryConfig, veto: VetoConfig):
    """The acting step of `fusion` for window-1 short observations (the trust gate's context read from them)."""
    from agents.advice.acting import CONTEXT_FEATURES, HybridActing

    env = TradingEnv(EnvConfig(window=1, extended_features=False))
    return HybridActing(fusion, query, veto, 0.3, tuple(env.observation_column(c) for c in CONTEXT_FEATURES))


def waiting(acting, carry, side, advice):
    """[N] bool: the flat envs the wait holds out of the market (the entry rules, on every action valid)."""
    import types

    rules = acting.rules.apply(carry.rule_state(), carry.advice, advice, types.SimpleNamespace(side=side), None,
                               jnp.ones((side.shape[0], 6), bool))
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
def test_advice_table_decays_expires_and_selection_respects_budget():
    cfg = QueryConfig(interval=5, cooldown=10, decay=0.8, max_age_intervals=2)
    table = AdviceTable.create(4)
    probs = jnp.tile(jnp.array([0.1, 0.6, 0.1, 0.1, 0.05, 0.05]), (4, 1))
    table = table.write(jnp.array([0, 1, 2, 3]), probs, jnp.full(4, 0.6), jnp.array([0, 0, 1, 0]), jnp.array([True, True, True, False]))
    for _ in range(5):
        table = table.tick()
    v = view(table, cfg, jnp.zeros(4, jnp.int32))
    assert v.valid.tolist() == [True, True, False, False]  # env 2 had a parse error; env 3 was padding
    np.testing.assert_allclose(v.confidence[:2], 0.6 * 0.8, rtol=1e-5)  # one interval old
    for _ in range(6):
        table = table.tick()
    assert not bool(view(table, cfg, jnp.zeros(4, jnp.int32)).valid.any())  # older than 2 intervals: expired

    pi = jnp.array([[0.9, 0.02, 0.02, 0.02, 0.02, 0.02], [0.4, 0.3, 0.3, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0], [0.3, 0.3, 0.4, 0, 0, 0]])
    long = jnp.ones(4, jnp.int32)
    ids, ok = select_queries(AdviceTable.create(4), cfg, 2, pi, long, jnp.zeros(4, bool))
    assert ok.tolist() == [True, True] and sorted(ids.tolist()) == [1, 3]  # the two most uncertain
    table = AdviceTable.create(4).mark_queried(jnp.array([1, 3]), jnp.array([True, True]), long)
    ids, ok = select_queries(table, cfg, 2, pi, long, jnp.zeros(4, bool))
    assert ids[ok].tolist() == [2]  # 1 and 3 are cooling down, 0 is confident and not flat
    ids, ok = select_queries(table, cfg, 2, pi, jnp.array([0, 1, 1, 1]), jnp.zeros(4, bool))
    assert sorted(ids[ok].tolist()) == [0, 2]  # a flat env is a candidate however confident


@pytest.mark.nojit
def test_advice_holds_only_for_the_position_side_it_was_asked_about():
    """Envs 0 and 1 are asked while flat; env 0 goes long before the answer comes: its BUY advice is not in force
    while long, is again once flat, and a long env whose advice is about flat is a candidate again at once."""
    cfg = QueryConfig(interval=5, cooldown=0)
    flat = jnp.zeros(2, jnp.int32)
    table = AdviceTable.create(2).mark_queried(jnp.arange(2), jnp.ones(2, bool), flat)
    probs = jnp.tile(jnp.array([0.05, 0.75, 0.05, 0.05, 0.05, 0.05]), (2, 1))
    table = table.tick().write(jnp.arange(2), probs, jnp.full(2, 0.75), jnp.zeros(2, jnp.int32), jnp.ones(2, bool))
    now = jnp.array([1, 0])  # env 0 is long now
    assert view(table, cfg, now).valid.tolist() == [False, True]
    assert view(table, cfg, flat).valid.tolist() == [True, True]  # flat again: the advice applies again
    ids, ok = select_queries(table, cfg, 2, jnp.full((2, 6), 1 / 6), now, jnp.zeros(2, bool))
    assert ids[ok].tolist() == [0]  # env 1's flat advice is fresh: not asked again yet


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

    tbl = AdviceTable.create(1).write(jnp.array([0]), advice, jnp.array([0.9]), jnp.array([0]), jnp.array([True]))
    features = fusion_features(pi_rl, view(tbl, QueryConfig(), jnp.zeros(1, jnp.int32)), jnp.zeros((1, 6)))
    gate = TrustGate()
    g = gate.apply(gate.init(jax.random.PRNGKey(0), features), features)
    assert 0.05 < float(g[0]) < 0.2


@pytest.mark.nojit
def test_an_advisor_with_no_view_leaves_the_policy_acting_alone_where_hold_would_pull_it_out():
    """The news advisor flat without news: its HOLD (status ok) is advice in force that moves probability onto HOLD;
    its PASS (no_view) is no advice: the gate is 0, the acting distribution is the policy's, and the env is asked
    again at the next query step."""
    from agents.advice.acting import trust_where_valid
    from bridge.protocol import STATUS_NO_VIEW
    from llm_sidecar.backends import MockBackend

    quiet = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k"
    hold = MockBackend(answers="news").advise([quiet])
    no_view = MockBackend(answers="news_pass").advise([quiet])
    assert no_view.status.tolist() == [STATUS_NO_VIEW]
    cfg = QueryConfig(interval=5, cooldown=0)
    flat = jnp.zeros(2, jnp.int32)
    table = AdviceTable.create(2).mark_queried(jnp.arange(2), jnp.ones(2, bool), flat).tick()
    table = table.write(jnp.arange(2), jnp.asarray(np.concatenate([hold.probs, no_view.probs])),
                        jnp.asarray(np.concatenate([hold.confidence, no_view.confidence])),
                        jnp.asarray(np.concatenate([hold.status, no_view.status]), jnp.int32), jnp.ones(2, bool))
    advice = view(table, cfg, flat)
    assert advice.valid.tolist() == [True, False]
    pi_rl = jnp.tile(jnp.array([[0.2, 0.5, 0.3, 0.0, 0.0, 0.0]]), (2, 1))
    mask = jnp.tile(jnp.array([[True, True, True, False, False, False]]), (2, 1))
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    gate_half = constant_gate(0.5)
    gate = trust_where_valid(gate_half, None, fusion_features(pi_rl, advice, jnp.zeros((2, 6))), advice.valid)
    assert gate.tolist() == [0.5, 0.0]
    p = jnp.exp(acting.fused_log_probs(pi_rl, advice, gate, mask))
    assert float(p[0, HOLD]) > 0.2 + 0.1 and float(p[0, BUY]) < 0.5  # HOLD advice pulls the env out of the market
    np.testing.assert_allclose(p[1], pi_rl[1], atol=1e-6)  # no view: the policy alone
    for _ in range(cfg.interval):
        table = table.tick()
    ids, ok = select_queries(table, cfg, 2, pi_rl, flat, jnp.zeros(2, bool))
    assert sorted(ids[ok].tolist()) == [0, 1]  # both are asked again at the next query step


def constant_gate(g: float):
    """A stand-in network whose trust gate is `g` on every row (trust_where_valid calls network.apply)."""
    import types

    return types.SimpleNamespace(apply=lambda params, features, method=None: jnp.full(features.shape[:-1], g))


@pytest.mark.nojit
def test_rules_fusion_priorities():
    def advice_for(action, conf):
        probs = jax.nn.one_hot(jnp.array([action]), 6)
        tbl = AdviceTable.create(1).write(jnp.array([0]), probs, jnp.array([conf]), jnp.array([0]), jnp.array([True]))
        return view(tbl, QueryConfig(), jnp.zeros(1, jnp.int32))

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
    invalid = view(AdviceTable.create(1), QueryConfig(), jnp.zeros(1, jnp.int32))
    assert run(ENABLE_TRAIL, pi(BUY, 0.3), invalid) == ENABLE_TRAIL  # no advice: the policy's sample


def test_switch_fusion_lets_valid_advice_act_and_the_policy_everywhere_else():
    """fusion switch: a flat env with a view in force takes the advice's action; one whose advisor passed, or that has
    no advice, takes the policy's. The steps the advice decided carry no policy gradient."""
    import dataclasses
    import types

    from agents.config import NetworkConfig
    from agents.rl.networks import make_network
    from jaxenv.env import N_BAR_FEATURES, N_POSITION
    from llm_sidecar.backends import MockBackend

    quiet = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k"
    no_view = MockBackend(answers="news_pass").advise([quiet])
    cfg = QueryConfig(interval=5, cooldown=0, bind_on="always")
    acting = dataclasses.replace(acting_with("switch", cfg, VetoConfig(enabled=False)),
                                 greedy=True)
    flat = jnp.zeros(3, jnp.int32)
    asked = jnp.array([0, 1])  # env 2 has no advice
    probs = jnp.concatenate([jax.nn.one_hot(jnp.array([BUY]), 6) * 0.9 + 0.1 / 6, jnp.asarray(no_view.probs)])
    status = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.asarray(no_view.status, jnp.int32)])
    advice = AdviceTable.create(3).mark_queried(asked, jnp.ones(2, bool), flat).tick()
    advice = advice.write(asked, probs, jnp.full(2, 0.8), status, jnp.ones(2, bool))
    assert view(advice, cfg, flat).valid.tolist() == [True, False, False]

    n_obs = N_BAR_FEATURES + N_POSITION
    network = make_network(NetworkConfig(), 6)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, n_obs)))
    policy_sells = jnp.tile(jnp.log(jnp.array([[0.1, 0.1, 0.8, 1e-9, 1e-9, 1e-9]])), (3, 1))
    action, learn_action, _, _, extras, _ = acting.act(
        network, params, acting.init_carry(3).replace(advice=advice), policy_sells, jnp.ones((3, 6), bool),
        jnp.zeros((3, n_obs)), types.SimpleNamespace(side=flat), None, jax.random.PRNGKey(1))
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
def test_a_flat_env_with_a_question_in_flight_waits_for_the_answer():
    """query.wait_for_answer: between its question and the answer a flat env may not enter (HOLD and the rest stay),
    nor after an exit until it has advice for being flat; once answered, or in a position, or for the policy alone
    (rl_only ablation), nothing is held back."""
    from agents.advice.table import pending

    cfg = QueryConfig(interval=5, cooldown=0, wait_for_answer=True, bind_on="always")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    carry = acting.init_carry(3)
    side = jnp.array([0, 0, 1])
    advice = carry.advice.mark_queried(jnp.array([0, 2]), jnp.ones(2, bool), side)  # env 1 was not asked
    for _ in range(3):
        advice = advice.tick()
    carry = carry.replace(advice=advice)
    assert pending(advice, cfg).tolist() == [True, False, True]
    assert waiting(acting, carry, side, view(advice, cfg, side)).tolist() == [True, False, False]  # env 2 is long: no entry to hold back
    import dataclasses

    assert not bool(waiting(dataclasses.replace(acting, fusion="none"), carry, side, view(advice, cfg, side)).any())
    answered = advice.write(jnp.array([0, 2]), jnp.full((2, 6), 1 / 6), jnp.full(2, 0.8), jnp.zeros(2, jnp.int32),
                            jnp.ones(2, bool))
    assert not bool(pending(answered, cfg).any())
    # env 1 exited a trade (changed) and has no advice: it waits for the question the next query step asks it;
    # env 0 has its answer: it may enter although it changed too
    exited = carry.replace(advice=answered, changed=jnp.array([True, True, False]))
    assert waiting(acting, exited, side, view(answered, cfg, side)).tolist() == [False, True, False]
    for _ in range(10):  # an answer that never comes stops holding the env after two intervals
        advice = advice.tick()
    assert not bool(pending(advice, cfg).any())
    # bind_on trust: an env whose running trust in its advice has fallen to it or below enters without waiting
    gated = dataclasses.replace(acting, query=dataclasses.replace(cfg, bind_on="trust", min_trust=0.05))
    low = exited.replace(trust=jnp.array([1.0, 0.05, 1.0]))
    assert waiting(gated, low, side, view(answered, cfg, side)).tolist() == [False, False, False]
    assert waiting(gated, exited, side, view(answered, cfg, side)).tolist() == [False, True, False]


@pytest.mark.nojit
def test_a_flat_env_whose_advisor_passed_does_not_wait_for_its_next_answer():
    """query.wait_for_answer with an advisor that can say PASS: a flat env whose latest answer was HOLD waits for the
    answer to its next question, but one whose latest answer was PASS does not: the advisor said it has no view,
    and the agent would otherwise sit out every quiet spell waiting for passes. Once the advisor answers with a
    view again, the env waits as before."""
    from agents.advice.table import pending
    from llm_sidecar.backends import MockBackend

    quiet = "10:00 ES 4500 ADX40 RSI20 VWAP-0.2 mom-0.5 flat pnl+0 win50% loss0 bal50k"
    hold, no_view = MockBackend(answers="news").advise([quiet]), MockBackend(answers="news_pass").advise([quiet])
    cfg = QueryConfig(interval=5, cooldown=0, wait_for_answer=True, bind_on="always")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat, both = jnp.zeros(2, jnp.int32), jnp.ones(2, bool)

    def answer(table, answers):
        return table.write(jnp.arange(2), jnp.asarray(np.concatenate([a.probs for a in answers])),
                           jnp.asarray(np.concatenate([a.confidence for a in answers])),
                           jnp.asarray(np.concatenate([a.status for a in answers]), jnp.int32), both)

    def ask_again(table):
        for _ in range(cfg.interval):
            table = table.tick()
        return table.mark_queried(jnp.arange(2), both, flat).tick()

    table = ask_again(answer(AdviceTable.create(2).mark_queried(jnp.arange(2), both, flat).tick(), [hold, no_view]))
    assert pending(table, cfg).tolist() == [True, True]
    carry = acting.init_carry(2).replace(advice=table)
    assert waiting(acting, carry, flat, view(table, cfg, flat)).tolist() == [True, False]
    # the advisor has a view again (HOLD for env 1 this time): its next question is waited for
    table = ask_again(answer(table, [hold, hold]))
    assert waiting(acting, carry.replace(advice=table), flat, view(table, cfg, flat)).tolist() == [True, True]


def act_on_window_one(learned, n_envs: int):
    """`act(acting, carry, side) -> (mask, carry)`: an acting step with all actions valid, on a network with the
    trust gate of `learned`, for window-1 observations of zeros (the fusion context reads the bar's and the
    position's columns)."""
    import types

    from agents.config import NetworkConfig
    from agents.rl.networks import make_network
    from jaxenv.env import N_BAR_FEATURES, N_POSITION, EnvParams

    n_obs = N_BAR_FEATURES + N_POSITION
    network = make_network(NetworkConfig(), 6, *learned.trust_gate())
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, n_obs)))

    env_params = EnvParams(bars=jnp.zeros((2, 8)))  # the record reads the decision bar's close

    def act(acting, carry, side):
        """`side`: the envs' position sides, or their whole env state (which the veto reads)."""
        state = side if hasattr(side, "side") else types.SimpleNamespace(side=side, t=jnp.zeros_like(side))
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

    cfg = QueryConfig(interval=5, cooldown=0, keep_advised_bracket=True, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    carry = acting.init_carry(3)
    flat = jnp.zeros(3, jnp.int32)
    advice = carry.advice.mark_queried(jnp.array([0, 1]), jnp.ones(2, bool), flat)  # env 2 has no advice
    advice = advice.tick().write(jnp.array([0, 1]), jnp.full((2, 6), 1 / 6), jnp.full(2, 0.8), jnp.zeros(2, jnp.int32),
                                 jnp.ones(2, bool))
    carry = carry.replace(advice=advice, trust=jnp.array([1.0, 0.01, 1.0]))  # env 1's advisor is ignored by now
    assert view(advice, cfg, flat).valid.tolist() == [True, True, False]
    act = act_on_window_one(acting, 3)

    def step(carry, side, entered, exited):
        mask, carry = act(acting, carry, side)
        return mask, acting.after_step(carry, {"entry_side": entered, "exit_reason": exited,
                                               "trade_pnl": jnp.zeros(3)})

    # the three envs decide while flat and all enter (the env fills the entry on the same step)
    _, carry = step(carry, flat, jnp.array([1, 1, 1]), jnp.zeros(3, jnp.int32))
    assert carry.advised_trade.tolist() == [True, False, False]
    entered = carry
    mask, carry = step(carry, jnp.ones(3, jnp.int32), jnp.zeros(3, jnp.int32), jnp.array([0, 0, 1]))
    moves = np.asarray(mask)[:, list(STOP_MOVES)]
    assert not moves[0].any() and moves[1].all() and moves[2].all()
    assert {ACTIONS[a] for a in STOP_MOVES} == {"MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL"}
    assert bool(np.asarray(mask)[0, 0])  # HOLD stays
    # the trades close; the next ones, entered with no advice in force, are the policy's to manage
    _, carry = step(carry, jnp.ones(3, jnp.int32), jnp.zeros(3, jnp.int32), jnp.array([1, 1, 0]))
    _, carry = step(carry.replace(advice=AdviceTable.create(3)), flat, jnp.array([1, 1, 1]), jnp.zeros(3, jnp.int32))
    mask, carry = step(carry, jnp.ones(3, jnp.int32), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32))
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


    cfg = QueryConfig(interval=5, cooldown=0, advised_entries_only=True, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(4, jnp.int32)
    asked = jnp.array([0, 1, 3])  # env 2 has no advice
    probs = jax.nn.one_hot(jnp.array([BUY, SELL, HOLD]), 6) * 0.9 + 0.1 / 6
    advice = acting.init_carry(4).advice.mark_queried(asked, jnp.ones(3, bool), flat)
    advice = advice.tick().write(asked, probs, jnp.full(3, 0.8), jnp.zeros(3, jnp.int32), jnp.ones(3, bool))
    # env 1's advisor is ignored by now (running trust below min_trust)
    carry = acting.init_carry(4).replace(advice=advice, trust=jnp.array([1.0, 0.01, 1.0, 1.0]))
    assert view(advice, cfg, flat).valid.tolist() == [True, True, False, True]

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
    state = state.replace(equity=jnp.array([48_500.0, 48_500.0, 50_000.0, 48_500.0]))
    cfg = QueryConfig(interval=5, cooldown=0, wait_for_answer=True, bind_on="trust", min_trust=0.05)
    acting = acting_with("learned", cfg, VetoConfig())
    assert acting.veto.advised_only_below == 0.5  # on by default
    flat = jnp.zeros(4, jnp.int32)
    advice = acting.init_carry(4).advice.mark_queried(jnp.array([0]), jnp.ones(1, bool), flat)
    advice = advice.tick().write(jnp.array([0]), jax.nn.one_hot(jnp.array([BUY]), 6) * 0.9 + 0.1 / 6,
                                 jnp.full(1, 0.8), jnp.zeros(1, jnp.int32), jnp.ones(1, bool))  # env 0: BUY
    carry = acting.init_carry(4).replace(advice=advice, trust=jnp.array([1.0, 1.0, 1.0, 0.01]))  # env 3 unbound
    network_act = act_on_window_one(acting, 4)

    def entries(acting):
        mask, _ = network_act(acting, carry, state)
        return np.asarray(mask)[:, [BUY, SELL]].tolist()

    assert entries(acting) == [[True, False], [False, False], [True, True], [True, True]]
    for other in (dataclasses.replace(acting, veto=VetoConfig(advised_only_below=0.0)),
                  dataclasses.replace(acting, query=dataclasses.replace(cfg, bind_on="always")),
                  dataclasses.replace(acting, fusion="none")):
        assert entries(other) == [[True, True]] * 4


def test_an_env_bound_to_its_advice_enters_alone_where_its_advisor_passes_but_not_straight_after_a_trade():
    """query.advised_entries_only with a PASS advisor: where the answer in force is PASS (no view) the policy may enter
    on its own, but not after a fill or an exit until the env is asked again."""
    from bridge.protocol import STATUS_NO_VIEW

    cfg = QueryConfig(interval=5, cooldown=0, advised_entries_only=True, bind_on="always")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(2, jnp.int32)
    both = jnp.array([0, 1])
    advice = acting.init_carry(2).advice.mark_queried(both, jnp.ones(2, bool), flat)
    advice = advice.tick().write(both, jnp.full((2, 6), 1 / 6), jnp.zeros(2), jnp.full(2, STATUS_NO_VIEW, jnp.int32),
                                 jnp.ones(2, bool))
    carry = acting.init_carry(2).replace(advice=advice, changed=jnp.array([False, True]))  # env 1 traded since
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


def test_the_advice_record_settles_each_call_after_the_advice_lifetime_or_at_a_reset():
    """query.bind_on=record: a call (+1/−1) is held on paper from its decision bar's close for `horizon` steps; its
    P&L is side × move × value − cost, whatever the agent did meanwhile. A call whose env starts a new episode (after
    a breach, say) is settled at the last close before it, not dropped: dropping it would drop the losers."""
    from agents.advice.rules import AdviceRecord

    r = AdviceRecord.create(3)
    t, close = jnp.array([10, 50, 90]), jnp.array([100.0, 100.0, 100.0])
    r = r.step(t, close, jnp.array([1, -1, 1]), horizon=2, value=20.0, cost=5.0, memory=1000)  # three calls start
    assert np.asarray(r.side).tolist() == [1, -1, 1] and float(r.calls.weight) == 0
    # one step on: env 2 was reset to bar 7 (a new episode): its call is settled at the close before, 100: −5; a new
    # call (env 0's) waits for a free slot
    r = r.step(jnp.array([11, 51, 7]), jnp.array([101.0, 99.0, 50.0]), jnp.array([-1, 0, 0]), 2, 20.0, 5.0, 1000)
    assert np.asarray(r.side).tolist() == [1, -1, 0]
    assert float(r.calls.weight) == 1.0 and float(r.calls.total) == pytest.approx(-5.0)
    r = r.step(jnp.array([12, 52, 8]), jnp.array([103.0, 104.0, 50.0]), jnp.zeros(3, jnp.int32), 2, 20.0, 5.0, 1000)
    # env 0: long 100 → 103: 3 × 20 − 5 = 55; env 1: short 100 → 104: −4 × 20 − 5 = −85
    assert float(r.calls.weight) == pytest.approx(3.0, abs=1e-2)
    assert float(r.calls.total) == pytest.approx(-5.0 + 55.0 - 85.0, abs=0.2)
    assert np.asarray(r.side).tolist() == [0, 0, 0]


def test_the_advice_binds_envs_once_its_calls_earn_by_four_standard_errors_until_under_two():
    """query.bind_on=record: the advice's record, not the gate, binds envs to it. Once its calls' paper P&L is above 0
    by over four standard errors, a flat env may enter only on the advice's side (advised entries only), until it is
    above 0 by under two; otherwise on either side. A walk from a checkpoint starts from the record saved in it."""
    from agents.advice.rules import RECORD_MIN_CALLS
    from bridge.protocol import STATUS_OK

    cfg = QueryConfig(interval=5, cooldown=0, advised_entries_only=True, bind_on="record")
    acting = acting_with("learned", cfg, VetoConfig(enabled=False))
    flat = jnp.zeros(2, jnp.int32)
    env_0 = jnp.array([0])  # env 0 is advised to buy; env 1 has no advice
    advice = acting.init_carry(2).advice.mark_queried(env_0, jnp.ones(1, bool), flat)
    advice = advice.tick().write(env_0, jax.nn.one_hot(jnp.array([BUY]), 6), jnp.ones(1),
                                 jnp.full(1, STATUS_OK, jnp.int32), jnp.ones(1, bool))
    start = acting.init_carry(2).replace(advice=advice)
    entries = [BUY, SELL]

    def entries_allowed(carry) -> list:
        mask, _ = act_on_window_one(acting, 2)(acting, carry, flat)
        return np.asarray(mask)[:, entries].tolist()

    def record_of(carry, pnl: list[float]):
        """The carry's record after calls with these paper P&Ls settled (one env's calls, horizon 1)."""
        r = carry.record
        for i, x in enumerate(pnl):
            r = r.step(jnp.array([2 * i, 0]), jnp.array([0.0, 0.0]), jnp.array([1, 0]), 1, 1.0, 0.0, cfg.record_calls)
            r = r.step(jnp.array([2 * i + 1, 0]), jnp.array([x, 0.0]), jnp.array([0, 0]), 1, 1.0, 0.0, cfg.record_calls)
        return carry.replace(record=r)

    free, bound = [[True, True], [True, True]], [[True, False], [False, False]]
    spread = [-40.0, 0.0, 40.0]
    assert entries_allowed(start) == free  # no record yet
    few = record_of(start, [100.0 + spread[i % 3] for i in range(RECORD_MIN_CALLS - 1)])
    assert entries_allowed(few) == free
    weak = record_of(start, [15.0 + spread[i % 3] for i in range(2 * RECORD_MIN_CALLS)])  # 3.5 standard errors
    assert entries_allowed(weak) == free
    paying = record_of(start, [100.0 + spread[i % 3] for i in range(2 * RECORD_MIN_CALLS)])
    # bound: env 0 may enter only on the advised side, env 1 (no advice) not on its own
    assert entries_allowed(paying) == bound
    assert entries_allowed(record_of(paying, [-30.0 + spread[i % 3] for i in range(60)])) == bound  # still over 2
    assert entries_allowed(record_of(paying, [-300.0 + spread[i % 3] for i in range(60)])) == free  # no longer

    # a walk from a checkpoint (restored as dicts) starts bound, with no call in flight
    saved = jax.tree.map(np.asarray, paying.record)
    walk = acting.carry_for_walk({"calls": vars(saved.calls), "bound": saved.bound})
    assert bool(walk.record.bound) and np.asarray(walk.record.side).tolist() == [0]
    assert float(walk.record.calls.weight) == float(paying.record.calls.weight)
