"""The gate's bar (`gate_against`): flat by default, or buy-and-hold, so that an agent that only holds long on a rising
market does not pass as an edge. Every command gates a run on its own bar: train's verdict, evaluate's gated walk,
trade.py and the walk-forward's stitched paths."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agents.config import ConfigError, load_config
from agents.evaluation.report import verdict_lines
from agents.evidence.gate import Gate, OutOfSample, gated_trace
from jaxenv.evaluate import held_pnl

DAYS = [f"2024-01-{d:02d}" for d in range(1, 31)]
SCALE = 100.0


def rising_long(n: int = 30) -> OutOfSample:
    """An agent that holds one contract long on a market that rises every session: its P&L is the market's move."""
    move = [SCALE] * n
    return OutOfSample(DAYS[:n], list(move), "test", buy_and_hold=list(move), held=list(move))


@pytest.mark.nojit
def test_a_long_only_agent_on_a_rising_market_passes_against_flat_and_not_against_buy_and_hold():
    record = rising_long()
    assert Gate.start(record, SCALE).passing  # flat's bar: the market's move reads as an edge
    gate = Gate.start(record, SCALE, "buy_and_hold")
    assert not gate.passing and gate.log_e == pytest.approx(0.0, abs=1e-6) and gate.sessions == 30
    assert "against buy-and-hold" in gate.reason()
    # beating the market by the scale each session passes against buy-and-hold too
    better = OutOfSample(record.days, [p + SCALE for p in record.pnl], "test", buy_and_hold=record.held,
                         held=record.held)
    assert Gate.start(better, SCALE, "buy_and_hold").passing


@pytest.mark.nojit
def test_the_verdict_names_the_gates_bar_and_points_at_buy_and_hold_only_while_the_bar_is_flat():
    record = rising_long(12)
    flat = verdict_lines(record, 1, SCALE, "best")
    assert "against flat" in flat[1] and flat[-1].startswith("note:") and "--gate-against buy_and_hold" in flat[-1]
    held = verdict_lines(record, 1, SCALE, "best", "buy_and_hold")
    assert "against buy-and-hold" in held[1] and not held[-1].startswith("note:")


@pytest.mark.nojit
def test_a_walk_counts_each_session_less_buy_and_holds_move_as_the_record_does():
    """gated_trace with `held`: each session counts its P&L less buy-and-hold's; the same sessions as a record count
    the same, so a walk of a split and the split's record agree."""
    pnl = np.array([10.0, 20.0, -5.0, 40.0, 0.0, 15.0])
    held = np.array([5.0, 5.0, 5.0, -10.0, 10.0, 0.0])
    days = np.array(["2024-01-01"] * 3 + ["2024-01-02"] * 3)
    trace = {"pnl": pnl, "position": np.zeros(6, int), "commission": np.zeros(6), "entry_side": np.zeros(6, int),
             "exit_reason": np.zeros(6, int), "trade_pnl": np.zeros(6), "breach": np.zeros(6, bool),
             "equity": np.zeros(6), "threshold": np.zeros(6)}
    walked = Gate.start(None, SCALE, "buy_and_hold")
    walked.in_sample_end = None  # a walk of fresh sessions: every one counts
    gated_trace(trace, days, walked, ends_session=True, held=held)
    sessions = OutOfSample(["2024-01-01", "2024-01-02"], [25.0, 55.0], "test", held=[15.0, 0.0])
    record = Gate.start(sessions, SCALE, "buy_and_hold")
    assert walked.sessions == record.sessions == 2
    assert walked.log_e == pytest.approx(record.log_e) and walked.pnl == pytest.approx(10.0 + 55.0)


@pytest.mark.nojit
def test_buy_and_holds_step_is_the_close_to_close_move_in_the_agents_size():
    close = np.array([100.0, 101.5, 101.0, 103.0])
    two_contracts = SimpleNamespace(point_value=20.0)  # $20 a point, two of them: $40 a point
    assert held_pnl(close, np.array([0, 1, 2]), two_contracts, 2).tolist() == [60.0, -20.0, 80.0]


@pytest.mark.nojit
def test_an_unknown_bar_is_refused_with_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^gate_against: must be one of flat, buy_and_hold$"):
        load_config(None, ["gate_against=market"])
    with pytest.raises(ValueError, match="gate_against"):
        Gate.start(None, SCALE, "market")
    with pytest.raises(ValueError, match="no buy-and-hold"):
        Gate.start(OutOfSample(DAYS[:2], [1.0, 2.0], "old record"), SCALE, "buy_and_hold")

