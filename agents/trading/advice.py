"""The run's advisor on bars as they arrive: a block's keys are asked as it closes, their answers are in force
during the next block (agents.advice.table's contract), and answers the advice store already holds are read, not
asked again. The pacer decides which keys to ask and when; the advisor (agents.advisor.advisor.Advisor) asks them.

An answer about block b is due at the close of bar (b + 1)·k, one bar after its block's last bar: it is on time when
it arrived within one bar interval of being asked (a store's answer always is). `advice_on_time` is the share of the
keys read by a decision whose answer was on time.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from agents.advice.table import answered, key_block, table_rows
from agents.advisor.advisor import Advisor, latency_metrics
from agents.advisor.prompt_fields import PromptFieldBuilder
from agents.config import HybridConfig
from agents.trading.bars import BarBook
from jaxenv.config import DataConfig, EnvConfig

ROWS = 16  # answers written into the table per bar, padded: one compiled write
# a ready row, as saved with the state: key, probs, confidence, status, version
READY_DTYPES = (np.int32, np.float32, np.float32, np.int32, np.int32)


class BookView:
    """One instrument's bars so far as the prompt fields read them (a jaxenv.Market's fields): a feed's BarBook."""

    def __init__(self, book: BarBook):
        self.book = book

    @property
    def n(self) -> int:
        return self.book.n

    @property
    def interval(self) -> int:
        return self.book.interval

    @property
    def text_table(self) -> list[str]:
        return self.book.text_table

    def market(self) -> SimpleNamespace:
        b, n = self.book, self.book.n
        return SimpleNamespace(
            num_bars=n, session_minutes=b.schedule.minutes, interval_minutes=b.interval, splits={"all": (0, n)},
            contract=b.contract, close=b.column("close"), indicators={k: v[:n] for k, v in b.indicators.items()},
            sessions=SimpleNamespace(minute_of_day=b.minute_of_day[:n]), text_index=b.text_index[:n])


class JointBookView(BookView):
    """Instrument i of a set on the joint timeline so far (agents.trading.account_agent.JointBook), as
    jaxenv.market_set puts it there for training's advisor: at a joint bar where it has none, its latest own bar's
    close and indicators carried, no headline."""

    def __init__(self, joint, i: int):
        super().__init__(joint.clock[i])
        self.joint, self.i = joint, i

    @property
    def text_table(self) -> list[str]:
        return self.joint.own[self.i].text_table

    def market(self) -> SimpleNamespace:
        own, n = self.joint.own[self.i], self.joint.n
        pos, present = self.joint.pos[:n, self.i], self.joint.present[:n, self.i]
        market = super().market()
        market.indicators = {k: v[pos] for k, v in own.indicators.items()}
        market.text_index = np.where(present, own.text_index[pos], -1).astype(np.int32)
        return market


class BookFields:
    """The prompt fields of keys of a growing feed: agents.advisor.prompt_fields over the bars so far of a BookView
    (the builder is made again only when bars came since the last submission)."""

    def __init__(self, view: BookView, markets: list[str], contracts_per_trade: int, interval: int):
        self.view, self.markets = view, markets
        self.contracts_per_trade, self.interval = contracts_per_trade, interval  # env's; hybrid.query's
        self.builder: PromptFieldBuilder | None = None
        self.bars = -1  # the view's length the builder was made over

    def build(self, keys: np.ndarray) -> np.ndarray:
        n = self.view.n
        if n != self.bars:
            self.builder = PromptFieldBuilder(self.view.market(), self.markets, self.contracts_per_trade, self.interval)
            self.bars = n
        return self.builder.build(keys)


