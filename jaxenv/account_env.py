"""One prop-firm account trading several instruments on one timeline (issue 77): gymnax style, pure JAX.

`AccountEnv` trades every instrument of a `jaxenv.market_set.MarketSet` in ONE account. Each instrument is traded
exactly as `jaxenv.env.TradingEnv` trades it (its own contract, costs, bracket, break-even and trailing stop: the
env's helpers, called on each instrument in turn); the account layer ties them together:

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

import functools
import math
import operator
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


def _rows(tree, n: int) -> list:
    """Each instrument's slice of `tree` (every leaf's leading axis), in instrument order. The account's per-instrument
    work runs on these slices, one instrument after another, rather than on [I] arrays: under a caller's vmap over
    envs an [I] array is an [envs, I] one, and XLA on CPU runs element-wise work over a minor axis of a few elements
    several times slower than over [envs] (docs/findings.md)."""
    return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def _stack(rows: list):
    """The [I] arrays (a pytree's leaves) of each instrument's rows."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *rows)


def _total(xs: list) -> jax.Array:
    """The sum of the instruments' values, added in instrument order."""
    return functools.reduce(operator.add, xs)


def _computed_once(tree, state: AccountState):
    """`tree`, its leaves stored once and read by every later use. XLA on CPU copies cheap element-wise work into each
    fused loop that reads it, and with several instruments the positions and exits feed dozens of them (every state
    field, mask and observation column), each then redoing every instrument's fill and exit. A float division it does
    not copy, so each leaf passes through one by a 1 it cannot fold: exact (x / 1 == x; a float32 subnormal may flush
    to 0 as elsewhere in XLA's arithmetic), an integer as two halves of at most 20 bits, each exact in a float32."""
    one = (state.time >= 0).astype(jnp.float32)  # always 1, not a constant to XLA

    def stored(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x / one.astype(x.dtype)
        if x.dtype == jnp.bool_:
            return x.astype(jnp.float32) / one != 0
        high, low = x.astype(jnp.int32) >> 12, x.astype(jnp.int32) & 0xFFF  # x == high * 4096 + low
        high, low = ((part.astype(jnp.float32) / one).astype(jnp.int32) for part in (high, low))
        return ((high << 12) + low).astype(x.dtype)

    return jax.tree.map(stored, tree)


def _any(xs: list) -> jax.Array:
    return functools.reduce(operator.or_, xs)


def _others(xs: list) -> list:
    """Each instrument's sum of the others' values, in instrument order (exactly 0 with one instrument)."""
    if len(xs) == 1:
        return [jnp.zeros_like(xs[0])]
    return [_total(xs[:i] + xs[i + 1:]) for i in range(len(xs))]


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
    def _own_masks(self, state: AccountState, params: AccountParams, legs: list, inst: list) -> list:
        """Each instrument's TradingEnv mask alone ([6] each), with no entry on a bar where it is absent."""
        masks = []
        for i, (leg, p) in enumerate(zip(legs, inst)):
            mask = self.single.action_mask(leg_state(state, leg), p)
            here = params.present[state.t, i]
            masks.append(mask.at[BUY].set(mask[BUY] & here).at[SELL].set(mask[SELL] & here))
        return masks

    def _rule(self, state: AccountState, params: AccountParams, i: int, held: list, before: list) -> jax.Array:
        """[6]: the account rules' mask of head i given `held` (each instrument's open side) and `before` (the entries
        taken by the first len(before) heads at this step, +1 BUY, -1 SELL, 0 none): the cap (the open contracts, the
        entries before and this one within the cap in force, in tenths of a mini) and the correlated pairs (no entry
        opposite a partner's open side or a partner's entry before)."""
        tenths = params.entry_tenths
        used = _total([jnp.abs(side) * tenths[j] for j, side in enumerate(held)]
                      + [jnp.abs(side) * tenths[j] for j, side in enumerate(before)])
        fits = used + tenths[i] <= cap_in_force(state, params)
        partner_long = partner_short = jnp.zeros((), bool)
        for j, side in enumerate(held):
            entry = before[j] if j < len(before) else 0
            partner_long = partner_long | (params.opposed[i, j] & ((side > 0) | (entry > 0)))
            partner_short = partner_short | (params.opposed[i, j] & ((side < 0) | (entry < 0)))
        rule = jnp.ones(NUM_ACTIONS, bool)
        return rule.at[BUY].set(fits & ~partner_short).at[SELL].set(fits & ~partner_long)

    def _sequential(self, state: AccountState, params: AccountParams, held: list, own: list, actions: list
                    ) -> tuple[list, list]:
        """(the mask each head had, the actions taken): head by head in instrument order, head i's mask its own
        (`own`) AND the account rules given the actions taken by the heads before it, a forbidden action taken as
        HOLD."""
        masks, taken, before = [], [], []
        for i, action in enumerate(actions):
            mask = own[i] & self._rule(state, params, i, held, before)
            a = jnp.where(mask[action], action, HOLD)
            masks.append(mask)
            taken.append(a)
            before.append(entry_side(a))
        return masks, taken

    def instrument_masks(self, state: AccountState, params: AccountParams) -> jax.Array:
        """[I, 6]: TradingEnv's mask of each instrument alone, with no entry on a bar where it is absent."""
        n = params.num_instruments
        return jnp.stack(self._own_masks(state, params, _rows(state.legs, n), _rows(params.inst, n)))

    def sequential_mask(self, state: AccountState, params: AccountParams, i: int, chosen: jax.Array,
                        masks: jax.Array | None = None) -> jax.Array:
        """[6]: head i's mask given `chosen` [I], the actions taken by heads < i at this step (entries >= i are
        ignored): its instrument's mask (instrument_masks) AND the account rules. `masks`: instrument_masks, when
        already computed."""
        masks = self.instrument_masks(state, params) if masks is None else masks
        chosen = jnp.asarray(chosen, jnp.int32)
        held = [leg.side for leg in _rows(state.legs, params.num_instruments)]
        return masks[i] & self._rule(state, params, i, held, [entry_side(chosen[j]) for j in range(i)])

    def sequential_masks(self, state: AccountState, params: AccountParams, actions: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
        """([I, 6] the mask each head had, [I] the actions taken): head i's mask given the actions taken by heads < i,
        a forbidden action taken as HOLD."""
        n = params.num_instruments
        legs, actions = _rows(state.legs, n), jnp.asarray(actions, jnp.int32)
        own = self._own_masks(state, params, legs, _rows(params.inst, n))
        masks, taken = self._sequential(state, params, [leg.side for leg in legs], own, [actions[i] for i in range(n)])
        return jnp.stack(masks), jnp.stack(taken)

    def action_mask(self, state: AccountState, params: AccountParams) -> jax.Array:
        """[I, 6]: each head's mask with every head before it holding (head 0's is exact; a later head's is
        sequential_mask's once the earlier heads have chosen)."""
        n = params.num_instruments
        legs = _rows(state.legs, n)
        held = [leg.side for leg in legs]
        return jnp.stack([own & self._rule(state, params, i, held, [])
                          for i, own in enumerate(self._own_masks(state, params, legs, _rows(params.inst, n)))])

    def sample_actions(self, key: jax.Array, state: AccountState, params: AccountParams, logits: jax.Array,
                       deterministic: bool = False) -> tuple[jax.Array, jax.Array]:
        """([I] actions, their joint log-probability): head by head in instrument order, each from its logits [I, 6]
        under its sequential mask (argmax where deterministic)."""
        n = params.num_instruments
        legs = _rows(state.legs, n)
        own = self._own_masks(state, params, legs, _rows(params.inst, n))
        held = [leg.side for leg in legs]
        taken, before = [], []
        log_prob = jnp.zeros((), jnp.float32)
        for i, k in enumerate(jax.random.split(key, n)):
            masked = jnp.where(own[i] & self._rule(state, params, i, held, before), logits[i], MASKED_LOGIT)
            a = (jnp.argmax(masked) if deterministic else jax.random.categorical(k, masked)).astype(jnp.int32)
            taken.append(a)
            before.append(entry_side(a))
            log_prob = log_prob + jax.nn.log_softmax(masked)[a]
        return jnp.stack(taken), log_prob

    def log_prob(self, state: AccountState, params: AccountParams, logits: jax.Array, actions: jax.Array
                 ) -> jax.Array:
        """The joint log-probability of `actions` [I] under `logits` [I, 6]: the sum over heads of each head's under
        its sequential mask."""
        masks, _ = self.sequential_masks(state, params, actions)
        logp = jax.nn.log_softmax(jnp.where(masks, logits, MASKED_LOGIT), axis=-1)
        chosen = jnp.take_along_axis(logp, jnp.asarray(actions, jnp.int32)[:, None], axis=-1)[:, 0]
        return _total([chosen[i] for i in range(params.num_instruments)])

    # ---------------------------------------------------------------------------------------- observe
    def get_obs(self, state: AccountState, params: AccountParams, key: jax.Array | None = None) -> AccountObs:
        return self._observe(state, params, self.action_mask(state, params))

    def _observe(self, state: AccountState, params: AccountParams, mask: jax.Array) -> AccountObs:
        n = params.num_instruments
        legs, inst = _rows(state.legs, n), _rows(params.inst, n)
        rows = []
        for i, (leg, p) in enumerate(zip(legs, inst)):
            # TradingEnv's observation of the instrument; its "can_enter" column is BUY or SELL allowed.
            own = mask[i]
            seen = self.single._observe(leg_state(state, leg), p, own.at[BUY].set(own[BUY] | own[SELL]))
            extras = jnp.stack([params.present[state.t, i], params.entry_tenths[i] / TENTHS_PER_MINI, own[BUY],
                                own[SELL]]).astype(jnp.float32)
            rows.append(jnp.concatenate([seen, extras]))
        capped = params.cap_tenths < NO_CAP
        scale = jnp.maximum(params.cap_tenths, 1).astype(jnp.float32)
        open_tenths = _total([jnp.abs(leg.side) * params.entry_tenths[i] for i, leg in enumerate(legs)])
        room = jnp.clip((cap_in_force(state, params) - open_tenths) / scale, 0.0, 1.0)
        account = jnp.stack([
            jnp.where(capped, open_tenths / scale, 0.0),
            jnp.where(capped, room, 1.0),
            (params.half_size & ~threshold_locked(state.peak, params)).astype(jnp.float32),
            threshold_locked(state.peak, params).astype(jnp.float32),
            _total([(leg.side != 0).astype(jnp.float32) for leg in legs]) / n,
        ]).astype(jnp.float32)
        return AccountObs(instruments=jnp.stack(rows), account=account)

    # ------------------------------------------------------------------------------------------- step
    def transition(self, state: AccountState, actions: jax.Array, params: AccountParams):
        """One bar forward for every instrument in one account. Returns (next_state, reward, terminated, info); info's
        per-instrument entries are [I], its episode totals the account's."""
        n = params.num_instruments
        legs, inst = _rows(state.legs, n), _rows(params.inst, n)
        actions = jnp.asarray(actions, jnp.int32)
        own = self._own_masks(state, params, legs, inst)
        _, taken = self._sequential(state, params, [leg.side for leg in legs], own, [actions[i] for i in range(n)])
        now, bars, here, touch, valid, unfilled, pos, fees, carried = [], [], [], [], [], [], [], [], []
        for i, (leg, p) in enumerate(zip(legs, inst)):
            now.append(p.bars[state.t])
            is_here = params.present[state.t + 1, i]  # the instrument has a bar of its own at t+1
            bar = p.bars[state.t + 1]
            # An absent instrument's bar is its carried close (as the market set builds it, whatever the data holds).
            bar = jnp.where(is_here, bar, bar.at[OPEN].set(bar[CLOSE]).at[HIGH].set(bar[CLOSE]).at[LOW].set(bar[CLOSE]))
            # No stop or target touches an absent bar: its high below and low above every level.
            touch.append(jnp.where(is_here, bar, bar.at[HIGH].set(-jnp.inf).at[LOW].set(jnp.inf)))
            valid.append(taken[i] == actions[i])
            unfilled.append(((taken[i] == BUY) | (taken[i] == SELL)) & ~is_here)
            a = jnp.where(unfilled[i], HOLD, taken[i])
            s = leg_state(state, leg)
            pos.append(fill_entry(s, a, *manage_position(s, a, now[i], p), now[i], bar, p))
            fees.append(jnp.where(pos[i].entered, commission(p), 0.0))
            carried.append(carried_over(pos[i], now[i], bar, p))
            bars.append(bar)
            here.append(is_here)
        balance = state.balance - _total(fees)
        commissions = state.commissions + _total(fees)
        threshold = drawdown_threshold(state.peak, params)
        exits = self.account_exit(pos, balance, threshold, carried, here, bars, touch, inst)
        if n > 1:
            pos, exits = _computed_once((pos, exits), state)
        settled = [settle_exit(*args, 0.0, 0.0, p) for *args, p in zip(pos, exits, inst)]
        balance = balance + _total([s[0] for s in settled])
        commissions = commissions + _total([s[1] for s in settled])
        trade_pnl = [s[2] for s in settled]
        still_open = [(q.side != 0) & ~e.exiting for q, e in zip(pos, exits)]
        sides = [jnp.where(e.exiting, 0, q.side) for q, e in zip(pos, exits)]
        close_marks = [marked_equity(0.0, side, q.entry_price, bar[CLOSE], p)
                       for side, q, bar, p in zip(sides, pos, bars, inst)]
        equity = balance + _total(close_marks)
        terminated = _any([e.liquidated for e in exits]) | (equity <= threshold)
        best = balance + _total([
            jnp.where(still, marked_equity(0.0, q.side, q.entry_price, jnp.where(q.side > 0, bar[HIGH], bar[LOW]), p),
                      close)
            for still, q, bar, p, close in zip(still_open, pos, bars, inst, close_marks)])
        counters = {name: getattr(state, name) for name in ("trades", "wins", "consecutive_losses", "recent_wins",
                                                             "recent_count")}
        for e, pnl in zip(exits, trade_pnl):  # trades closed on one bar are recorded in instrument order
            counters = record_trade(state.replace(**counters), e.exiting, pnl > 0)
        next_state = AccountState(
            time=state.time + 1,
            t=state.t + 1,
            legs=_stack([
                Legs(side=side, entry_price=q.entry_price, stop=trailed_stop(q, still, bar, p), target=q.target,
                     trailing=q.trailing & still, entry_time=q.entry_time)
                for side, q, still, bar, p in zip(sides, pos, still_open, bars, inst)]),
            balance=balance,
            equity=equity,
            commissions=commissions,
            peak=jnp.maximum(state.peak, jnp.maximum(best, equity)),
            **counters,
            **roll_session(state, bars[0], _total([e.exiting.astype(jnp.int32) for e in exits])),
        )
        infos = [step_info(valid[i], pos[i], exits[i], exit_reason(legs[i].trailing, pos[i], exits[i]), trade_pnl[i],
                           next_state, terminated, params) for i in range(n)]
        info = {key: value if key.startswith("episode_") else jnp.stack([row[key] for row in infos])
                for key, value in infos[0].items()}
        info["unfilled"] = jnp.stack(unfilled)
        return next_state, step_reward(state, equity, terminated, params), terminated, info

    def account_exit(self, pos: list, balance, threshold, carried: list, here: list, bars: list, touch: list,
                     inst: list) -> list:
        """How bar t+1 closes each position (an Exit per instrument), the account's drawdown rule applied to the
        combined equity.

        First each instrument's exit as TradingEnv finds it (find_exit), its liquidation price the one where the
        combined equity meets the threshold with every other position at its worst mark: an instrument reaches it iff
        the combined worst equity reaches the threshold (with one instrument: TradingEnv's own rule). On a breach
        every open position is liquidated at the point where the combined equity meets the threshold, all moved the
        same share of the way from their opens to their worst marks (the module's docstring)."""
        worst, worst_marks, open_marks = [], [], []
        for q, c, is_here, bar, p in zip(pos, carried, here, bars, inst):
            is_long = q.side > 0
            adverse = jnp.where(is_long, bar[LOW], bar[HIGH])
            stop_fill = jnp.where(is_long, jnp.minimum(q.stop, bar[OPEN]), jnp.maximum(q.stop, bar[OPEN]))
            movable = (q.side != 0) & ~c & is_here
            worst.append(jnp.where(movable, better_for(is_long, adverse, stop_fill), bar[OPEN]))
            worst_marks.append(marked_equity(0.0, q.side, q.entry_price, worst[-1], p))
            open_marks.append(marked_equity(0.0, q.side, q.entry_price, bar[OPEN], p))
        first = [find_exit(q, balance + others, threshold, c, t, p)
                 for q, others, c, t, p in zip(pos, _others(worst_marks), carried, touch, inst)]
        breach = _any([f.liquidated for f in first])
        at_open, at_worst = balance + _total(open_marks), balance + _total(worst_marks)
        span = at_open - at_worst
        share = jnp.where(span > 0, jnp.clip((at_open - threshold) / jnp.where(span > 0, span, 1.0), 0.0, 1.0), 0.0)
        meet = [bar[OPEN] + share * (w - bar[OPEN]) for bar, w in zip(bars, worst)]
        meet_marks = [marked_equity(0.0, q.side, q.entry_price, m, p) for q, m, p in zip(pos, meet, inst)]
        exits = []
        for q, f, c, others, bar, p in zip(pos, first, carried, _others(meet_marks), bars, inst):
            level = liquidation_price(q, balance + others, threshold, p)
            forced = breach & (q.side != 0) & ~c
            yes, no = jnp.ones_like(forced), jnp.zeros_like(forced)
            exits.append(Exit(
                liquidated=forced,
                stop_hit=f.stop_hit & ~forced,
                target_hit=f.target_hit & ~forced,
                session_exit=f.session_exit & ~forced,
                exiting=f.exiting | forced,
                price=jnp.where(forced, exit_fill(q, level, yes, no, no, bar, p), f.price),
            ))
        return exits


__all__ = [
    "ACCOUNT_FEATURES", "INSTRUMENT_EXTRAS", "INSTRUMENT_INFO", "AccountEnv", "AccountObs", "AccountParams",
    "AccountState", "Legs", "flatten_observation", "is_micro",
]
