"""The futures-trading environment: gymnax 1.0 API, pure JAX, jitted and vmapped.

Timing (no look-ahead): the agent acts on the close of bar t and sees only bars <= t. A market order fills
at bar t+1's open plus slippage; stops and targets are checked against bar t+1's high/low (the stop first
when both are touched); positions still open on a session's last allowed bar are closed at its close (when the
instrument or the prop firm asks for flat positions at the session's end; the calendar says which bar that is).

Drawdown (prop-firm trailing rule): each bar is first checked against the threshold set by the previous
peak, at the bar's worst mark (adverse extreme, floored at the stop); the peak then rises to the bar's best
mark while the position is held (favourable extreme, or the exit price). The threshold trails the peak by
`trailing_drawdown` and freezes at `starting_balance + trail_stop_offset`; an account without a trailing drawdown
(`trailing_drawdown` inf: the plain account of jaxenv.config.ACCOUNT_RULES) has the threshold −inf, which no equity
reaches. A breach liquidates at the price where equity meets the threshold and terminates the episode. A walk goes
on with a fresh account that takes no new entry until the next session (`entry_locked`, jaxenv.evaluate): a session's
loss is bounded by the account's room at its start, plus a gap through the liquidation price (the evidence's bound,
agents.evidence.eprocess).
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from bridge.protocol import BUY, DISABLE_TRAIL, ENABLE_TRAIL, HOLD, MOVE_TO_BE, NUM_ACTIONS, SELL
from jaxenv.config import DataConfig, EnvConfig, PropFirmRules, check_rules
from jaxenv.contracts import ContractSpec
from jaxenv.features import FEATURES, N_BAR_FEATURES, N_CONTEXT_FEATURES, RISK_FEATURES
from jaxenv.market import MAX_WINDOW, Market, load_market
from jaxenv.sessions import flat_rules

EXIT_REASONS = ("none", "stop_loss", "take_profit", "session_close", "breach", "breakeven_stop", "trailing_stop")
NO_EXIT, STOP_LOSS, TAKE_PROFIT, SESSION_CLOSE, BREACH, BREAKEVEN_STOP, TRAILING_STOP = range(len(EXIT_REASONS))
RECENT_TRADES = 10  # closed trades the recent win rate (recent_wins, recent_count) looks back over
# The observation after the market window: the position, the validity flags, then (extended form only) the market
# context of the current bar (jaxenv.features) and the account's risk features (jaxenv.features.RISK_FEATURES).
POSITION_FEATURES = ("side", "unrealised_atr", "time_in_trade", "stop_distance_atr", "target_distance_atr")
VALIDITY_FEATURES = ("can_enter", "can_move_to_be", "trailing")
N_POSITION, N_VALIDITY, N_RISK = len(POSITION_FEATURES), len(VALIDITY_FEATURES), len(RISK_FEATURES)

# Columns of EnvParams.bars: everything a step reads about one bar, gathered with one row read.
OPEN, HIGH, LOW, CLOSE, ATR, CAN_ENTER, FLATTEN, SESSION = range(8)


@struct.dataclass
class EnvParams(environment.EnvParams):
    bars: jax.Array = None  # float32 [n, 8]
    bar_features: jax.Array = None  # float32 [n, 11]
    context_features: jax.Array = None  # float32 [n, 28]
    start_bar: jax.Array = 0  # first decision bar of the split
    end_bar: jax.Array = 0  # one past the split's last bar
    sequential: jax.Array = False  # reset at start_bar instead of a random bar
    max_steps_in_episode: jax.Array = 1950
    tick_size: jax.Array = 0.25
    point_value: jax.Array = 20.0
    commission_per_side: jax.Array = 2.14  # per contract
    slippage: jax.Array = 0.25  # price units
    contracts: jax.Array = 1.0
    stop_atr_mult: jax.Array = 1.5
    target_atr_mult: jax.Array = 3.0
    trail_atr_mult: jax.Array = 1.0
    breakeven_trigger_atr: jax.Array = 1.0
    starting_balance: jax.Array = 50_000.0
    trailing_drawdown: jax.Array = 2_500.0
    trail_stop_offset: jax.Array = 100.0
    reward_scale: jax.Array = 0.01
    breach_penalty: jax.Array = 0.0
    # Positions may not be held from one session into the next: one still open when the next bar belongs to another
    # session (its last bar was missing from the data) is closed at that bar's open.
    flat_between_sessions: jax.Array = True


@struct.dataclass
class EnvState(environment.EnvState):
    t: jax.Array  # current bar
    side: jax.Array  # -1 short, 0 flat, +1 long
    entry_price: jax.Array
    stop: jax.Array
    target: jax.Array
    trailing: jax.Array
    entry_time: jax.Array  # episode step of the entry
    balance: jax.Array  # realised, after commissions
    equity: jax.Array  # balance + unrealised at bar t's close
    peak: jax.Array  # highest mark of equity, drives the trailing threshold
    trades: jax.Array
    wins: jax.Array
    consecutive_losses: jax.Array
    recent_wins: jax.Array  # bit i = outcome of the i-th latest trade (1 = win)
    recent_count: jax.Array  # trades in recent_wins, at most RECENT_TRADES
    session: jax.Array
    session_start_equity: jax.Array
    trades_today: jax.Array
    commissions: jax.Array  # paid this episode
    entry_locked: jax.Array  # bool: no new entry until the next session (the account replaced a breached one)


class Position(NamedTuple):
    """The position held through bar t+1, after bar t's order and position management (side 0: flat)."""

    side: jax.Array
    entry_price: jax.Array
    stop: jax.Array
    target: jax.Array
    trailing: jax.Array
    entry_time: jax.Array
    entered: jax.Array  # bar t's order opened it at bar t+1's open


