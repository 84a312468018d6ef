"""The persistent advice store: the advisor's answers per key (agents.advice.table), kept on disk so that every run,
seed, resume and evaluation walk on the same data with the same advisor starts from what earlier ones were told.

A store folder is named by the digest of its identity: everything an answer depends on. The advisor (model, mode,
quantisation, mock answers; its learning options, for one that learns), the digest of the model's files, the device
class and precision it answers in, its LoRA adapter's files, the prompt template, the prompt format (a digest of
every key's prompt fields and of prompts rendered from them: a change to the renderer, the indicators or the fields
moves it), the data and the query interval k. Change any of them and the answers are another folder's. Inside:

    <root>/<digest>/answers.sqlite   one row per answered key (key, probs, confidence, status), and the identity

Why SQLite: one store has several holders at once (a run's training and its walks in one process; scripts/advise.py
or another run beside it). A save is one transaction that adds the holder's new rows to the file's: holders merge,
none overwrites another's answers. SQLite's locking orders writers across processes, its rollback journal makes
each save atomic (a process killed mid-save loses that save's rows, never the store) and `synchronous=EXTRA` makes it
durable (the folder is synced once the journal's deletion commits it); the first save creates the tables and the
identity in its one transaction, so a database without tables (a first save not committed yet, or killed) is an empty
store. Within a process every holder of one identity shares one `AdviceStore` (`open_store`), so training's answers
and its walks' are one set. A folder whose database fails its integrity check or is no database of this format, whose
identity differs, or whose rows hold values no answer can have, is set aside (renamed *.damaged-<time>) with one line
on stderr, never trusted; a file that cannot be read now (locked, read-only, gone) is not judged. A save that fails
(its folder set aside under it) tries once more, then keeps its answers for the next save. A local model folder is
named by its resolved path, however it is spelled. Stores of the first format (npz files and a manifest) have another
identity and are not read.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.advice.table import STATUS_NONE, answered
from agents.config import HybridConfig
from agents.runs.storage import fsync_dir
from bridge.protocol import NUM_ACTIONS
from jaxenv.config import EnvConfig

DATABASE_FILE = "answers.sqlite"
STORE_FORMAT = 2  # 2: SQLite, merged by key; the identity holds the model's files, device class and prompt format
LOCK_TIMEOUT_S = 120.0  # how long a save waits for another holder's
DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_ERROR")  # errors of the file's bytes or schema, not of the moment
MODEL_DIGESTS_FILE = "model-digests.json"  # <root>/: the digests of model files read so far
DEFAULT_ROOT = Path("runs") / "advice_store"  # hybrid.store: auto, for a model advisor


def store_root(hybrid: HybridConfig, llm: str) -> Path | None:
    """Where the run's store lives: hybrid.store, where `auto` is DEFAULT_ROOT for a model advisor and no store for
    the mock (it answers faster than a store is read) and '' is none."""
    store = hybrid.store
    if store == "auto":
        return None if llm in ("mock", "none") else DEFAULT_ROOT
    return Path(store) if store else None


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def adapter_digest(adapter: str | None) -> str:
    """sha256 over what a LoRA adapter answers with: its config and weights files (names and bytes), not its model
    card or the experiences saved beside it; "none" without one."""
    if not adapter:
        return "none"
    files = sorted(p for p in Path(adapter).iterdir()
                   if p.is_file() and (p.name == "adapter_config.json" or p.name.startswith("adapter_model")))
    return _digest(*(p.relative_to(adapter).as_posix().encode() + b"\0" + p.read_bytes() for p in files))


def data_digest(market) -> str:
    """sha256 of everything a key's prompt is rendered from: the bars, their stamps, the headlines, the contract."""
    stamps = np.asarray(market.timestamps.asi8, np.int64)
    arrays = [np.ascontiguousarray(a, np.float64).tobytes() for a in (market.open, market.high, market.low,
                                                                       market.close, market.volume)]
    texts = "\n".join(market.text_table).encode()
    return _digest(stamps.tobytes(), *arrays, np.asarray(market.text_index, np.int32).tobytes(), texts,
                   market.contract.symbol.encode())


PROMPT_SAMPLE = 256  # keys whose prompts are rendered into the prompt format's digest