class LivePacer:
    """Asks the advisor about keys of a growing feed and hands their answers to the acting step."""

    def __init__(self, hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, view: BookView,
                 adapter: str | None, log_stem: Path | None = None, market=None, instruments: tuple[str, ...] = ()):
        """The run's config sections; `view`: the bars the prompts read; `adapter`: the LoRA adapter the advisor
        answers with (the checkpoint's: SavedPolicy.adapter); `market`: the whole file being replayed, whose keys'
        answers the advisor's store holds (None: no store); its answers are read and the new ones added;
        `instruments`: the set's symbols, for one instrument of a set (agents.advisor.instrument_set)."""
        self.hybrid, self.view = hybrid, view
        self.advisor = Advisor.open(
            hybrid, llm, env, data, market, ROWS, adapter, log_stem=log_stem, keep_known=False,
            fields=lambda renderer: BookFields(view, list(renderer.markets), env.contracts_per_trade,
                                               hybrid.query.interval),
            texts=view.text_table, instruments=instruments)
        self.queue: list[int] = []  # keys to ask once the advisor can take a submission (MAX_IN_FLIGHT)
        self.asked: dict[int, float] = {}  # key -> perf_counter() when asked (pending)
        self.latency: dict[int, float] = {}  # key -> seconds its answer took (0 from the store)
        self.ready: list[tuple] = []  # collected rows not yet written into the table
        self.read: set[int] = set()  # keys a decision has read (for advice_on_time)
        self.on_time = 0
        self.prompts = 0

    def close(self) -> None:
        self.advisor.close()

    @property
    def interval_s(self) -> float:
        return 60.0 * self.view.interval

    def state(self) -> dict:
        """What a restart needs: the answers taken and not yet written into the table (the store's, read as a block
        closed), each key's latency, the keys read and the counters."""
        ready = [np.concatenate(p).tolist() for p in zip(*self.ready)] if self.ready else None
        return {"ready": ready, "latency": {str(k): v for k, v in self.latency.items()}, "read": sorted(self.read),
                "on_time": self.on_time, "prompts": self.prompts}

    def restore(self, state: dict) -> None:
        ready = state["ready"]
        self.ready = [tuple(np.asarray(v, dtype) for v, dtype in zip(ready, READY_DTYPES))] if ready else []
        self.latency = {int(k): float(v) for k, v in state["latency"].items()}
        self.read, self.on_time, self.prompts = set(state["read"]), state["on_time"], state["prompts"]

    def ask(self, keys: list[int]) -> list[int]:
        """Asks about the keys not answered or asked yet (the store's answers are taken at once); each is timed from
        now, when it is due to be asked. Returns the keys asked of the advisor (in flight until answered)."""
        keys = [k for k in dict.fromkeys(keys) if k >= 0 and k not in self.latency and k not in self.asked]
        store = self.advisor.store
        if store is not None and keys:
            have = store.answers
            stored = [k for k in keys if k < have.num_keys and bool(answered(have.status[k]))]
            if stored:
                ids = np.array(stored, np.int32)
                self.ready.append((ids, have.probs[ids], have.confidence[ids], have.status[ids],
                                   np.zeros(len(ids), np.int32)))
                self.latency.update({k: 0.0 for k in stored})
                keys = [k for k in keys if k not in self.latency]
        now = time.perf_counter()
        self.asked.update({k: now for k in keys})
        self.queue += keys
        self._submit()
        return keys

    def _submit(self) -> None:
        """Submits queued keys while the advisor can take them, the newest blocks first; keys of blocks too old to be
        read any more (max_age) are dropped."""
        q = self.hybrid.query
        while self.queue and self.advisor.can_take:
            newest = max(key_block(np.array(self.queue)))
            stale = [k for k in self.queue if key_block(k) < newest - q.max_age // q.interval - 1]
            for k in stale:
                self.asked.pop(k, None)
            keys = sorted((k for k in self.queue if k not in stale), reverse=True)[:ROWS]
            self.queue = [k for k in self.queue if k not in stale and k not in keys]
            if not keys:
                return
            self.advisor.submit(np.array(keys, np.int64))
            self.prompts += len(keys)

    def _collect(self, wait: bool) -> None:
        """Collects answered submissions (with `wait`: every one, the queue included), refilling the advisor, each
        answer timed and kept for the table (and the store: the advisor keeps it there)."""
        while self.advisor.pending and (wait or self.advisor.workers.oldest_done):
            rows = self.advisor.collect(wait, self.hybrid.link.strict_timeout_s).rows
            now = time.perf_counter()
            got = np.asarray(answered(rows[3]))
            for k, ok in zip(rows[0].tolist(), got.tolist()):  # a key whose answer did not come: asked when needed
                asked = self.asked.pop(k, now)
                if ok:
                    self.latency[k] = now - asked
            self.ready.append(rows)
            self._submit()

    def answers(self, read: int | None, wait: bool) -> list[tuple]:
        """The rows (AdviceTable.write's arguments, in chunks padded to ROWS) of every answer collected since the
        last call; a key whose answer did not come is missing again (no longer in flight). `read`: the key the next
        decision reads; `wait`: collect every pending answer, waiting for it (else: those back already)."""
        self._collect(wait)
        if read is not None and read not in self.read:
            self.read.add(read)
            self.on_time += int(self.latency.get(read, np.inf) <= self.interval_s)
        if not self.ready:
            return []
        keys, probs, confidence, status, version = (np.concatenate(p) for p in zip(*self.ready))
        self.ready = []
        return [table_rows([tuple(x[start:start + ROWS] for x in (keys, probs, confidence, status, version))], ROWS)
                for start in range(0, len(keys), ROWS)]

    def metrics(self) -> dict:
        """`advice_on_time`, how many prompts were asked and their latency."""
        return {"advice_on_time": self.on_time / max(len(self.read), 1), "advice_keys_read": len(self.read),
                "llm_prompts": self.prompts, **latency_metrics(v for v in self.latency.values() if v > 0)}
