"""The one sequential test behind every claim of an edge here (the advice's record, the agent's gate): a betting
e-process on session P&L, fed whole sessions in time order.

A session's P&L X (after costs, in dollars) is clipped to a fixed range ±c and scaled to x = clip(X, −c, c) / c in
[−1, 1]. Betting a fixed fraction λ of one's capital on every session grows it to W_λ = Π (1 + λ·x); where each
session's clipped P&L has conditional mean ≤ 0 given the sessions before it, W_λ is a nonnegative supermartingale,
whatever the P&L's distribution (skewed, all its mass in a few losses) and however it depends on the past. The
evidence E is the mean of W_λ over a fixed grid of fractions (a mixture of test supermartingales is one), so by
Ville's inequality P(E ever ≥ 1/α) ≤ α, however often E is looked at (Waudby-Smith & Ramdas 2023, "Estimating means of
bounded random variables by betting"). The grid halves from ½: a bet near the best fraction in hindsight, within a
factor √2, at the price of log(len(grid)) in log E.

The null, in one line: the session P&L clipped to ±c has mean ≤ 0 (c: the account's trailing drawdown, `scale_of`).
An edge proved is an edge after costs; a P&L beyond ±c counts as ±c (the share of sessions clipped is reported).

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


def scale_of(params) -> jax.Array:
    """c, the range session P&L is clipped to: the account's trailing drawdown (EnvParams or PropFirmRules), the most
    a session may lose before the account is breached."""
    return params.trailing_drawdown


@struct.dataclass
class Evidence:
    """Sessions counted so far and what betting on them made, per bet fraction."""

    log_wealth: jax.Array  # [len(BET_FRACTIONS)] log W_λ
    sessions: jax.Array  # [] sessions counted
    clipped: jax.Array  # [] of them, sessions whose P&L lay beyond ±c
    pnl: jax.Array  # [] their P&L summed, unclipped

    @classmethod
    def zero(cls) -> Evidence:
        return cls(jnp.zeros(len(BET_FRACTIONS)), jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))

    def add(self, pnl, scale, counted=None) -> Evidence:
        """These sessions' P&L [S], in time order after the ones counted (`counted` [S] bool: those to count, where
        not all)."""
        pnl = jnp.asarray(pnl, jnp.float32)
        counted = jnp.ones(pnl.shape, bool) if counted is None else jnp.asarray(counted, bool)
        x = jnp.clip(pnl / scale, -1.0, 1.0)
        bets = jnp.log1p(jnp.asarray(BET_FRACTIONS, jnp.float32)[None, :] * x[:, None])  # [S, J]
        return Evidence(
            log_wealth=self.log_wealth + jnp.where(counted[:, None], bets, 0.0).sum(0),
            sessions=self.sessions + counted.sum(),
            clipped=self.clipped + (counted & (jnp.abs(pnl) > scale)).sum(),
            pnl=self.pnl + jnp.where(counted, pnl, 0.0).sum(),
        )

    def __add__(self, other: Evidence) -> Evidence:
        """Two runs of sessions, this one's first."""
        return jax.tree.map(jnp.add, self, other)

    def log_e(self) -> jax.Array:
        """[] log E, the mixture's log evidence (0 with no session)."""
        return jax.nn.logsumexp(self.log_wealth) - math.log(len(BET_FRACTIONS))


def prefix_log_e(pnl, scale) -> jax.Array:
    """[S + 1] log E after each prefix of the sessions' P&L [S] in time order (0 before the first): the evidence at
    every look a session at a time, as Evidence.add counts it."""
    x = jnp.clip(jnp.asarray(pnl, jnp.float32) / scale, -1.0, 1.0)
    bets = jnp.log1p(jnp.asarray(BET_FRACTIONS, jnp.float32)[None, :] * x[:, None])
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
