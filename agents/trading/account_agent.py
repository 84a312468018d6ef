"""A trained account agent (a run on several instruments, issue 77) deciding on joint bars as they arrive:
`AccountAgent(saved)`, then `on_bar({symbol: Bar | None})` at each bar time of the joint timeline.

    agent = AccountAgent(restore_policy("runs/pair", "best", account=True))
    if agent.advised:                             # trained with advice: each instrument's advisor (else none is read)
        agent.open_advisors()
    for bars in joint_bars:                       # {"NQ": Bar, "ES": None}: ES has no bar at this time (absent)
        decision = agent.on_bar(stamp, bars)      # None while the history warms up the features
        for symbol, order in decision.orders.items():
            brokers[symbol].place(order)

The joint timeline is jaxenv.market_set's, built as bars arrive (JointBook): each instrument's features come from its
own bars (a BarBook each), an absent instrument carries its last close (open = high = low = close, no volume, its
last features), and the sessions and per-bar rules are those of the joint stamps (a feature-less BarBook per
instrument, the clock). A decision at bar t reads bars up to t only; the account then moves over bar t + 1 when it
arrives: the walk of jaxenv.account_evaluate step for step (the same transition, the same random keys), greedy.

A run trained with advice acts as evaluate.py walks it (agents.evaluation.account_advice.advised_act): each head with
its own instrument's advice, veto, rules and record. Each instrument's advisor (`open_advisors`) is asked about that
instrument's keys as its blocks close, its prompts read the instrument on the joint timeline as training's advisor read
it (agents.trading.advice.JointBookView); the answer about block b is in force during block b + 1, as for one
instrument (agents.trading.agent), waited for (`advice="wait"`, a replay's default) or not ("realtime").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from agents.advice.acting import training_acting
from agents.advice.risk_veto import RULES
from agents.advice.table import SIDES, AdviceTable, num_blocks, view
from agents.evaluation.account_advice import advised_act, advised_carry
from agents.evaluation.policies import make_account_act
from agents.evaluation.saved_run import run_data
from agents.rl.account import AccountHeads
from agents.rl.ppo import make_train
from agents.runs.integrity import path_name
from agents.runs.saved_runs import SavedPolicy, check_fits
from agents.trading.agent import block_keys, check_tradable, grown_table, marked, read_key, unasked
from agents.trading.bars import FIRST_DECISION_BAR, Bar, BarBook
from agents.trading.orders import Order
from bridge.protocol import ACTIONS, BUY, DISABLE_TRAIL, ENABLE_TRAIL, MOVE_TO_BE, SELL
from jaxenv.account_env import AccountEnv
from jaxenv.account_evaluate import account_trace_step
from jaxenv.config import resolve_instruments
from jaxenv.env import ATR, SESSION, bracket_distances
from jaxenv.evaluate import continue_after_breach

OPEN_END = 2**30  # the joint bar the data ends at, for a live feed: never (a replay of files knows its end)


class JointBook:
    """Several instruments' bars on one timeline, grown a joint bar at a time (the module's docstring). `own[i]` holds
    instrument i's own bars; joint bar t reads its row `pos[t, i]` there; `clock[i]` holds the joint stamps with
    instrument i's own or carried prices (sessions and per-bar rules)."""

    def __init__(self, symbols: list[str], contracts: list, rules, min_range_ticks: float, trained_interval: int,
                 capacity: int = 8192):
        self.symbols = list(symbols)
        self.own = [BarBook(c, rules, min_range_ticks, capacity, trained_interval) for c in contracts]
        self.clock = [BarBook(c, rules, min_range_ticks, capacity, trained_interval, features=False)
                      for c in contracts]
        self.pos = np.zeros((capacity, len(contracts)), np.int64)
        self.present = np.zeros((capacity, len(contracts)), bool)
        self.n = 0

    @property
    def capacity(self) -> int:
        return len(self.pos)

    @property
    def started(self) -> bool:
        """Every instrument's own history and the clocks have their schedules: decisions may be taken."""
        return all(b.schedule is not None for b in (*self.own, *self.clock))

    def add_own(self, i: int, bar: Bar) -> None:
        """A bar of instrument i before the joint timeline starts (before every instrument has one): its features
        only, as the batch pipeline computes them on each file's whole history."""
        self.own[i].add(bar)

    def refusals(self, stamp: pd.Timestamp, bars: list[Bar | None]) -> tuple[str, dict[int, str]]:
        """Why joint bar `stamp` cannot follow the ones before ("" if it can: its stamp fits the clocks), and why
        each instrument's own bar cannot ({i: why}; such an instrument is absent at the stamp instead)."""
        whole = next((problem for i, clock in enumerate(self.clock)
                      if (problem := clock.check(self._proxy(i, stamp, bars[i])))), "")
        own = {i: problem for i, bar in enumerate(bars) if bar is not None and (problem := self.own[i].check(bar))}
        return whole, own

    def _proxy(self, i: int, stamp: pd.Timestamp, bar: Bar | None) -> Bar:
        """Instrument i's bar on the clock: its own, or its last close carried (no volume)."""
        if bar is not None:
            return bar
        close = float(self.own[i].raw[self.own[i].n - 1, 3])
        return Bar(stamp, close, close, close, close, 0.0)

    def add(self, stamp: pd.Timestamp, bars: list[Bar | None]) -> None:
        """Joint bar `stamp`: instrument i's own bar `bars[i]`, or None (absent: its last close carried). `refusals`
        says first whether it can follow; agents.trading.bars.HistoryRefused where a history that just completed is
        not the run's."""
        if self.n == self.capacity:
            self.pos = np.concatenate([self.pos, np.zeros_like(self.pos)])
            self.present = np.concatenate([self.present, np.zeros_like(self.present)])
        for i, bar in enumerate(bars):
            proxy = self._proxy(i, stamp, bar)
            if bar is not None:
                self.own[i].add(bar)
            self.clock[i].add(proxy)
            self.pos[self.n, i] = self.own[i].n - 1
            self.present[self.n, i] = bar is not None
        self.n += 1

    def env_rows(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Joint bars [start, end) of every instrument as EnvParams rows: (bars [I, k, 8], bar features [I, k, F],
        context features [I, k, C]): the prices of the clock (own or carried), the ATR and features of the
        instrument's latest own bar, the clock's sessions and rules."""
        out = []
        for i, (own, clock) in enumerate(zip(self.own, self.clock)):
            pos = self.pos[start:end, i]
            bars, _, _ = clock.env_rows(start, end)
            bars[:, ATR] = own.atr[pos]
            out.append((bars, own.bar_features[pos], own.context_features[pos]))
        return tuple(np.stack(parts) for parts in zip(*out))

    def stamp(self, t: int) -> pd.Timestamp:
        """Joint bar t's stamp, in the first instrument's exchange zone."""
        return self.clock[0].stamp(t)

    def day(self, t: int) -> str:
        """Joint bar t's trading day (its session's, as jaxenv.metrics.step_days labels a walk's steps)."""
        return str(np.datetime64(int(self.clock[0].day[t]), "D"))

    def close(self, i: int) -> np.ndarray:
        """Instrument i's close at every joint bar (carried where absent)."""
        return self.clock[i].column("close")


@dataclass
class AccountDecision:
    bar: int  # the joint bar's index
    time: str
    actions: dict[str, str]  # symbol -> bridge.protocol.ACTIONS
    orders: dict[str, Order]  # symbol -> the order its action places (none for HOLD)
    positions: dict[str, int]  # the side each instrument holds when deciding
    present: dict[str, bool]
    equity: float
    latency_ms: float = 0.0
    row: dict = field(default_factory=dict)  # the trace's row of the bar the last decision's orders met ({} before)
    advice: dict = field(default_factory=dict)  # symbol -> the advice in force (action, confidence, key), where one is
    trust: dict = field(default_factory=dict)  # symbol -> the trust gate's weight on its advice (learned fusion)
    veto: dict = field(default_factory=dict)  # symbol -> the risk veto's rules that held an action back
    bound: dict = field(default_factory=dict)  # symbol -> whether its advice record binds it (None: no record)


class AccountAgent:
    """One account of a trained run on several instruments, on joint bars (the module's docstring). Its state
    (`state`, `restore`) is everything a restart needs besides the bars."""

    def __init__(self, saved: SavedPolicy, *, advice: str = "wait", end: int = OPEN_END, capacity: int = 8192):
        cfg = saved.cfg
        check_tradable(saved, advice)
        self.cfg, self.saved, self.end, self.advice_mode = cfg, saved, end, advice
        instruments = resolve_instruments(cfg.data.instruments)
        self.contracts = [item.contract for item in instruments]
        self.symbols = [c.symbol for c in self.contracts]
        self.env = AccountEnv(cfg.env)  # the run's prop-firm rules, as training's account_setup trades under them
        self.book = JointBook(self.symbols, self.contracts, cfg.env.prop_firm, cfg.data.min_range_ticks,
                              run_data(saved.run_dir).get("interval_minutes", 0), capacity)
        self.params = self._env_params()
        self.advised = cfg.llm != "none"
        acting = training_acting(cfg.hybrid, cfg.llm, self.env)  # the networks as trained (the trust gate's)
        ppo = make_train(cfg.ppo, cfg.network, self.env, self.params, acting, num_envs=cfg.num_envs,
                         num_updates=cfg.num_updates)
        check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions, AccountHeads(self.env).example_obs())
        self.policy_state = (saved.params, saved.obs_norm)
        if self.advised:
            self.acting = acting.walking(greedy=True)
            act = advised_act(self.acting, ppo.network, cfg.ppo.normalize_obs, head_stats=True)
            self._write = jax.jit(lambda table, *rows: table.write(*rows))
            self._in_force = jax.jit(partial(_in_force, cfg.hybrid.query))
            self._mark_asked = jax.jit(lambda table, keys: table.mark_asked(keys, keys >= 0))
        else:
            act = make_account_act(ppo, self.env, cfg.ppo.normalize_obs, True)
        self.k = cfg.hybrid.query.interval
        self._decide = jax.jit(partial(_decide, self.env, act))
        self._advance = jax.jit(partial(_advance, self.env))
        self.state = None  # the account (AccountState), opened at the first decision
        self.key = None  # the walk's key, split each decision as jaxenv.account_evaluate's walk splits it
        self.pending = None  # (actions [I], the reset key) of the last decision, applied when the next bar arrives
        self.carry = None  # an advised run's acting carry (a HybridCarry per instrument: its advice table, record)
        self.advisors = []  # agents.trading.advice.LivePacer per instrument, once open_advisors() opened them

    def open_advisors(self, log_stem: Path | None = None, market_set=None, saved: list | None = None) -> list:
        """Opens each instrument's advisor (the checkpoint's adapter; its logs named LOG_STEM_SYMBOL...), asked as its
        blocks close: `market_set` is the whole files being replayed, whose keys' answers the stores hold (None: no
        store); `saved`, a resumed run's advisors' states (LivePacer.state, one per instrument)."""
        from agents.advisor.instrument_set import instrument_data
        from agents.trading.advice import JointBookView, LivePacer

        cfg = self.cfg
        try:
            for i, contract in enumerate(self.contracts):
                stem = None if log_stem is None else log_stem.with_name(f"{log_stem.name}_{contract.symbol}")
                self.advisors.append(LivePacer(
                    cfg.hybrid, cfg.llm, cfg.env, instrument_data(cfg.data, contract), JointBookView(self.book, i),
                    self.saved.adapter, stem, None if market_set is None else market_set.markets[i],
                    tuple(self.symbols)))
                if saved:
                    self.advisors[-1].restore(saved[i])
        except BaseException:
            self.close()
            raise
        return self.advisors

    def close(self) -> None:
        for advisor in self.advisors:
            advisor.close()
        self.advisors = []

    # ---------------------------------------------------------------------------------------------- device
    def _env_params(self):
        bars, bar_f, context_f = self.book.env_rows(0, self.book.capacity)
        start = FIRST_DECISION_BAR
        per = [self.env.single.params_of(c, bars[i], bar_f[i], context_f[i], start, self.end, True,
                                         max(self.end - 1 - start, 1)) for i, c in enumerate(self.contracts)]
        return self.env.params_of(per, self.contracts, self.book.present[: self.book.capacity])

    def _tables(self) -> AdviceTable:
        """Every instrument's empty advice table at the book's capacity, stacked (leaves [I, ...])."""
        table = AdviceTable.create(num_blocks(self.book.capacity, self.k) * SIDES)
        return jax.tree.map(lambda x: jnp.stack([x] * len(self.contracts)), table)

    def _put(self, t: int) -> None:
        """Joint bar t's rows written into the env's arrays; rows after it carry the session the calendar says comes
        next (as agents.trading.agent writes one instrument's)."""
        if self.params.present.shape[0] != self.book.capacity:
            self.params = self._env_params()  # grown: the jitted steps compile again (log2(bars) times in a feed)
            if self.carry is not None:
                keys = num_blocks(self.book.capacity, self.k) * SIDES
                self.carry = tuple(c.replace(advice=grown_table(c.advice, keys)) for c in self.carry)
        bars, bar_f, context_f = self.book.env_rows(t, t + 1)
        self.params = _put_rows(self.params, t, bars[:, 0], bar_f[:, 0], context_f[:, 0],
                                self.book.present[t], np.float32(self.book.clock[0].next_session_id()))

    # ------------------------------------------------------------------------------------------------ bars
    def on_bar(self, stamp: pd.Timestamp, bars: list[Bar | None]) -> AccountDecision | None:
        """The decision at joint bar `stamp`'s close (`bars`: each instrument's own bar, None where absent); None while
        the history warms up. Raises agents.trading.bars.BarRefused (HistoryRefused for history that is not the run's),
        adding nothing, for a bar that cannot follow the ones before."""
        t0 = time.perf_counter()
        self.book.add(stamp, bars)
        t = self.book.n - 1
        if not self.book.started or t < FIRST_DECISION_BAR:
            return None
        row = {}
        if self.state is None:  # the first decision: the history goes to the device at once
            self.params = self._env_params()
            self._put(t)
            self.key = jax.random.PRNGKey(0)  # evaluation's seed 0
            self.state = self.env.initial_state(self.key, self.params, jnp.asarray(t, jnp.int32))
            if self.advised:
                self.carry = advised_carry(self.acting, self.params, self._tables(), self.saved.advice_record)
            self._warm_up()
            t0 = time.perf_counter()  # compiling is set-up, not the first decision's latency
        else:
            self._put(t)
            self.state, step = self._advance(self.state, *self.pending, self.params)
            row = {k: np.asarray(v) for k, v in jax.device_get(step).items()}
        sides = np.asarray(jax.device_get(self.state.legs.side))
        advice = {}
        if self.advised:
            self._advise(t, sides)
            valid, action, confidence, key = jax.device_get(self._in_force(self.carry, self.state))
            advice = {s: {"action": ACTIONS[int(action[i])], "confidence": round(float(confidence[i]), 4),
                          "key": int(key[i])} for i, s in enumerate(self.symbols) if valid[i]}
        self.key, actions, reset_key, self.carry, stats = self._decide(self.policy_state, self.carry, self.state,
                                                                       self.params, self.key)
        self.pending = (actions, reset_key)
        actions = np.asarray(actions)
        if self.advised and (t + 1) % self.k == 0:  # block t // k closes: ask its keys, as for one instrument
            after = [{BUY: 1, SELL: -1}.get(int(a), int(side)) for a, side in zip(actions, sides)]
            entries_only = self.cfg.hybrid.query.entries_only
            self._ask([block_keys(t // self.k, (int(side), a), entries_only) for side, a in zip(sides, after)])
        decision = self._describe(t, t0, actions, row)
        if self.advised:
            stats = jax.device_get(stats)
            decision.advice = advice
            decision.trust = ({s: round(float(stats["trust"][i]), 4) for i, s in enumerate(self.symbols) if s in advice}
                              if self.acting.gated else {})
            decision.veto = {s: [r for r in RULES if stats[f"veto_fired_{r}"][i] > 0] for i, s in enumerate(self.symbols)}
            decision.bound = {s: None if c.record is None else bool(np.asarray(c.record.bound))
                              for s, c in zip(self.symbols, self.carry)}
        return decision

    def _advise(self, t: int, sides: np.ndarray) -> None:
        """Each instrument's answers into its table; the keys this bar's decision reads asked where missing (and
        waited for, in wait mode), as agents.trading.agent's for one instrument."""
        block, entries_only = t // self.k, self.cfg.hybrid.query.entries_only
        read = [read_key(block, int(side), entries_only) for side in sides]
        self._ask([block_keys(block - 1, (int(side),), entries_only) if block >= 1 else [] for side in sides])
        carry = list(self.carry)
        for i, advisor in enumerate(self.advisors):
            table = carry[i].advice
            for rows in advisor.answers(read[i], wait=self.advice_mode == "wait"):
                table = self._write(table, *rows)
            carry[i] = carry[i].replace(advice=table)
        self.carry = tuple(carry)

    def _ask(self, keys: list[list[int]]) -> None:
        """Each instrument's advisor asked about its `keys[i]` (those answered or asked already skipped); the keys
        asked of it marked in flight in its table, as training's query step marks them (the wait rule reads it)."""
        carry = list(self.carry)
        for i, advisor in enumerate(self.advisors):
            carry[i] = carry[i].replace(advice=marked(self._mark_asked, carry[i].advice, advisor.ask(keys[i])))
        self.carry = tuple(carry)

    def _warm_up(self) -> None:
        """Compiles both steps before the first decision."""
        key, actions, reset_key, _, _ = self._decide(self.policy_state, self.carry, self.state, self.params, self.key)
        jax.block_until_ready(self._advance(self.state, actions, reset_key, self.params))

    def _describe(self, t: int, t0: float, actions: np.ndarray, row: dict) -> AccountDecision:
        legs = jax.device_get(self.state.legs)
        bars, _, _ = self.book.env_rows(t, t + 1)
        stops, targets = bracket_distances(self.params.inst, bars[:, 0, ATR])  # the env's own rule, each instrument's
        qty = float(self.cfg.env.contracts_per_trade)
        orders = {}
        for i, symbol in enumerate(self.symbols):
            action, side = int(actions[i]), int(legs.side[i])
            oid = f"{t}-{symbol}-{ACTIONS[action]}"
            if action in (BUY, SELL):
                orders[symbol] = Order(oid, t, "market", 1 if action == BUY else -1, qty,
                                       stop_distance=float(stops[i]), target_distance=float(targets[i]))
            elif action == MOVE_TO_BE:
                orders[symbol] = Order(oid, t, "stop", side, qty, stop=float(legs.entry_price[i]))
            elif action in (ENABLE_TRAIL, DISABLE_TRAIL):
                orders[symbol] = Order(oid, t, "stop", side, qty, trailing=action == ENABLE_TRAIL)
        return AccountDecision(
            bar=t, time=str(self.book.stamp(t)),
            actions={s: ACTIONS[int(a)] for s, a in zip(self.symbols, actions)}, orders=orders,
            positions={s: int(x) for s, x in zip(self.symbols, legs.side)},
            present={s: bool(p) for s, p in zip(self.symbols, self.book.present[t])},
            equity=float(self.state.equity), latency_ms=round((time.perf_counter() - t0) * 1e3, 3), row=row)

    # ------------------------------------------------------------------------------------------------ state
    def arrays(self) -> dict[str, np.ndarray]:
        """What a restart needs besides the bars, as named arrays: the account, its key and the pending decision."""
        tree = {"state": self.state, "key": self.key, "pending": self.pending, "carry": self.carry}
        return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """The account as `arrays` (`arrays()`'s) left it, on a book that holds the same bars."""
        self.params = self._env_params()
        key = jax.random.PRNGKey(0)
        state = self.env.initial_state(key, self.params, jnp.asarray(FIRST_DECISION_BAR, jnp.int32))
        carry = (advised_carry(self.acting, self.params, self._tables(), self.saved.advice_record) if self.advised
                 else None)
        _, actions, reset_key, _, _ = jax.eval_shape(self._decide, self.policy_state, carry, state, self.params, key)
        template = {"state": state, "key": key, "pending": (actions, reset_key), "carry": carry}
        paths, treedef = jax.tree_util.tree_flatten_with_path(template)
        missing = [path_name(p) for p, _ in paths if path_name(p) not in arrays]
        if missing:
            raise ValueError(f"the saved account lacks {missing[0]}: it was saved by another version of the agent")
        tree = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(arrays[path_name(p)]) for p, _ in paths])
        self.state, self.key, self.pending = tree["state"], tree["key"], tree["pending"]
        self.carry = None if tree["carry"] is None else tuple(c.replace(advice=unasked(c.advice)) for c in tree["carry"])


def _decide(env: AccountEnv, act, policy_state, carry, state, params, key):
    """One decision of jaxenv.account_evaluate's walk: (the walk's next key, the actions [I], the key a breach's fresh
    account is drawn with, the act's carry after it and each head's stats: None for an act without advice)."""
    key, act_key, reset_key = jax.random.split(key, 3)
    obs = env.get_obs(state, params)
    stats = None
    if carry is None:
        actions = act(policy_state, obs, state, params, act_key)
    else:
        actions, carry, stats = act(policy_state, carry, obs, state, params, act_key)
    return key, jnp.asarray(actions, jnp.int32), reset_key, carry, stats


def _in_force(query, carry: tuple, state):
    """Each instrument's advice in force at the account's bar (agents.advice.table.view, as its head reads it): (valid,
    most probable action, decayed confidence, key), each [I]."""
    views = [view(c.advice, query, state.t[None], state.legs.side[i][None]) for i, c in enumerate(carry)]
    return (jnp.concatenate([v.valid for v in views]), jnp.concatenate([jnp.argmax(v.probs, -1) for v in views]),
            jnp.concatenate([v.confidence for v in views]), jnp.concatenate([v.key for v in views]))


def _advance(env: AccountEnv, state, actions, reset_key, params):
    """The account over the next bar (the walk's step): (the account after it, a fresh one where it breached; the
    trace's row)."""
    next_state, _, terminated, info = env.transition(state, actions, params)
    step = account_trace_step(state, actions, next_state, terminated, info, params)
    return continue_after_breach(env, next_state, terminated, reset_key, params), step


@jax.jit
def _put_rows(params, t, bars_rows, bar_feature_rows, context_rows, present_row, next_session):
    """Joint bar t's rows of every instrument written into the account's arrays; later rows carry the next session."""
    inst = params.inst
    bars = inst.bars.at[:, t].set(bars_rows)
    later = jnp.arange(bars.shape[1]) > t
    bars = bars.at[:, :, SESSION].set(jnp.where(later[None], next_session, bars[:, :, SESSION]))
    inst = inst.replace(bars=bars, bar_features=inst.bar_features.at[:, t].set(bar_feature_rows),
                        context_features=inst.context_features.at[:, t].set(context_rows))
    return params.replace(inst=inst, present=params.present.at[t].set(present_row))


__all__ = ["OPEN_END", "AccountAgent", "AccountDecision", "JointBook"]