class Exit(NamedTuple):
    """How bar t+1 closes the position (all False: it does not) and at what price."""

    liquidated: jax.Array  # the drawdown's liquidation price was met before the stop
    stop_hit: jax.Array
    target_hit: jax.Array
    session_exit: jax.Array
    exiting: jax.Array  # any of the four
    price: jax.Array


def recent_win_rate(state: EnvState) -> jax.Array:
    """Wins / trades over the last (at most RECENT_TRADES) closed trades; 0 before any trade."""
    return jax.lax.population_count(state.recent_wins) / jnp.maximum(state.recent_count, 1)


def drawdown_threshold(peak: jax.Array, params: EnvParams) -> jax.Array:
    return jnp.minimum(peak - params.trailing_drawdown, params.starting_balance + params.trail_stop_offset)


def bracket_distances(params: EnvParams, atr):
    """An entry's stop and target distances from its fill, in price units: the ATR rule (the levels are rounded to
    ticks from the fill, jaxenv.env's fill_entry). Defined once: a trading decision's order carries them."""
    return params.stop_atr_mult * atr, params.target_atr_mult * atr


def drawdown_room(state: EnvState, params: EnvParams) -> jax.Array:
    """The account's room before a breach, as a share of the trailing drawdown (1 for a fresh account, and always 1
    for an account without a trailing drawdown)."""
    room = (state.equity - drawdown_threshold(state.peak, params)) / params.trailing_drawdown
    return jnp.where(jnp.isinf(params.trailing_drawdown), 1.0, room)  # there room is inf / inf


@lru_cache(maxsize=1)
def default_market() -> Market:
    """The market of `DataConfig()` (synthetic NQ minute bars), built once on first use."""
    return load_market(DataConfig())


