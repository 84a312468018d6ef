"""Trade a trained run on a bars file: a replay of every row, or `--follow` for rows appended as they arrive.

    python scripts/trade.py --run-dir runs/x --data bars.csv                  # replay, paper broker
    python scripts/trade.py --run-dir runs/x --data live.csv --follow         # wait for new rows (Ctrl-C stops)
    python scripts/trade.py --run-dir runs/x --data bars.csv --out paper/x    # the same command again resumes

Writes to --out (default RUN/trade/<file name>): decisions.jsonl, orders.csv, fills.csv, trace.csv and
summary.json (docs/trading.md says what each column means). The state is saved after every bar; running the same
command again resumes at the next row, without repeating or missing a decision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from agents.command_line import CommandParser, data_items, print_error
from agents.evidence.gate import GATE_MODES, UNKNOWN_IN_SAMPLE

TRADE_DIR = "trade"  # RUN/trade/<file name>: the default --out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, metavar="RUN", help="run folder made by scripts/train.py")
    ap.add_argument("--data", required=True, action="append", metavar="FILE | SYMBOL=FILE",
                    help="the bars file (CSV or Parquet; --follow: CSV); for a run on several instruments, "
                    "SYMBOL=FILE once per instrument in the run's order (--data NQ=nq.csv --data ES=es.csv)")
    ap.add_argument("--checkpoint", default="best", metavar="STEP|best|latest", help="which checkpoint (default best)")
    ap.add_argument("--news", metavar="FILE", help="a news file (data.news's format): each bar's prompt shows the items "
                    "published before its close, with the run's data.news_items and data.news_max_age")
    ap.add_argument("--follow", action="store_true", help="after the file's rows, wait for rows appended to it")
    ap.add_argument("--gate", choices=GATE_MODES, default="evidence",
                    help="evidence (default): orders reach the broker only while the agent's own out-of-sample record "
                    "passes its test (its run's test split, then every session it trades), else paper; off: every "
                    "order reaches the broker")
    ap.add_argument("--out", metavar="DIR", help="outputs and state (default RUN/trade/<file name>); an existing "
                    "state there is resumed")
    ap.add_argument("--advice", choices=["wait", "realtime"],
                    help="hybrid runs: wait for each answer before the decision that reads it (evaluation's strict "
                    "walk; the default for a replay), or never wait (the default with --follow): a late answer "
                    "leaves the older block's advice in force")
    ap.add_argument("--timezone", metavar="ZONE", help="the zone of naive stamps in the file (default: the one "
                    "training read the run's data in, data.source_timezone=auto's pick included; else the exchange's)")
    ap.add_argument("--wait", type=float, default=30.0, metavar="S",
                    help="several instruments with --follow: seconds a bar time waits for an instrument's bar before it "
                    "is decided with that instrument absent (default 30)")
    ap.add_argument("--poll", type=float, default=1.0, metavar="S", help="--follow: seconds between reads (default 1)")
    ap.add_argument("--idle-exit", type=float, metavar="S", help="--follow: stop after S seconds without a new row")
    ap.add_argument("--status-every", type=int, metavar="N",
                    help="a status line every N decisions (default: every one with --follow, none in a replay, "
                    "which shows a progress bar)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.poll <= 0 or (args.status_every is not None and args.status_every < 0):
        ap.error("--poll must be > 0 and --status-every >= 0")
    if args.idle_exit is not None and not args.follow:
        ap.error("--idle-exit goes with --follow")
    if args.wait < 0:
        ap.error("--wait must be >= 0")
    from agents.config import ConfigError

    try:  # one file (the last given, as a flag given twice always took), or SYMBOL=FILE once per instrument
        args.data, args.instruments = data_items(args.data)
    except ConfigError as e:
        ap.error(str(e))
    if args.instruments:  # several instruments (agents.trading.account_session): --data in messages names them all
        args.data = " ".join(args.instruments)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from agents.config import ConfigError
    from agents.runs.lock import RunLocked
    from jaxenv.data import DataValidationError

    try:
        if args.instruments:
            from agents.trading.account_session import AccountSession

            session = AccountSession.open(args, args.instruments)
        else:
            session = Session.open(args)
    except (ConfigError, DataValidationError, FileNotFoundError, ValueError, RunLocked) as e:
        print_error(e)
        return 2
    try:
        return session.run()
    except KeyboardInterrupt:
        where = session.rows_done if args.instruments else f"row {session.rows_done} of {args.data}"
        print(f"\nstopped after {where}; the state is saved: run the same command to "
              "resume", file=sys.stderr)
        return 130
    except (DataValidationError, FileNotFoundError, ValueError) as e:  # a file that is not the run's instrument
        print_error(e)
        session.refused_file()
        return 2
    finally:
        session.close()


class Session:
    """One trading run: the agent, its broker, the feed and the journal, in an --out folder it holds locked."""

    def __init__(self, args, agent, broker, paper, journal, feed, lock):
        self.args, self.agent, self.broker, self.journal, self.feed = args, agent, broker, journal, feed
        self.paper = paper  # agents.trading.broker.PaperBroker: the paper book, where orders go while the gate is shut
        self.lock = lock  # agents.runs.lock.RunLock on the --out folder: one trader writes it
        self.discard = False  # close() removes what this run wrote (it stopped before its first decision)
        self.rows_done = 0
        self.refused = 0
        self.decisions = 0
        self.latencies: list[float] = []
        self.entry_order = None  # the last decision's entry order, filled (or not) on the next bar
        self.gate = None  # agents.evidence.gate.Gate (--gate evidence), made at the first decision
        self.record = None  # the checkpoint's out-of-sample record, where the gate's evidence starts
        self.live = args.gate == "off"  # orders reach the broker
        self.status_every = args.status_every if args.status_every is not None else (1 if args.follow else 0)
        self.total = None  # a replay's rows (the progress bar's total)
        self.bar = None
        self.said_in_sample = False  # the line saying that sessions the agent trained or was chosen on are not evidence
        self.said_rules = False  # the rules line, said once the history fits (a file that does not gets one line)
        self.zone_why = ""  # why the file's naive stamps are read in feed.source_timezone

    @classmethod
    def open(cls, args) -> Session:
        """The session of `args`: its --out folder locked first (a second trader there exits with one line naming
        the holder), then the run, the feed and the journal, resumed where a state is saved. Whatever fails here
        leaves the folder as it was."""
        from agents.runs.lock import RunLock

        out = Path(args.out) if args.out else Path(args.run_dir) / TRADE_DIR / Path(args.data).stem
        lock = RunLock.acquire(out, reason="a second trader would repeat its decisions and orders")
        try:
            return cls._open(args, out, lock)
        except BaseException:
            lock.release(discard=True)
            raise

    @classmethod
    def _open(cls, args, out: Path, lock) -> Session:
        from agents.evaluation.saved_run import run_data
        from agents.runs.saved_runs import load_run_config, refuse_instrument_set, restore_policy
        from agents.trading.agent import OPEN_END, Agent
        from agents.trading.broker import PaperBroker
        from agents.trading.feed import BarFile
        from agents.trading.journal import Journal
        from jaxenv.config import resolve_data_config

        run_dir = Path(args.run_dir)
        cfg = load_run_config(run_dir)
        refuse_instrument_set(cfg, run_dir, "give --data SYMBOL=FILE once per instrument, in the run's order")
        data = resolve_data_config(cfg.data)
        news = dataclasses.replace(data, news=args.news) if args.news else None
        zone, why = stamps_zone(args.timezone, run_data(run_dir).get("source_timezone", ""), cfg.data.source_timezone)
        feed = BarFile(args.data, data.contract.timezone, zone, cfg.data.date_format, cfg.data.text_column, news)
        if args.follow and Path(args.data).suffix.lower() != ".csv":
            raise ValueError(f"{args.data}: --follow reads rows appended to a CSV file")
        rows = feed.read()  # a replay knows where the data ends (entries stop a bar before, as in evaluation)
        end = OPEN_END if args.follow else len([r for r in rows if not isinstance(r[1], str)])
        mode = args.advice or ("realtime" if args.follow else "wait")
        agent = Agent(restore_policy(run_dir, args.checkpoint, cfg), advice=mode, end=end)
        journal = Journal(out)
        session = cls(args, agent, PaperBroker(), PaperBroker(), journal, feed, lock)
        session.zone_why = why
        session.total = None if args.follow else len(rows)
        state = session._resume() if journal.has_state else None
        if state is None:
            journal.open()
            if args.gate == "evidence":
                session.record = session._out_of_sample()
        if agent.advised:
            agent.open_advisor(journal.out / "advisor", None if args.follow else session._replayed_market(),
                               state and state["advisor"])
        return session

    def refused_file(self) -> None:
        """The file is not the run's instrument: where nothing was traded, close() leaves nothing behind."""
        self.discard = not self.decisions

    def _out_of_sample(self):
        """The checkpoint's out-of-sample record (agents.evaluation.saved_run.out_of_sample), or None with a note where
        its run's data cannot be walked."""
        from agents.evaluation.saved_run import out_of_sample

        return record_or_none(out_of_sample, self.args.run_dir, self.args.checkpoint)

    def _replayed_market(self):
        """A replay of a whole file reads (and fills) the advice store of that file's keys, as evaluate.py --data does:
        the file as a market, whose keys the store holds; none for a run without a store or a file that does not load
        as a whole."""
        from agents.advisor.store import store_root
        from jaxenv import load_market
        from jaxenv.data import DataValidationError

        cfg = self.agent.cfg
        if store_root(cfg.hybrid, cfg.llm) is None:
            return None
        try:
            return load_market(dataclasses.replace(cfg.data, source=str(self.args.data), news=self.args.news or ""))
        except DataValidationError as e:
            print(f"note: the advice store is not read ({str(e).splitlines()[0][:160]}): every key is asked",
                  file=sys.stderr)
            return None

    def _resume(self) -> dict:
        from agents.trading.orders import Order

        from agents.trading.journal import check_resumed

        state, arrays = self.journal.load(self.agent.book)
        check_resumed(self.journal.out, state, str(self.args.run_dir), str(self.args.data),
                      self.agent.saved.identity(), self.args.gate)
        self.journal.open(state["sizes"])
        self.agent.restore(arrays)
        self.broker.restore(state["broker"])
        self.paper.restore(state["paper"])
        self.rows_done, self.refused, self.decisions = state["rows_done"], state["refused"], state["decisions"]
        self.latencies, self.live = self.journal.latencies(), state["live"]
        self.entry_order = Order(**state["entry_order"]) if state["entry_order"] else None
        if state["gate"] is not None:
            from agents.evidence.gate import Gate

            self.gate = Gate.restored(state["gate"])
        print(f"resumed at row {self.rows_done} of {self.args.data} ({self.decisions} decisions so far)",
              file=sys.stderr)
        return state

    def _save(self) -> None:
        self.journal.save(self.agent.book, {
            "run": str(self.args.run_dir), "data": str(self.args.data), "checkpoint": self.agent.saved.identity(),
            "gate_mode": self.args.gate, "rows_done": self.rows_done,
            "refused": self.refused, "decisions": self.decisions,
            "entry_order": self.entry_order and dataclasses.asdict(self.entry_order), "broker": self.broker.state(),
            "paper": self.paper.state(), "live": self.live, "gate": self.gate.state() if self.gate else None,
            "advisor": self.agent.advisor.state() if self.agent.advisor else None,
        }, self.agent.state())

    # ------------------------------------------------------------------------------------------------ the loop
    def run(self) -> int:
        from tqdm import tqdm

        from agents.trading.bars import BarRefused, HistoryRefused

        a = self.args
        self.bar = tqdm(total=self.total, initial=self.rows_done, unit="bar", desc="trading", file=sys.stderr,
                        disable=a.no_progress or a.follow, mininterval=1.0)
        for line, item in self.feed.rows(self.rows_done, a.follow, a.poll, a.idle_exit):
            self.rows_done += 1
            self.bar.update(1)
            if isinstance(item, str):
                self._refuse(line, item)
                continue
            try:
                decision = self.agent.on_bar(item)
            except HistoryRefused as e:  # no later bar could be traded on it: the run stops
                self.bar.close()  # the progress bar's line ends before the error's
                raise ValueError(f"{a.data}: {e}{self._zone_note() if e.outside else ''}") from None
            except BarRefused as e:
                self._refuse(line, str(e))
                continue
            if not self.said_rules and self.agent.book.schedule is not None:
                self._say(rules_line(self.agent.cfg.env.prop_firm))
                self.said_rules = True
            if self.agent.book.note:
                self._say(f"{a.data}: line {line}: {self.agent.book.note}")
            if decision is not None:
                self._record(decision)
        self.bar.close()
        book = self.agent.book
        if self.gate is not None and book.n and book.next_session_id() != book.session_id[book.n - 1]:
            # the last bar closed its session: it counts now, as evaluation's walk of the same bars counts it
            self.gate.close_session()
            self._save()
        summary = self.summary()
        print(json.dumps({k: summary[k] for k in ("pnl", "trades", "bars", "latency_p50_ms", "latency_p99_ms")
                          + (("advice_on_time",) if "advice_on_time" in summary else ())}))
        return 0

    def _held(self, bar: int) -> float:
        """Buy-and-hold's P&L over bar `bar` (the gate's bar when it is buy_and_hold), as evaluation's walk counts it
        (jaxenv.evaluate.held_pnl)."""
        from jaxenv.evaluate import held_pnl

        agent = self.agent
        close = agent.book.column("close")
        return float(held_pnl(close, np.array([bar - 1]), agent.contract, agent.cfg.env.contracts_per_trade)[0])

    def _say(self, text: str) -> None:
        (self.bar.write if self.bar is not None else print)(text, file=sys.stderr)

    def _zone_note(self) -> str:
        """For history outside the sessions: the zone its stamps were read in, and the flag that reads them in
        another."""
        feed = self.feed
        if not feed.naive:
            return ("; its stamps carry their UTC offsets (no zone setting moves them): its bars are at hours "
                    f"{self.agent.contract.symbol} does not trade")
        return (f"; its naive stamps were read as {feed.source_timezone} ({self.zone_why}): --timezone ZONE reads them "
                "in the file's zone")

    def _refuse(self, line: int, why: str) -> None:
        self.refused += 1
        self._say(f"{self.args.data}: line {line}: {why}; skipped, the position is unchanged")

    def _record(self, decision) -> None:
        """The fills of the bar the last decision's order met, then the gate, then this decision's order (to the broker
        while live, to the paper book while not), the reconciliation and the decision's line."""
        agent, journal = self.agent, self.journal
        book = self.broker if self.live else self.paper  # the book that holds the account's position
        row = agent.last_row
        if row is not None:  # the bar the last decision's order met
            book.settle(decision.bar, decision.time, row, self.entry_order)
            for fill in book.fills():
                journal.row("fills.csv", {**fill.row(), "mode": self.mode})
            journal.row("trace.csv", {**row, "live": int(self.live)})
            if self.gate is not None:
                self.gate.settle(str(agent.book.days[decision.bar]), row["pnl"], self._held(decision.bar))
        if self.args.gate == "evidence":
            if self.gate is None:  # the first decision: the evidence before its session
                from agents.evidence.eprocess import scale_of
                from agents.evidence.gate import Gate

                day = str(agent.book.days[decision.bar])
                self.gate = Gate.start(self.record.before(day) if self.record else None,
                                       scale_of(agent.cfg.env.prop_firm), agent.cfg.gate_against)
            self._say_in_sample(str(agent.book.days[decision.bar]))
            self.live = self.gate.decide(flat=decision.position == 0)
        book, other = (self.broker, self.paper) if self.live else (self.paper, self.broker)
        if decision.order is not None:
            book.place(decision.order)
            journal.row("orders.csv", {"time": decision.time, **dataclasses.asdict(decision.order), "mode": self.mode})
        self.entry_order = decision.order if decision.order is not None and decision.order.kind == "market" else None
        held = book.position()
        if held != decision.position * agent.cfg.env.contracts_per_trade or other.position():
            raise ValueError(f"the {self.mode} book holds {held:g} contracts, the agent {decision.position:+d} "
                             "position: reconcile the account, then resume")
        line = {**dataclasses.asdict(decision), "mode": self.mode,
                "gate": self.gate.reason() if self.gate is not None else "off"}
        journal.decision(line)
        self.decisions += 1
        self.latencies.append(decision.latency_ms)
        if self.status_every and self.decisions % self.status_every == 0:
            self._say(status_line(decision, self.mode))
        self.bar.set_postfix_str(f"{self.mode} pos {decision.position:+d} equity {decision.equity:,.0f}", refresh=False)
        self._save()

    def _say_in_sample(self, day: str) -> None:
        """Once a run: the line saying that this bar's session is one the agent trained or was chosen on (or may
        have been), so it is never evidence."""
        if self.said_in_sample or not self.gate.in_sample_day(day):
            return
        self.said_in_sample = True
        if self.gate.in_sample_end == UNKNOWN_IN_SAMPLE:
            self._say(f"{self.args.data}: the run's training and validation sessions cannot be known: no session "
                      "traded counts as out-of-sample evidence, and the gate stays on paper")
        else:
            self._say(f"{self.args.data}: sessions up to {self.gate.in_sample_end} are the run's training and "
                      f"validation sessions (this bar's is {day}): they are traded as usual but never counted as "
                      "out-of-sample evidence")

    @property
    def mode(self) -> str:
        return "live" if self.live else "paper"

    # ---------------------------------------------------------------------------------------------- summary
    def summary(self) -> dict:
        from jaxenv.metrics import walk_metrics

        path = self.journal.out / "trace.csv"
        book = self.agent.book
        out = {"run": str(self.args.run_dir), "checkpoint": self.agent.saved.label, "data": str(self.args.data),
               "rows": self.rows_done, "refused_rows": self.refused, "decisions": self.decisions, "pnl": 0.0,
               "trades": 0, "bars": 0}
        if path.exists() and path.stat().st_size and book.n:
            from agents.evidence.gate import live_part

            self.journal.files["trace.csv"].flush()
            trace = {k: v.to_numpy() for k, v in pd.read_csv(path).items()}
            rules = self.agent.cfg.env.prop_firm
            # what reached the broker (evaluation's gated walk); the agent's every decision (its ungated walk)
            metrics = walk_metrics(live_part(trace, trace["live"]), book.timestamps, rules, book.days)
            ungated = walk_metrics(trace, book.timestamps, rules, book.days)
            out.update(metrics, pnl=metrics["net_pnl"], pnl_ungated=ungated["net_pnl"],
                       trades_ungated=ungated["trades"])  # bars: the bars the account moved over, as evaluate.py's
        if self.gate is not None:
            out["gate"] = {"mode": self.mode, "reason": self.gate.reason(), "log_e": self.gate.log_e,
                           "sessions": self.gate.sessions, "in_sample_sessions": self.gate.in_sample,
                           "in_sample_end": self.gate.in_sample_end, "changes": self.gate.history}
        lat = np.array(self.latencies or [np.nan])
        out["latency_p50_ms"] = float(np.nanpercentile(lat, 50)) if self.latencies else None
        out["latency_p99_ms"] = float(np.nanpercentile(lat, 99)) if self.latencies else None
        if self.agent.advisor is not None:
            out.update(self.agent.advisor.metrics())
        return out

    def close(self) -> None:
        """The summary written (unless the run is discarded), the advisor stopped, the folder unlocked."""
        from agents.trading.journal import SUMMARY_FILE

        try:
            if self.journal.files and not self.discard:
                summary = self.summary()
                path = self.journal.out / SUMMARY_FILE
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(json.dumps(summary, indent=1, default=float))
                tmp.replace(path)
            self.journal.close()
        finally:
            try:
                if self.agent.advisor is not None:
                    self.agent.advisor.close()
            finally:
                self.lock.release(discard=self.discard)


