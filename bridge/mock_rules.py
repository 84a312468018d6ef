"""The mock advisor's rules over numbers: the one definition its two forms apply. `MockBackend` (a sidecar process,
hybrid.mock.reads=text) reads the numbers from a rendered prompt's text; `agents.advisor.numeric_mock` (the
trainer's process, hybrid.mock.reads=fields) takes them from the prompt fields as the prompt would show them. Given
the same numbers both give the same answer. Imports neither torch nor jax."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from bridge.protocol import ACTIONS, BUY, DISABLE_TRAIL, ENABLE_TRAIL, HOLD, MOVE_TO_BE, NO_VIEW_ANSWER, NUM_ACTIONS, SELL

BULLISH = re.compile(r"\b(beat|beats|surge|surges|rally|rallies|upgrade|strong|record high|cut rates|rate cut|soar)", re.I)
BEARISH = re.compile(r"\b(miss|misses|plunge|plunges|selloff|downgrade|weak|war|hike|crash|slump|default)", re.I)
# What the rules take for a number the prompt does not show (not in the template, or not finite: "n/a").
DEFAULTS = {"rsi": 50.0, "adx": 20.0, "vwap": 0.0, "momentum": 0.0, "pnl": 0.0}
PASS = -1  # the action of a PASS answer (no view)

# Why each rule answered; {side}, {adx} and {rsi} are filled in. The index is the answer's rule id.
REASONS = (
    "{side} in profit with ADX {adx:.0f}",  # 0
    "{side} in profit, protect it",
    "trend faded (ADX {adx:.0f})",
    "keep the {side} position",
    "uptrend: ADX {adx:.0f}, above VWAP",
    "downtrend: ADX {adx:.0f}, below VWAP",  # 5
    "RSI {rsi:.0f} oversold",
    "RSI {rsi:.0f} overbought",
    "headline sentiment",
    "no clear edge",
    "let the bracket work",  # 10
    "bullish news",
    "bearish news",
    "no news",
)


def sentiment(headline: str) -> int:
    """Bullish minus bearish words."""
    return len(BULLISH.findall(headline)) - len(BEARISH.findall(headline))


def decide(mode: str, side, sentiment, rsi, adx, vwap, momentum, pnl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(action int64 [n] (PASS = -1), confidence float64 [n] as written: two decimals, rule id [n]) for arrays of
    numbers (side: -1 short, 0 flat, 1 long; NaN numbers take DEFAULTS). Modes `rules`, `news` and `news_pass` (see
    llm_sidecar.backends.MockBackend); `random` draws from the prompt, not from numbers (`coin`)."""
    side = np.asarray(side, np.int64)
    sent = np.asarray(sentiment, np.int64)

    def number(x, name: str) -> np.ndarray:
        x = np.asarray(x, np.float64)
        return np.where(np.isfinite(x), x, DEFAULTS[name])

    rsi, adx, vwap, momentum, pnl = (number(x, name) for x, name in
                                     ((rsi, "rsi"), (adx, "adx"), (vwap, "vwap"), (momentum, "momentum"), (pnl, "pnl")))
    flat, held = side == 0, side != 0
    if mode in ("news", "news_pass"):
        cases = [  # (condition, action, confidence, rule), first match wins
            (held, HOLD, 0.60, 10),
            (sent > 0, BUY, 0.80, 11),
            (sent < 0, SELL, 0.80, 12),
            (flat, PASS if mode == "news_pass" else HOLD, 0.0 if mode == "news_pass" else 0.60, 13),
        ]
    elif mode == "rules":
        trend = np.sign(vwap) + np.sign(momentum) + sent
        strong = adx > 25
        cases = [
            (held & (pnl > 0) & strong, ENABLE_TRAIL, np.minimum(0.9, 0.5 + adx / 100), 0),
            (held & (pnl > 0), MOVE_TO_BE, 0.60, 1),
            (held & (adx < 15), DISABLE_TRAIL, 0.55, 2),
            (held, HOLD, 0.50, 3),
            (strong & (trend >= 2), BUY, np.minimum(0.95, 0.45 + adx / 100), 4),
            (strong & (trend <= -2), SELL, np.minimum(0.95, 0.45 + adx / 100), 5),
            ((rsi < 30) & (sent >= 0), BUY, 0.5 + (30 - rsi) / 100, 6),
            ((rsi > 70) & (sent <= 0), SELL, 0.5 + (rsi - 70) / 100, 7),
            (sent != 0, np.where(sent > 0, BUY, SELL), 0.55, 8),
            (flat, HOLD, 0.60, 9),
        ]
    else:
        raise ValueError(f"mock rules: no numeric rules for answers {mode!r}")
    conditions = [np.broadcast_to(c, side.shape) for c, *_ in cases]
    action = np.select(conditions, [np.broadcast_to(a, side.shape) for _, a, _, _ in cases], HOLD).astype(np.int64)
    confidence = np.select(conditions, [np.broadcast_to(c, side.shape) for _, _, c, _ in cases], 0.0)
    rule = np.select(conditions, [np.full(side.shape, r) for *_, r in cases], 0).astype(np.int64)
    values, where = np.unique(confidence, return_inverse=True)  # a few values: each written once
    return action, np.array([float(f"{c:.2f}") for c in values])[where].reshape(confidence.shape), rule


def reason(rule: int, side: int, adx: float, rsi: float) -> str:
    return REASONS[rule].format(side={1: "long", -1: "short"}.get(int(side), "flat"),
                                adx=adx if np.isfinite(adx) else DEFAULTS["adx"],
                                rsi=rsi if np.isfinite(rsi) else DEFAULTS["rsi"])


def line(action: int, confidence: float, why: str) -> str:
    """The answer as the mock writes it: `ACTION | confidence | reason`, or `PASS | reason`."""
    if action == PASS:
        return f"{NO_VIEW_ANSWER} | {why}"
    return f"{ACTIONS[action]} | {confidence:.2f} | {why}"


def prompt_digest(prompt: bytes) -> bytes:
    """The 8-byte hash of a rendered prompt that seeds the mock's draws about it."""
    return hashlib.blake2b(prompt, digest_size=8).digest()


def coin(prompt: bytes) -> tuple[int, float]:
    """The random mode's answer to a rendered prompt: an action and a confidence (two decimals), drawn from its digest
    read big-endian (MockBackend reads it little-endian for its garbage draw: the two are independent)."""
    rng = np.random.default_rng(int.from_bytes(prompt_digest(prompt), "big"))
    return int(rng.integers(NUM_ACTIONS)), float(f"{rng.uniform(0.5, 0.95):.2f}")