def model_name(llm: str) -> str:
    """The advisor's model as a store's identity names it: a local folder by its resolved absolute path (`m`, `./m`
    and `/abs/m` are one model), a hub id or a built-in choice by its name."""
    if llm in ("none", "mock", "smollm2"):  # agents.config's choices, never a folder
        return llm
    path = Path(os.path.expanduser(llm))  # os.path: an unknown ~user stays a name
    return str(path.resolve()) if path.is_dir() else llm


def model_digest(llm: str, root: Path) -> str:
    """sha256 over the files the advisor's model loads: the embedded model's GGUF, or a model folder's files; a
    hub id that is no local folder, its name (this machine has no files of it to read). Cached under `root` by
    each file's path, size and modification time, so a large model is read once."""
    from bridge.embedded_model import EMBEDDED_MODEL, find_smollm2_gguf

    if llm == EMBEDDED_MODEL:
        files = [find_smollm2_gguf()]
    elif Path(model_name(llm)).is_dir():
        files = sorted(p for p in Path(model_name(llm)).rglob("*") if p.is_file())
    else:
        return f"name:{llm}"
    cache_path = Path(root) / MODEL_DIGESTS_FILE
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    parts = []
    for f in files:
        st = f.stat()
        stamp = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        if stamp not in cache:
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
            cache[stamp] = h.hexdigest()
        parts.append(f.name.encode() + b"\0" + cache[stamp].encode())
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, cache_path)
    except OSError:  # a read-only root: the digest is still right, only not cached
        pass
    return _digest(*parts)


