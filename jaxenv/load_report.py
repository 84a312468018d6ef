"""The one-screen report of a loaded market that `train.py` prints before training: what was read, at which
interval, in which sessions and time zones, as which instrument, on which scale, how it was split and what was
dropped. What loading decided (the stamps' zone, day-first dates) and dropped is told here, never as a Python
warning."""

from __future__ import annotations

import numpy as np

from jaxenv.config import ACCOUNT_RULES, EnvConfig, PropFirmRules, rules_text
from jaxenv.contracts import describe
from jaxenv.env import flattens_at_session_end, prop_flat_by, session_rules
from jaxenv.market import Market, splits_text
from jaxenv.sessions import DAILY, interval_text


def _stamp(market: Market, i: int) -> str:
    stamp = market.timestamps[i]
    return f"{stamp:%Y-%m-%d}" if market.interval_minutes == DAILY else f"{stamp:%Y-%m-%d %H:%M}"


def dropped_text(market: Market) -> str:
    """What data.drop_invalid_rows dropped and why, on one line: the load report's and evaluate.py's warning."""
    if not market.dropped_rows:
        return "0 rows"
    return f"{market.dropped_rows:,} rows (data.drop_invalid_rows): {market.dropped_note}"


def account_text(rules: PropFirmRules) -> str:
    """The account rules in force and the flag that trades under another set: the load report's account line."""
    others = ", ".join(f"--set env.prop_firm={name}" for name in ACCOUNT_RULES if name != rules.version)
    return f"{rules.version} (env.prop_firm): {rules_text(rules)}; other account rules: {others}"


def load_report(market: Market, env: EnvConfig | None = None) -> str:
    env = env or EnvConfig()
    spec, sessions, rules = market.contract, market.sessions, env.prop_firm
    schedule = sessions.schedule
    daily = market.interval_minutes == DAILY
    if env.max_steps_in_episode:
        episode = f"episodes of {env.max_steps_in_episode:,} bars (env.max_steps_in_episode)"
    else:
        why = "a trading year" if daily else f"five sessions of {sessions.bars_per_period} bars"
        episode = f"episodes of {market.episode_bars:,} bars by default ({why}; env.max_steps_in_episode sets another)"
    days = "every day" if spec.weekends else "Monday to Friday"
    if daily:
        kind = f"one daily bar each, {days}"
    else:
        hours = "regular hours" if schedule.hours == "regular" else "full session" if spec.rth_open else "session"
        kind = f"{hours} {schedule.text()} {spec.timezone}, {days}"
    flat_by = prop_flat_by(spec, rules)
    if not flattens_at_session_end(spec, rules):
        holding = "positions may be held across sessions"
    elif flat_by is not None:
        holding = (f"positions are closed on the last bar ending by {flat_by} {rules.timezone} or the session's close "
                   f"(prop firm {rules.version}, env.prop_firm.flat_by)")
    else:
        holding = "positions are closed on the session's last bar (the instrument's flat_at_close)"
    if flattens_at_session_end(spec, rules):
        _, flatten = session_rules(market, rules)
        sid = sessions.session_id
        short = len(np.setdiff1d(np.unique(sid), sid[flatten])) - (0 if flatten[-1] else 1)  # the last may run on
        if short > 0:
            ends = "sessions end" if short != 1 else "session ends"
            holding += (f"; {short} {ends} before the bar that closes positions (a position still open there closes at "
                        "the next session's open)")
    scale = market.scale
    on_grid = f"; {1 - scale.off_grid_share:.1%} of prices on the tick grid" if scale is not None else ""
    ranges = f"median bar range {scale.median_range_ticks:,.1f} ticks{on_grid}" if scale is not None else ""
    lines = [
        ("data", f"{market.source}: {market.num_bars:,} bars, {_stamp(market, 0)} to {_stamp(market, -1)}"),
        ("interval", f"{interval_text(market.interval_minutes)} (detected); {episode}"),
        ("instrument", describe(spec)),
        ("scale", ranges),
        ("time zones", f"stamps {market.stamps_note}; exchange time {spec.timezone}"),
        ("sessions", f"{sessions.num_sessions:,} sessions ({kind}); {holding}"),
        ("account", account_text(rules)),
        ("splits", splits_text(market.splits, sessions.session_id, market.first_decision_bar)),
        ("dropped", dropped_text(market)),
        *([("news", market.news_note)] if market.news_note else []),
    ]
    return "\n".join(f"{label:<11} {text}" for label, text in lines)
