"""The persistent advice store: the advisor's answers per key (agents.advice.table), kept on disk so that every run,
seed, resume and evaluation walk on the same data with the same advisor starts from what earlier ones were told.

A store folder is named by the digest of its identity: the advisor (model, mode, quantisation, mock answers), its
LoRA adapter's files, the prompt template, the data (prices, stamps, headlines, contract) and the query interval k
that cuts the bars into blocks. Change any of them and the answers are another folder's. Inside:

    <root>/<digest>/answers-<sha>.npz  keys, probs, confidence, status of every answered key
    <root>/<digest>/manifest.json      the identity, the count, and the answers file's name, bytes and sha256

A save writes a new answers file, then the manifest to a temporary name renamed over the old one, then deletes the
answers file it replaced: a crash at any point leaves a manifest naming a whole answers file. A
folder whose manifest is missing or unreadable, whose identity differs or whose answers file does not match its
sha256 is set aside (renamed *.damaged-<time>) with one line on stderr, never trusted.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.advice.table import STATUS_NONE, answered
from bridge.protocol import NUM_ACTIONS

MANIFEST_FILE = "manifest.json"
STORE_FORMAT = 1
DEFAULT_ROOT = Path("runs") / "advice_store"  # hybrid.store: auto, for a model advisor


def store_root(cfg) -> Path | None:
    """Where the run's store lives: hybrid.store, where `auto` is DEFAULT_ROOT for a model advisor and no store for
    the mock (it answers faster than a store is read) and '' is none."""
    store = cfg.hybrid.store
    if store == "auto":
        return None if cfg.llm in ("mock", "none") else DEFAULT_ROOT
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


def identity(cfg, market, template: str, adapter: str | None) -> dict:
    """What the answers depend on (`template`: the prompt template's text)."""
    h = cfg.hybrid
    advisor = {"llm": cfg.llm}
    if cfg.llm == "mock":
        advisor["mock_answers"] = h.mock_answers
    else:
        advisor.update(mode=h.llm_mode, quantization=h.quantization)
    if h.shuffled:  # named only when on: the stores of every other advisor keep their folders
        advisor["shuffled"] = True
    return {"format": STORE_FORMAT, "advisor": advisor, "adapter": adapter_digest(adapter),
            "template": hashlib.sha256(template.encode()).hexdigest(), "data": data_digest(market),
            "interval": cfg.hybrid.query.interval, "contracts": cfg.env.contracts_per_trade,
            "reasoning": bool(h.reasoning.enabled)}


@dataclass
class Answers:
    """The host's copy of an advice table: per key, probabilities, confidence, status and advisor version."""

    probs: np.ndarray  # [K, 6] float32
    confidence: np.ndarray  # [K] float32
    status: np.ndarray  # [K] int32
    version: np.ndarray  # [K] int32

    @classmethod
    def empty(cls, num_keys: int) -> Answers:
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
            version: int) -> None:
        self.probs[keys], self.confidence[keys], self.status[keys] = probs, confidence, status
        self.version[keys] = version

    def keep(self, answers, version: int) -> np.ndarray:
        """Puts the real answers (`answered`) of a collected submission (bridge.client.Answers, keyed by its env ids)
        from advisor `version`; every row's status, int32."""
        status = answers.status.astype(np.int32)
        got = np.asarray(answered(status))
        self.put(answers.env_ids[got], answers.probs[got], answers.confidence[got], status[got], version)
        return status


class AdviceStore:
    def __init__(self, root: Path, ident: dict, num_keys: int):
        self.ident = ident
        self.num_keys = num_keys
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
        self.dir = Path(root) / digest[:24]
        self.saved = -1  # answered keys at the last save (or load)

    def _set_aside(self, why: str) -> None:
        aside = self.dir.with_name(f"{self.dir.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.dir, aside)
        print(f"WARNING: advice store {self.dir}: {why}; set aside as {aside.name}, starting empty", file=sys.stderr)

    def load(self) -> Answers:
        """The stored answers (version 0), or none: a missing store starts empty, a damaged one is set aside."""
        out = Answers.empty(self.num_keys)
        if not self.dir.exists():
            return out
        try:
            manifest = json.loads((self.dir / MANIFEST_FILE).read_text())
            answers_path = self.dir / Path(manifest["file"]).name
            data = answers_path.read_bytes()
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._set_aside(f"unreadable ({type(error).__name__}: {error})")
            return out
        if manifest.get("identity") != self.ident or manifest.get("keys") != self.num_keys:
            self._set_aside("its manifest names another advisor, template or data")
            return out
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            self._set_aside(f"{answers_path.name} does not match the sha256 in its manifest")
            return out
        try:
            with np.load(answers_path) as z:
                keys = z["keys"].astype(np.int64)
                if len(keys) and (keys.min() < 0 or keys.max() >= self.num_keys):
                    raise ValueError("a key out of range")
                out.put(keys, z["probs"], z["confidence"], z["status"], 0)
        except (OSError, ValueError, KeyError) as error:
            self._set_aside(f"{answers_path.name} unreadable ({error})")
            return Answers.empty(self.num_keys)
        self.saved = len(keys)
        return out

    def save(self, answers: Answers) -> bool:
        """Writes the answers of version 0 (the advisor the identity names) atomically; False when none are new."""
        keys = np.flatnonzero(answers.filled(0))
        if len(keys) == self.saved:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, keys=keys.astype(np.int32), probs=answers.probs[keys], confidence=answers.confidence[keys],
                 status=answers.status[keys])
        data = buffer.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        name = f"answers-{sha[:16]}.npz"
        with open(self.dir / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        manifest = {"identity": self.ident, "keys": self.num_keys, "answered": int(len(keys)), "file": name,
                    "bytes": len(data), "sha256": sha, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = self.dir / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, self.dir / MANIFEST_FILE)
        for old in self.dir.glob("answers-*.npz"):
            if old.name != name:
                old.unlink(missing_ok=True)
        self.saved = len(keys)
        return True