def record_or_none(walk, run_dir, checkpoint: str):
    """The checkpoint's out-of-sample record, `walk(run_dir, checkpoint)` (saved_run.out_of_sample, or an account's),
    or None with a note where its run's data cannot be walked: the gate then starts with no record."""
    from jaxenv.data import DataValidationError

    try:
        return walk(run_dir, checkpoint)
    except (DataValidationError, FileNotFoundError) as e:
        print(f"note: the run's test split cannot be walked ({str(e).splitlines()[0][:160]}): the gate starts with no "
              "out-of-sample record", file=sys.stderr)
        return None


def stamps_zone(given: str | None, trained: str, configured: str) -> tuple[str, str]:
    """The zone the file's naive stamps are read in ("": the exchange's) and why: --timezone, else the one training
    read the run's data in (RUN/data.json: data.source_timezone=auto's pick included), else the run's
    data.source_timezone (a run trained before data.json was written: auto falls back to the exchange's)."""
    if given:
        return given, "--timezone"
    if trained:
        return trained, "the zone training read the run's data in"
    if configured and configured != "auto":
        return configured, "the run's data.source_timezone"
    return "", "the exchange's zone"


def rules_line(rules) -> str:
    """The run's first line: which account rules it enforces, and whose call live orders to such an account are."""
    from jaxenv.config import rules_text

    return (f"rules: {rules.version} ({rules_text(rules)}) are enforced here; whether a prop firm allows automated "
            "orders to its accounts, or positions on correlated markets, is that firm's rule and your call (public "
            "summaries of Apex's rules say it allows neither): docs/trading.md")


def status_line(d, mode: str) -> str:
    """One line a decision: time, action, paper or live, position, equity, drawdown left, the advice in force."""
    advice = f"advice {d.advice['action']} {d.advice['confidence']:.2f}" if d.advice else "no advice"
    bound = " (bound)" if d.bound else ""
    veto = f" veto {','.join(d.veto)}" if d.veto else ""
    return (f"{d.time}  {d.action:<13} {mode:<5} pos {d.position:+d}  equity {d.equity:,.0f}  drawdown left "
            f"{d.drawdown_left:,.0f}  {advice}{bound}{veto}  {d.latency_ms:.0f} ms")
