"""The one sequential test (agents.evidence.eprocess) and the agent's gate (agents.evidence.gate): valid on skewed
nulls looked at after every session, counting sessions once and in time order, switching between paper and live only
while flat; and the battery (experiments/evidence_battery.py) in its short form. The long form is `slow`:
    .venv/bin/python -m pytest -m slow tests/test_evidence.py
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from agents.evidence.eprocess import ALPHA, BET_FRACTIONS, Evidence, passes, prefix_log_e
from agents.evidence.gate import Gate, OutOfSample, gated_trace


@pytest.mark.nojit
def test_the_evidence_is_the_mixture_of_betting_wealths_counting_losses_in_full():
    pnl = np.array([50.0, -20.0, 300.0, -300.0, 10.0])
    e = Evidence.zero().add(pnl, 100.0)
    x = np.minimum(pnl / 100.0, 1)  # gains up to the scale, losses in full: −3 takes all of the ½ bet's capital
    wealth = [np.prod(np.maximum(1 + lam * x, 0.0)) for lam in BET_FRACTIONS]
    assert wealth[0] == 0.0 and wealth[1] > 0.0
    assert float(e.log_e()) == pytest.approx(math.log(np.mean(wealth)), rel=1e-5)
    # clipped: the sessions beyond the test's exact range (a loss over twice the scale)
    assert int(e.sessions) == 5 and int(e.clipped) == 1 and float(e.pnl) == pytest.approx(40.0)
    # every prefix, as counted one session at a time; two runs of sessions add
    assert np.allclose(prefix_log_e(pnl, 100.0), [0.0] + [float(Evidence.zero().add(pnl[:i], 100.0).log_e())
                                                         for i in range(1, 6)], atol=1e-5)
    first, rest = Evidence.zero().add(pnl[:2], 100.0), Evidence.zero().add(pnl[2:], 100.0)
    assert float((first + rest).log_e()) == pytest.approx(float(e.log_e()), rel=1e-5)
    # counted: only the sessions marked
    assert float(Evidence.zero().add(pnl, 100.0, pnl > 0).pnl) == pytest.approx(360.0)


@pytest.mark.nojit
@pytest.mark.parametrize("draw", [
    lambda rng, n: np.where(rng.random(n) < 0.95, 1.0, -19.0),  # mean 0, one loss of nineteen wins
    lambda rng, n: np.where(rng.random(n) < 0.95, -1.0, 19.0),
])
def test_a_skewed_null_looked_at_after_every_session_passes_rarely(draw):
    """Mean-zero sessions, +1 with probability 0.95 and −19 otherwise (and its mirror), within the range: the review's
    simulation bound the old normal-mixture rule on 51% of such paths."""
    rng = np.random.default_rng(0)
    passed = [(prefix_log_e(draw(rng, 300), 19.0) >= math.log(1 / ALPHA)).any() for _ in range(400)]
    assert np.mean(passed) <= ALPHA


@pytest.mark.nojit
@pytest.mark.parametrize("loss, mean", [(-4_750.0, 0.0), (-5_750.0, -50.0)])
def test_a_null_losing_beyond_the_trailing_drawdown_passes_rarely(loss, mean):
    """+$250 a session, and now and then a loss beyond the trailing drawdown ($2,500): mean 0, and mean −$50. Clipping
    those losses up to −$2,500 passed the test on 81% and 83% of such paths."""
    p = (mean - loss) / (250.0 - loss)  # the share of +250 sessions that gives the mean
    rng = np.random.default_rng(0)
    passed = [(prefix_log_e(np.where(rng.random(500) < p, 250.0, loss), 2_500.0) >= math.log(1 / ALPHA)).any()
              for _ in range(400)]
    assert np.mean(passed) <= ALPHA


@pytest.mark.nojit
def test_the_gate_trades_on_paper_until_its_record_passes_and_switches_only_while_flat():
    # 10 sessions at the top of the range: E = 14.7, short of 20
    gate = Gate.start(OutOfSample([f"2024-01-{d:02d}" for d in range(1, 11)], [100.0] * 10, "test"), 100.0)
    assert not gate.passing and not gate.live and gate.sessions == 10
    assert gate.reason().startswith("no edge shown out of sample")
    assert not gate.decide(flat=True)
    gate.settle("2024-02-01", 150.0)  # a session in progress counts only once it completes
    assert not gate.decide(flat=True) and gate.sessions == 10
    gate.settle("2024-02-02", 5.0)  # 2024-02-01 completes: E = 21.9
    assert gate.passing and gate.sessions == 11
    assert not gate.decide(flat=False)  # in a position: it stays on paper until flat
    assert gate.decide(flat=True) and gate.mode == "live"
    assert gate.history == [{"day": "2024-02-02", "mode": "live", "log_e": round(gate.log_e, 4)}]
    for day in range(3, 13):  # losing sessions: the evidence is lost below E = 1
        gate.settle(f"2024-02-{day:02d}", -100.0)
    assert not gate.passing and gate.decide(flat=False)  # still live while the position is open ...
    assert not gate.decide(flat=True)  # ... and paper from the next flat moment
    # a day counted already is not counted again: a file that holds the record's own sessions adds nothing
    gate.settle("2024-01-05", 100.0)  # completes 2024-02-12
    before = gate.sessions
    gate.settle("2024-01-06", 0.0)  # completes 2024-01-05: before the last day counted
    assert gate.sessions == before
    assert Gate.restored(gate.state()) == gate


@pytest.mark.nojit
def test_the_gate_never_counts_a_session_at_or_before_the_end_of_the_runs_training_and_validation():
    """The record's test-split sessions count; a traded session at or before in_sample_end (the run trained or was
    chosen on it) is counted as in sample, never as evidence; without a record (the run's sessions unknown) none is."""
    record = OutOfSample(["2024-03-04", "2024-03-05"], [100.0, 100.0], "test", in_sample_end="2024-02-29")
    gate = Gate.start(record, 100.0)
    assert gate.sessions == 2 and gate.in_sample == 0
    for day in ("2024-02-27", "2024-02-28", "2024-02-29", "2024-03-06", "2024-03-07"):
        gate.settle(day, 100.0)
    assert gate.in_sample == 3 and gate.sessions == 3  # 2024-03-06 completed; 2024-03-07 is in progress
    assert "3 sessions not counted: at or before 2024-02-29" in gate.reason()
    unknown = Gate.start(None, 100.0)
    for day in ("2030-01-01", "2030-01-02", "2030-01-03"):
        unknown.settle(day, 100.0)
    assert unknown.sessions == 0 and unknown.in_sample == 2 and "cannot be known" in unknown.reason()
    assert Gate.restored(gate.state()) == gate


@pytest.mark.nojit
def test_the_record_before_a_walk_holds_only_sessions_that_closed_before_it():
    record = OutOfSample(["2024-01-02", "2024-01-03", "2024-01-04"], [1.0, 2.0, 3.0], "test")
    assert record.before("2024-01-04").pnl == [1.0, 2.0] and record.before("2024-01-01").days == []
    assert record.before(None).pnl == [1.0, 2.0, 3.0]


@pytest.mark.nojit
def test_a_gated_walk_takes_out_the_paper_steps_and_keeps_trades_whole():
    # steps: flat, enter (live only once flat), hold, exit, flat; the gate passes after the first day
    days = np.array(["d1", "d1", "d2", "d2", "d2", "d2"])
    trace = {"pnl": np.array([0.0, 500.0, 10.0, 20.0, -5.0, 0.0]), "position": np.array([0, 1, 1, 0, 1, 0]),
             "commission": np.full(6, 1.0), "entry_side": np.array([0, 1, 0, 0, 1, 0]),
             "exit_reason": np.array([0, 0, 0, 1, 0, 1]), "trade_pnl": np.array([0.0, 0, 0, 530, 0, -5]),
             "breach": np.zeros(6, bool), "equity": np.zeros(6), "threshold": np.zeros(6)}
    gate = Gate.start(OutOfSample([f"2000-01-{d:02d}" for d in range(1, 11)], [100.0] * 10, "test"), 100.0)
    gated, live = gated_trace(trace, days, gate)
    # d1 completes (+500: E passes) before step 2's decision, but the account is long until step 3 exits
    assert live.tolist() == [False, False, False, False, True, True]
    assert gated["pnl"].tolist() == [0, 0, 0, 0, -5.0, 0] and gated["trade_pnl"].tolist() == [0, 0, 0, 0, 0, -5]


@pytest.mark.nojit
def test_the_evidence_needs_eleven_sessions_at_the_top_of_its_range():
    assert not bool(passes(Evidence.zero().add(np.full(10, 1.0), 1.0), False))
    assert bool(passes(Evidence.zero().add(np.full(11, 1.0), 1.0), False))


def check_battery(out: dict, placebo_bar: float) -> None:
    for name, rates in out["streams"].items():
        assert rates["passed"] <= ALPHA, (name, rates)
    for name, rates in out["record"]["no_edge"].items():
        assert rates["bound"] <= placebo_bar, (name, rates)
    # not a null (its paper earns), reported only: its sessions' losses, counted in full, reach 4× the scale, and it no
    # longer binds within the split's sessions, as it did while they were clipped to the scale
    assert 0.0 <= out["record"]["always BUY, drift 10 × costs"]["bound"] <= 1.0
    assert out["record"]["informed"]["bound_within_tenth"] >= 0.9
    assert out["policies"]["opened"] <= ALPHA


def test_the_battery_short_form():
    from experiments.evidence_battery import random_policies, record, streams

    check_battery({"streams": streams(paths=200, sessions=300), "record": record(placebos=20, informed_seeds=[0, 1]),
                   "policies": random_policies(walks=3, days=30)}, placebo_bar=0.1)


@pytest.mark.slow
def test_the_battery_long_form():
    from experiments.evidence_battery import random_policies, record, streams

    check_battery({"streams": streams(paths=2000, sessions=500), "record": record(placebos=200,
                                                                                   informed_seeds=list(range(20))),
                   "policies": random_policies(walks=50)}, placebo_bar=ALPHA)


def test_the_main_commands_end_says_what_the_agent_shows_out_of_sample(tmp_path, capsys):
    """train.py's last lines: the best checkpoint against flat on the test split (an interval over its sessions, the
    deflated Sharpe ratio over the trials in the folder of runs) and what trade.py's gate will do with it."""
    from agents.training.cli import main

    tiny = ["num_envs=16", "ppo.num_steps=16", "total_steps=512", "network.actor_hidden=[16]",
            "network.critic_hidden=[16]", "checkpoint.eval_every_updates=1", "data.synthetic_days=30",
            "log.tensorboard=false"]
    runs = tmp_path / "runs"
    assert main(["--config", "configs/quick.yaml", "--run-dir", str(runs / "a"), "--no-progress",
                 *(a for o in tiny for a in ("--set", o))]) == 0
    out = capsys.readouterr().out.splitlines()
    [verdict] = [line for line in out if line.startswith("out of sample (test split of synthetic:signal, ")]
    assert "best checkpoint): P&L" in verdict and "against flat's 0 [" in verdict
    assert " and buy-and-hold's " in verdict and "(the difference " in verdict  # the market's own move beside
    assert verdict.endswith("over 1 trial on this data")  # the folder of runs holds this run alone
    [gate] = [line for line in out if line.startswith("gate: ")]
    assert gate.endswith(("trade.py will paper-trade this agent until its record passes",
                          "trade.py will send its orders to the broker"))
    assert len((runs / "trials.jsonl").read_text().splitlines()) == 1
    # scripts/runs.py lists the runs side by side with the same figures as their ends
    from agents.evaluation.runs_table import main as runs_main

    assert runs_main([str(runs), "--json", str(tmp_path / "runs.json")]) == 0
    [row] = json.loads((tmp_path / "runs.json").read_text())
    assert f"P&L {row['pnl'][0]:,.0f} against flat's 0 [{row['pnl'][1]:,.0f}, {row['pnl'][2]:,.0f}]" in verdict
    assert f"buy-and-hold's {row['buy_and_hold']:,.0f} " in verdict and row["trials"] == 1
    assert runs_main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("nowhere: no such folder")
    # evaluate.py's gated walk of the same checkpoint and split ends with the gate train.py's end reported: its last
    # session counts too (before: one session short, another E)
    from agents.evaluation.cli import main as evaluate_main

    assert evaluate_main(["--run-dir", str(runs / "a"), "--json", str(tmp_path / "eval.json")]) == 0
    [walked] = json.loads((tmp_path / "eval.json").read_text())["gate"]
    assert walked["reason"] == gate.removeprefix("gate: ").rsplit(": trade.py", 1)[0]


def test_the_verdict_says_when_an_agent_that_clears_flat_has_not_beaten_buy_and_hold():
    """A long-biased agent on a rising market clears the gate's bar (flat) without beating the market: the verdict
    shows buy-and-hold beside flat and says the gate's bar is flat; an agent that beats buy-and-hold gets no note."""
    from agents.evaluation.report import verdict_lines
    from agents.evidence.gate import OutOfSample

    rng = np.random.default_rng(0)
    market = rng.normal(300.0, 400.0, 40)  # a rising market's sessions
    days = [f"2024-01-{d:02d}" for d in range(1, 41)]
    long_only = OutOfSample(days, (market - 20.0).tolist(), "test split of F.csv", "2023-12-31", market.tolist())
    lines = verdict_lines(long_only, 1, 2500.0, "best")
    assert f"buy-and-hold's {market.sum():,.0f} (the difference " in lines[0]
    assert lines[-1].startswith("note: the agent has not shown that it beats buy-and-hold here; the gate's bar is flat")
    edge = OutOfSample(days, (market + 600.0 + rng.normal(0, 50, 40)).tolist(), "test split of F.csv", "2023-12-31",
                       market.tolist())
    assert not any(line.startswith("note:") for line in verdict_lines(edge, 1, 2500.0, "best"))
