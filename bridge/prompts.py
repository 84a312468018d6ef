"""Renders text prompts from the float array of prompt fields, vectorised over envs.

Why not a per-row `str.format`: 4096 rows x 12 numbers costs ~10 ms in Python. Here every field becomes a
fixed-width uint8 column (NUL where a shorter value leaves room), the columns are concatenated into one
[N, W] byte matrix, and one `bytes.translate` drops the NULs; a 0x01 byte ends each row so one `split`
recovers the prompts. Literal template text and headlines must therefore not contain bytes 0x00/0x01.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from bridge.protocol import ACTIONS, FIELD_INDEX, NUM_ACTIONS, NUM_PROMPT_FIELDS, PROMPT_FIELDS

DEFAULT_PROMPTS_PATH = Path(__file__).resolve().parents[1] / "configs" / "prompts.yaml"

_ROW_END = b"\x01"
_SPEC = re.compile(r"^(?P<sign>\+)?(?:\.(?P<decimals>[0-4]))?(?P<kind>[df%k])$")
_TEXT_FIELDS = ("market", "minute_of_day", "position", "headline")
_MAX_ABS = 1e15  # larger magnitudes are clipped so the int64 digit arithmetic cannot overflow
_TEMPLATE_KEYS = {
    "system", "context", "headline", "answer_prefix", "action_labels", "markets", "position_words", "formats",
    "reasoning",
}  # fmt: skip
# How score mode names the 6 actions (bridge.ACTIONS order) after the answer prefix. The default names are the
# protocol's own, which bridge.parse_answer also reads in generate mode; `action_labels` in the YAML changes them.
DEFAULT_ACTION_LABELS = ACTIONS  # score mode labels each action with its own name unless the YAML says otherwise
# Chain-of-thought answers (the optional `reasoning` mapping): the step headings the model writes, the last one
# holding the `ACTION | confidence | reason` line, how many tokens it may generate for them, and how long one query
# step's batch of thoughts may take (the labels are then scored after whatever was written).
DEFAULT_REASONING_STEPS = ("market analysis", "options", "risks", "decision")
DEFAULT_REASONING_TOKENS = 160
DEFAULT_REASONING_TIME_S = 30.0  # well inside hybrid.link.strict_timeout_s (120 s), which would drop the answers
_REASONING_KEYS = {"system", "steps", "max_new_tokens", "max_time_s"}


PRICE_SIGNIFICANT = 5  # digits of a price in a prompt (18234, 5012.3, 1.0871): every digit is a token to SmolLM2


@dataclass(frozen=True)
class PromptInstrument:
    """What the prompts say about the run's instrument: `symbol` (added to the `markets` the `market` field indexes
    where the template's list lacks it), `kind_words` for `{kind}` in the system prompts ("futures", "spot FX",
    "stock"), and `price_decimals`, the most decimals a price is written with (the tick's): a `price` field without a
    format of its own is written with PRICE_SIGNIFICANT digits, never more decimals than that. The defaults are the
    default contract's (NQ), for renderers built without a run."""

    symbol: str = ""
    kind_words: str = "futures"
    price_decimals: int = 2


@dataclass(frozen=True)
class NumberFormat:
    """How a numeric field is written: fixed decimals, optional forced sign, optional percent or thousands; with
    `significant`, each number gets as many of `decimals` as keep it to that many digits (a price's format)."""

    decimals: int = 2
    sign: bool = False
    percent: bool = False  # value is a fraction; written x100 with a trailing '%'
    thousands: bool = False  # written /1000 with a trailing 'k' (52k: two digit tokens fewer than 51937)
    significant: int = 0  # > 0: digits per number, decimals dropped from the right (never more than `decimals`)

    @classmethod
    def parse(cls, spec: str, where: str) -> "NumberFormat":
        m = _SPEC.match(spec)
        if m is None:
            raise ValueError(f"{where}: format {spec!r} is not one of d, .Nf, .N%, .Nk (N = 0..4, optionally with a "
                             "leading +)")
        decimals = 0 if m["kind"] == "d" else int(m["decimals"] or 0)
        return cls(decimals=decimals, sign=bool(m["sign"]), percent=m["kind"] == "%", thousands=m["kind"] == "k")


def _u8(column: np.ndarray) -> np.ndarray:
    """A 1-D bytes array ('S' dtype) as an [N, width] uint8 matrix, NUL padded."""
    column = np.ascontiguousarray(column)
    return column.view(np.uint8).reshape(len(column), column.dtype.itemsize)


def _literal(text: bytes, n: int) -> np.ndarray:
    return np.broadcast_to(np.frombuffer(text, np.uint8), (n, len(text)))


# Digits are written four at a time by table lookup, each group of four ASCII bytes held as one uint32:
# gathering and selecting whole uint32 values is far cheaper than per-digit integer division.
_GROUP = 10_000
_ZERO_PADDED = np.array([b"%04d" % i for i in range(_GROUP)], dtype="S4").view(np.uint8).reshape(_GROUP, 4)
_NUL_PADDED = np.where(np.cumsum(_ZERO_PADDED != ord("0"), axis=1) > 0, _ZERO_PADDED, 0).astype(np.uint8)
_NUL_PADDED[:, 3] = _ZERO_PADDED[:, 3]  # the last digit always shows, so zero is "0"
_ZERO_PADDED32 = _ZERO_PADDED.view(np.uint32).ravel()
_NUL_PADDED32 = _NUL_PADDED.view(np.uint32).ravel()


def _digits(values: np.ndarray) -> np.ndarray:
    """Non-negative int64 values as right-aligned ASCII digits in an [N, 4k] uint8 matrix, NUL before the number."""
    groups = max(1, -(-len(str(int(values.max(initial=0)))) // 4))
    words = np.empty((len(values), groups), dtype=np.uint32)
    for g in range(groups):
        scale = _GROUP ** (groups - 1 - g)
        group = (values // scale) % _GROUP
        leading = _NUL_PADDED32[group] if scale == 1 else np.where(values >= scale, _NUL_PADDED32[group], 0)
        words[:, g] = np.where(values >= scale * _GROUP, _ZERO_PADDED32[group], leading)
    return words.view(np.uint8)


def _written(values: np.ndarray, fmt: NumberFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(finite, negative, digits, decimals) of a float column as `fmt` writes it: the digits an int64 (the number
    times 10**decimals, after the percent or thousands scaling), negative only where a digit is not 0 (no "-0.00"),
    the decimals per number."""
    finite = np.isfinite(values)
    v = np.where(finite, values, 0.0).astype(np.float64)
    if fmt.percent:
        v *= 100.0
    if fmt.thousands:
        v /= 1000.0
    v = np.minimum(np.abs(v), _MAX_ABS) * np.sign(v)
    decimals = np.full(len(v), fmt.decimals, np.int64)
    if fmt.significant:
        whole = np.floor(np.log10(np.maximum(np.abs(v), 1.0))).astype(np.int64) + 1  # digits before the point
        decimals = np.clip(fmt.significant - whole, 0, fmt.decimals)
    scaled = np.rint(np.abs(v) * 10.0**decimals).astype(np.int64)
    return finite, (v < 0) & (scaled > 0), scaled, decimals


def written_numbers(values: np.ndarray, fmt: NumberFormat) -> np.ndarray:
    """The numbers a reader of `format_numbers`' text reads (float64; NaN for "n/a"): 31.46 as `.0f` is 31.0, 0.5
    as `.0%` is 50.0."""
    finite, negative, scaled, decimals = _written(values, fmt)
    return np.where(finite, np.where(negative, -1.0, 1.0) * scaled / 10.0**decimals, np.nan)


def format_numbers(values: np.ndarray, fmt: NumberFormat) -> list[np.ndarray]:
    """Formats a float column as uint8 matrices [N, w] to be laid side by side (NUL = no character).

    Non-finite values are written as 'n/a'."""
    n = len(values)
    finite, negative, scaled, decimals = _written(values, fmt)
    sign = np.where(negative, np.uint8(ord("-")), np.uint8(ord("+") if fmt.sign else 0))
    unit = 10**decimals
    pieces = [sign[:, None], _digits(scaled // unit)]
    if fmt.decimals:
        # the fraction's digits left-aligned in `fmt.decimals` columns, those beyond a number's own decimals NUL
        most = fmt.decimals
        fraction = _ZERO_PADDED32[(scaled % unit) * 10 ** (most - decimals)][:, None].view(np.uint8)[:, 4 - most :]
        fraction = np.where(np.arange(most)[None, :] < decimals[:, None], fraction, np.uint8(0))
        pieces += [np.where(decimals[:, None] > 0, _literal(b".", n), np.uint8(0)), fraction]
    if fmt.percent:
        pieces.append(_literal(b"%", n))
    if fmt.thousands:
        pieces.append(_literal(b"k", n))
    if finite.all():
        return pieces
    hide = finite[:, None]
    pieces = [np.where(hide, piece, np.uint8(0)) for piece in pieces]
    pieces.append(np.where(hide, np.uint8(0), np.frombuffer(b"n/a", np.uint8)[None, :]))
    return pieces


def _clean_text(text: str) -> bytes:
    return text.encode("utf-8").translate(None, b"\x00\x01")


def check_reasoning(reasoning: object, source: str) -> dict:
    """The `reasoning` mapping with its defaults filled in, as plain JSON types (it travels to the sidecar in a
    JSON blob). Raises ValueError naming `source` and the offending key."""
    if not isinstance(reasoning, dict):
        raise ValueError(f"{source}: reasoning must be a mapping with keys {sorted(_REASONING_KEYS)}, "
                         f"got {type(reasoning).__name__}")
    unknown = set(reasoning) - _REASONING_KEYS
    if unknown:
        raise ValueError(f"{source}: reasoning has unknown key(s) {sorted(unknown)}; "
                         f"allowed: {sorted(_REASONING_KEYS)}")
    system = reasoning.get("system")
    if not isinstance(system, str) or not system.strip():
        raise ValueError(f"{source}: reasoning.system is required and must be a non-empty string")
    steps = reasoning.get("steps", DEFAULT_REASONING_STEPS)
    if (not isinstance(steps, (list, tuple)) or not steps or not all(isinstance(s, str) and s.strip() for s in steps)
            or len({s.strip().lower() for s in steps}) != len(steps)):
        raise ValueError(f"{source}: reasoning.steps must be a non-empty list of distinct step names (the last one "
                         f"holds the answer), got {steps!r}")
    steps = [" ".join(s.split()) for s in steps]
    # The parser finds the steps by their names and reads the protocol's action names: the prompt must use both.
    flat_system = " ".join(system.lower().split())
    unnamed = [s for s in steps if s.lower() not in flat_system]
    if unnamed:
        raise ValueError(f"{source}: reasoning.steps {unnamed} do not appear in reasoning.system; the prompt must ask "
                         "for each step under its name")
    unlisted = [a for a in ACTIONS if a not in system]
    if unlisted:
        raise ValueError(f"{source}: reasoning.system must list the actions {list(ACTIONS)}; missing {unlisted}")
    max_new_tokens = reasoning.get("max_new_tokens", DEFAULT_REASONING_TOKENS)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"{source}: reasoning.max_new_tokens must be an integer >= 1 (the tokens a thought may "
                         f"generate), got {max_new_tokens!r}")
    max_time_s = reasoning.get("max_time_s", DEFAULT_REASONING_TIME_S)
    if isinstance(max_time_s, bool) or not isinstance(max_time_s, (int, float)) or not max_time_s > 0:
        raise ValueError(f"{source}: reasoning.max_time_s must be a number > 0 (seconds one query step's thoughts may "
                         f"take), got {max_time_s!r}")
    return {"system": system, "steps": steps, "max_new_tokens": max_new_tokens, "max_time_s": float(max_time_s)}


class PromptRenderer:
    """Turns prompt-field rows (see bridge.PROMPT_FIELDS) into the context part of each prompt.

    `system`, `answer_prefix` and `action_labels` are not rendered per env: the sidecar receives them once, and so
    does `reasoning` (None, or the chain-of-thought settings checked by `check_reasoning`).
    """

    def __init__(
        self,
        system: str,
        context: str,
        headline: str = " {text}",
        answer_prefix: str = "Action:",
        action_labels: Sequence[str] = DEFAULT_ACTION_LABELS,
        markets: Sequence[str] = ("ES",),
        position_words: dict[str, str] | None = None,
        formats: dict[str, str] | None = None,
        reasoning: dict | None = None,
        source: str = "<arguments>",
        instrument: PromptInstrument = PromptInstrument(),
    ):
        """`instrument`: the run's (agents.advisor.prompt_fields.prompt_instrument): its symbol is one of the
        `markets`, its kind's words replace `{kind}` in the system prompts, its tick bounds a price's decimals."""
        self.instrument = instrument
        self.system = system.replace("{kind}", instrument.kind_words)
        self.context = context
        markets = tuple(markets)
        if instrument.symbol and instrument.symbol not in markets:
            markets += (instrument.symbol,)
        self.markets = markets  # symbols the `market` field indexes
        self.answer_prefix = answer_prefix
        self.source = source
        labels = tuple(action_labels)
        distinct = len(labels) == len(set(labels)) == NUM_ACTIONS
        if not distinct or not all(isinstance(a, str) and a.strip() for a in labels):
            raise ValueError(f"{source}: action_labels must be {NUM_ACTIONS} distinct non-empty strings naming "
                             f"{', '.join(ACTIONS)} in that order, got {action_labels!r}")
        self.action_labels = labels
        if isinstance(reasoning, dict) and isinstance(reasoning.get("system"), str):
            reasoning = {**reasoning, "system": reasoning["system"].replace("{kind}", instrument.kind_words)}
        self.reasoning = None if reasoning is None else check_reasoning(reasoning, source)
        words = {"long": "long", "short": "short", "flat": "flat", **(position_words or {})}
        unknown_words = set(words) - {"long", "short", "flat"}
        if unknown_words:
            raise ValueError(f"{source}: position_words has unknown key(s) {sorted(unknown_words)}; use long/short/flat")
        formats = dict(formats or {})
        for name in formats:
            if name not in FIELD_INDEX or name in _TEXT_FIELDS:
                raise ValueError(f"{source}: formats.{name}: not a numeric prompt field; numeric fields are "
                                 f"{[f for f in PROMPT_FIELDS if f not in _TEXT_FIELDS]}")
        if "{text}" not in headline:
            raise ValueError(f"{source}: headline template {headline!r} must contain {{text}}")
        self._headline_wrap = headline
        self._market_table = np.array([_clean_text(m) for m in markets] or [b""], dtype="S")
        self._sign_words = np.array(
            [_clean_text(words["short"] + " "), _clean_text(words["flat"]), _clean_text(words["long"] + " ")], dtype="S"
        )
        self._clock = np.array([b"%02d:%02d" % divmod(m, 60) for m in range(24 * 60)], dtype="S5")
        # The context template as a list of (literal bytes, field name | None, NumberFormat | None).
        self._parts: list[tuple[bytes, str | None, NumberFormat | None]] = []
        for literal, name, spec, conversion in string.Formatter().parse(context):
            if conversion:
                raise ValueError(f"{source}: context: conversion !{conversion} is not supported")
            field, fmt = None, None
            if name is not None:
                if name not in FIELD_INDEX:
                    raise ValueError(f"{source}: context: unknown field {{{name}}}; known fields: {list(PROMPT_FIELDS)}")
                field = name
                if name == "price" and not (spec or "price" in formats):  # the instrument's precision
                    fmt = NumberFormat(decimals=min(instrument.price_decimals, 4), significant=PRICE_SIGNIFICANT)
                elif name not in _TEXT_FIELDS:
                    fmt = NumberFormat.parse(spec or formats.get(name, ".2f"), f"{source}: context field {name}")
                elif spec:
                    raise ValueError(f"{source}: context: field {name} is text and takes no format ({spec!r})")
            self._parts.append((_clean_text(literal), field, fmt))

    @property
    def fields_used(self) -> set[str]:
        """The prompt fields the context template names."""
        return {name for _, name, _ in self._parts if name is not None}

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>",
                  instrument: PromptInstrument = PromptInstrument()) -> "PromptRenderer":
        unknown = set(data) - _TEMPLATE_KEYS
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TEMPLATE_KEYS)}")
        for key in ("system", "context"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"{source}: key {key!r} is required and must be a string")
        return cls(**data, source=source, instrument=instrument)

    @classmethod
    def from_yaml(cls, path: str | Path = DEFAULT_PROMPTS_PATH,
                  instrument: PromptInstrument = PromptInstrument()) -> "PromptRenderer":
        path = Path(path)
        with open(path) as f:
            data = yaml.safe_load(f)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of template keys, got {type(data).__name__}")
        return cls.from_dict(data, source=str(path), instrument=instrument)

    def render(self, fields: np.ndarray, texts: Sequence[str] | None = None) -> np.ndarray:
        """Renders one context prompt per row of `fields` ([N, len(PROMPT_FIELDS)] float32).

        `texts` is the headline table indexed by the `headline` field. Returns a 1-D numpy bytes array
        (dtype 'S'): a sequence of UTF-8 prompts that SidecarClient.submit() packs without a Python loop.
        """
        fields = np.asarray(fields)
        if fields.ndim != 2 or fields.shape[1] != NUM_PROMPT_FIELDS:
            raise ValueError(f"prompt fields must have shape [N, {NUM_PROMPT_FIELDS}] ({', '.join(PROMPT_FIELDS)}), "
                             f"got {fields.shape}")
        n = len(fields)
        if n == 0:
            return np.zeros(0, dtype="S1")
        pieces = []
        for literal, name, fmt in self._parts:
            if literal:
                pieces.append(_literal(literal, n))
            if name is not None:
                column = fields[:, FIELD_INDEX[name]]
                if fmt is not None:
                    pieces += format_numbers(column, fmt)
                else:
                    pieces.append(self._text_column(name, column, texts))
        pieces.append(_literal(_ROW_END, n))
        matrix = np.concatenate(pieces, axis=1)
        rows = matrix.tobytes().translate(None, b"\x00").split(_ROW_END)[:-1]
        return np.array(rows, dtype="S")

    def shown(self, fields: np.ndarray) -> np.ndarray:
        """The numbers `render` writes, without writing them ([N, len(PROMPT_FIELDS)] float64): each numeric field
        the context names as its text reads (`written_numbers`), the market, time, position and headline fields
        the context names as given, NaN for every field it does not name (a reader of the text never sees it)."""
        fields = np.asarray(fields, np.float64)
        out = np.full(fields.shape, np.nan)
        for _, name, fmt in self._parts:
            if name is not None:
                column = fields[:, FIELD_INDEX[name]]
                out[:, FIELD_INDEX[name]] = column if fmt is None else written_numbers(column, fmt)
        return out

    def _text_column(self, name: str, column: np.ndarray, texts: Sequence[str] | None) -> np.ndarray:
        if name == "market":
            index = self._checked_index(name, column, len(self._market_table))
            return _u8(self._market_table[index])
        if name == "minute_of_day":
            minutes = np.where(np.isfinite(column), column, 0).astype(np.int64) % (24 * 60)
            return _u8(self._clock[minutes])
        if name == "position":
            contracts = np.where(np.isfinite(column), np.rint(column), 0).astype(np.int64)
            words = _u8(self._sign_words[np.sign(contracts) + 1])
            size = np.where(contracts[:, None] == 0, np.uint8(0), _digits(np.abs(contracts)))
            return np.concatenate([words, size], axis=1)
        # headline: only the referenced entries are encoded, so a long text table costs nothing per call.
        ids = np.where(np.isfinite(column), column, -1).astype(np.int64)
        used = np.unique(ids[ids >= 0])
        if used.size and (texts is None or used[-1] >= len(texts)):
            have = 0 if texts is None else len(texts)
            raise ValueError(f"prompt field 'headline' refers to text {int(used[-1])} but the text table has {have} entries")
        table = np.array([b""] + [_clean_text(self._headline_wrap.format(text=texts[i])) for i in used], dtype="S")
        return _u8(table[np.searchsorted(used, ids) * (ids >= 0) + (ids >= 0)])

    def _checked_index(self, name: str, column: np.ndarray, size: int) -> np.ndarray:
        index = np.where(np.isfinite(column), column, -1).astype(np.int64)
        bad = (index < 0) | (index >= size)
        if bad.any():
            raise ValueError(f"prompt field {name!r} has value {column[bad][0]!r}; valid values are 0..{size - 1} "
                             f"(the template's {name}s list: {self._market_table.tolist()})")
        return index
