"""Advisors that turn context prompts into answers: a deterministic mock and any transformers causal LM."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from bridge.parsing import answer_probabilities, parse_answer
from bridge.prompts import DEFAULT_ACTION_LABELS
from bridge.protocol import ACTIONS, MOCK_ANSWERS, NUM_ACTIONS, STATUS_OK
from bridge import mock_rules
from llm_sidecar.models import log, resolve_model


@dataclass
class BackendAnswers:
    probs: np.ndarray  # float32 [n, 6]
    action: np.ndarray  # int8 [n], -1 on a parse error
    confidence: np.ndarray  # float32 [n]
    status: np.ndarray  # int8 [n]
    reasons: list[bytes]
    prompt_tokens: int = 0  # tokens run through the model for these prompts
    # Generate and reasoned answers: whether each one's text read as an answer (generate: the `ACTION | confidence`
    # line; reasoned: the thought's decision step). A counter only: the decision is the scored distribution.
    text_ok: np.ndarray | None = None  # bool [n]
    generated_tokens: int = 0  # tokens generated for these answers (the mock: words)


REASON_BYTES = 480  # the UTF-8 reason kept per generated or reasoned answer (the bridge keeps 512)


def reason_bytes(text: str) -> bytes:
    """At most REASON_BYTES of UTF-8, cut at a character boundary (the model may write non-ASCII text)."""
    return text.encode()[:REASON_BYTES].decode("utf-8", "ignore").encode()


def scored_reason(probs: np.ndarray, text: str) -> bytes:
    """The reason of a scored answer after generated text: the decision, then the text on one line."""
    action = int(np.argmax(probs))
    return reason_bytes(f"{ACTIONS[action]} {probs[action]:.2f}; " + " ".join(text.split()))


def answers_from_text(texts: list[str], prompt_tokens: int = 0) -> BackendAnswers:
    """Parses generated `ACTION | confidence | reason` lines into answers (parse errors keep their reason)."""
    n = len(texts)
    out = BackendAnswers(
        probs=np.full((n, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32),
        action=np.full(n, -1, dtype=np.int8),
        confidence=np.zeros(n, dtype=np.float32),
        status=np.empty(n, dtype=np.int8),
        reasons=[],
        prompt_tokens=prompt_tokens,
    )
    for i, text in enumerate(texts):
        parsed = parse_answer(text)
        out.status[i] = parsed.status
        out.reasons.append(parsed.reason.encode("utf-8", errors="replace"))
        if parsed.status == STATUS_OK:
            out.action[i], out.confidence[i] = parsed.action, parsed.confidence
            out.probs[i] = answer_probabilities(parsed.action, parsed.confidence)
    return out


# ---- mock ------------------------------------------------------------------------------------------------

_NUMBER = r"([-+]?\d+(?:\.\d+)?)"


def _read(pattern: str, text: str) -> float:
    """The number after `pattern`, or NaN (the rules then take their default)."""
    match = re.search(pattern, text, re.I)
    return float(match.group(1)) if match else np.nan


def _side_and_sentiment(context: str) -> tuple[int, int]:
    """The position side a prompt states (1 long, -1 short, 0 flat) and its headline's sentiment (the words after
    "News:")."""
    market, _, headline = context.partition("News:")
    position = re.search(r"\b(long|short)\s*\d", market, re.I)
    side = 0 if position is None else 1 if position.group(1).lower() == "long" else -1
    return side, mock_rules.sentiment(headline)


@dataclass
class MockOptions:
    """The mock backend's settings (the sidecar's flags are generated from them): what it answers, and the faults
    tests inject."""

    # rules: read the prompt (indicators, position, headline); news: trade the headline alone (HOLD without news);
    # news_pass: the same, PASS (no view) without news; random: ignore it
    answers: str = "rules"
    latency_s: float = 0.0  # sleep per prompt
    garbage_rate: float = 0.0  # fraction of unparseable answers
    crash_after: int | None = None  # exit with code 70 after this many prompts


class MockBackend:
    """A deterministic rule-based advisor that reads the rendered prompt text and answers in the text
    protocol, so rendering, transport and parsing are all exercised without a model (hybrid.mock.reads=text; by
    default the trainer applies the same rules, llm_sidecar.mock_rules, to the prompt fields in its own process).

    Rules: flat → trend following when ADX > 25 (direction from VWAP distance and momentum), mean reversion
    on RSI extremes, headline sentiment words tilt the call; in a position → ENABLE_TRAIL in a strong trend
    with profit, MOVE_TO_BE with profit, DISABLE_TRAIL when the trend fades, else HOLD.
    With `answers="news"` it trades the headline alone: flat → BUY on bullish news, SELL on bearish (confidence
    0.8), HOLD otherwise: an advisor whose information the prices show only slowly (synthetic:headlines).
    With `answers="news_pass"` it is the same advisor, but says PASS (no view) instead of HOLD when flat without
    news: an advisor that knows when it knows nothing, so the agent acts alone there (synthetic:headlines_then_trend).
    With `answers="random"` it ignores the prompt and names a random action with a random confidence (seeded by
    the prompt's hash, so runs stay reproducible): an advisor with no information, for checking that the
    learned trust learns to ignore it.
    (The shuffled control of any advisor asks it about other bars: hybrid.shuffled.)
    Fault injection for tests: `latency_s` per prompt, a `garbage_rate` of unparseable answers (chosen by
    prompt hash, so deterministic) and `crash_after` prompts (the process exits with code 70).
    """

    name = "mock"

    def __init__(self, **options):
        o = MockOptions(**options)
        if o.answers not in MOCK_ANSWERS:
            raise ValueError(f"mock answers must be one of {MOCK_ANSWERS}, got {o.answers!r}")
        self.latency_s, self.garbage_rate, self.crash_after, self.answers = (o.latency_s, o.garbage_rate,
                                                                             o.crash_after, o.answers)
        self.answered = 0

    def advise_text(self, context: str) -> str:
        """The rules (llm_sidecar.mock_rules) applied to the numbers the prompt's text shows."""
        side, sentiment = _side_and_sentiment(context)
        adx, rsi = _read(r"\bADX\s*" + _NUMBER, context), _read(r"\bRSI\s*" + _NUMBER, context)
        action, confidence, rule = mock_rules.decide(
            self.answers, side, sentiment, rsi, adx, _read(r"\bVWAP\s*" + _NUMBER, context),
            _read(r"\bmom(?:entum)?\s*" + _NUMBER, context), _read(r"\b(?:uPnL|PnL|P&L)\s*" + _NUMBER, context))
        return mock_rules.line(int(action), float(confidence), mock_rules.reason(int(rule), side, adx, rsi))

    def _one_line(self, context: str) -> tuple[str, str]:
        """(the answer as the mock writes it, the answer without injected garbage) for one prompt."""
        if self.crash_after is not None and self.answered >= self.crash_after:
            log(f"mock: injected crash after {self.answered} prompts")
            os._exit(70)
        self.answered += 1
        if self.answers == "random":
            clean = mock_rules.line(*mock_rules.coin(context.encode()), "a coin flip")
        else:
            clean = self.advise_text(context)
        garbage = int.from_bytes(mock_rules.prompt_digest(context.encode()), "little") / 2**64 < self.garbage_rate
        return ("lorem ipsum dolor sit amet" if garbage else clean), clean

    def advise(self, contexts: list[str]) -> BackendAnswers:
        texts = [self._one_line(context)[0] for context in contexts]
        if self.latency_s:
            time.sleep(self.latency_s * len(contexts))
        return answers_from_text(texts)

    def reason(self, contexts: list[str], steps: tuple[str, ...]) -> tuple[list[str], BackendAnswers]:
        """The mock's reason-then-score: a thought per prompt in `steps`, its last step the one-line answer (left
        unreadable where garbage is injected), and a decision that never fails: the distribution of the answer
        without garbage (the mock's stand-in for scoring the labels after the thought). Its answer mode, crashes
        and latency apply; a thought waits twice the latency (thinking costs more than answering)."""
        thoughts, decisions = [], []
        for context in contexts:
            text, clean = self._one_line(context)
            thoughts.append(_mock_thought(context, text if text == clean else "undecided", steps))
            decisions.append(clean)
        if self.latency_s:
            time.sleep(2 * self.latency_s * len(contexts))
        answers = answers_from_text(decisions)
        answers.generated_tokens = sum(len(thought.split()) for thought in thoughts)
        return thoughts, answers


# What the mock's thoughts quote from the rendered context (configs/prompts.yaml's compact form).
_INDICATOR = re.compile(r"\b(ADX|RSI|VWAP|mom)\s*([-+]?\d+(?:\.\d+)?%?)")
_POSITION = re.compile(r"\b(long \d+|short \d+|flat)\b")
_PNL = re.compile(r"\b(?:pnl|P&L)\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)


def _mock_thought(context: str, decision: str, steps: tuple[str, ...]) -> str:
    """A thought in `steps` that quotes the context's indicators, position and P&L and ends in `decision`."""
    market = context.partition("News:")[0]  # the position and P&L are read before any headline
    indicators = ", ".join(f"{name} {value}" for name, value in _INDICATOR.findall(market))
    position, pnl = _POSITION.search(market), _PNL.search(market)
    notes = [
        f"read {indicators or 'no indicators'}.",
        "BUY, SELL or HOLD when flat; MOVE_TO_BE, ENABLE_TRAIL or DISABLE_TRAIL with a position.",
        f"position {position[1] if position else 'unknown'}, P&L {pnl[1] if pnl else 'unknown'}.",
    ]
    notes += ["nothing to add."] * (len(steps) - 1 - len(notes))  # steps beyond the three the mock knows
    lines = [f"{n}. {step.capitalize()}: {note}" for n, (step, note) in enumerate(zip(steps[:-1], notes), 1)]
    lines.append(f"{len(steps)}. {steps[-1].capitalize()}: {decision}")
    return "\n".join(lines)


# ---- transformers -------------------------------------------------------------------------------------

_SENTINEL = "\x1f@@CONTEXT@@\x1f"


# The option sets of the backends' option fields that take one of a few values (the sidecar's flags offer them).
OPTION_CHOICES = {
    "answers": MOCK_ANSWERS,  # MockOptions
    "mode": ("score", "generate"),
    "dtype": ("auto", "float32", "float16", "bfloat16"),
    "quantize": ("none", "int8", "int4"),
    "score_tokens": ("first", "full"),
}


@dataclass
class TransformersOptions:
    model: str = "smollm2"  # 'smollm2' (embedded), a local directory or a hub id
    # 'score': one forward pass, the action labels' scores after the answer prefix. 'generate': free text (up to
    # max_new_tokens), then the labels scored after it and the answer prefix (reason_then_score): the text is the
    # answer's reason, the decision never depends on a small model following a text format.
    mode: str = "score"
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16 (auto: bfloat16 on CUDA, float32 on CPU)
    quantize: str = "none"  # none | int8 | int4 (bitsandbytes)
    lora: str | None = None  # a peft adapter directory
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    temperature: float = 1.0  # score mode: softmax temperature over the action scores
    max_new_tokens: int = 24  # generate mode: the free text's token budget
    sample: bool = False  # generate mode and thoughts: sample instead of greedy decoding
    prefix_cache: bool = True  # score mode: compute the shared system prefix once
    # Score mode: how each action's label (`action_labels`, bridge.ACTIONS order) is scored after the answer prefix.
    #   'first': one forward pass; each action's score is the next-token logit of its label's first token, and
    #            the 6 scores go through one softmax. Needs labels whose first tokens differ. Exact when every
    #            label is one token; for multi-token labels the first token stands for the whole label.
    #   'full':  the length-normalised log-likelihood of every token of each label (one extra cached forward
    #            pass per multi-token label): the slow, exact-for-multi-token path.
    score_tokens: str = "first"
    action_labels: tuple[str, ...] = DEFAULT_ACTION_LABELS  # score mode: the 6 action names the system prompt uses
    micro_batch: int = 64  # score mode: at most this many prompts per forward pass (length-sorted sub-batches)


def quantization_config(quantize: str, compute_dtype):
    """The BitsAndBytesConfig for 'int8' / 'int4' (NF4, double quantisation), or None for 'none'."""
    from transformers import BitsAndBytesConfig

    if quantize == "none":
        return None
    if quantize == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantize == "int4":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )  # fmt: skip
    raise ValueError(f"quantize must be none, int8 or int4, got {quantize!r}")


class TransformersBackend:
    """A causal LM advising through score mode (default) or generate mode; both answer with the action labels'
    scores, generate mode after free text (reason_then_score, which llm_sidecar.reasoning's thoughts use too)."""

    name = "transformers"

    def __init__(self, options: TransformersOptions, system: str, answer_prefix: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if options.mode not in OPTION_CHOICES["mode"]:
            raise ValueError(f"mode must be score or generate, got {options.mode!r}")
        self.torch = torch
        self.options = options
        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        dtype_name = options.dtype
        if dtype_name == "auto":
            dtype_name = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype_name not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {options.dtype!r}")
        dtype = getattr(torch, dtype_name)
        path = resolve_model(options.model)
        t0 = time.perf_counter()
        log(f"loading tokenizer from {path}")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        log(f"loading model ({dtype_name}, quantize={options.quantize}, device={self.device})")
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=dtype,
            quantization_config=quantization_config(options.quantize, dtype),
            device_map={"": str(self.device)},
        )
        if options.lora:
            from peft import PeftModel

            log(f"applying LoRA adapter {options.lora}")
            model = PeftModel.from_pretrained(model, options.lora)
        self.model = model.eval()
        self.use_adapter = True  # False: answer with the base model (a LoRA model's `disable_adapter`)
        log(f"model ready in {time.perf_counter() - t0:.1f} s")

        # Prompt = prefix (chat template up to the user's text, system prompt included: shared by all)
        #        + context + suffix (end of the user turn, start of the assistant's) [+ answer prefix].
        self.prefix_text, self.suffix_text = self._split_chat_template(system)
        self.answer_prefix = answer_prefix
        self.prefix_ids = self.prefix_token_ids(self.prefix_text)
        self._setup_action_labels(system)
        # Generated text ends at the model's end-of-sequence token(s); the labels are then scored after the cue.
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.stop_token_ids = sorted({*eos, self.tokenizer.eos_token_id} - {None})
        self.answer_cue_ids = self.tokenizer("\n" + answer_prefix, add_special_tokens=False).input_ids
        self._prefix_cache = None
        self.refresh_prefix_cache()

    def prefix_token_ids(self, prefix_text: str) -> list[int]:
        """A chat prefix's token ids, with the tokenizer's BOS unless the chat template wrote it already."""
        bos = self.tokenizer.bos_token
        return self.tokenizer(prefix_text, add_special_tokens=not (bos and prefix_text.startswith(bos))).input_ids

    def _setup_action_labels(self, system: str) -> None:
        """Token ids of each action's label as it follows the answer prefix (" " + label)."""
        options = self.options
        labels = tuple(options.action_labels)
        if len(labels) != NUM_ACTIONS or len(set(labels)) != NUM_ACTIONS:
            raise ValueError(f"action_labels must be {NUM_ACTIONS} distinct labels in the order {list(ACTIONS)}, "
                             f"got {list(labels)}")
        if options.score_tokens not in OPTION_CHOICES["score_tokens"]:
            raise ValueError(f"score_tokens must be first or full, got {options.score_tokens!r}")
        self.action_labels = labels
        self.action_ids = [self.tokenizer(" " + a, add_special_tokens=False).input_ids for a in labels]
        missing = [a for a in labels if not re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", system)]
        if missing:  # the model can only pick a label it was told about
            raise ValueError(f"action label(s) {missing} do not appear in the system prompt; list them "
                             f"there or set action_labels (--action-labels) to the names the prompt uses")
        if options.score_tokens == "first":
            firsts = [ids[0] for ids in self.action_ids]
            if len(set(firsts)) != NUM_ACTIONS:
                clash = {self.tokenizer.decode([t]): [a for a, f in zip(labels, firsts) if f == t] for t in firsts
                         if firsts.count(t) > 1}  # fmt: skip
                raise ValueError(f"score_tokens='first' needs action labels whose first tokens differ; {clash} share "
                                 f"one. Choose other labels or use score_tokens='full'")
        self.first_token_ids = [ids[0] for ids in self.action_ids]
        self.single_token_labels = all(len(ids) == 1 for ids in self.action_ids)

    def _split_chat_template(self, system: str) -> tuple[str, str]:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return f"{system}\n\n", "\n"
        try:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": _SENTINEL}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # templates without a system role: the system text opens the user turn
            messages = [{"role": "user", "content": f"{system}\n\n{_SENTINEL}"}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prefix, suffix = text.split(_SENTINEL)
        return prefix, suffix

    def advise(self, contexts: list[str]) -> BackendAnswers:
        with self.torch.inference_mode(), self.adapter_scope():
            if self.options.mode == "score":
                return self._score(contexts)
            return self._generate(contexts)

    def adapter_scope(self):
        """A context in which the model answers as configured: with its LoRA adapter, or as the base model."""
        if self.use_adapter or not hasattr(self.model, "disable_adapter"):
            return contextlib.nullcontext()
        return self.model.disable_adapter()

    def action_scores(self, contexts: list[str]):
        """[n, 6] score-mode action scores over temperature (log-softmax them for log-probabilities): the
        computation `advise` answers with, in one micro-batch, under the caller's autograd mode and with the
        system prefix recomputed for the weights (and adapter) active now. For LoRA learning."""
        if self.options.score_tokens != "first":
            raise ValueError("LoRA learning needs the transformers backend with score_tokens='first'")
        texts = [c + self.suffix_text + self.answer_prefix for c in contexts]
        if self._prefix_cache is None:
            texts = [self.prefix_text + t for t in texts]
        tokens = self.tokenizer(texts, add_special_tokens=False).input_ids
        cache = None if self._prefix_cache is None else self.fresh_prefix_cache()
        return self._score_tokens(tokens, cache) / self.options.temperature

    def _left_padded(self, token_lists: list[list[int]]):
        torch = self.torch
        width = max(len(t) for t in token_lists)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(token_lists), width), pad, dtype=torch.long)
        mask = torch.zeros((len(token_lists), width), dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            ids[row, width - len(tokens) :] = torch.tensor(tokens)
            mask[row, width - len(tokens) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _micro_batches(self, lengths: list[int]) -> list[list[int]]:
        """Splits prompt indices into length-sorted groups of at most `micro_batch`, so little compute goes to
        padding; a group also ends where the next prompt is longer than its shortest by more than 1/8."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        groups, group = [], []
        limit = max(1, self.options.micro_batch)
        for i in order:
            if group and (len(group) >= limit or (len(group) >= 8 and lengths[i] > lengths[group[0]] * 9 / 8)):
                groups.append(group)
                group = []
            group.append(i)
        if group:
            groups.append(group)
        return groups

    def _score(self, contexts: list[str]) -> BackendAnswers:
        """Softmax over the 6 action scores (see TransformersOptions.score_tokens), in length-sorted micro-batches."""
        torch = self.torch
        texts = [c + self.suffix_text + self.answer_prefix for c in contexts]
        if self._prefix_cache is None:
            texts = [self.prefix_text + t for t in texts]
        tokens = self.tokenizer(texts, add_special_tokens=False).input_ids
        batch = len(texts)
        scores = torch.empty((batch, NUM_ACTIONS), dtype=torch.float32)
        for group in self._micro_batches([len(t) for t in tokens]):
            scores[group] = self._score_tokens([tokens[i] for i in group]).cpu()
        probs = torch.softmax(scores / self.options.temperature, dim=-1).numpy().astype(np.float32)
        action = probs.argmax(axis=1)
        reasons = [b"score %s %.2f" % (ACTIONS[i].encode(), p) for i, p in zip(action, probs.max(axis=1))]
        return BackendAnswers(
            probs=probs,
            action=action.astype(np.int8),
            confidence=probs.max(axis=1).astype(np.float32),
            status=np.full(batch, STATUS_OK, dtype=np.int8),
            reasons=reasons,
            prompt_tokens=sum(len(t) for t in tokens),
        )

    def refresh_prefix_cache(self) -> None:
        """Recomputes the system prefix's key/value cache (after the weights changed: LoRA learning)."""
        if self.options.mode == "score" and self.options.prefix_cache:
            with self.torch.inference_mode(), self.adapter_scope():
                ids = self.torch.tensor([self.prefix_ids], device=self.device)
                self._prefix_cache = self.model(input_ids=ids, use_cache=True).past_key_values

    def fresh_prefix_cache(self):
        """A one-row system-prefix cache for the weights active now, under the caller's autograd mode."""
        ids = self.torch.tensor([self.prefix_ids], device=self.device)
        return self.model(input_ids=ids, use_cache=True).past_key_values

    def _shared_prefix_cache(self, batch: int, cache=None):
        """The system prefix's key/value cache for `batch` rows. The rows are broadcast views of the one cached
        row (the first forward pass concatenates new keys onto them, which copies once, as it must). `cache`:
        a one-row cache to expand in place instead of a copy of the stored one."""
        cache = copy.deepcopy(self._prefix_cache) if cache is None else cache
        layers = getattr(cache, "layers", None)
        if layers and all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
            for layer in layers:
                layer.keys = layer.keys.expand(batch, *layer.keys.shape[1:])
                layer.values = layer.values.expand(batch, *layer.values.shape[1:])
        else:
            cache.batch_repeat_interleave(batch)
        return cache

    def _score_tokens(self, token_lists: list[list[int]], prefix_cache=None):
        """[batch, 6] action scores for one micro-batch of tokenised prompts (each ending in the answer prefix).
        `prefix_cache`: a one-row system-prefix cache to use instead of the stored one."""
        torch = self.torch
        batch = len(token_lists)
        if self._prefix_cache is None:
            prefix_len, cache = 0, None
        else:
            prefix_len, cache = len(self.prefix_ids), self._shared_prefix_cache(batch, prefix_cache)
        ids, mask = self._left_padded(token_lists)
        # Padding sits between the shared prefix and each context; positions skip it.
        full_mask = torch.cat([torch.ones((batch, prefix_len), dtype=mask.dtype, device=self.device), mask], dim=1)
        positions = (prefix_len + mask.cumsum(dim=1) - 1).clamp(min=0)
        return self._label_scores(ids, full_mask, positions, cache)

    def _label_scores(self, ids, attention_mask, positions, cache):
        """[batch, 6] action scores (TransformersOptions.score_tokens) at the end of `ids`, which follow `cache`
        (None: nothing) and end in the answer prefix. `attention_mask` covers the cache and `ids`. The one label
        scoring of score mode, generate mode and reasoned answers."""
        torch = self.torch
        batch = ids.shape[0]
        full = self.options.score_tokens == "full" and not self.single_token_labels
        out = self.model(input_ids=ids, attention_mask=attention_mask, position_ids=positions, past_key_values=cache,
                         use_cache=full or cache is not None, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        if not full:  # one softmax over the 6 first-token logits: the log-normaliser cancels
            return logits[:, self.first_token_ids]
        cache = out.past_key_values
        first = torch.log_softmax(logits, dim=-1)
        last_position = positions[:, -1:]
        scores = torch.empty((batch, NUM_ACTIONS), device=self.device)
        for a, tokens in enumerate(self.action_ids):
            total = first[:, tokens[0]].clone()
            if len(tokens) > 1:  # feed the action's tokens but its last, score its tokens after the first
                rest = torch.tensor(tokens, device=self.device)
                steps = len(tokens) - 1
                step_mask = torch.cat([attention_mask, torch.ones((batch, steps), dtype=attention_mask.dtype,
                                                                  device=self.device)], 1)
                step_positions = last_position + 1 + torch.arange(steps, device=self.device)
                step = self.model(input_ids=rest[:-1].expand(batch, steps), attention_mask=step_mask,
                                  position_ids=step_positions, past_key_values=cache, use_cache=True,
                                  logits_to_keep=steps)
                logp = torch.log_softmax(step.logits.float(), dim=-1)
                total += logp.gather(2, rest[1:].expand(batch, steps).unsqueeze(-1)).squeeze(-1).sum(dim=1)
                cache.crop(-steps)  # back to the prompt for the next action
            scores[:, a] = total / len(tokens)
        return scores

    def reason_then_score(self, prefix_text: str, suffix_text: str, contexts: list[str], max_new_tokens: int,
                          max_time_s: float | None = None) -> tuple[BackendAnswers, list[str], np.ndarray]:
        """Generates text after each prompt (prefix + context + suffix) in one batched generation, then scores the
        action labels after the text and the answer cue ("\\n" + answer prefix) in one forward pass that reuses
        the generation's key/value cache. The prefix (the system prompt, shared by every row) runs once, for the
        weights active now, and the batch's rows start from broadcast views of its cache, as in score mode.
        Returns the answers (status ok, reasons unset, `text_ok` unset), the texts, each up to its first
        end-of-sequence token, and which texts ended there (bool [n]; the others a budget cut).

        Budgets: `max_new_tokens` per prompt and `max_time_s` for the whole batch (transformers' MaxTimeCriteria);
        a text cut by either is scored on what it has. Rows that ended early hold padding after their end; it is
        masked out of the scoring pass, whose positions continue each row's own text, so each row's scores equal
        scoring prompt + text + cue from scratch."""
        torch = self.torch
        batch = len(contexts)
        prefix = torch.tensor([self.prefix_token_ids(prefix_text)], device=self.device)
        prefix_cache = self._shared_prefix_cache(batch, self.model(input_ids=prefix, use_cache=True).past_key_values)
        tokens = self.tokenizer([c + suffix_text for c in contexts], add_special_tokens=False).input_ids
        ids, mask = self._left_padded(tokens)  # padding sits between the prefix and each context, masked
        ids = torch.cat([prefix.expand(batch, -1), ids], dim=1)
        mask = torch.cat([torch.ones((batch, prefix.shape[1]), dtype=mask.dtype, device=self.device), mask], dim=1)
        sample = self.options.sample
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, past_key_values=prefix_cache, max_new_tokens=max_new_tokens,
            max_time=max_time_s,
            do_sample=sample, pad_token_id=self.tokenizer.pad_token_id, return_dict_in_generate=True,
            # Greedy: unset the model's sampling defaults, which generate() would otherwise warn about.
            **({} if sample else {"temperature": None, "top_p": None, "top_k": None}),
        )  # fmt: skip
        new = out.sequences[:, ids.shape[1] :]
        ended = torch.isin(new, torch.tensor(self.stop_token_ids, device=new.device))
        text_mask = (ended.long().cumsum(dim=1) == 0).long()  # the text: every token before its row's first end
        cue = torch.tensor(self.answer_cue_ids, device=self.device).expand(len(contexts), -1)
        # The cache holds all but the last generated token: feed it (masked where the row had ended) and the cue.
        full_mask = torch.cat([mask, text_mask, torch.ones_like(cue)], dim=1)
        step_ids = torch.cat([new[:, -1:], cue], dim=1)
        positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
        scores = self._label_scores(step_ids, full_mask, positions, out.past_key_values)
        texts = self.tokenizer.batch_decode(new * text_mask + self.tokenizer.pad_token_id * (1 - text_mask),
                                            skip_special_tokens=True)
        probs = torch.softmax(scores.float() / self.options.temperature, dim=-1).cpu().numpy().astype(np.float32)
        answers = BackendAnswers(
            probs=probs, action=probs.argmax(axis=1).astype(np.int8), confidence=probs.max(axis=1),
            status=np.full(batch, STATUS_OK, dtype=np.int8), reasons=[b""] * batch,
            prompt_tokens=int(mask[:, prefix.shape[1] :].sum()),  # as score mode counts: the shared prefix aside
            generated_tokens=int(text_mask.sum()),
        )  # fmt: skip
        return answers, texts, ended.any(dim=1).cpu().numpy()

    def _generate(self, contexts: list[str]) -> BackendAnswers:
        """Generate mode: free text per prompt, then the labels scored after it (reason_then_score). The text is the
        answer's reason; whether it also read as an `ACTION | confidence | reason` line is `text_ok`."""
        answers, texts, _ = self.reason_then_score(self.prefix_text, self.suffix_text, contexts,
                                                self.options.max_new_tokens)
        answers.reasons = [scored_reason(p, text) for p, text in zip(answers.probs, texts)]
        answers.text_ok = np.array([parse_answer(text).status == STATUS_OK for text in texts])
        return answers
