"""The agent's gate: an agent trades for real only what it has shown out of sample.

Its evidence is the betting e-process (agents.evidence.eprocess) on the agent's own session P&L against flat (flat
makes 0), fed whole sessions in time order: first the sessions it was neither trained on nor chosen on before the bars
it trades (its run's test split, `OutOfSample`), then every session it trades as they complete, except those at or
before the last session it was trained or chosen on (`in_sample_end`: the end of its run's train and validation
splits), which are never evidence, whatever file they come from. While the test has
not passed, the agent trades on paper: its decisions, orders and P&L are what they would be, and nothing reaches the
broker. Once it passes, orders go to the broker from the next moment the account is flat; once the evidence is lost
(E below RELEASE), back to paper from the next flat moment. A position is never split between the two.

The same `Gate` runs in `scripts/trade.py` (bar by bar) and in evaluation's gated walk (`gated_trace`, over a walk's
trace), so the two agree step for step.

    gate = Gate.start(out_of_sample.before(first_day), scale)
    for each step of a walk, before its decision:
        gate.settle(day, pnl)        # the last step's P&L, and the trading day it was marked in
        live = gate.decide(flat)     # whether this decision's orders reach the broker
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.evidence.eprocess import ALPHA, Evidence, passes
from jaxenv.env import NO_EXIT

GATE_BARS = ("flat", "buy_and_hold")  # gate_against: what the agent's session P&L is measured against
GATE_MODES = ("evidence", "off")  # trade.py --gate: the gate decides, or every order goes to the broker
UNKNOWN_IN_SAMPLE = "9999-12-31"  # in_sample_end where the run's sessions cannot be known: no session is evidence


@dataclass
class OutOfSample:
    """A checkpoint's P&L per trading day on sessions it was neither trained on nor chosen on (its run's test split),
    in time order: where the gate's evidence starts."""

    days: list[str]  # ISO dates (a session is labelled by the day it closes on)
    pnl: list[float]
    source: str  # what was walked ("test split of synthetic:default", ...)
    # the last session of the run's train and validation splits: a session at or before it is never evidence (None:
    # no such sessions, for a path of fresh agents)
    in_sample_end: str | None = None
    # buy-and-hold's P&L on the same sessions (jaxenv.evaluate.buy_and_hold: the market's own move, its costs paid),
    # shown beside the agent's (None: a record saved before it was kept)
    buy_and_hold: list[float] | None = None
    # the gate's buy-and-hold bar on the same sessions: the market's move held in the agent's size with no costs
    # (jaxenv.evaluate.held_pnl), as every walk and trade.py count it (None: a record saved before it was kept)
    held: list[float] | None = None

    def before(self, day: str | None) -> OutOfSample:
        """The sessions that closed before `day` (all, for None): a walk is never given evidence from its own bars or
        later ones."""
        keep = [i for i, d in enumerate(self.days) if day is None or d < day]
        pick = lambda values: None if values is None else [values[i] for i in keep]  # noqa: E731
        return OutOfSample(pick(self.days), pick(self.pnl), self.source, self.in_sample_end, pick(self.buy_and_hold),
                           pick(self.held))

    def against(self, bar: str) -> list[float]:
        """Each session's P&L as the gate counts it: the agent's, less the bar's (`GATE_BARS`)."""
        if bar == "flat":
            return list(self.pnl)
        if self.held is None:
            raise ValueError(f"the out-of-sample record of {self.source} has no buy-and-hold to be gated against")
        return [p - h for p, h in zip(self.pnl, self.held)]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> OutOfSample:
        return cls(**json.loads(path.read_text()))