class TradingEnv(environment.Environment[EnvState, EnvParams]):
    """Trades one instrument over its bars. Build params with `make_params(market, split)`; `default_params` trades
    the default synthetic market's training split (for gymnax wrappers that read it)."""

    def __init__(self, config: EnvConfig | None = None):
        super().__init__()
        self.config = config or EnvConfig()
        if not 1 <= self.config.window <= MAX_WINDOW:
            raise ValueError(f"env.window must be between 1 and {MAX_WINDOW}, got {self.config.window}")
        if not 1 <= self.config.contracts_per_trade <= self.config.prop_firm.max_contracts:
            raise ValueError(
                f"env.contracts_per_trade={self.config.contracts_per_trade} must be between 1 and "
                f"prop_firm.max_contracts={self.config.prop_firm.max_contracts:g}"
            )
        check_rules(self.config.prop_firm)
        self.window = self.config.window
        self.extended = self.config.extended_features
        self._default_params: EnvParams | None = None

    def episode_steps(self, market: Market) -> int:
        """env.max_steps_in_episode, or the market's default when it is 0."""
        return self.config.max_steps_in_episode or market.episode_bars

    # ----------------------------------------------------------------------------------------- params
    def make_params(self, market: Market, split: str | tuple[int, int] = "train", sequential: bool = False) -> EnvParams:
        """Market arrays and rules as device arrays; every split of a market gives the same shapes."""
        start, end = market.split_range(split)
        if start < self.window - 1:
            raise ValueError(f"split starts at bar {start}, before one {self.window}-bar window exists")
        can_enter, flatten = session_rules(market, self.config.prop_firm)
        bars = np.stack(
            [market.open, market.high, market.low, market.close, market.atr, can_enter, flatten, market.sessions.session_id],
            axis=1,
        ).astype(np.float32)
        max_steps = end - 1 - start if sequential else self.episode_steps(market)
        return self.params_of(market.contract, bars, market.bar_features, market.context_features, start, end,
                              sequential, max_steps)

    def params_of(self, spec: ContractSpec, bars, bar_features, context_features, start: int, end: int,
                  sequential: bool, max_steps: int) -> EnvParams:
        """EnvParams of bar arrays (`bars`: the columns OPEN ... SESSION) traded as `spec` under this env's rules:
        make_params' body, also used by agents.trading for bars that arrive one at a time."""
        cfg, rules = self.config, self.config.prop_firm
        f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        return EnvParams(
            bars=jnp.asarray(bars, jnp.float32),
            bar_features=jnp.asarray(bar_features, jnp.float32),
            context_features=jnp.asarray(context_features, jnp.float32),
            start_bar=jnp.asarray(start, jnp.int32),
            end_bar=jnp.asarray(end, jnp.int32),
            sequential=jnp.asarray(sequential),
            max_steps_in_episode=jnp.asarray(max_steps, jnp.int32),
            tick_size=f32(spec.tick_size),
            point_value=f32(spec.point_value),
            commission_per_side=f32(spec.commission_per_side),
            slippage=f32(cfg.slippage_ticks * spec.tick_size),
            contracts=f32(cfg.contracts_per_trade),
            stop_atr_mult=f32(cfg.stop_atr_mult),
            target_atr_mult=f32(cfg.target_atr_mult),
            trail_atr_mult=f32(cfg.trail_atr_mult),
            breakeven_trigger_atr=f32(cfg.breakeven_trigger_atr),
            starting_balance=f32(rules.starting_balance),
            trailing_drawdown=f32(rules.trailing_drawdown),
            trail_stop_offset=f32(rules.trail_stop_offset),
            reward_scale=f32(cfg.reward_scale),
            breach_penalty=f32(cfg.breach_penalty),
            flat_between_sessions=jnp.asarray(flattens_at_session_end(spec, rules)),
        )

    @property
    def default_params(self) -> EnvParams:
        """The default synthetic market's training split, built on first use."""
        if self._default_params is None:
            self._default_params = self.make_params(default_market(), "train")
        return self._default_params

    # ---------------------------------------------------------------------------------------- gymnax API
    @property
    def name(self) -> str:
        return "FuturesTrading-v0"

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS

    @property
    def obs_size(self) -> int:
        base = self.window * N_BAR_FEATURES + N_POSITION + N_VALIDITY
        return base + (N_CONTEXT_FEATURES + N_RISK if self.extended else 0)

    def observation_column(self, name: str) -> int | None:
        """The column of a named feature in this env's observation: a bar feature (of the latest bar of the window),
        a position or validity feature, or a context or risk feature (None in the short form, which has neither)."""
        after_window = self.window * N_BAR_FEATURES
        context_start = after_window + N_POSITION + N_VALIDITY
        groups = [
            ([f.name for f in FEATURES if f.group == "bar"], (self.window - 1) * N_BAR_FEATURES),
            (POSITION_FEATURES, after_window),
            (VALIDITY_FEATURES, after_window + N_POSITION),
            ([f.name for f in FEATURES if f.group != "bar"], context_start if self.extended else None),
            ([f.name for f in RISK_FEATURES], context_start + N_CONTEXT_FEATURES if self.extended else None),
        ]
        for names, start in groups:
            if name in names:
                return None if start is None else start + list(names).index(name)
        raise KeyError(f"no observation feature named {name!r}")

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(NUM_ACTIONS)

    def observation_space(self, params: EnvParams | None = None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, (self.obs_size,), jnp.float32)

    def state_space(self, params: EnvParams | None = None) -> spaces.Dict:
        raise NotImplementedError("TradingEnv does not describe its state space")

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        state = self.initial_state(key, params)
        return self.get_obs(state, params), state

    def step_env(self, key, state, action, params):
        next_state, reward, terminated, info = self.transition(state, action, params)
        return self.get_obs(next_state, params), next_state, reward, terminated, info

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        """gymnax's step with auto-reset, computing each observation once: the reset state's obs is only
        built for the state that is kept, and the pre-reset obs is returned as info["final_observation"]."""
        return step_with_reset(self, key, state, action, self.default_params if params is None else params)

    def is_truncated(self, state: EnvState, params: EnvParams) -> jax.Array:
        return (state.time >= params.max_steps_in_episode) | (state.t >= params.end_bar - 1)

    def is_terminal(self, state: EnvState, params: EnvParams) -> jax.Array:
        threshold = drawdown_threshold(state.peak, params)
        return (state.equity <= threshold) | self.is_truncated(state, params)

    # ------------------------------------------------------------------------------------------ reset
    def initial_state(self, key: jax.Array, params: EnvParams, bar: jax.Array | None = None) -> EnvState:
        """A fresh account at `bar`, or at a random bar of the split (the split's start when sequential)."""
        if bar is None:
            last_start = jnp.maximum(params.end_bar - 1 - params.max_steps_in_episode, params.start_bar + 1)
            random_bar = jax.random.randint(key, (), params.start_bar, last_start)
            bar = jnp.where(params.sequential, params.start_bar, random_bar)
        bar = jnp.asarray(bar, jnp.int32)
        zero_i = jnp.zeros((), jnp.int32)
        zero_f = jnp.zeros((), jnp.float32)
        balance = params.starting_balance.astype(jnp.float32)
        return EnvState(
            time=zero_i,
            t=bar,
            side=zero_i,
            entry_price=zero_f,
            stop=zero_f,
            target=zero_f,
            trailing=jnp.zeros((), bool),
            entry_time=zero_i,
            balance=balance,
            equity=balance,
            peak=balance,
            trades=zero_i,
            wins=zero_i,
            consecutive_losses=zero_i,
            recent_wins=zero_i,
            recent_count=zero_i,
            session=params.bars[bar, SESSION].astype(jnp.int32),
            session_start_equity=balance,
            trades_today=zero_i,
            commissions=zero_f,
            entry_locked=jnp.zeros((), bool),
        )

    # ------------------------------------------------------------------------------------------- mask
    def action_mask(self, state: EnvState, params: EnvParams) -> jax.Array:
        bar = params.bars[state.t]
        flat = state.side == 0
        can_enter = flat & (bar[CAN_ENTER] > 0) & (state.t + 1 < params.end_bar - 1) & ~state.entry_locked
        in_pos = ~flat
        profit_atr = state.side * (bar[CLOSE] - state.entry_price) / bar[ATR]
        stop_behind_entry = jnp.where(state.side > 0, state.stop < state.entry_price, state.stop > state.entry_price)
        move_to_be = in_pos & (profit_atr >= params.breakeven_trigger_atr) & stop_behind_entry
        return jnp.stack(
            [jnp.ones((), bool), can_enter, can_enter, move_to_be, in_pos & ~state.trailing, in_pos & state.trailing]
        )

    # ---------------------------------------------------------------------------------------- observe
    def get_obs(self, state: EnvState, params: EnvParams, key: jax.Array | None = None) -> jax.Array:
        return self._observe(state, params, self.action_mask(state, params))

    def _observe(self, state: EnvState, params: EnvParams, mask: jax.Array) -> jax.Array:
        w = self.window
        window = jax.lax.dynamic_slice(params.bar_features, (state.t - (w - 1), 0), (w, N_BAR_FEATURES))
        bar = params.bars[state.t]
        atr, close = bar[ATR], bar[CLOSE]
        in_pos = state.side != 0
        side = state.side.astype(jnp.float32)
        position = jnp.stack(
            [
                side,
                jnp.clip(side * (close - state.entry_price) / atr, -10.0, 10.0) / 5.0,
                jnp.where(in_pos, jnp.minimum((state.time - state.entry_time) / 60.0, 5.0), 0.0),
                jnp.where(in_pos, side * (close - state.stop) / atr, 0.0),
                jnp.where(in_pos, side * (state.target - close) / atr, 0.0),
            ]
        )
        validity = jnp.stack([mask[BUY], mask[MOVE_TO_BE], state.trailing]).astype(jnp.float32)
        parts = [window.reshape(-1), position.astype(jnp.float32), validity]
        if self.extended:
            parts += [params.context_features[state.t], self.risk_features(state, params)]
        return jnp.concatenate(parts)

    def risk_features(self, state: EnvState, params: EnvParams) -> jax.Array:
        win_rate = jnp.where(state.recent_count > 0, recent_win_rate(state), 0.5)
        return jnp.stack(
            [
                drawdown_room(state, params),
                jnp.minimum(state.consecutive_losses / 5.0, 2.0),
                win_rate,
                state.trades_today / 10.0,
                (state.equity - state.session_start_equity) / 1000.0,
            ]
        ).astype(jnp.float32)

    # ------------------------------------------------------------------------------------------- step
    def transition(self, state: EnvState, action: jax.Array, params: EnvParams):
        """One bar forward: fill the order placed at bar t on bar t+1, then stops/targets/session close and
        the drawdown rule on bar t+1. Returns (next_state, reward, terminated, info). Invalid actions act
        as HOLD and are flagged in info."""
        now, bar = params.bars[state.t], params.bars[state.t + 1]
        a, valid = self.taken_action(state, action, params)
        pos = fill_entry(state, a, *manage_position(state, a, now, params), now, bar, params)
        balance, commissions = pay_entry(state, pos.entered, params)
        # Bar t+1 is checked against the threshold the peak set before it.
        threshold = drawdown_threshold(state.peak, params)
        exit_ = find_exit(pos, balance, threshold, carried_over(pos, now, bar, params), bar, params)
        balance, commissions, trade_pnl = settle_exit(pos, exit_, balance, commissions, params)
        still_open = (pos.side != 0) & ~exit_.exiting
        side = jnp.where(exit_.exiting, 0, pos.side)
        equity = marked_equity(balance, side, pos.entry_price, bar[CLOSE], params)
        # A breach: the liquidation, or an exit whose fill (a gap, the slippage) left equity at the threshold or below.
        terminated = exit_.liquidated | (equity <= threshold)
        next_state = EnvState(
            time=state.time + 1,
            t=state.t + 1,
            side=side,
            entry_price=pos.entry_price,
            stop=trailed_stop(pos, still_open, bar, params),
            target=pos.target,
            trailing=pos.trailing & still_open,
            entry_time=pos.entry_time,
            balance=balance,
            equity=equity,
            commissions=commissions,
            peak=raised_peak(state.peak, pos, still_open, balance, equity, bar, params),
            **record_trade(state, exit_.exiting, trade_pnl > 0),
            **roll_session(state, bar, exit_.exiting),
        )
        reason = exit_reason(state.trailing, pos, exit_)
        info = step_info(valid, pos, exit_, reason, trade_pnl, next_state, terminated, params)
        return next_state, step_reward(state, equity, terminated, params), terminated, info

    def taken_action(self, state: EnvState, action: jax.Array, params: EnvParams) -> tuple[jax.Array, jax.Array]:
        """The action taken (`action` where the mask allows it, else HOLD) and whether `action` was valid."""
        action = jnp.asarray(action, jnp.int32)
        valid = self.action_mask(state, params)[action]
        return jnp.where(valid, action, HOLD), valid


