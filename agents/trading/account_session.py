"""trade.py on a run of several instruments traded in one account (issue 77):

    python scripts/trade.py --run-dir runs/pair --data NQ=nq.csv --data ES=es.csv            # replay both files
    python scripts/trade.py --run-dir runs/pair --data NQ=nq.csv --data ES=es.csv --follow   # rows as they arrive

The files are joined as training joined them (agents.trading.joint_feed: a bar time is decided once every file has
its bar there, or, following, after --wait seconds with the late one absent); the account decides each joint bar
(agents.trading.account_agent) and each instrument's order goes to its own broker (the paper broker here) while the
gate passes on the account's own out-of-sample record (agents.evaluation.account_run.account_out_of_sample, then every
session it trades), else to its paper book. The --out folder holds what trade.py's does for one instrument
(decisions.jsonl, orders.csv and fills.csv with a symbol column, trace.csv with the account's columns and each
instrument's as <column>_<SYMBOL>, summary.json with each instrument's P&L and trades) and its state, saved after every
bar: the same command resumes at the next bar time, the bars rebuilt from the files' rows already taken, so a run
killed and resumed decides as one replay does.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from agents.trading.journal import SUMMARY_FILE
from jaxenv.contracts import price_decimals
from jaxenv.env import NO_EXIT

ACCOUNT_COLUMNS = ("t", "pnl", "equity", "threshold", "breach", "commission")  # the trace's account columns
# each instrument's trace columns, and the names its paper broker reads them by (agents.trading.broker.settle)
LEG_COLUMNS = {"action": "action", "position": "position", "entry_side": "entry_side", "entry_price": "entry_price",
               "exit_reason": "exit_reason", "exit_price": "exit_price", "trade_pnl": "trade_pnl",
               "invalid_action": "invalid_action", "unfilled": "unfilled", "instrument_pnl": "pnl",
               "instrument_commission": "commission"}


class AccountSession:
    """One trading run of an account: the agent, a broker and a paper book per instrument, the joint feed and the
    journal, in an --out folder it holds locked."""

    def __init__(self, args, agent, feed, journal, lock, paths: list[str]):
        self.args, self.agent, self.feed, self.journal, self.lock = args, agent, feed, journal, lock
        self.paths = paths  # each instrument's file, in the run's instrument order
        symbols = agent.symbols
        from agents.trading.broker import PaperBroker

        self.brokers = {s: PaperBroker() for s in symbols}
        self.paper = {s: PaperBroker() for s in symbols}  # where orders go while the gate is shut
        self.entry_orders: dict[str, dict | None] = dict.fromkeys(symbols)
        self.discard = False
        self.refused = 0
        self.decisions = 0
        self.latencies: list[float] = []
        self.gate = None
        self.record = None
        self.live = args.gate == "off"
        self.status_every = args.status_every if args.status_every is not None else (1 if args.follow else 0)
        self.last_stamp: pd.Timestamp | None = None
        self.said_in_sample = False
        self.bar = None

    # ------------------------------------------------------------------------------------------------ open
    @classmethod
    def open(cls, args, items: list[str]) -> AccountSession:
        from agents.runs.lock import RunLock

        stems = "+".join(Path(item.partition("=")[2]).stem for item in items)
        out = Path(args.out) if args.out else Path(args.run_dir) / "trade" / stems
        lock = RunLock.acquire(out, reason="a second trader would repeat its decisions and orders")
        try:
            return cls._open(args, items, out, lock)
        except BaseException:
            lock.release(discard=True)
            raise

    @classmethod
    def _open(cls, args, items: list[str], out: Path, lock) -> AccountSession:
        from agents.config import ConfigError
        from agents.evaluation.account_run import account_data
        from agents.evaluation.saved_run import run_data
        from agents.runs.saved_runs import load_run_config, restore_policy
        from agents.trading.account_agent import OPEN_END, AccountAgent
        from agents.trading.cli import stamps_zone
        from agents.trading.feed import BarFile
        from agents.trading.joint_feed import JointFeed, joint_bars
        from agents.trading.journal import Journal
        from jaxenv.config import resolve_instruments

        run_dir = Path(args.run_dir)
        cfg = load_run_config(run_dir)
        if not cfg.data.instruments:
            raise ConfigError(f"--data: {run_dir} trades one instrument; give its file as --data PATH")
        contracts = [item.contract for item in resolve_instruments(cfg.data.instruments)]
        paths = [item.source for item in account_data(cfg.data, items).instruments]  # one line where they do not fit
        for path in paths:
            if not Path(path).is_file():
                raise FileNotFoundError(f"--data: {path}: file not found")
            if args.follow and Path(path).suffix.lower() != ".csv":
                raise ValueError(f"{path}: --follow reads rows appended to a CSV file")
        zone, _ = stamps_zone(args.timezone, run_data(run_dir).get("source_timezone", ""), cfg.data.source_timezone)
        files = [BarFile(p, c.timezone, zone, cfg.data.date_format, cfg.data.text_column)
                 for p, c in zip(paths, contracts)]
        end = OPEN_END if args.follow else joint_bars(files)
        mode = args.advice or ("realtime" if args.follow else "wait")
        agent = AccountAgent(restore_policy(run_dir, args.checkpoint, cfg, account=True), advice=mode, end=end)
        session = cls(args, agent, JointFeed(files), Journal(out), lock, paths)
        state = session._resume() if session.journal.has_state else None
        if state is None:
            session.journal.open()
            if args.gate == "evidence":
                session.record = session._out_of_sample()
        if agent.advised:
            agent.open_advisors(session.journal.out / "advisor", None if args.follow else session._replayed_set(),
                                state and state["advisors"])
        return session

    def _replayed_set(self):
        """A replay of whole files reads (and fills) the advice stores of those files' keys, as evaluate.py --data
        does: the files as the run's market set; none for a run without a store or files that do not load as one."""
        from agents.advisor.store import store_root
        from agents.evaluation.account_run import account_data
        from jaxenv.data import DataValidationError
        from jaxenv.market_set import load_market_set

        cfg = self.agent.cfg
        if store_root(cfg.hybrid, cfg.llm) is None:
            return None
        data = account_data(cfg.data, self.args.instruments)
        try:
            return load_market_set([(item.contract, item.source) for item in data.instruments], data)
        except DataValidationError as e:
            print(f"note: the advice stores are not read ({str(e).splitlines()[0][:160]}): every key is asked",
                  file=sys.stderr)
            return None

    def _out_of_sample(self):
        from agents.evaluation.account_run import account_out_of_sample
        from agents.trading.cli import record_or_none

        return record_or_none(account_out_of_sample, self.args.run_dir, self.args.checkpoint)

    # ---------------------------------------------------------------------------------------------- state
    def _state(self) -> dict:
        return {"run": str(self.args.run_dir), "data": self.paths, "checkpoint": self.agent.saved.identity(),
                "gate_mode": self.args.gate, "consumed": self.feed.consumed, "refused": self.refused,
                "decisions": self.decisions, "entry_orders": self.entry_orders,
                "brokers": {s: b.state() for s, b in self.brokers.items()},
                "paper": {s: b.state() for s, b in self.paper.items()}, "live": self.live,
                "gate": self.gate.state() if self.gate else None, "said_in_sample": self.said_in_sample,
                "advisors": [advisor.state() for advisor in self.agent.advisors]}

    def _save(self) -> None:
        book = self.agent.book
        arrays = {**self.agent.arrays(), "joint_stamps": book.clock[0].stamps[: book.n],
                  "joint_present": book.present[: book.n]}
        self.journal.save_state(self._state(), arrays)

    def _resume(self) -> dict:
        from agents.evidence.gate import Gate

        from agents.trading.journal import check_resumed

        state, arrays = self.journal.load_state()
        check_resumed(self.journal.out, state, str(self.args.run_dir), self.paths, self.agent.saved.identity(),
                      self.args.gate)
        self.journal.open(state["sizes"])
        self._rebuild(state["consumed"], arrays["joint_stamps"], arrays["joint_present"])
        if state["decisions"]:  # the account and its pending decision (none is saved while the history warms up)
            self.agent.restore(arrays)
        for s in self.agent.symbols:
            self.brokers[s].restore(state["brokers"][s])
            self.paper[s].restore(state["paper"][s])
        self.refused, self.decisions, self.latencies = state["refused"], state["decisions"], self.journal.latencies()
        self.entry_orders, self.live = state["entry_orders"], state["live"]
        self.said_in_sample = state["said_in_sample"]
        self.gate = Gate.restored(state["gate"]) if state["gate"] is not None else None
        self.feed.consumed = list(state["consumed"])
        stamps = arrays["joint_stamps"]
        self.last_stamp = pd.Timestamp(int(stamps[-1]), tz="UTC") if len(stamps) else None
        print(f"resumed after {len(stamps)} bar times ({self.decisions} decisions so far)", file=sys.stderr)
        return state

    def _rebuild(self, consumed: list[int], stamps: np.ndarray, present: np.ndarray) -> None:
        """The books as the run had them: each file's first `consumed` rows taken again, the history before the
        timeline as history, each joint bar time with the instruments present then (a row refused then is skipped)."""
        from agents.trading.bars import BarRefused

        book = self.agent.book
        rows = [f.read(self.args.follow)[:n] for f, n in zip(self.feed.files, consumed)]
        ptr = [0] * len(rows)
        start = stamps[0] if len(stamps) else None

        def is_bar(i: int) -> bool:
            return not isinstance(rows[i][ptr[i]][1], str)

        for i in range(len(rows)):
            while ptr[i] < len(rows[i]) and (not is_bar(i) or start is None
                                             or rows[i][ptr[i]][1].time.value < start):
                if is_bar(i):
                    try:
                        book.add_own(i, rows[i][ptr[i]][1])
                    except BarRefused:
                        pass  # refused then too
                ptr[i] += 1
        for j, ns in enumerate(stamps):
            bars = []
            for i in range(len(rows)):
                while ptr[i] < len(rows[i]) and (not is_bar(i) or rows[i][ptr[i]][1].time.value < ns):
                    ptr[i] += 1  # a row refused then
                bar = None
                if ptr[i] < len(rows[i]) and rows[i][ptr[i]][1].time.value == ns:
                    bar = rows[i][ptr[i]][1] if present[j, i] else None
                    ptr[i] += 1
                bars.append(bar)
            book.add(pd.Timestamp(int(ns), tz="UTC"), bars)

    # ------------------------------------------------------------------------------------------------ loop
    def run(self) -> int:
        from tqdm import tqdm

        from agents.trading.bars import BarRefused, HistoryRefused

        a = self.args
        total = None if a.follow else self.agent.end
        self.bar = tqdm(total=total, initial=self.agent.book.n, unit="bar", desc="trading", file=sys.stderr,
                        disable=a.no_progress or a.follow, mininterval=1.0)
        book = self.agent.book
        for event in self.feed.events(self.feed.consumed, self.last_stamp, a.follow, a.poll, a.idle_exit, a.wait):
            if event.kind == "refused":
                self._refuse(event.file, event.line, event.why)
                continue
            if event.kind == "own":
                try:
                    book.add_own(event.file, event.bar)
                except HistoryRefused as e:
                    raise ValueError(f"{self.paths[event.file]}: {e}") from None
                except BarRefused as e:
                    self._refuse(event.file, event.line, str(e))
                continue
            whole, own = book.refusals(event.stamp, event.bars)
            if whole:
                self._say(f"{' and '.join(self.paths)}: bar time {event.stamp}: {whole}; skipped, the positions are "
                          "unchanged")
                self.refused += 1
                continue
            bars = list(event.bars)
            for i, why in own.items():
                self._refuse(i, event.lines[i], f"{why}; the instrument is absent at {event.stamp}")
                bars[i] = None
            self.bar.update(1)
            try:
                decision = self.agent.on_bar(event.stamp, bars)
            except HistoryRefused as e:
                raise ValueError(f"{' and '.join(self.paths)}: {e}") from None
            if decision is not None:
                self._record(decision)
            elif book.n % 64 == 0:
                self._save()  # the history so far: a restart rebuilds it from the files
        self.bar.close()
        if self.gate is not None and book.n and book.clock[0].next_session_id() != book.clock[0].session_id[book.n - 1]:
            self.gate.close_session()  # the last bar closed its session: it counts now, as evaluation's walk counts it
            self._save()
        summary = self.summary()
        print(json.dumps({k: summary[k] for k in ("pnl", "trades", "bars", "latency_p50_ms", "latency_p99_ms")}))
        return 0

    def _say(self, text: str) -> None:
        (self.bar.write if self.bar is not None else print)(text, file=sys.stderr)

    def _refuse(self, i: int, line: int | None, why: str) -> None:
        self.refused += 1
        self._say(f"{self.paths[i]}: line {line}: {why}; skipped, the position is unchanged")

    def _held(self, t: int) -> float:
        """The set's buy-and-hold over joint bar t (each instrument held in the agent's size, no costs)."""
        from jaxenv.evaluate import held_pnl

        agent = self.agent
        return float(sum(held_pnl(agent.book.close(i), np.array([t - 1]), c, agent.cfg.env.contracts_per_trade)[0]
                         for i, c in enumerate(agent.contracts)))

    def _record(self, decision) -> None:
        """The fills of the bar the last decision's orders met, then the gate, then this decision's orders (to the
        brokers while live, to the paper books while not), the reconciliation and the decision's line."""
        from agents.trading.orders import Order

        agent, journal = self.agent, self.journal
        books = self.brokers if self.live else self.paper
        row = decision.row
        day = agent.book.day(decision.bar)
        if row:
            for i, symbol in enumerate(agent.symbols):
                leg = {name: row[col][i].item() for col, name in LEG_COLUMNS.items()}
                entry = self.entry_orders[symbol]
                books[symbol].settle(decision.bar, decision.time, leg, Order(**entry) if entry else None)
                for fill in books[symbol].fills():
                    journal.row("fills.csv", {"symbol": symbol, **fill.row(), "mode": self.mode},
                                price_decimals(agent.contracts[i]))
            flat = {k: row[k].item() for k in ACCOUNT_COLUMNS}
            legs = {f"{name}_{s}": row[col][i].item() for col, name in LEG_COLUMNS.items()
                    for i, s in enumerate(agent.symbols)}
            journal.row("trace.csv", {**flat, **legs, "live": int(self.live)})
            if self.gate is not None:
                self.gate.settle(day, flat["pnl"], self._held(decision.bar))
        if self.args.gate == "evidence":
            if self.gate is None:
                from agents.evidence.eprocess import scale_of
                from agents.evidence.gate import Gate

                self.gate = Gate.start(self.record.before(day) if self.record else None,
                                       scale_of(agent.cfg.env.prop_firm), agent.cfg.gate_against)
            if not self.said_in_sample and self.gate.in_sample_day(day):
                self.said_in_sample = True
                self._say(f"{' and '.join(self.paths)}: sessions up to {self.gate.in_sample_end} are the run's training"
                          f" and validation sessions (this bar's is {day}): traded as usual but never counted as "
                          "out-of-sample evidence")
            self.live = self.gate.decide(flat=not any(decision.positions.values()))
        books, others = (self.brokers, self.paper) if self.live else (self.paper, self.brokers)
        qty = agent.cfg.env.contracts_per_trade
        for symbol in agent.symbols:
            order = decision.orders.get(symbol)
            if order is not None:
                books[symbol].place(order)
                journal.row("orders.csv", {"time": decision.time, "symbol": symbol, **dataclasses.asdict(order),
                                           "mode": self.mode})
            self.entry_orders[symbol] = (dataclasses.asdict(order) if order is not None and order.kind == "market"
                                         else None)
            held = books[symbol].position()
            if held != decision.positions[symbol] * qty or others[symbol].position():
                raise ValueError(f"the {self.mode} book holds {held:g} {symbol} contracts, the agent "
                                 f"{decision.positions[symbol]:+d} position: reconcile the account, then resume")
        line = {**{k: v for k, v in dataclasses.asdict(decision).items() if k not in ("row", "orders")},
                "orders": {s: o.id for s, o in decision.orders.items()}, "mode": self.mode,
                "gate": self.gate.reason() if self.gate is not None else "off"}
        journal.decision(line)
        self.decisions += 1
        self.latencies.append(decision.latency_ms)
        if self.status_every and self.decisions % self.status_every == 0:
            held = " ".join(f"{s} {p:+d}" for s, p in decision.positions.items())
            self._say(f"{decision.time}  {self.mode:<5} {held}  equity {decision.equity:,.0f}  "
                      f"{decision.latency_ms:.0f} ms")
        self.bar.set_postfix_str(f"{self.mode} equity {decision.equity:,.0f}", refresh=False)
        self._save()

    @property
    def mode(self) -> str:
        return "live" if self.live else "paper"

    # ---------------------------------------------------------------------------------------------- summary
    def summary(self) -> dict:
        agent = self.agent
        out = {"run": str(self.args.run_dir), "checkpoint": agent.saved.label,
               "data": dict(zip(agent.symbols, self.paths)), "rows": self.feed.consumed,
               "refused_rows": self.refused, "decisions": self.decisions, "pnl": 0.0, "pnl_ungated": 0.0, "trades": 0,
               "trades_ungated": 0, "bars": 0, "instruments": {}}
        path = self.journal.out / "trace.csv"
        if path.exists() and path.stat().st_size:
            self.journal.files["trace.csv"].flush()
            trace = pd.read_csv(path)
            live = trace["live"].to_numpy(bool)
            exits = np.stack([trace[f"exit_reason_{s}"].to_numpy() != NO_EXIT for s in agent.symbols], axis=1)
            out.update(pnl=float(trace["pnl"][live].sum()), pnl_ungated=float(trace["pnl"].sum()),
                       trades=int(exits[live].sum()), trades_ungated=int(exits.sum()), bars=len(trace),
                       breaches=int(trace["breach"].sum()))
            out["instruments"] = {s: {"net_pnl": float(trace[f"pnl_{s}"].sum()), "trades": int(exits[:, i].sum())}
                                  for i, s in enumerate(agent.symbols)}
        if self.gate is not None:
            out["gate"] = {"mode": self.mode, "reason": self.gate.reason(), "log_e": self.gate.log_e,
                           "sessions": self.gate.sessions, "in_sample_sessions": self.gate.in_sample,
                           "in_sample_end": self.gate.in_sample_end, "changes": self.gate.history}
        out["latency_p50_ms"] = float(np.percentile(self.latencies, 50)) if self.latencies else None
        out["latency_p99_ms"] = float(np.percentile(self.latencies, 99)) if self.latencies else None
        for symbol, advisor in zip(agent.symbols, agent.advisors):
            out["instruments"].setdefault(symbol, {}).update(advisor.metrics())
        return out

    def refused_file(self) -> None:
        self.discard = not self.decisions

    def close(self) -> None:
        try:
            if self.journal.files and not self.discard:
                path = self.journal.out / SUMMARY_FILE
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(json.dumps(self.summary(), indent=1, default=float))
                tmp.replace(path)
            self.journal.close()
        finally:
            try:
                self.agent.close()  # each instrument's advisor process
            finally:
                self.lock.release(discard=self.discard)

    @property
    def rows_done(self) -> str:
        return ", ".join(f"{n} rows of {p}" for n, p in zip(self.feed.consumed, self.paths))


__all__ = ["AccountSession"]
