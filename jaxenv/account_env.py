"""One prop-firm account trading several instruments on one timeline (issue 77): gymnax style, pure JAX.

`AccountEnv` trades every instrument of a `jaxenv.market_set.MarketSet` in ONE account. Each instrument is traded
exactly as `jaxenv.env.TradingEnv` trades it (its own contract, costs, bracket, break-even and trailing stop: the
env's helpers, vmapped over the instrument axis); the account layer ties them together:

- **One balance and one trailing threshold** on the combined equity (balance + every open position's mark), the
  threshold trailing the combined peak as TradingEnv's does (`drawdown_threshold`).
- **The breach check, each bar t+1**, against the threshold the previous peak set, at the combined WORST mark: every
  open position at its bar's adverse extreme (a long at the low, a short at the high) floored at its stop's fill (the
  stop, or the open where the bar gapped through it); a position on an absent bar, or one carried into a new session,
  at the bar's open. The account is breached when that combined worst equity reaches the threshold. Every open
  position is then liquidated where the combined equity meets the threshold, each moved the same share λ of the way
  from its bar's open to its worst mark (λ = 0: a gap opened the bar at or below the threshold, all fill at their
  opens); the fills slip as TradingEnv's liquidation does and the episode ends (terminated). With one instrument this
  is TradingEnv's rule exactly: the liquidation price where equity meets the threshold, at the open on a gap.
- **The peak** rises to the bar's best combined mark: every position still open at its favourable extreme (an upper
  bound of the combined intrabar high, the conservative counterpart of the worst mark), else the equity.
- **Account limits** (the prop firm's rules, `EnvConfig.prop_firm`): a cap on the contracts held, in mini-equivalents
  (`max_contracts`; a built-in micro counts 0.1); half that cap until the trailing threshold locks
  (`half_size_until_threshold`); no opposite sides on a declared correlated pair (`correlated`).

Actions are TradingEnv's six, one per instrument. The masks apply the account rules in a FIXED instrument order: head
i's mask depends on the actions taken by heads < i at this step (an entry of instrument 0 counts against the cap of
instrument 1). `sequential_mask(state, params, i, chosen)` is head i's mask; `sequential_masks(state, params,
actions)` every head's given the others; `sample_actions` / `log_prob` sample and score head by head, so a policy's
log-probability (the sum over heads of each head's log-probability under its mask) is exact. `step` takes what the
sequential masks forbid as HOLD and flags it in info["invalid_action"], as TradingEnv does.

Absent bars (`MarketSet.present` False): no entry is allowed on them (mask), an entry ordered for a bar where the
instrument is absent is cancelled (no fill, no commission; info["unfilled"]), no stop or target fills on them, and a
position is marked at the carried close. The flat-by close and the close of a position carried into a new session
still happen on an absent bar, at the carried close (the firm's rule binds every instrument).

    market_set = load_market_set([("NQ", "synthetic:pair_signal"), ("ES", "synthetic:pair_signal")])
    rules = dataclasses.replace(PropFirmRules(), max_contracts=2.0, correlated=[["NQ", "ES"]])
    env = AccountEnv(dataclasses.replace(EnvConfig(), prop_firm=rules))   # or load_config(...).env
    params = env.make_params(market_set, "train")
    obs, state = env.reset(key, params)                     # obs.instruments [I, F_inst], obs.account [F_acc]
    actions, log_prob = env.sample_actions(key, state, params, logits)   # logits [I, 6], head by head
    obs, state, reward, terminated, truncated, info = env.step(key, state, actions, params)
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from bridge.protocol import BUY, HOLD, NUM_ACTIONS, SELL
from jaxenv.config import EnvConfig
from jaxenv.contracts import CONTRACTS, ContractSpec
from jaxenv.env import (
    CLOSE,
    HIGH,
    LOW,
    OPEN,
    EnvParams,
    EnvState,
    Exit,
    TradingEnv,
    better_for,
    carried_over,
    commission,
    drawdown_threshold,
    exit_fill,
    exit_reason,
    fill_entry,
    find_exit,
    liquidation_price,
    manage_position,
    marked_equity,
    record_trade,
    roll_session,
    settle_exit,
    step_info,
    step_with_reset,
    step_reward,
    trailed_stop,
)
from jaxenv.market_set import MarketSet

# Per-instrument columns after TradingEnv's observation of the instrument (its obs_size columns, the account's risk
# features included): is bar t the instrument's own, one entry's size in mini-equivalents, BUY and SELL allowed.
INSTRUMENT_EXTRAS = ("present", "entry_minis", "can_buy", "can_sell")
# The account block: open contracts in minis / the cap (prop_firm.max_contracts; 0 without a cap), the room left under
# the cap in force / the cap (1 without a cap), the half-size rule binds, the trailing threshold is locked, open
# positions / I.
ACCOUNT_FEATURES = ("minis_open", "minis_room", "half_size", "threshold_locked", "open_positions")
TENTHS_PER_MINI = 10  # contracts are counted in tenths of a mini, in integers: a micro is 1, a mini 10
NO_CAP = 1 << 30  # tenths: no cap
# info's per-instrument entries ([I]); its others (episode_*, terminated, truncated, ...) are the account's.
INSTRUMENT_INFO = ("invalid_action", "unfilled", "entry_side", "entry_price", "exit_reason", "exit_price", "trade_pnl")
MASKED_LOGIT = -1e9  # as agents.rl.networks: exp() underflows to 0, and no 0·(-inf) = nan in an entropy


def is_micro(spec: ContractSpec) -> bool:
    """A built-in micro contract (MNQ, MES, MBT): its symbol starts with M and the built-in of that name is a micro."""
    symbol = spec.symbol.upper()
    return symbol.startswith("M") and symbol in CONTRACTS and CONTRACTS[symbol].name.startswith("Micro")


def mini_tenths(spec: ContractSpec, contracts: int) -> int:
    """One entry of `contracts` contracts in tenths of a mini: a micro counts 1, any other contract 10."""
    return int(contracts) * (1 if is_micro(spec) else TENTHS_PER_MINI)


@struct.dataclass
class AccountParams(environment.EnvParams):
    inst: EnvParams = None  # TradingEnv's params of each instrument, stacked: every field has a leading [I] axis
    present: jax.Array = None  # bool [n, I]
    start_bar: jax.Array = 0
    end_bar: jax.Array = 0
    sequential: jax.Array = False
    max_steps_in_episode: jax.Array = 1950
    starting_balance: jax.Array = 50_000.0
    trailing_drawdown: jax.Array = 2_500.0
    trail_stop_offset: jax.Array = 100.0
    reward_scale: jax.Array = 0.01
    breach_penalty: jax.Array = 0.0
    entry_tenths: jax.Array = None  # int32 [I]: one entry's size in tenths of a mini
    cap_tenths: jax.Array = NO_CAP  # prop_firm.max_contracts in tenths of a mini (NO_CAP: none)
    half_size: jax.Array = False  # prop_firm.half_size_until_threshold
    opposed: jax.Array = None  # bool [I, I]: prop_firm.correlated's pairs, symmetric

    @property
    def num_instruments(self) -> int:
        return self.present.shape[-1]


@struct.dataclass
class Legs:
    """The position of each instrument, every field [I] (TradingEnv's EnvState position fields)."""

    side: jax.Array
    entry_price: jax.Array
    stop: jax.Array
    target: jax.Array
    trailing: jax.Array
    entry_time: jax.Array


@struct.dataclass
class AccountState(environment.EnvState):
    t: jax.Array
    legs: Legs
    balance: jax.Array  # realised, after commissions, all instruments
    equity: jax.Array  # balance + every open position marked at bar t's close
    peak: jax.Array
    trades: jax.Array
    wins: jax.Array
    consecutive_losses: jax.Array
    recent_wins: jax.Array
    recent_count: jax.Array
    session: jax.Array
    session_start_equity: jax.Array
    trades_today: jax.Array
    commissions: jax.Array
    entry_locked: jax.Array


@struct.dataclass
class AccountObs:
    """`instruments` [I, F_inst]: each row TradingEnv's observation of the instrument (obs_size columns, the account's
    risk features in its last five) then INSTRUMENT_EXTRAS; `account` [F_acc]: ACCOUNT_FEATURES."""

    instruments: jax.Array
    account: jax.Array


def flatten_observation(obs: AccountObs) -> jax.Array:
    """One vector: the instrument rows in instrument order, then the account block."""
    return jnp.concatenate([obs.instruments.reshape(*obs.instruments.shape[:-2], -1), obs.account], axis=-1)


def leg_state(state: AccountState, leg: Legs) -> EnvState:
    """TradingEnv's state of one instrument: its position (`leg`, one instrument's fields) in the account's books."""
    return EnvState(
        time=state.time, t=state.t, side=leg.side, entry_price=leg.entry_price, stop=leg.stop, target=leg.target,
        trailing=leg.trailing, entry_time=leg.entry_time, balance=state.balance, equity=state.equity, peak=state.peak,
        trades=state.trades, wins=state.wins, consecutive_losses=state.consecutive_losses,
        recent_wins=state.recent_wins, recent_count=state.recent_count, session=state.session,
        session_start_equity=state.session_start_equity, trades_today=state.trades_today,
        commissions=state.commissions, entry_locked=state.entry_locked,
    )


def threshold_locked(peak: jax.Array, params: AccountParams) -> jax.Array:
    """The trailing threshold has stopped trailing (jaxenv.env.drawdown_threshold's freeze); always, without one."""
    return jnp.isinf(params.trailing_drawdown) | (
        peak - params.trailing_drawdown >= params.starting_balance + params.trail_stop_offset)


def cap_in_force(state: AccountState, params: AccountParams) -> jax.Array:
    """The cap on contracts held, in tenths of a mini: prop_firm.max_contracts, or half of it while the half-size rule
    binds."""
    half = params.half_size & ~threshold_locked(state.peak, params)
    return jnp.where(half, params.cap_tenths // 2, params.cap_tenths)


def entry_side(actions: jax.Array) -> jax.Array:
    """+1 for BUY, -1 for SELL, else 0."""
    return jnp.where(actions == BUY, 1, jnp.where(actions == SELL, -1, 0))


def _sum(x: jax.Array) -> jax.Array:
    """The sum over the instrument axis (the last), as adds in instrument order: element-wise work that fuses with
    its neighbours (a reduction over a short axis does not); with one instrument, x itself."""
    parts = [x[..., i] for i in range(x.shape[-1])]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _others(x: jax.Array) -> jax.Array:
    """[I]: the sum of x over every other instrument (exactly 0 with one instrument)."""
    n = x.shape[-1]
    if n == 1:
        return jnp.zeros_like(x)
    return jnp.stack([_sum(jnp.concatenate([x[..., :i], x[..., i + 1:]], axis=-1)) for i in range(n)], axis=-1)


def _each(fn, in_axes=0):
    """jax.vmap over the instrument axis; with one instrument, `fn` on that instrument's slice (a vmap over an axis of
    one still runs XLA's batched gathers, slower on CPU than the plain call)."""
    vmapped = jax.vmap(fn, in_axes=in_axes)

    def each(*args):
        axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
        n = next(jax.tree.leaves(a)[0].shape[0] for a, axis in zip(args, axes) if axis == 0)
        if n > 1:
            return vmapped(*args)
        out = fn(*(jax.tree.map(lambda x: x[0], a) if axis == 0 else a for a, axis in zip(args, axes)))
        return jax.tree.map(lambda x: x[None], out)

    return each

class AccountEnv(environment.Environment[AccountState, AccountParams]):
    """Trades the instruments of a MarketSet in one prop-firm account (the module's docstring). Build params with
    `make_params(market_set, split)`."""

    def __init__(self, config: EnvConfig | None = None):
        super().__init__()
        self.single = TradingEnv(config)  # validates the config (its prop-firm rules too); trades each instrument
        self.config = self.single.config
        self.window = self.single.window
        self.extended = self.single.extended

    # ----------------------------------------------------------------------------------------- params
    def make_params(self, market_set: MarketSet, split: str | tuple[int, int] = "train",
                    sequential: bool = False) -> AccountParams:
        """Each instrument's TradingEnv params (its own contract and costs, the set's sessions and prop-firm session
        rules) stacked on an instrument axis, and the account's rules."""
        per = [self.single.make_params(market, split, sequential) for market in market_set.markets]
        return self.params_of(per, [m.contract for m in market_set.markets], market_set.present)

    def params_of(self, per: list[EnvParams], contracts: list[ContractSpec], present) -> AccountParams:
        """AccountParams of each instrument's TradingEnv params `per` (one start, end and episode length), traded as
        `contracts`, `present` bool [n, I]: make_params' body, also used by agents.trading for bars that arrive one
        joint bar at a time."""
        inst = jax.tree.map(lambda *xs: jnp.stack(xs), *per)
        first, rules = per[0], self.config.prop_firm
        symbols = [c.symbol.upper() for c in contracts]
        n = len(symbols)
        opposed = np.zeros((n, n), bool)
        for a, b in rules.correlated:
            a, b = a.strip().upper(), b.strip().upper()
            if a in symbols and b in symbols:
                i, j = symbols.index(a), symbols.index(b)
                opposed[i, j] = opposed[j, i] = True
        cap = rules.max_contracts  # in mini-equivalents
        cap_tenths = NO_CAP if math.isinf(cap) else min(NO_CAP, math.floor(cap * TENTHS_PER_MINI + 1e-6))
        f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        return AccountParams(
            inst=inst,
            present=jnp.asarray(present, bool),
            start_bar=first.start_bar,
            end_bar=first.end_bar,
            sequential=first.sequential,
            max_steps_in_episode=first.max_steps_in_episode,
            starting_balance=f32(rules.starting_balance),
            trailing_drawdown=f32(rules.trailing_drawdown),
            trail_stop_offset=f32(rules.trail_stop_offset),
            reward_scale=f32(self.config.reward_scale),
            breach_penalty=f32(self.config.breach_penalty),
            entry_tenths=jnp.asarray([mini_tenths(c, self.config.contracts_per_trade) for c in contracts], jnp.int32),
            cap_tenths=jnp.asarray(cap_tenths, jnp.int32),
            half_size=jnp.asarray(rules.half_size_until_threshold),
            opposed=jnp.asarray(opposed),
        )

    # ---------------------------------------------------------------------------------------- gymnax API
    @property
    def name(self) -> str:
        return "FuturesAccount-v0"

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS  # per instrument

    def num_instruments(self, params: AccountParams) -> int:
        return params.num_instruments

    @property
    def instrument_obs_size(self) -> int:
        return self.single.obs_size + len(INSTRUMENT_EXTRAS)

    @property
    def account_obs_size(self) -> int:
        return len(ACCOUNT_FEATURES)

    def action_space(self, params: AccountParams | None = None) -> spaces.Box:
        n = 1 if params is None else params.num_instruments
        return spaces.Box(0, NUM_ACTIONS - 1, (n,), jnp.int32)

    def observation_space(self, params: AccountParams) -> spaces.Dict:
        return spaces.Dict({
            "instruments": spaces.Box(-jnp.inf, jnp.inf, (params.num_instruments, self.instrument_obs_size)),
            "account": spaces.Box(-jnp.inf, jnp.inf, (self.account_obs_size,)),
        })

    def reset_env(self, key: jax.Array, params: AccountParams) -> tuple[AccountObs, AccountState]:
        state = self.initial_state(key, params)
        return self.get_obs(state, params), state

    def step_env(self, key, state, actions, params):
        next_state, reward, terminated, info = self.transition(state, actions, params)
        return self.get_obs(next_state, params), next_state, reward, terminated, info

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, actions, params):
        """gymnax's step with auto-reset, as TradingEnv.step: the pre-reset observation in info["final_observation"],
        the returned state's first-head masks in info["action_mask"]."""
        return step_with_reset(self, key, state, actions, params)

    def is_truncated(self, state: AccountState, params: AccountParams) -> jax.Array:
        return (state.time >= params.max_steps_in_episode) | (state.t >= params.end_bar - 1)

    def is_terminal(self, state: AccountState, params: AccountParams) -> jax.Array:
        return (state.equity <= drawdown_threshold(state.peak, params)) | self.is_truncated(state, params)

    # ------------------------------------------------------------------------------------------ reset
    def initial_state(self, key: jax.Array, params: AccountParams, bar: jax.Array | None = None) -> AccountState:
        """A fresh account, flat in every instrument, at `bar` or TradingEnv's random start bar (the same key picks
        the same bar)."""
        base = self.single.initial_state(key, jax.tree.map(lambda x: x[0], params.inst), bar)
        n = params.num_instruments
        zero_i, zero_f = jnp.zeros(n, jnp.int32), jnp.zeros(n, jnp.float32)
        legs = Legs(side=zero_i, entry_price=zero_f, stop=zero_f, target=zero_f, trailing=jnp.zeros(n, bool),
                    entry_time=zero_i)
        fields = {name: getattr(base, name) for name in AccountState.__dataclass_fields__ if name != "legs"}
        return AccountState(legs=legs, **fields)

    # ------------------------------------------------------------------------------------------- masks
    def instrument_masks(self, state: AccountState, params: AccountParams) -> jax.Array:
        """[I, 6]: TradingEnv's mask of each instrument alone, with no entry on a bar where it is absent."""
        masks = _each(lambda leg, p: self.single.action_mask(leg_state(state, leg), p))(state.legs, params.inst)
        present = params.present[state.t]
        return masks.at[:, BUY].set(masks[:, BUY] & present).at[:, SELL].set(masks[:, SELL] & present)

    def account_rules(self, state: AccountState, params: AccountParams, head, before_sides: jax.Array) -> jax.Array:
        """[..., 6]: the account rules' mask of head `head` [...] (an instrument) given `before_sides` [..., I], the
        entries taken by the heads before it at this step (+1 BUY, -1 SELL, 0 none): the cap (the open contracts, the
        entries before and this one within the cap in force, in tenths of a mini) and the correlated pairs (no entry
        opposite a partner's open side or a partner's entry before)."""
        held, tenths = state.legs.side, params.entry_tenths
        used = _sum(jnp.abs(held) * tenths) + _sum(jnp.abs(before_sides) * tenths)
        fits = used + tenths[head] <= cap_in_force(state, params)
        partner = params.opposed[head]
        partner_long = jnp.any(partner & ((held > 0) | (before_sides > 0)), axis=-1)
        partner_short = jnp.any(partner & ((held < 0) | (before_sides < 0)), axis=-1)
        rule = jnp.ones((*fits.shape, NUM_ACTIONS), bool)
        return rule.at[..., BUY].set(fits & ~partner_short).at[..., SELL].set(fits & ~partner_long)

    def sequential_mask(self, state: AccountState, params: AccountParams, i, chosen: jax.Array,
                        masks: jax.Array | None = None) -> jax.Array:
        """[6]: head i's mask given `chosen` [I], the actions taken by heads < i at this step (entries >= i are
        ignored): its instrument's mask (instrument_masks) AND the account rules (account_rules). `masks`:
        instrument_masks, when already computed."""
        masks = self.instrument_masks(state, params) if masks is None else masks
        before = jnp.arange(params.num_instruments) < i
        before_sides = jnp.where(before, entry_side(jnp.asarray(chosen, jnp.int32)), 0)
        return masks[i] & self.account_rules(state, params, i, before_sides)

    def sequential_masks(self, state: AccountState, params: AccountParams, actions: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
        """([I, 6] the mask each head had, [I] the actions taken): head i's mask given the actions taken by heads < i,
        a forbidden action taken as HOLD."""
        actions = jnp.asarray(actions, jnp.int32)
        masks = self.instrument_masks(state, params)
        taken = jnp.full_like(actions, HOLD)
        rows = []
        for i in range(params.num_instruments):
            row = self.sequential_mask(state, params, i, taken, masks)
            rows.append(row)
            taken = taken.at[i].set(jnp.where(row[actions[i]], actions[i], HOLD))
        return jnp.stack(rows), taken

    def action_mask(self, state: AccountState, params: AccountParams) -> jax.Array:
        """[I, 6]: each head's mask with every head before it holding (head 0's is exact; a later head's is
        sequential_mask's once the earlier heads have chosen)."""
        n = params.num_instruments
        return self.instrument_masks(state, params) & self.account_rules(state, params, jnp.arange(n),
                                                                         jnp.zeros((n, n), jnp.int32))

    def sample_actions(self, key: jax.Array, state: AccountState, params: AccountParams, logits: jax.Array,
                       deterministic: bool = False) -> tuple[jax.Array, jax.Array]:
        """([I] actions, their joint log-probability): head by head in instrument order, each from its logits [I, 6]
        under its sequential mask (argmax where deterministic)."""
        masks = self.instrument_masks(state, params)
        taken = jnp.full(params.num_instruments, HOLD, jnp.int32)
        log_prob = jnp.zeros((), jnp.float32)
        for i, k in enumerate(jax.random.split(key, params.num_instruments)):
            masked = jnp.where(self.sequential_mask(state, params, i, taken, masks), logits[i], MASKED_LOGIT)
            a = jnp.argmax(masked) if deterministic else jax.random.categorical(k, masked)
            taken = taken.at[i].set(a.astype(jnp.int32))
            log_prob = log_prob + jax.nn.log_softmax(masked)[a]
        return taken, log_prob

    def log_prob(self, state: AccountState, params: AccountParams, logits: jax.Array, actions: jax.Array
                 ) -> jax.Array:
        """The joint log-probability of `actions` [I] under `logits` [I, 6]: the sum over heads of each head's under
        its sequential mask."""
        masks, _ = self.sequential_masks(state, params, actions)
        logp = jax.nn.log_softmax(jnp.where(masks, logits, MASKED_LOGIT), axis=-1)
        return _sum(jnp.take_along_axis(logp, jnp.asarray(actions, jnp.int32)[:, None], axis=-1)[:, 0])

    # ---------------------------------------------------------------------------------------- observe
    def get_obs(self, state: AccountState, params: AccountParams, key: jax.Array | None = None) -> AccountObs:
        return self._observe(state, params, self.action_mask(state, params))

    def _observe(self, state: AccountState, params: AccountParams, mask: jax.Array) -> AccountObs:
        # TradingEnv's observation of each instrument; its "can_enter" column is BUY or SELL allowed.
        entry_ok = mask[:, BUY] | mask[:, SELL]
        rows = _each(lambda leg, p, m: self.single._observe(leg_state(state, leg), p, m))(
            state.legs, params.inst, mask.at[:, BUY].set(entry_ok))
        extras = jnp.stack([params.present[state.t], params.entry_tenths / TENTHS_PER_MINI, mask[:, BUY],
                            mask[:, SELL]], axis=1).astype(jnp.float32)
        capped = params.cap_tenths < NO_CAP
        scale = jnp.maximum(params.cap_tenths, 1).astype(jnp.float32)
        open_tenths = _sum(jnp.abs(state.legs.side) * params.entry_tenths)
        room = jnp.clip((cap_in_force(state, params) - open_tenths) / scale, 0.0, 1.0)
        account = jnp.stack([
            jnp.where(capped, open_tenths / scale, 0.0),
            jnp.where(capped, room, 1.0),
            (params.half_size & ~threshold_locked(state.peak, params)).astype(jnp.float32),
            threshold_locked(state.peak, params).astype(jnp.float32),
            _sum((state.legs.side != 0).astype(jnp.float32)) / params.num_instruments,
        ]).astype(jnp.float32)
        return AccountObs(instruments=jnp.concatenate([rows, extras], axis=1), account=account)

    # ------------------------------------------------------------------------------------------- step
    def transition(self, state: AccountState, actions: jax.Array, params: AccountParams):
        """One bar forward for every instrument in one account. Returns (next_state, reward, terminated, info); info's
        per-instrument entries are [I], its episode totals the account's."""
        inst = params.inst
        now, bar = inst.bars[:, state.t], inst.bars[:, state.t + 1]  # [I, 8]
        here = params.present[state.t + 1]  # the instruments with a bar of their own at t+1
        # An absent instrument's bar is its carried close (as the market set builds it, whatever the data holds).
        flat = bar.at[:, OPEN].set(bar[:, CLOSE]).at[:, HIGH].set(bar[:, CLOSE]).at[:, LOW].set(bar[:, CLOSE])
        bar = jnp.where(here[:, None], bar, flat)
        _, taken = self.sequential_masks(state, params, actions)
        valid = taken == jnp.asarray(actions, jnp.int32)
        ordered = (taken == BUY) | (taken == SELL)
        unfilled = ordered & ~here
        a = jnp.where(unfilled, HOLD, taken)

        def position(leg, a, now, bar, p):
            s = leg_state(state, leg)
            return fill_entry(s, a, *manage_position(s, a, now, p), now, bar, p)

        pos = _each(position)(state.legs, a, now, bar, inst)
        balance = state.balance - _sum(jnp.where(pos.entered, _each(commission)(inst), 0.0))
        commissions = state.commissions + _sum(jnp.where(pos.entered, _each(commission)(inst), 0.0))
        carried = _each(carried_over)(pos, now, bar, inst)
        # No stop or target touches an absent bar: its high below and low above every level.
        touch = jnp.where(here[:, None], bar, bar.at[:, HIGH].set(-jnp.inf).at[:, LOW].set(jnp.inf))
        threshold = drawdown_threshold(state.peak, params)
        exit_ = self.account_exit(pos, balance, threshold, carried, here, bar, touch, params)
        settled = _each(settle_exit, in_axes=(0, 0, None, None, 0))(pos, exit_, 0.0, 0.0, inst)
        balance = balance + _sum(settled[0])
        commissions = commissions + _sum(settled[1])
        trade_pnl = settled[2]
        still_open = (pos.side != 0) & ~exit_.exiting
        side = jnp.where(exit_.exiting, 0, pos.side)
        mark = _each(marked_equity, in_axes=(None, 0, 0, 0, 0))
        close_marks = mark(0.0, side, pos.entry_price, bar[:, CLOSE], inst)
        equity = balance + _sum(close_marks)
        terminated = jnp.any(exit_.liquidated) | (equity <= threshold)
        favourable = jnp.where(pos.side > 0, bar[:, HIGH], bar[:, LOW])
        best = balance + _sum(jnp.where(still_open, mark(0.0, pos.side, pos.entry_price, favourable, inst),
                                        close_marks))
        counters = {name: getattr(state, name) for name in ("trades", "wins", "consecutive_losses", "recent_wins",
                                                             "recent_count")}
        for i in range(params.num_instruments):  # trades closed on one bar are recorded in instrument order
            counters = record_trade(state.replace(**counters), exit_.exiting[i], trade_pnl[i] > 0)
        exits = _sum(exit_.exiting.astype(jnp.int32))
        next_state = AccountState(
            time=state.time + 1,
            t=state.t + 1,
            legs=Legs(
                side=side,
                entry_price=pos.entry_price,
                stop=_each(trailed_stop)(pos, still_open, bar, inst),
                target=pos.target,
                trailing=pos.trailing & still_open,
                entry_time=pos.entry_time,
            ),
            balance=balance,
            equity=equity,
            commissions=commissions,
            peak=jnp.maximum(state.peak, jnp.maximum(best, equity)),
            **counters,
            **roll_session(state, bar[0], exits),
        )
        reason = _each(exit_reason)(state.legs.trailing, pos, exit_)
        info = _each(step_info, in_axes=(0, 0, 0, 0, 0, None, None, None))(
            valid, pos, exit_, reason, trade_pnl, next_state, terminated, params)
        info = {key: value[0] if key.startswith("episode_") else value for key, value in info.items()}
        info["unfilled"] = unfilled
        return next_state, step_reward(state, equity, terminated, params), terminated, info

    def account_exit(self, pos, balance, threshold, carried, here, bar, touch, params: AccountParams) -> Exit:
        """How bar t+1 closes each position ([I] fields), the account's drawdown rule applied to the combined equity.

        First each instrument's exit as TradingEnv finds it (find_exit), its liquidation price the one where the
        combined equity meets the threshold with every other position at its worst mark: an instrument reaches it iff
        the combined worst equity reaches the threshold (with one instrument: TradingEnv's own rule). On a breach
        every open position is liquidated at the point where the combined equity meets the threshold, all moved the
        same share of the way from their opens to their worst marks (the module's docstring)."""
        inst = params.inst
        is_long = pos.side > 0
        movable = (pos.side != 0) & ~carried & here
        adverse = jnp.where(is_long, bar[:, LOW], bar[:, HIGH])
        stop_fill = jnp.where(is_long, jnp.minimum(pos.stop, bar[:, OPEN]), jnp.maximum(pos.stop, bar[:, OPEN]))
        worst = jnp.where(movable, better_for(is_long, adverse, stop_fill), bar[:, OPEN])
        mark = _each(marked_equity, in_axes=(None, 0, 0, 0, 0))
        worst_marks = mark(0.0, pos.side, pos.entry_price, worst, inst)
        first = _each(find_exit, in_axes=(0, 0, None, 0, 0, 0))(
            pos, balance + _others(worst_marks), threshold, carried, touch, inst)
        breach = jnp.any(first.liquidated)
        open_marks = mark(0.0, pos.side, pos.entry_price, bar[:, OPEN], inst)
        at_open, at_worst = balance + _sum(open_marks), balance + _sum(worst_marks)
        span = at_open - at_worst
        share = jnp.where(span > 0, jnp.clip((at_open - threshold) / jnp.where(span > 0, span, 1.0), 0.0, 1.0), 0.0)
        meet = bar[:, OPEN] + share * (worst - bar[:, OPEN])
        level = _each(liquidation_price, in_axes=(0, 0, None, 0))(
            pos, balance + _others(mark(0.0, pos.side, pos.entry_price, meet, inst)), threshold, inst)
        forced = breach & (pos.side != 0) & ~carried
        yes, no = jnp.ones_like(forced), jnp.zeros_like(forced)
        price = _each(exit_fill)(pos, level, yes, no, no, bar, inst)
        return Exit(
            liquidated=forced,
            stop_hit=first.stop_hit & ~forced,
            target_hit=first.target_hit & ~forced,
            session_exit=first.session_exit & ~forced,
            exiting=first.exiting | forced,
            price=jnp.where(forced, price, first.price),
        )


__all__ = [
    "ACCOUNT_FEATURES", "INSTRUMENT_EXTRAS", "INSTRUMENT_INFO", "AccountEnv", "AccountObs", "AccountParams",
    "AccountState", "Legs", "flatten_observation", "is_micro",
]