# ----------------------------------------------------------------------------- transition's steps, in order
def step_with_reset(env, key, state, action, params):
    """gymnax's step with auto-reset for an env with `transition`, `is_truncated`, `initial_state`, `action_mask`,
    `get_obs` and `_observe` (TradingEnv, jaxenv.account_env.AccountEnv): the reset state's observation is only built
    for the state that is kept, the pre-reset one is info["final_observation"], and the returned state's mask is
    info["action_mask"], so callers need not compute it again."""
    next_state, reward, terminated, info = env.transition(state, action, params)
    truncated = env.is_truncated(next_state, params)
    done = terminated | truncated
    reset_state = env.initial_state(key, params)
    kept = jax.tree.map(lambda r, s: jax.lax.select(done, r, s), reset_state, next_state)
    mask = env.action_mask(kept, params)
    info = {**info, "terminated": terminated, "truncated": truncated,
            "final_observation": env.get_obs(next_state, params), "action_mask": mask}
    return env._observe(kept, params, mask), kept, reward, terminated, truncated, info


def to_tick(x: jax.Array, tick_size: jax.Array) -> jax.Array:
    """`x` rounded to the nearest tick."""
    return jnp.round(x / tick_size) * tick_size


def commission(params: EnvParams) -> jax.Array:
    """The commission of one side of a trade, all contracts."""
    return params.commission_per_side * params.contracts


