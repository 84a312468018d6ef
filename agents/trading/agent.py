"""A trained agent deciding on bars as they arrive: `Agent.load(run_dir)`, then `on_bar(bar)` for each new bar.

    agent = Agent.load("runs/x", checkpoint="best")
    if agent.advised:                     # a hybrid run: its advisor (open_advisor), asked as blocks close
        agent.open_advisor()
    for bar in feed:                      # agents.trading.Bar: stamp, OHLCV, its news context
        decision = agent.on_bar(bar)      # None while the history warms up the features
        if decision and decision.order:
            broker.place(decision.order)

A decision is taken at a bar's close from bars up to it only, and its order fills on the next bar, as in the
environment. Acting is evaluation's, step for step: the same two jitted functions every walk runs
(`agents.evaluation.advised_walk.advised_decision` and `advised_advance`; for a run without an advisor, acting without
advice) on the same arrays (agents.trading.bars: the batch pipeline's features, bar by bar), one account, greedy.
On bar t + 1 the account first moves over it (fills, stops, targets, the trailing drawdown; a breached account is
replaced by a fresh one, as in evaluation), then decides.

With an advisor (a hybrid run), the keys of a block are asked as it closes (agents.trading.advice) and the answer
about block b is in force during block b + 1, exactly as in training. `advice="wait"` waits for each answer before
the decision that reads it (evaluation's strict walk; a replay's default); `advice="realtime"` never waits: an
answer not back in time leaves the older block's in force (within max_age), then none.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from agents.advice.risk_veto import RULES
from agents.advice.table import SIDES, STATUS_ASKED, STATUS_NONE, AdviceTable, key_of, num_blocks
from agents.advice.usage import STAT_PREFIX
from agents.config import ConfigError
from agents.evaluation.advised_walk import WalkCarry, advised_advance, advised_decision
from agents.evaluation.saved_run import restore_agent, run_data
from agents.runs.integrity import path_name
from agents.runs.saved_runs import SavedPolicy, load_run_config, refuse_instrument_set, restore_policy
from agents.trading.bars import FIRST_DECISION_BAR, Bar, BarBook
from agents.trading.orders import Decision, Order
from bridge.protocol import ACTIONS, BUY, DISABLE_TRAIL, ENABLE_TRAIL, MOVE_TO_BE, SELL
from jaxenv import TradingEnv
from jaxenv.config import resolve_data_config
from jaxenv.env import ATR, SESSION, bracket_distances, drawdown_room

OPEN_END = 2**30  # the bar the data ends at, for a live feed: never (a replay of a file knows its end)


@jax.jit
def _put_bar(params, i, bars_row, bar_features_row, context_row, next_session):
    """Bar i's rows written into the env's arrays; rows after it carry the session the calendar says comes next."""
    bars = params.bars.at[i].set(bars_row)
    later = jnp.arange(bars.shape[0]) > i
    bars = bars.at[:, SESSION].set(jnp.where(later, next_session, bars[:, SESSION]))
    return params.replace(bars=bars, bar_features=params.bar_features.at[i].set(bar_features_row),
                          context_features=params.context_features.at[i].set(context_row))


def check_tradable(saved: SavedPolicy, advice: str) -> None:
    """A ConfigError for a run whose advisor cannot trade, a ValueError for an unknown advice mode."""
    if saved.cfg.hybrid.shuffled and saved.cfg.llm != "none":
        raise ConfigError(f"{saved.run_dir}: its advisor is the shuffled control (hybrid.shuffled), which reads "
                          "other blocks' markets; it does not trade")
    if advice not in ("wait", "realtime"):
        raise ValueError(f"advice={advice!r}: use wait or realtime")


def read_key(block: int, side: int, entries_only: bool) -> int | None:
    """The key a decision in `block` with position `side` reads (block − 1's): none in block 0, nor for a held side
    under hybrid.query.entries_only (training and evaluation never ask it)."""
    return key_of(block - 1, side) if block >= 1 and (side == 0 or not entries_only) else None


def block_keys(block: int, sides, entries_only: bool) -> list[int]:
    """The keys of `block` asked for positions `sides`, the flat one first: the flat one alone under
    hybrid.query.entries_only, as training and evaluation ask them (agents.advice.table.walk_keys)."""
    return [key_of(block, s) for s in dict.fromkeys((0, *sides)) if s == 0 or not entries_only]


def grown_table(table: AdviceTable, keys: int) -> AdviceTable:
    """`table` holding `keys` keys (its answers kept) where it holds fewer: a feed's arrays doubled."""
    if table.num_keys >= keys:
        return table
    return jax.tree.map(lambda g, o: g.at[: o.shape[0]].set(o) if g.ndim else o, AdviceTable.create(keys), table)


def marked(mark_asked, table: AdviceTable, asked: list[int]) -> AdviceTable:
    """`table` with the keys just asked of the advisor in flight until answered, as training's query step marks them
    (the wait rule reads it): `mark_asked(table, keys)` on the keys padded to SIDES with -1."""
    if not asked:
        return table
    keys = np.full(SIDES, -1, np.int32)
    keys[: len(asked)] = asked
    return mark_asked(table, keys)


def unasked(table: AdviceTable) -> AdviceTable:
    """`table` with the keys in flight when a run stopped missing again: a resumed run asks them again."""
    return table.replace(status=jnp.where(table.status == STATUS_ASKED, STATUS_NONE, table.status))


class Agent:
    """One account of a trained run on a feed of bars. Its state (`state`, `restore`) is everything a restart needs
    besides the bars."""

    def __init__(self, saved: SavedPolicy, *, advice: str = "wait", end: int = OPEN_END,
                 min_range_ticks: float | None = None, capacity: int = 8192):
        """`end`: the bar the data ends at (a replay's file length), where entries stop as in evaluation; `capacity`:
        bars the arrays hold before they double."""
        cfg = saved.cfg
        check_tradable(saved, advice)
        self.cfg, self.saved, self.advice_mode = cfg, saved, advice
        self.env = TradingEnv(cfg.env)
        self.contract = resolve_data_config(cfg.data).contract  # the run's instrument
        self.book = BarBook(self.contract, cfg.env.prop_firm,
                            cfg.data.min_range_ticks if min_range_ticks is None else min_range_ticks, capacity,
                            run_data(saved.run_dir).get("interval_minutes", 0))  # history of another is refused
        self.end = end
        self.advised = cfg.llm != "none"
        self.params = self._env_params(self.book.capacity)
        acting, self.ppo = restore_agent(saved, self.env, self.params)
        self.acting = dataclasses.replace(acting, greedy=True)
        self.policy_state = (saved.params, saved.obs_norm)
        self.k = cfg.hybrid.query.interval
        self.advisor = None  # agents.trading.advice.LivePacer, once open_advisor() opened it (hybrid runs)
        self.carry = None  # the account (agents.evaluation.advised_walk.WalkCarry)
        self.choice = None  # the decision taken on the last bar, applied when the next one arrives
        self.last_row: dict | None = None  # the trace's row of the bar before the last (its fills)
        self._compile()

    @classmethod
    def load(cls, run_dir: str | Path, checkpoint: str = "best", **options) -> Agent:
        """A run's `checkpoint` (best, latest or an update), restored to act as evaluation acts (greedy)."""
        cfg = load_run_config(run_dir)
        refuse_instrument_set(cfg, run_dir, "agents.trading.account_agent.AccountAgent trades it")
        return cls(restore_policy(run_dir, checkpoint, cfg), **options)

    def open_advisor(self, log_stem: Path | None = None, market=None, saved: dict | None = None):
        """Opens the checkpoint's advisor (its adapter: SavedPolicy.adapter, as evaluation's), asked as blocks close:
        `market` is the whole file being replayed, whose keys' answers its store holds (None: no store); `saved`, a
        resumed run's advisor state (LivePacer.state)."""
        from agents.trading.advice import BookView, LivePacer

        self.advisor = LivePacer(self.cfg.hybrid, self.cfg.llm, self.cfg.env, self.cfg.data, BookView(self.book),
                                 self.saved.adapter, log_stem, market)
        if saved:
            self.advisor.restore(saved)
        return self.advisor

    # ---------------------------------------------------------------------------------------------- device
    def _env_params(self, capacity: int):
        bars, bar_f, context_f = self.book.env_rows(0, capacity)
        return self.env.params_of(self.contract, bars, bar_f, context_f, self.start_bar, self.end, True,
                                  max(self.end - 1 - self.start_bar, 1))

    @property
    def start_bar(self) -> int:
        return FIRST_DECISION_BAR

    def _compile(self) -> None:
        env, network, normalize = self.env, self.ppo.network, self.cfg.ppo.normalize_obs
        self._decide = jax.jit(partial(advised_decision, env, self.acting, network, normalize))
        self._advance = jax.jit(partial(advised_advance, env))
        self._look = jax.jit(self.acting.look)
        self._write = jax.jit(lambda table, *rows: table.write(*rows))
        self._mark_asked = jax.jit(lambda table, keys: table.mark_asked(keys, keys >= 0))

    def _fit_to_book(self) -> None:
        """The env's arrays, and the advice table of the account and its pending decision, at the book's capacity:
        shapes change, so the jitted steps compile again (a doubling: log2(bars) times in a feed)."""
        self.params = self._env_params(self.book.capacity)
        keys = num_blocks(self.book.capacity, self.k) * SIDES

        def grown(hybrid):
            return hybrid.replace(advice=grown_table(hybrid.advice, keys))

        if self.carry is not None:
            self.carry = self.carry.replace(hybrid=grown(self.carry.hybrid))
        if self.choice is not None:
            self.choice = self.choice.replace(hybrid=grown(self.choice.hybrid))

    def _put(self, i: int) -> None:
        if self.params.bars.shape[0] != self.book.capacity:
            self._fit_to_book()
        bars, bar_f, context_f = self.book.env_rows(i, i + 1)
        self.params = _put_bar(self.params, i, bars[0], bar_f[0], context_f[0],
                               np.float32(self.book.next_session_id()))

    # ------------------------------------------------------------------------------------------------ bars
    def on_bar(self, bar: Bar) -> Decision | None:
        """The decision at `bar`'s close (None while the feed is history: the first FIRST_DECISION_BAR bars). Raises
        agents.trading.bars.BarRefused, adding nothing, for a bar that cannot follow the ones before."""
        t0 = time.perf_counter()
        warming = self.book.schedule is None
        self.book.add(bar)
        t = self.book.n - 1
        if self.book.schedule is None:
            return None
        if warming:  # the history just completed: all of it goes to the device at once
            self.params = self._env_params(self.book.capacity)
        self._put(t)  # the padding rows' session
        if warming:
            self._warm_up()
            t0 = time.perf_counter()  # compiling is set-up, not the first decision's latency
        if t < self.start_bar:
            return None
        if self.carry is None:
            self._open_account()
        else:
            self._step_over(t)
        self._advise(t)
        return self._decision(t, t0)

    def _warm_up(self) -> None:
        """Compiles the acting steps on a throwaway account, before the first decision."""
        carry, choice = self.carry, self.choice
        self._open_account()
        self.choice = self._decide(self.carry, *self.policy_state, self.params)
        jax.block_until_ready(self._advance(self.carry, self.choice, self.params))
        jax.block_until_ready(self._look(self.carry.hybrid, self.carry.env_state, self.params))
        self.carry, self.choice = carry, choice

    def _open_account(self) -> None:
        key = jax.random.PRNGKey(0)  # evaluation's seed 0: greedy acting leaves it unused
        k_init, key = jax.random.split(key)
        state = jax.vmap(self.env.initial_state, in_axes=(0, None))(k_init[None], self.params)
        hybrid = self.acting.carry_for_walk(self.params, self.saved.advice_record)
        self.carry = WalkCarry(env_state=state, hybrid=hybrid, key=key)

    def _step_over(self, t: int) -> None:
        """The account over bar t: the last decision's fill, stops and targets, the drawdown rule."""
        self.carry, row = self._advance(self.carry, self.choice, self.params)
        self.last_row = {k: np.asarray(v).item() for k, v in jax.device_get(row).items()}

    def _advise(self, t: int) -> None:
        """Answers into the table; at a query step (every k bars from the first decision, as a walk's chunks) the
        record looks; the keys this bar's decision reads are asked where missing (and waited for, in wait mode)."""
        carry = self.carry
        side = int(np.asarray(carry.env_state.side)[0])
        block = t // self.k
        if self.advisor is not None:
            entries_only = self.cfg.hybrid.query.entries_only
            read = read_key(block, side, entries_only)
            asked = self.advisor.ask(block_keys(block - 1, (side,), entries_only) if block >= 1 else [])
            table = marked(self._mark_asked, carry.hybrid.advice, asked)
            for rows in self.advisor.answers(read, wait=self.advice_mode == "wait"):
                table = self._write(table, *rows)
            carry = carry.replace(hybrid=carry.hybrid.replace(advice=table))
        if (t - self.start_bar) % self.k == 0:
            carry = carry.replace(hybrid=self._look(carry.hybrid, carry.env_state, self.params))
        self.carry = carry

    def _decision(self, t: int, t0: float) -> Decision:
        self.choice = self._decide(self.carry, *self.policy_state, self.params)
        action = int(np.asarray(self.choice.action)[0])
        state = jax.tree.map(lambda x: x[0], self.carry.env_state)
        if self.advisor is not None and (t + 1) % self.k == 0:  # block t // k closes: ask its keys
            side = int(state.side)
            after = {BUY: 1, SELL: -1}.get(action, side)
            asked = self.advisor.ask(block_keys(t // self.k, (side, after), self.cfg.hybrid.query.entries_only))
            table = marked(self._mark_asked, self.choice.hybrid.advice, asked)
            self.choice = self.choice.replace(hybrid=self.choice.hybrid.replace(advice=table))
        return self._describe(t, t0, action, state)

    # ----------------------------------------------------------------------------------------------- output
    def _describe(self, t: int, t0: float, action: int, state) -> Decision:
        book, env_cfg = self.book, self.cfg.env
        side = int(state.side)
        bar = self.book.env_rows(t, t + 1)[0][0]
        order = None
        qty = float(env_cfg.contracts_per_trade)
        if action in (BUY, SELL):
            stop, target = bracket_distances(self.params, bar[ATR])  # the env's own rule
            order = Order(f"{t}-{ACTIONS[action]}", t, "market", 1 if action == BUY else -1, qty,
                          stop_distance=float(stop), target_distance=float(target))
        elif action == MOVE_TO_BE:
            order = Order(f"{t}-{ACTIONS[action]}", t, "stop", side, qty, stop=float(state.entry_price))
        elif action in (ENABLE_TRAIL, DISABLE_TRAIL):
            order = Order(f"{t}-{ACTIONS[action]}", t, "stop", side, qty, trailing=action == ENABLE_TRAIL)
        decision = Decision(
            bar=t, time=str(book.stamp(t)), action=ACTIONS[action],
            order=order, position=side, equity=float(state.equity),
            drawdown_left=float(drawdown_room(state, self.params) * self.params.trailing_drawdown))
        if self.advised:
            c = jax.device_get(self.choice.columns)
            if bool(c["advice_valid"]):
                decision.advice = {"action": ACTIONS[int(c["advice_action"])],
                                   "confidence": round(float(c["advice_confidence"]), 4), "key": int(c["advice_key"])}
            if self.acting.gated and decision.advice is not None:
                decision.trust = round(float(c[STAT_PREFIX + "trust"]), 4)
            decision.veto = [r for r in RULES if float(c[f"{STAT_PREFIX}veto_fired_{r}"]) > 0]
            record = self.choice.hybrid.record
            decision.bound = None if record is None else bool(np.asarray(record.bound))
        decision.latency_ms = round((time.perf_counter() - t0) * 1e3, 3)
        return decision

    # ------------------------------------------------------------------------------------------------ state
    def state(self) -> dict[str, np.ndarray]:
        """What a restart needs besides the bars, as named arrays: the account, the pending decision (its advice
        table and record among them)."""
        return {f"{name}/{path_name(p)}": np.asarray(x) for name, tree in (("carry", self.carry), ("choice", self.choice))
                for p, x in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """The account as `arrays` (`state`'s) left it, on a book that holds the same bars (agents.trading.journal),
        its arrays at the book's capacity. Keys asked but not answered are asked again. A ValueError where the arrays
        are not this agent's layout."""
        self._open_account()  # the layout: the account's, and a decision's of it
        template = {"carry": self.carry, "choice": jax.eval_shape(self._decide, self.carry, *self.policy_state,
                                                                   self.params)}
        trees = {}
        for name, tree in template.items():
            paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
            missing = [f"{name}/{path_name(p)}" for p, _ in paths if f"{name}/{path_name(p)}" not in arrays]
            if missing:
                raise ValueError(f"the saved account lacks {missing[0]}: it was saved by another version of the agent")
            trees[name] = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(arrays[f"{name}/{path_name(p)}"])
                                                                for p, _ in paths])

        def restarted(tree):
            return tree.replace(hybrid=tree.hybrid.replace(advice=unasked(tree.hybrid.advice)))

        self.carry, self.choice = restarted(trees["carry"]), restarted(trees["choice"])
        self._fit_to_book()