def prompt_format_digest(fields, renderer, texts: list[str] | None, num_keys: int) -> str:
    """sha256 over every key's prompt fields (agents.advisor.prompt_fields) and the prompts rendered from a sample
    of them: any change to how a key's prompt is made (fields, indicators, renderer, template) moves it."""
    keys = np.arange(num_keys)
    rows = fields.build(keys)
    sample = keys[:: max(1, num_keys // PROMPT_SAMPLE)]
    rendered = renderer.render(rows[sample], texts)
    return _digest(np.ascontiguousarray(rows).tobytes(), b"\n".join(bytes(p) for p in rendered))


def identity(hybrid: HybridConfig, llm: str, env: EnvConfig, market, template: str, adapter: str | None,
             prompt_format: str, root: Path, instruments: tuple[str, ...] = ()) -> dict:
    """What the answers depend on (`template`: the prompt template's text; `prompt_format`: prompt_format_digest;
    `instruments`: the set `market` is one instrument of, on the set's joint timeline, in the set's order)."""
    from agents.devices.gpus import visible_gpus

    h = hybrid
    advisor = {"llm": model_name(llm)}  # a local folder's one name, however llm spells its path
    if llm == "mock":
        advisor["mock_answers"] = h.mock.answers
    else:
        gpu = visible_gpus() > 0  # the transformers backend answers in bfloat16 on a GPU, float32 on a CPU
        advisor.update(mode=h.sidecar.mode, quantization=h.sidecar.quantization, model=model_digest(llm, root),
                       device="cuda" if gpu else "cpu", dtype="bfloat16" if gpu else "float32")
    if h.shuffled:  # named only when on: the stores of every other advisor keep their folders
        advisor["shuffled"] = True
    if h.learning.enabled:  # an advisor that learns is its own arm, even where it starts from another's adapter
        advisor["learning"] = h.learning.options()
    return {"format": STORE_FORMAT, "advisor": advisor, "adapter": adapter_digest(adapter),
            "template": hashlib.sha256(template.encode()).hexdigest(), "prompt_format": prompt_format,
            "data": data_digest(market), "interval": h.query.interval,
            "contracts": env.contracts_per_trade, "reasoning": bool(h.reasoning.enabled),
            **({"instruments": list(instruments)} if instruments else {})}  # named only for a set: others keep theirs


@dataclass
class KnownAdvice:
    """The host's copy of an advice table: per key, probabilities, confidence, status and advisor version."""

    probs: np.ndarray  # [K, 6] float32
    confidence: np.ndarray  # [K] float32
    status: np.ndarray  # [K] int32
    version: np.ndarray  # [K] int32

    @classmethod
    def empty(cls, num_keys: int) -> KnownAdvice:
        return cls(np.full((num_keys, NUM_ACTIONS), 1 / NUM_ACTIONS, np.float32), np.zeros(num_keys, np.float32),
                   np.full(num_keys, STATUS_NONE, np.int32), np.full(num_keys, -1, np.int32))

    @property
    def num_keys(self) -> int:
        return len(self.status)

    def filled(self, version: int | None = None) -> np.ndarray:
        """[K] bool: the key has an answer (from `version` only, if given)."""
        ok = np.asarray(answered(self.status))
        return ok if version is None else ok & (self.version == version)

    def put(self, keys: np.ndarray, probs: np.ndarray, confidence: np.ndarray, status: np.ndarray,
            version: int | np.ndarray) -> None:
        self.probs[keys], self.confidence[keys], self.status[keys] = probs, confidence, status
        self.version[keys] = version

    def keep(self, answers, version: int) -> np.ndarray:
        """Puts the real answers (`answered`) of a collected submission (bridge.client.Answers, keyed by its keys),
        each under the advisor version that gave it (the sidecar's report; `version` for an advisor that reports
        none); every row's status, int32."""
        status = answers.status.astype(np.int32)
        got = np.asarray(answered(status))
        versions = np.full(len(status), version, np.int32) if answers.version is None else answers.version
        self.put(answers.keys[got], answers.probs[got], answers.confidence[got], status[got], versions[got])
        return status

    def take_missing(self, other) -> None:
        """Puts the answers `other` has and this copy lacks (`other`: KnownAdvice, or a host copy of an AdviceTable,
        whose fields are named alike), each under its version there."""
        take = np.asarray(answered(other.status)) & ~self.filled()
        self.put(np.flatnonzero(take), other.probs[take], other.confidence[take], other.status[take],
                 other.version[take])

    def copy(self) -> KnownAdvice:
        return KnownAdvice(self.probs.copy(), self.confidence.copy(), self.status.copy(), self.version.copy())


_OPEN: dict[Path, AdviceStore] = {}  # this process's stores, by folder: one holder per identity


def open_store(root: Path, ident: dict, num_keys: int) -> AdviceStore:
    """This process's one holder of the store of `ident` under `root` (its file's answers read on first use)."""
    store = AdviceStore(root, ident, num_keys)
    held = _OPEN.get(store.dir.resolve())
    if held is not None and held.num_keys == num_keys:
        return held
    _OPEN[store.dir.resolve()] = store
    store.load()
    return store


class AdviceStore:
    """The answers of one identity: `answers` (version 0: the advisor the identity names), read from the folder,
    kept by every holder in this process, and saved by adding to the folder's rows."""

    def __init__(self, root: Path, ident: dict, num_keys: int):
        self.ident = ident
        self.num_keys = num_keys
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
        self.dir = Path(root) / digest[:24]
        self.path = self.dir / DATABASE_FILE
        self.answers = KnownAdvice.empty(num_keys)
        self.on_disk = np.zeros(num_keys, bool)  # keys whose answer the file holds

    def _set_aside(self, why: str) -> None:
        self.on_disk[:] = False
        aside = self.dir.with_name(f"{self.dir.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(self.dir, aside)
        except FileNotFoundError:  # another holder set it aside first
            return
        except OSError as error:  # a read-only folder: not trusted all the same
            print(f"WARNING: advice store {self.dir}: {why}; cannot set it aside ({error}), starting empty",
                  file=sys.stderr)
            return
        print(f"WARNING: advice store {self.dir}: {why}; set aside as {aside.name}, starting empty", file=sys.stderr)

    def _connect(self, create: bool = False) -> sqlite3.Connection:
        """A connection to the file, which only a save creates (a reader never leaves an empty file behind)."""
        uri = f"{self.path.absolute().as_uri()}?mode={'rwc' if create else 'rw'}"  # rw: read-only if write-protected
        db = sqlite3.connect(uri, uri=True, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        # rollback + EXTRA (syncs the journal's deletion, the commit): WAL's -shm would need a writable folder, one host
        db.execute("PRAGMA synchronous=EXTRA")
        return db

    def _rows(self, db: sqlite3.Connection) -> tuple[np.ndarray, ...]:
        """Every row of the file, checked: (keys, probs, confidence, status). LookupError: another identity;
        ValueError: a row no answer can be."""
        db.execute("BEGIN")  # one snapshot: the check and the rows of one committed state
        if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise ValueError("the database fails its integrity check")
        if not db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:  # a first save not committed (or killed)
            return (np.zeros(0, np.int64), np.zeros((0, NUM_ACTIONS), np.float32), np.zeros(0, np.float32),
                    np.zeros(0, np.int32))
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        if json.loads(meta.get("identity", "null")) != self.ident or int(meta.get("keys", -1)) != self.num_keys:
            raise LookupError("it names another advisor, template or data")
        rows = db.execute("SELECT key, probs, confidence, status FROM answers").fetchall()
        keys = np.array([r[0] for r in rows], np.int64)
        blob = b"".join(r[1] for r in rows)
        if len(blob) != len(rows) * NUM_ACTIONS * 4:
            raise ValueError("a row's probabilities are not 6 float32")
        probs = np.frombuffer(blob, np.float32).reshape(len(rows), NUM_ACTIONS)
        confidence = np.array([r[2] for r in rows], np.float32)
        status = np.array([r[3] for r in rows], np.int32)
        bad = ((keys < 0) | (keys >= self.num_keys) | ~np.asarray(answered(status)) | ~np.isfinite(probs).all(-1)
               | (np.abs(probs.sum(-1) - 1.0) > 1e-3) | ~np.isfinite(confidence))
        if bad.any():
            raise ValueError(f"key {keys[np.argmax(bad)]} holds a value no answer can have")
        return keys, probs, confidence, status

    def load(self) -> KnownAdvice:
        """Reads the file's answers into `answers` (a missing store is empty; a damaged one is set aside)."""
        self.refresh()
        return self.answers

    def refresh(self) -> int:
        """Adds the file's answers this process does not hold yet (other processes' saves); how many."""
        if not self.path.exists():
            self.on_disk[:] = False  # gone (set aside, removed): the next save writes every answer held
            try:
                other = any(self.dir.iterdir())
            except OSError:  # no folder (yet, or set aside since)
                other = False
            if other:
                self._set_aside(f"no {DATABASE_FILE} in it (a store of another format, or damaged)")
            return 0
        try:
            with closing(self._connect()) as db:
                keys, probs, confidence, status = self._rows(db)
        except LookupError as error:
            self._set_aside(str(error))
            return 0
        except (sqlite3.Error, ValueError, TypeError) as error:
            if isinstance(error, sqlite3.Error) and not (error.sqlite_errorname or "").startswith(DAMAGED):
                if self.path.exists():  # locked or read-only now: not the file's fault (gone: set aside by another)
                    print(f"WARNING: advice store {self.dir}: cannot read it now ({error}); going on with the answers "
                          "held", file=sys.stderr)
                return 0
            self._set_aside(f"unreadable ({type(error).__name__}: {error})")
            return 0
        self.on_disk[keys] = True
        new = ~self.answers.filled()[keys]
        self.answers.put(keys[new], probs[new], confidence[new], status[new], 0)
        return int(new.sum())

    def keep(self, keys: np.ndarray, probs: np.ndarray, confidence: np.ndarray, status: np.ndarray) -> None:
        """Holds answers of the identity's advisor (version 0) for the next save."""
        self.answers.put(keys, probs, confidence, status, 0)

    def save(self) -> int:
        """Adds the answers held and not yet in the file to it, in one durable transaction; how many (0 where it
        fails twice: one line on stderr, and the answers stay held for the next save)."""
        for _ in range(2):  # the folder set aside under the first try (another holder found it damaged): a new file
            try:
                return self._save()
            except (sqlite3.Error, OSError) as error:
                failed = error
        print(f"WARNING: advice store {self.dir}: cannot save ({type(failed).__name__}: {failed}); the answers stay "
              "held for the next save", file=sys.stderr)
        return 0

    def _save(self) -> int:
        if not self.path.exists():
            self.on_disk[:] = False  # gone (set aside, removed): every answer held goes into the new file
        keys = np.flatnonzero(self.answers.filled(0) & ~self.on_disk)
        if not len(keys):
            return 0
        created = not self.path.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        rows = [(int(k), self.answers.probs[k].astype(np.float32).tobytes(), float(self.answers.confidence[k]),
                 int(self.answers.status[k])) for k in keys]
        with closing(self._connect(create=True)) as db:
            db.execute("BEGIN IMMEDIATE")  # the write lock first: another holder's save waits, then adds to it
            # the tables and the identity commit together: another holder sees all of them or none (an empty store)
            db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS answers (key INTEGER PRIMARY KEY, probs BLOB NOT NULL, "
                       "confidence REAL NOT NULL, status INTEGER NOT NULL)")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('identity', ?), ('keys', ?)",
                       (json.dumps(self.ident, sort_keys=True), str(self.num_keys)))
            db.executemany("INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        if created:
            fsync_dir(self.dir)
            fsync_dir(self.dir.parent)
        self.on_disk[keys] = True
        return len(keys)
