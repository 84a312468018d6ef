"""A trained account agent (a run on several instruments, issue 77) deciding on joint bars as they arrive:
`AccountAgent(saved)`, then `on_bar({symbol: Bar | None})` at each bar time of the joint timeline.

    agent = AccountAgent(restore_policy("runs/pair", "best", account=True))
    for bars in joint_bars:                       # {"NQ": Bar, "ES": None}: ES has no bar at this time (absent)
        decision = agent.on_bar(stamp, bars)      # None while the history warms up the features
        for symbol, order in decision.orders.items():
            brokers[symbol].place(order)

The joint timeline is jaxenv.market_set's, built as bars arrive (JointBook): each instrument's features come from its
own bars (a BarBook each), an absent instrument carries its last close (open = high = low = close, no volume, its
last features), and the sessions and per-bar rules are those of the joint stamps (a feature-less BarBook per
instrument, the clock). A decision at bar t reads bars up to t only; the account then moves over bar t + 1 when it
arrives: the walk of jaxenv.account_evaluate step for step (the same transition, the same random keys), greedy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from agents.evaluation.policies import make_account_act
from agents.evaluation.saved_run import run_data
from agents.rl.account import AccountHeads
from agents.rl.ppo import make_train
from agents.runs.integrity import path_name
from agents.runs.saved_runs import SavedPolicy, check_fits
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


class AccountAgent:
    """One account of a trained run on several instruments, on joint bars (the module's docstring). Its state
    (`state`, `restore`) is everything a restart needs besides the bars."""

    def __init__(self, saved: SavedPolicy, *, end: int = OPEN_END, capacity: int = 8192):
        cfg = saved.cfg
        self.cfg, self.saved, self.end = cfg, saved, end
        instruments = resolve_instruments(cfg.data.instruments)
        self.contracts = [item.contract for item in instruments]
        self.symbols = [c.symbol for c in self.contracts]
        self.env = AccountEnv(cfg.env)  # the run's prop-firm rules, as training's account_setup trades under them
        self.book = JointBook(self.symbols, self.contracts, cfg.env.prop_firm, cfg.data.min_range_ticks,
                              run_data(saved.run_dir).get("interval_minutes", 0), capacity)
        self.params = self._env_params()
        ppo = make_train(cfg.ppo, cfg.network, self.env, self.params, None, num_envs=cfg.num_envs,
                         num_updates=cfg.num_updates)
        check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions, AccountHeads(self.env).example_obs())
        self.policy_state = (saved.params, saved.obs_norm)
        act = make_account_act(ppo, self.env, cfg.ppo.normalize_obs, True)
        self._decide = jax.jit(partial(_decide, self.env, act))
        self._advance = jax.jit(partial(_advance, self.env))
        self.state = None  # the account (AccountState), opened at the first decision
        self.key = None  # the walk's key, split each decision as jaxenv.account_evaluate's walk splits it
        self.pending = None  # (actions [I], the reset key) of the last decision, applied when the next bar arrives

    # ---------------------------------------------------------------------------------------------- device
    def _env_params(self):
        bars, bar_f, context_f = self.book.env_rows(0, self.book.capacity)
        start = FIRST_DECISION_BAR
        per = [self.env.single.params_of(c, bars[i], bar_f[i], context_f[i], start, self.end, True,
                                         max(self.end - 1 - start, 1)) for i, c in enumerate(self.contracts)]
        return self.env.params_of(per, self.contracts, self.book.present[: self.book.capacity])

    def _put(self, t: int) -> None:
        """Joint bar t's rows written into the env's arrays; rows after it carry the session the calendar says comes
        next (as agents.trading.agent writes one instrument's)."""
        if self.params.present.shape[0] != self.book.capacity:
            self.params = self._env_params()  # grown: the jitted steps compile again (log2(bars) times in a feed)
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
            self._warm_up()
            t0 = time.perf_counter()  # compiling is set-up, not the first decision's latency
        else:
            self._put(t)
            self.state, step = self._advance(self.state, *self.pending, self.params)
            row = {k: np.asarray(v) for k, v in jax.device_get(step).items()}
        self.key, actions, reset_key = self._decide(self.policy_state, self.state, self.params, self.key)
        self.pending = (actions, reset_key)
        return self._describe(t, t0, np.asarray(actions), row)

    def _warm_up(self) -> None:
        """Compiles both steps before the first decision."""
        key, actions, reset_key = self._decide(self.policy_state, self.state, self.params, self.key)
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
        tree = {"state": self.state, "key": self.key, "pending": self.pending}
        return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """The account as `arrays` (`arrays()`'s) left it, on a book that holds the same bars."""
        self.params = self._env_params()
        key = jax.random.PRNGKey(0)
        state = self.env.initial_state(key, self.params, jnp.asarray(FIRST_DECISION_BAR, jnp.int32))
        _, actions, reset_key = jax.eval_shape(self._decide, self.policy_state, state, self.params, key)
        template = {"state": state, "key": key, "pending": (actions, reset_key)}
        paths, treedef = jax.tree_util.tree_flatten_with_path(template)
        missing = [path_name(p) for p, _ in paths if path_name(p) not in arrays]
        if missing:
            raise ValueError(f"the saved account lacks {missing[0]}: it was saved by another version of the agent")
        tree = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(arrays[path_name(p)]) for p, _ in paths])
        self.state, self.key, self.pending = tree["state"], tree["key"], tree["pending"]


def _decide(env: AccountEnv, act, policy_state, state, params, key):
    """One decision of jaxenv.account_evaluate's walk: (the walk's next key, the actions [I], the key a breach's fresh
    account is drawn with)."""
    key, act_key, reset_key = jax.random.split(key, 3)
    actions = act(policy_state, env.get_obs(state, params), state, params, act_key)
    return key, jnp.asarray(actions, jnp.int32), reset_key


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