def money_per_point(params: EnvParams) -> jax.Array:
    """Dollars per point of price move of a position, all contracts."""
    return params.point_value * params.contracts


def better_for(is_long: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    """Of two prices, the better for the position (the higher for a long): e.g. the tighter of two stops."""
    return jnp.where(is_long, jnp.maximum(x, y), jnp.minimum(x, y))


def trail_level(close: jax.Array, atr: jax.Array, side: jax.Array, params: EnvParams) -> jax.Array:
    """Where a trailing stop sits after a bar: trail_atr_mult ATRs behind its close, on a tick."""
    return to_tick(close - side.astype(jnp.float32) * params.trail_atr_mult * atr, params.tick_size)


def manage_position(state: EnvState, a: jax.Array, now: jax.Array, params: EnvParams) -> tuple[jax.Array, jax.Array]:
    """Stop and trail flag after bar t's MOVE_TO_BE (stop to entry) / ENABLE_TRAIL (tighter trail) / DISABLE_TRAIL."""
    stop = jnp.where(a == MOVE_TO_BE, state.entry_price, state.stop)
    tighter = better_for(state.side > 0, stop, trail_level(now[CLOSE], now[ATR], state.side, params))
    stop = jnp.where(a == ENABLE_TRAIL, tighter, stop)
    return stop, (state.trailing | (a == ENABLE_TRAIL)) & (a != DISABLE_TRAIL)


def fill_entry(state: EnvState, a: jax.Array, stop: jax.Array, trailing: jax.Array, now: jax.Array, bar: jax.Array,
               params: EnvParams) -> Position:
    """The position held through bar t+1: a BUY/SELL fills at its open plus slippage, bracketed by bar t's ATR."""
    entered = (a == BUY) | (a == SELL)
    side = jnp.where(a == BUY, 1, jnp.where(a == SELL, -1, state.side))
    sign = side.astype(jnp.float32)
    fill = bar[OPEN] + sign * params.slippage
    stop_distance, target_distance = bracket_distances(params, now[ATR])
    return Position(
        side=side,
        entry_price=jnp.where(entered, fill, state.entry_price),
        stop=jnp.where(entered, to_tick(fill - sign * stop_distance, params.tick_size), stop),
        target=jnp.where(entered, to_tick(fill + sign * target_distance, params.tick_size), state.target),
        trailing=trailing & ~entered,
        entry_time=jnp.where(entered, state.time, state.entry_time),
        entered=entered,
    )


def pay_entry(state: EnvState, entered: jax.Array, params: EnvParams) -> tuple[jax.Array, jax.Array]:
    """Balance and commissions paid after an entry's commission (unchanged without an entry)."""
    paid = jnp.where(entered, commission(params), 0.0)
    return state.balance - paid, state.commissions + paid


def carried_over(pos: Position, now: jax.Array, bar: jax.Array, params: EnvParams) -> jax.Array:
    """A held position bar t+1 carries into another session (its last bar missing) where that is not allowed."""
    return (pos.side != 0) & ~pos.entered & (bar[SESSION] != now[SESSION]) & params.flat_between_sessions


def liquidation_price(pos: Position, balance: jax.Array, threshold: jax.Array, params: EnvParams) -> jax.Array:
    """The price at which the position's equity meets the drawdown threshold."""
    safe_sign_pv = jnp.where(pos.side != 0, pos.side.astype(jnp.float32) * money_per_point(params), 1.0)  # flat: no 0
    return pos.entry_price + (threshold - balance) / safe_sign_pv


def adverse_exit(pos: Position, liquidation: jax.Array, carried: jax.Array, bar: jax.Array):
    """(level, hit, liquidated): the nearer of stop and liquidation price, bar t+1 reaches it, it is the latter."""
    is_long = pos.side > 0
    level = better_for(is_long, pos.stop, liquidation)
    hit = (pos.side != 0) & ~carried & jnp.where(is_long, bar[LOW] <= level, bar[HIGH] >= level)
    return level, hit, hit & jnp.where(is_long, liquidation >= pos.stop, liquidation <= pos.stop)


def exit_fill(pos: Position, adverse_level, adverse_hit, target_hit, carried, bar: jax.Array, params: EnvParams):
    """The exit's price; a session exit fills at bar t+1's close (a carried position at its open)."""
    is_long, sign, open_ = pos.side > 0, pos.side.astype(jnp.float32), bar[OPEN]
    # A gap through a level fills at the open; stops, liquidations and closes slip, the target is a limit order.
    adverse_fill = jnp.where(is_long, jnp.minimum(adverse_level, open_), jnp.maximum(adverse_level, open_))
    adverse_fill = adverse_fill - sign * params.slippage
    target_fill = better_for(is_long, pos.target, open_)
    session_fill = jnp.where(carried, open_, bar[CLOSE]) - sign * params.slippage
    return jnp.where(adverse_hit, adverse_fill, jnp.where(target_hit, target_fill, session_fill))


def find_exit(pos: Position, balance: jax.Array, threshold: jax.Array, carried: jax.Array, bar: jax.Array,
              params: EnvParams) -> Exit:
    """How bar t+1 closes the position: at the adverse level (before the target when both), target, or session end."""
    liquidation = liquidation_price(pos, balance, threshold, params)
    level, adverse_hit, liquidated = adverse_exit(pos, liquidation, carried, bar)
    target_hit = (pos.side != 0) & ~carried & ~adverse_hit & jnp.where(pos.side > 0, bar[HIGH] >= pos.target,
                                                                        bar[LOW] <= pos.target)
    session_exit = (pos.side != 0) & ~adverse_hit & ~target_hit & ((bar[FLATTEN] > 0) | carried)
    return Exit(liquidated=liquidated, stop_hit=adverse_hit & ~liquidated, target_hit=target_hit,
                session_exit=session_exit, exiting=adverse_hit | target_hit | session_exit,
                price=exit_fill(pos, level, adverse_hit, target_hit, carried, bar, params))


def settle_exit(pos: Position, exit_: Exit, balance: jax.Array, commissions: jax.Array, params: EnvParams):
    """(balance, commissions, trade_pnl) after the exit; trade_pnl is the whole trade's, net of both commissions."""
    comm = commission(params)
    gross = pos.side.astype(jnp.float32) * (exit_.price - pos.entry_price) * money_per_point(params)
    booked_balance = balance + jnp.where(exit_.exiting, gross - comm, 0.0)
    return booked_balance, commissions + jnp.where(exit_.exiting, comm, 0.0), gross - 2.0 * comm


def marked_equity(balance: jax.Array, side: jax.Array, entry_price: jax.Array, price: jax.Array,
                  params: EnvParams) -> jax.Array:
    """The account's equity with the position (side 0: none) marked at `price`."""
    return balance + side.astype(jnp.float32) * (price - entry_price) * money_per_point(params)


def trailed_stop(pos: Position, still_open: jax.Array, bar: jax.Array, params: EnvParams) -> jax.Array:
    """The stop from bar t+2 on: a trailing stop follows bar t+1's close, never loosening."""
    trailed = better_for(pos.side > 0, pos.stop, trail_level(bar[CLOSE], bar[ATR], pos.side, params))
    return jnp.where(still_open & pos.trailing, trailed, pos.stop)


def raised_peak(peak: jax.Array, pos: Position, still_open: jax.Array, balance: jax.Array, equity: jax.Array,
                bar: jax.Array, params: EnvParams) -> jax.Array:
    """The peak after bar t+1: raised to its best mark (favourable extreme while held, else the equity)."""
    favourable = jnp.where(pos.side > 0, bar[HIGH], bar[LOW])
    best_mark = jnp.where(still_open, marked_equity(balance, pos.side, pos.entry_price, favourable, params), equity)
    return jnp.maximum(peak, jnp.maximum(best_mark, equity))


def record_trade(state: EnvState, exiting: jax.Array, win: jax.Array) -> dict[str, jax.Array]:
    """The trade counters of EnvState after bar t+1 (unchanged unless a trade closed on it)."""
    return dict(
        trades=state.trades + exiting,
        wins=state.wins + (exiting & win),
        consecutive_losses=jnp.where(exiting, jnp.where(win, 0, state.consecutive_losses + 1),
                                     state.consecutive_losses),
        recent_wins=jnp.where(exiting, ((state.recent_wins << 1) | win.astype(jnp.int32)) & ((1 << RECENT_TRADES) - 1),
                              state.recent_wins),
        recent_count=jnp.where(exiting, jnp.minimum(state.recent_count + 1, RECENT_TRADES), state.recent_count),
    )


def roll_session(state: EnvState, bar: jax.Array, exiting: jax.Array) -> dict[str, jax.Array]:
    """EnvState's session fields at bar t+1: a new session restarts them and lifts a replaced account's entry lock."""
    session = bar[SESSION].astype(jnp.int32)
    new_session = session != state.session
    return dict(
        session=session,
        session_start_equity=jnp.where(new_session, state.equity, state.session_start_equity),
        trades_today=jnp.where(new_session, 0, state.trades_today) + exiting.astype(jnp.int32),
        entry_locked=state.entry_locked & ~new_session,
    )


def exit_reason(was_trailing: jax.Array, pos: Position, exit_: Exit) -> jax.Array:
    """The EXIT_REASONS code; a stop is a trailing one if trailing at bar t, break-even if it sat at the entry."""
    stop_kind = jnp.where(was_trailing & ~pos.entered, TRAILING_STOP,
                          jnp.where(pos.stop == pos.entry_price, BREAKEVEN_STOP, STOP_LOSS))
    other = jnp.where(exit_.target_hit, TAKE_PROFIT, jnp.where(exit_.session_exit, SESSION_CLOSE, NO_EXIT))
    return jnp.where(exit_.liquidated, BREACH, jnp.where(exit_.stop_hit, stop_kind, other))


def step_reward(state: EnvState, equity: jax.Array, terminated: jax.Array, params: EnvParams) -> jax.Array:
    """The bar's change of equity, less the breach penalty on a breach, scaled."""
    reward = (equity - state.equity - jnp.where(terminated, params.breach_penalty, 0.0)) * params.reward_scale
    return reward.astype(jnp.float32)


def step_info(valid, pos: Position, exit_: Exit, reason, trade_pnl, next_state: EnvState, terminated,
              params: EnvParams) -> dict[str, Any]:
    """transition's info: the bar's entry and exit (zeros where none) and the episode's running totals."""
    return {
        "invalid_action": ~valid,
        "entry_side": jnp.where(pos.entered, pos.side, 0),
        "entry_price": jnp.where(pos.entered, pos.entry_price, 0.0),
        "exit_reason": reason,
        "exit_price": jnp.where(exit_.exiting, exit_.price, 0.0),
        "trade_pnl": jnp.where(exit_.exiting, trade_pnl, 0.0),
        "episode_pnl": next_state.equity - params.starting_balance,
        "episode_trades": next_state.trades,
        "episode_wins": next_state.wins,
        "episode_breached": terminated,
        "episode_commissions": next_state.commissions,
    }


def flattens_at_session_end(spec: ContractSpec, rules: PropFirmRules) -> bool:
    """Must positions be flat at each session's end: the instrument says so, or the prop firm's flat_by (futures)."""
    return spec.flat_at_close or prop_flat_by(spec, rules) is not None


def prop_flat_by(spec: ContractSpec, rules: PropFirmRules) -> str | None:
    """The prop firm's flat-by time where it binds: futures accounts, when set."""
    return rules.flat_by if rules.flat_by and spec.kind == "future" else None


def session_rules(market: Market, rules: PropFirmRules) -> tuple[np.ndarray, np.ndarray]:
    """Per bar: may a new entry be placed, and must an open position be closed at this bar's close
    (jaxenv.sessions.flat_rules: from the calendar and the bar's own stamp, never the next bar's)."""
    spec = market.contract
    return flat_rules(market.timestamps, market.sessions, spec, prop_flat_by(spec, rules), rules.timezone,
                      rules.no_entry_minutes_before_close)