@dataclass
class Gate:
    """Paper or live, from the evidence so far. Plain values only: it is saved with trade.py's state as JSON."""

    scale: float  # the e-process's range c (agents.evidence.eprocess.scale_of)
    log_wealth: list[float]
    against: str = "flat"  # the bar (GATE_BARS): a session counts the agent's P&L less the bar's
    sessions: int = 0
    clipped: int = 0
    pnl: float = 0.0
    passing: bool = False  # the test passes now
    live: bool = False  # orders reach the broker
    day: str | None = None  # the trading day being summed
    day_pnl: float = 0.0
    last_counted: str | None = None  # the last day counted: a day at or before it is not counted again
    history: list[dict] = field(default_factory=list)  # each change of mode: day, mode, log E
    in_sample_end: str | None = None  # OutOfSample.in_sample_end: a session at or before it is never counted
    in_sample: int = 0  # sessions completed at or before in_sample_end, not counted

    @classmethod
    def start(cls, out_of_sample: OutOfSample | None, scale: float, against: str = "flat") -> Gate:
        """A gate whose evidence is `out_of_sample`'s sessions against the bar `against` (none: it starts on paper with
        no evidence, and as the run's own sessions cannot be told from others, it counts none)."""
        if against not in GATE_BARS:
            raise ValueError(f"gate_against: must be one of {', '.join(GATE_BARS)}, got {against!r}")
        gate = cls(scale=float(scale), log_wealth=Evidence.zero().log_wealth.tolist(), against=against)
        if out_of_sample is not None:
            for day, pnl in zip(out_of_sample.days, out_of_sample.against(against)):
                gate._count(day, pnl)
            gate.live = gate.passing  # the account starts flat
        # from here on: the record's sessions were out of sample by construction, a traded one may not be
        gate.in_sample_end = out_of_sample.in_sample_end if out_of_sample is not None else UNKNOWN_IN_SAMPLE
        return gate

    # ------------------------------------------------------------------------------------------------ evidence
    @property
    def evidence(self) -> Evidence:
        return Evidence(np.asarray(self.log_wealth, np.float32), np.float32(self.sessions), np.float32(self.clipped),
                        np.float32(self.pnl))

    @property
    def log_e(self) -> float:
        return float(self.evidence.log_e())

    def in_sample_day(self, day: str) -> bool:
        """Whether the session of `day` is one the agent was trained or chosen on (or may have been)."""
        return self.in_sample_end is not None and day <= self.in_sample_end

    def _count(self, day: str, pnl: float) -> None:
        """One whole session into the evidence, unless it was counted already (its day is not after the last) or the
        agent was trained or chosen on it."""
        if self.in_sample_day(day):
            self.in_sample += 1
            return
        if self.last_counted is not None and day <= self.last_counted:
            return
        e = self.evidence.add(np.array([pnl]), self.scale)
        self.log_wealth, self.sessions = np.asarray(e.log_wealth, np.float64).tolist(), int(e.sessions)
        self.clipped, self.pnl = int(e.clipped), float(e.pnl)
        self.passing = bool(passes(e, self.passing))
        self.last_counted = day

    def settle(self, day: str, pnl: float, held: float = 0.0) -> None:
        """The last step's P&L, the trading day it was marked in and buy-and-hold's P&L of the step (`held`, counted
        against when the bar is buy_and_hold); a day that changes completes the one before."""
        if day != self.day:
            if self.day is not None:
                self._count(self.day, self.day_pnl)
            self.day, self.day_pnl = day, 0.0
        self.day_pnl += float(pnl) - (float(held) if self.against == "buy_and_hold" else 0.0)

    def close_session(self) -> None:
        """The session being summed is complete (its last bar has been settled): it counts now, not at the next day."""
        if self.day is not None:
            self._count(self.day, self.day_pnl)
            self.day, self.day_pnl = None, 0.0

    def decide(self, flat: bool) -> bool:
        """Whether the next decision's orders reach the broker: the mode switches to what the evidence says only
        while the account is flat."""
        if self.live != self.passing and flat:
            self.live = self.passing
            self.history.append({"day": self.day, "mode": self.mode, "log_e": round(self.log_e, 4)})
        return self.live

    # --------------------------------------------------------------------------------------------------- words
    @property
    def mode(self) -> str:
        return "live" if self.live else "paper"

    def reason(self) -> str:
        """Why the account is in its mode, in one line."""
        e, bar = math.exp(self.log_e), 1 / ALPHA
        held = f"E = {e:.3g} over {self.sessions} out-of-sample sessions against {self.against.replace('_', '-')}"
        if self.live:
            why = f"an edge shown out of sample ({held}; the bar is {bar:.0f})"
        elif self.passing:
            why = f"an edge shown out of sample ({held}): live from the next flat moment"
        elif self.sessions == 0:
            why = "no out-of-sample record yet"
        else:
            why = f"no edge shown out of sample ({held}; E must reach {bar:.0f})"
        return why + (f"; {self.in_sample_note()}" if self.in_sample else "")

    def in_sample_note(self) -> str:
        """What the gate did with sessions the agent was trained or chosen on, in a few words."""
        if self.in_sample_end == UNKNOWN_IN_SAMPLE:
            return (f"{self.in_sample} sessions not counted: the run's training and validation sessions cannot be "
                    "known, so no traded session is evidence")
        return (f"{self.in_sample} sessions not counted: at or before {self.in_sample_end}, the end of the run's "
                "training and validation splits")

    def state(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def restored(cls, state: dict) -> Gate:
        return cls(**state)


def gated_trace(trace: dict, days: np.ndarray, gate: Gate, ends_session: bool = False,
                held: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
    """A walk's trace as the gate would have traded it: (the live part of the trace, each step's live flag). `days`:
    the trading day each step's P&L is marked in (jaxenv.metrics.step_days); `held`: buy-and-hold's P&L of each step
    (jaxenv.evaluate.held_pnl; none: the bar is flat). `gate` is advanced over the walk; `ends_session`: the walk's
    last step closes its session (a split's end), which then counts as every other does, so the gate after a walk of
    a split is the one its record of that split starts."""
    pnl, position = np.asarray(trace["pnl"], np.float64), np.asarray(trace["position"])
    held = np.zeros(len(pnl)) if held is None else np.asarray(held, np.float64)
    live = np.zeros(len(pnl), bool)
    flat = True  # a walk's account starts flat
    for i in range(len(pnl)):
        if i:
            gate.settle(str(days[i - 1]), pnl[i - 1], held[i - 1])
        live[i] = gate.decide(flat)
        flat = position[i] == 0
    if len(pnl):
        gate.settle(str(days[-1]), pnl[-1], held[-1])
        if ends_session:
            gate.close_session()
    return live_part(trace, live), live


def live_part(trace: dict, live: np.ndarray) -> dict:
    """The trace with its paper steps' P&L, costs, trades and breaches taken out: what reached the broker."""
    live = np.asarray(live, bool)
    out = {k: np.asarray(v) for k, v in trace.items() if isinstance(v, np.ndarray) and len(v) == len(live)}
    for name, paper in (("pnl", 0.0), ("commission", 0.0), ("entry_side", 0), ("exit_reason", NO_EXIT),
                        ("trade_pnl", 0.0), ("breach", False), ("position", 0), ("equity", np.nan),
                        ("threshold", np.nan)):
        out[name] = np.where(live, out[name], paper).astype(out[name].dtype)
    return out
