"""The one sequential test behind every claim of an edge here (the advice's record, the agent's gate): a betting
e-process on session P&L, fed whole sessions in time order.

A session's P&L X (after costs, in dollars) is scaled to x = X / c (c: `scale_of`, the account's trailing drawdown).
Betting a fixed fraction λ of one's capital on every session grows it to W_λ = Π (1 + λ·x); where each session's P&L
has conditional mean ≤ 0 given the sessions before it, W_λ is a nonnegative supermartingale, whatever the P&L's
distribution (skewed, all its mass in a few losses) and however it depends on the past, as long as 1 + λ·x ≥ 0. The
evidence E is the mean of W_λ over a fixed grid of fractions (a mixture of test supermartingales is one), so by
Ville's inequality P(E ever ≥ 1/α) ≤ α, however often E is looked at (Waudby-Smith & Ramdas 2023, "Estimating means of
bounded random variables by betting"). The grid halves from ½: a bet near the best fraction in hindsight, within a
factor √2, at the price of log(len(grid)) in log E.

Gains count up to +c (x ≤ 1: counting less than was won only makes the test harder to pass). Losses count in full:
the bet of fraction λ absorbs any loss down to −c/λ, and a larger loss takes all of that bet's capital (W_λ = 0 from
then on; the smaller bets count the loss exactly). So the test is exact while no session loses more than 2c (the
largest bet's range, `LOSS_BOUND` scales); `clipped` counts the sessions that did. No test can do without some bound
on losses: a null that loses a fortune once in a long while and gains a little every other session cannot be told
from a sure gain in any finite record. The account's rules give the bound: a session never loses more than the room
its account had at its start (≤ c until the threshold freezes), because a breached account enters nothing more that
session (jaxenv.evaluate), plus a gap through the liquidation price; what the walks showed is in docs/findings.md.

The null, in one line: the session P&L has mean ≤ 0, its gains counted up to +c and no session losing more than 2c.
An edge proved is an edge after costs.

Works on jax arrays inside jitted programs and on numpy arrays on the host alike.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

BET_FRACTIONS = (1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32)  # λ: at most half the capital on a session
ALPHA = 0.05  # the most often the test may pass on no edge, over all its looks
RELEASE = 1.0  # passed evidence is lost once E falls below this: no evidence left either way
LOSS_BOUND = 1 / max(BET_FRACTIONS)  # in units of the scale: the loss beyond which the largest bet loses everything
NO_DRAWDOWN_SCALE = 0.05  # c of an account without a trailing drawdown, as a share of its starting balance


def scale_of(params) -> jax.Array:
    """c, the scale of session P&L (EnvParams or PropFirmRules): the account's trailing drawdown, a fresh account's
    room before a breach. An account without a trailing drawdown (the plain account of jaxenv.config.ACCOUNT_RULES)
    gets NO_DRAWDOWN_SCALE of its starting balance instead: $2,500 on $50,000, the default account's drawdown, so its
    evidence is weighed on the same scale; nothing then bounds a session's loss, and sessions that lose more than
    LOSS_BOUND·c are counted as `clipped`. Gains count up to +c, losses in full down to −LOSS_BOUND·c."""
    drawdown = params.trailing_drawdown
    return jnp.where(jnp.isinf(drawdown), NO_DRAWDOWN_SCALE * params.starting_balance, drawdown)


@struct.dataclass
class Evidence:
    """Sessions counted so far and what betting on them made, per bet fraction."""

    log_wealth: jax.Array  # [len(BET_FRACTIONS)] log W_λ
    sessions: jax.Array  # [] sessions counted
    clipped: jax.Array  # [] of them, sessions that lost more than LOSS_BOUND·c: beyond the test's exact range
    pnl: jax.Array  # [] their P&L summed, as it was

    @classmethod
    def zero(cls) -> Evidence:
        return cls(jnp.zeros(len(BET_FRACTIONS)), jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))

    def add(self, pnl, scale, counted=None) -> Evidence:
        """These sessions' P&L [S], in time order after the ones counted (`counted` [S] bool: those to count, where
        not all)."""
        pnl = jnp.asarray(pnl, jnp.float32)
        counted = jnp.ones(pnl.shape, bool) if counted is None else jnp.asarray(counted, bool)
        return Evidence(
            log_wealth=self.log_wealth + jnp.where(counted[:, None], session_bets(pnl, scale), 0.0).sum(0),
            sessions=self.sessions + counted.sum(),
            clipped=self.clipped + (counted & (pnl < -LOSS_BOUND * scale)).sum(),
            pnl=self.pnl + jnp.where(counted, pnl, 0.0).sum(),
        )

    def __add__(self, other: Evidence) -> Evidence:
        """Two runs of sessions, this one's first."""
        return jax.tree.map(jnp.add, self, other)

    def log_e(self) -> jax.Array:
        """[] log E, the mixture's log evidence (0 with no session)."""
        return jax.nn.logsumexp(self.log_wealth) - math.log(len(BET_FRACTIONS))


def session_bets(pnl, scale) -> jax.Array:
    """[S, len(BET_FRACTIONS)] log(1 + λ·x) of each session and bet: gains up to +scale, losses in full; a loss beyond
    a bet's range (x < −1/λ) takes all of its capital (−inf)."""
    x = jnp.minimum(jnp.asarray(pnl, jnp.float32) / scale, 1.0)
    stake = jnp.asarray(BET_FRACTIONS, jnp.float32)[None, :] * x[:, None]
    return jnp.log1p(jnp.maximum(stake, -1.0))


def prefix_log_e(pnl, scale) -> jax.Array:
    """[S + 1] log E after each prefix of the sessions' P&L [S] in time order (0 before the first): the evidence at
    every look a session at a time, as Evidence.add counts it."""
    bets = session_bets(pnl, scale)
    wealth = jnp.concatenate([jnp.zeros((1, len(BET_FRACTIONS))), jnp.cumsum(bets, 0)])
    return jax.nn.logsumexp(wealth, axis=1) - math.log(len(BET_FRACTIONS))


def passes(evidence: Evidence, passing) -> jax.Array:
    """Whether the test passes now: E ≥ 1/ALPHA, or it passed at the last look and E is still ≥ RELEASE."""
    log_e = evidence.log_e()
    return jnp.where(passing, log_e >= math.log(RELEASE), log_e >= math.log(1 / ALPHA))


def evidence_metrics(evidence: Evidence, prefix: str) -> dict[str, float]:
    """The evidence's figures for metrics and reports (host values): log E and the bar it must reach, sessions
    counted and clipped, their P&L."""
    e = jax.device_get(evidence)
    return {f"{prefix}_log_e": float(e.log_e()), f"{prefix}_log_e_bar": math.log(1 / ALPHA),
            f"{prefix}_sessions": float(e.sessions), f"{prefix}_clipped": float(e.clipped), f"{prefix}_pnl": float(e.pnl)}
