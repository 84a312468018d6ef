"""LoRA learning from outcomes, inside the sidecar (docs/advisor-learning.md).

For each answered query the trainer sends the market's move after it (bridge.transport.OUTCOME_FIELDS; the
learner reads the answer's submission seq and row, and the move over the next `move_bars` bars in ATRs, NaN when
unknown).
`PromptMemory` remembers each recent submission's prompts and answers so those rows become `Experience`s in a
bounded `ExperienceBuffer` that holds a share of prompts out for validation.

`LoraLearner` trains a second LoRA adapter ("learning") on the score head, the 6-way softmax the advisor
answers with, while the "default" adapter keeps answering: answers never come from half-trained weights.
The loss of an example is -w·log p(BUY) where the market rose after the answer and -w·log p(SELL) where it fell,
w = |move| over the training share's RMS move, clipped. Every answered prompt with a known move counts, whatever
the agent then did: the move says which way the market went, which the advice's own trades (stopped out or
taken at their target within a few bars) say too weakly to learn the news from (docs/findings.md).
Plus kl_coef · KL(base ‖ adapted) so the answers do not collapse. Adam, gradient clipping, and early stopping
on the validation share: after each epoch the held-out loss decides whether to go on, and the best epoch's
weights are the ones copied into "default" at the round's end, only if the held-out loss improved.

A round runs as a generator, one minibatch per `step()`, so the server answers prompts between steps.
What it computes once: the base model's log-probabilities of a prompt (an answer the base model gave holds them:
answers before any adopted round, or with adapters off), and the held-out figures of the weights it adopts (those
of their epoch).

Reasoned answers (llm_sidecar.reasoning: a thought, then the labels scored after it) join outcomes like any other:
their decision is always a distribution, even when the thought's steps are unreadable, and the experience holds
the prompt alone. The learner trains the score head on the prompt, the one that answers every unreasoned query;
the thought is context for its own answer only (it is sampled text the next query would not reproduce), and the
adapter the round adopts also scores the labels after every later thought.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bridge.learning import LearningOptions, direction_accuracy, move_targets_of, move_weights_of, rms_move
from llm_sidecar.models import log

EXPERIENCES_FILE = "experiences.jsonl.gz"  # saved beside each adapter
TRAINING_ADAPTER = "learning"
SERVING_ADAPTER = "default"


@dataclass
class Experience:
    prompt: str
    advice: np.ndarray  # float32 [6]: the answer's probabilities when it was given
    move: float  # the market's move over the following bars, in ATRs; NaN if unknown
    from_base: bool = False  # the base model gave the answer (its score head): `advice` is the base's distribution

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "advice": [round(float(p), 6) for p in self.advice],
                "move": self.move if np.isfinite(self.move) else None}

    @classmethod
    def from_json(cls, row: dict) -> "Experience":
        """Also reads files saved by earlier versions (their other columns are ignored; rows without a move
        cannot be learned from)."""
        move = row.get("move")
        return cls(row["prompt"], np.asarray(row["advice"], np.float32), float("nan") if move is None else float(move))


class PromptMemory:
    """The prompts and answer probabilities of the last `capacity` submissions, by seq, to join outcomes to."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self.entries: OrderedDict[int, tuple[list[str], np.ndarray, np.ndarray]] = OrderedDict()

    def remember(self, seq: int, prompts: list[str], probs: np.ndarray, from_base=False) -> None:
        """`from_base` (bool or bool [n]): which rows' answers are the base model's score head (the learner's
        `answers_are_base`, and not a reasoned answer)."""
        self.entries[seq] = (prompts, probs, np.broadcast_to(np.asarray(from_base, bool), (len(prompts),)))
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def join(self, rows: dict[str, np.ndarray]) -> tuple[list[Experience], int]:
        """Experiences for the outcome rows whose submission is remembered; also how many were not."""
        out, unknown = [], 0
        for i in range(len(rows["seq"])):
            entry = self.entries.get(int(rows["seq"][i]))
            row = int(rows["row"][i])
            if entry is None or not 0 <= row < len(entry[0]) or not np.isfinite(entry[1][row]).all():
                unknown += 1
                continue
            out.append(Experience(entry[0][row], entry[1][row], float(rows["move"][i]), bool(entry[2][row])))
        return out, unknown


ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")


def attention_projections(model) -> list[str] | str:
    """The attention projections' module names (Llama/SmolLM2: q,k,v,o_proj; Phi-3: qkv_proj, o_proj): LoRA's
    usual targets. Models that name them otherwise get every linear layer but the output head."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    found = sorted(names & set(ATTENTION_PROJECTIONS))
    return found or "all-linear"


def held_out(prompt: str, share: float) -> bool:
    """A fixed split by prompt hash: the same prompt is always on the same side."""
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "little") / 2**64 < share


class ExperienceBuffer:
    def __init__(self, capacity: int, val_share: float):
        self.val_share = val_share
        self.val: deque[Experience] = deque(maxlen=max(1, round(capacity * val_share)))
        self.train: deque[Experience] = deque(maxlen=max(1, capacity - self.val.maxlen))
        self.added = 0

    def add(self, experiences: list[Experience]) -> None:
        for e in experiences:
            (self.val if held_out(e.prompt, self.val_share) else self.train).append(e)
        self.added += len(experiences)

    def sizes(self) -> dict[str, int]:
        return {"buffer_train": len(self.train), "buffer_val": len(self.val), "experiences_added": self.added}


def load_experiences(adapter_dir: str | Path) -> tuple[list[Experience], list[Experience]]:
    """The (training, held-out) experiences saved beside an adapter by `LoraLearner.save`."""
    train, val = [], []
    with gzip.open(Path(adapter_dir) / EXPERIENCES_FILE, "rt") as f:
        for line in f:
            row = json.loads(line)
            (val if row["held_out"] else train).append(Experience.from_json(row))
    return train, val


def move_weights(options: LearningOptions, train: list[Experience]) -> Callable[[list[Experience]], np.ndarray]:
    """Per-example weights w (loss -w·log p(target)): |move| over the round's training share's RMS move, clipped;
    applied alike to its validation share."""
    rms = rms_move([e.move for e in train])
    return lambda examples: move_weights_of([e.move for e in examples], rms, options.move_clip)


def move_targets(examples: list[Experience]) -> np.ndarray:
    """The action each example's weight applies to: BUY where the market rose, SELL where it fell."""
    return move_targets_of([e.move for e in examples])


def usable(experience: Experience) -> bool:
    """Whether the learner can learn from `experience`: its move is known."""
    return bool(np.isfinite(experience.move))


class LoraLearner:
    """Adds a trainable LoRA adapter beside the serving one and trains it in rounds (see the module doc)."""

    def __init__(self, backend, options: LearningOptions, seed: int = 0):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training

        self.torch = torch
        self.backend = backend
        self.options = options
        self.rng = np.random.default_rng(seed)
        model = backend.model
        self.adapter_is_base = not isinstance(model, PeftModel)  # the serving adapter is new: its B matrices are 0
        if not isinstance(model, PeftModel):
            if backend.options.quantize != "none":  # QLoRA: a 4/8-bit base with float LoRA weights
                model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            # A new adapter's B matrices start at zero: until a round succeeds, answers are the base model's.
            config = LoraConfig(r=options.rank, lora_alpha=options.alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                                target_modules=attention_projections(model))
            model = get_peft_model(model, config)
        model.add_adapter(TRAINING_ADAPTER, model.peft_config[SERVING_ADAPTER])
        model.set_adapter(SERVING_ADAPTER)
        backend.model = model.eval()
        self.model = model
        self.pairs = self._adapter_pairs()
        self._copy(to_training=True)
        backend.refresh_prefix_cache()
        self.buffer = ExperienceBuffer(options.buffer_size, options.val_share)
        self.memory = PromptMemory()
        self.version = 0  # bumps when the serving adapter changes (the server then clears its answer cache)
        self.rounds: list[dict] = []
        self.learn_s = 0.0
        self.unknown_outcomes = 0
        self._work: Iterator[None] | None = None
        self._base_logp: dict[str, np.ndarray] = {}
        self._last_started = -1

    @property
    def answers_are_base(self) -> bool:
        """Whether the answers given now are the base model's: adapters off, or a serving adapter no round has
        changed."""
        return not self.backend.use_adapter or self.adapter_is_base

    def adapter_loaded(self, path: str | None) -> None:
        """The server loaded the adapter at `path` into the serving one (None: answers from the base model)."""
        if path is not None:
            self.adapter_is_base = False

    # ---- experience -----------------------------------------------------------------------------------

    def add_outcomes(self, rows: dict[str, np.ndarray]) -> None:
        experiences, unknown = self.memory.join(rows)
        self.buffer.add([e for e in experiences if usable(e)])
        self.unknown_outcomes += unknown

    # ---- adapters --------------------------------------------------------------------------------------

    def _adapter_pairs(self) -> list[tuple]:
        """(serving parameter, training parameter) pairs of the two adapters."""
        params = dict(self.model.named_parameters())
        pairs = []
        for name, p in params.items():
            if f".{TRAINING_ADAPTER}." in name:
                pairs.append((params[name.replace(f".{TRAINING_ADAPTER}.", f".{SERVING_ADAPTER}.")], p))
        if not pairs:
            raise RuntimeError("LoRA learning found no adapter weights to train")
        return pairs

    def _copy(self, to_training: bool) -> None:
        with self.torch.no_grad():
            for serving, training in self.pairs:
                (training if to_training else serving).copy_(serving if to_training else training)

    def save(self, path: str | Path) -> str:
        """Writes the serving adapter as a peft adapter directory (loadable with --lora), with the experiences
        it learned from beside it (EXPERIENCES_FILE: one JSON object per line, `held_out` marks validation)."""
        self.model.save_pretrained(str(path), selected_adapters=[SERVING_ADAPTER])
        with gzip.open(Path(path) / EXPERIENCES_FILE, "wt") as f:
            for held, share in ((False, self.buffer.train), (True, self.buffer.val)):
                for e in share:
                    f.write(json.dumps({**e.to_json(), "held_out": held}) + "\n")
        return str(path)

    # ---- rounds ----------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._work is not None

    def start_round(self) -> dict:
        """Starts a learning round if none runs and the buffer holds enough; says why not otherwise."""
        o = self.options
        if self.busy:
            return {"started": False, "why": "a round is running"}
        if len(self.buffer.train) < o.min_examples or len(self.buffer.val) < 8:
            return {"started": False, "why": f"{len(self.buffer.train)} training / {len(self.buffer.val)} validation "
                                              f"examples; a round needs {o.min_examples} / 8"}
        self._work = self._round(list(self.buffer.train), list(self.buffer.val))
        return {"started": True}

    def step(self) -> None:
        """One unit of a running round's work (a learning step or a validation batch)."""
        if self._work is None:
            return
        t0 = time.perf_counter()
        try:
            next(self._work)
        except StopIteration:
            self._work = None
        finally:
            self.learn_s += time.perf_counter() - t0

    def finish(self) -> None:
        """Runs the current round to its end. The trainer waits on it (at the end of a run), so the round may
        use every core, not just the threads the sidecar was given to share the machine with JAX."""
        threads = self.torch.get_num_threads()
        self.torch.set_num_threads(max(threads, os.cpu_count() or 1))
        try:
            while self.busy:
                self.step()
        finally:
            self.torch.set_num_threads(threads)

    def _log_probs(self, prompts: list[str]):
        return self.torch.log_softmax(self.backend.action_scores(prompts).float(), dim=-1)

    def _adapter(self, name: str | None):
        """Makes adapter `name` active (None: the base model, all adapters off) for one batch of work."""
        if name is None:
            return self.model.disable_adapter()
        self.model.set_adapter(name)
        return contextlib.nullcontext()

    def _base_prepare(self, examples: list[Experience]) -> Iterator[None]:
        """Base-model log-probabilities (all adapters off) of prompts not yet seen, a batch per yield; an answer
        the base model gave already holds them."""
        for e in examples:
            if e.from_base and e.prompt not in self._base_logp and (e.advice > 0).all():
                self._base_logp[e.prompt] = np.log(e.advice)
        todo = list(dict.fromkeys(e.prompt for e in examples if e.prompt not in self._base_logp))
        for start in range(0, len(todo), self.options.batch_size):
            batch = todo[start : start + self.options.batch_size]
            with self.torch.no_grad(), self._adapter(None):
                for logp, prompt in zip(self._log_probs(batch).cpu().numpy(), batch):
                    self._base_logp[prompt] = logp
            yield None

    def _base(self, examples: list[Experience]):
        return self.torch.tensor(np.stack([self._base_logp[e.prompt] for e in examples]))

    def _objective(self, examples: list[Experience], actions: np.ndarray, weights: np.ndarray, logp):
        """(loss, KL to the base model) of a batch whose log-probabilities [n, 6] are `logp`."""
        torch = self.torch
        base = self._base(examples)
        actions = torch.tensor(actions)
        nll = -(torch.tensor(weights) * logp.gather(1, actions[:, None])[:, 0]).mean()
        kl = (base.exp() * (base - logp)).sum(-1).mean()
        return nll + self.options.kl_coef * kl, kl

    def _loss(self, examples: list[Experience], actions: np.ndarray, weights: np.ndarray):
        """(loss, KL, log-probabilities [n, 6]) of a batch under the active adapter."""
        logp = self._log_probs([e.prompt for e in examples]).cpu()
        return (*self._objective(examples, actions, weights, logp), logp)

    def _evaluate(self, examples: list[Experience], actions: np.ndarray, weights: np.ndarray,
                  adapter: str) -> Iterator[None]:
        """Loss, KL and top actions over `examples` under `adapter` (no gradients), a batch per yield; the
        result lands in self._result. The serving adapter is active again at every yield."""
        total = kl_total = 0.0
        tops = []
        bs = self.options.batch_size
        for start in range(0, len(examples), bs):
            batch = examples[start : start + bs]
            with self.torch.no_grad(), self._adapter(adapter):
                loss, kl, logp = self._loss(batch, actions[start : start + bs], weights[start : start + bs])
                tops.append(logp.argmax(-1).numpy())
            self.model.set_adapter(SERVING_ADAPTER)
            total += float(loss) * len(batch)
            kl_total += float(kl) * len(batch)
            yield None
        self._result = (total / len(examples), kl_total / len(examples), np.concatenate(tops))

    def _base_figures(self, examples: list[Experience], actions: np.ndarray, weights: np.ndarray) -> tuple:
        """What _evaluate gives for the base model, from the log-probabilities _base_prepare holds."""
        logp = self._base(examples)
        loss, kl = self._objective(examples, actions, weights, logp)
        return float(loss), float(kl), logp.argmax(-1).numpy()

    @staticmethod
    def direction_accuracy(examples: list[Experience], top_actions: np.ndarray) -> float:
        """Share of the examples whose top action is BUY or SELL (and whose move is known) where the market then
        moved that way."""
        return direction_accuracy([e.move for e in examples], top_actions)

    def _round(self, train: list[Experience], val: list[Experience]) -> Iterator[None]:
        torch, o = self.torch, self.options
        t0, learn_before = time.perf_counter(), self.learn_s
        weights = move_weights(o, train)
        w_train, w_val = weights(train), weights(val)
        a_train, a_val = move_targets(train), move_targets(val)
        yield from self._base_prepare(train + val)
        base_tops = self._base(val).argmax(-1).numpy()
        if self.adapter_is_base:
            best_result = self._base_figures(val, a_val, w_val)
        else:
            yield from self._evaluate(val, a_val, w_val, SERVING_ADAPTER)
            best_result = self._result
        val_before = best_loss = best_result[0]
        best_epoch, epochs, steps, train_loss = 0, 0, 0, float("nan")
        params = [p for _, p in self.pairs]
        best = [p.detach().clone() for p in params]
        optimizer = torch.optim.Adam(params, lr=o.lr)
        for epoch in range(1, o.max_epochs + 1):
            order = self.rng.permutation(len(train))
            losses = []
            for start in range(0, len(order), o.batch_size):
                idx = order[start : start + o.batch_size]
                self.model.set_adapter(TRAINING_ADAPTER)
                loss = self._loss([train[i] for i in idx], a_train[idx], w_train[idx])[0]
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
                optimizer.step()
                self.model.set_adapter(SERVING_ADAPTER)  # answers between steps come from the serving adapter
                losses.append(loss.item())
                steps += 1
                yield None
            train_loss, epochs = float(np.mean(losses)), epoch
            yield from self._evaluate(val, a_val, w_val, TRAINING_ADAPTER)
            val_loss = self._result[0]
            if val_loss < best_loss - 1e-4:
                best_loss, best_epoch, best_result = val_loss, epoch, self._result
                best = [p.detach().clone() for p in params]
            elif epoch - best_epoch > o.patience:
                break
        with torch.no_grad():
            for p, b in zip(params, best):
                p.copy_(b)
        if best_epoch:  # the held-out loss improved: the learned weights start answering
            self._copy(to_training=False)
            self.backend.refresh_prefix_cache()
            self.version += 1
            self.adapter_is_base = False
        # The serving adapter now holds the best epoch's weights, or those it had: their held-out figures are known.
        val_after, kl_after, tops_after = best_result
        record = {
            "round": len(self.rounds) + 1, "train_examples": len(train), "val_examples": len(val),
            "epochs": epochs, "best_epoch": best_epoch, "steps": steps, "adopted": bool(best_epoch),
            "train_loss": train_loss, "val_loss_before": val_before, "val_loss": val_after, "kl_to_base": kl_after,
            "direction_accuracy_base": self.direction_accuracy(val, base_tops),
            "direction_accuracy": self.direction_accuracy(val, tops_after), "learn_s": self.learn_s - learn_before,
            "wall_s": time.perf_counter() - t0,
        }  # fmt: skip
        self.rounds.append(record)
        log(f"LoRA round {record['round']}: {steps} steps, val loss {val_before:.4f} -> {val_after:.4f}, "
            f"KL {kl_after:.4f}, direction accuracy {record['direction_accuracy_base']:.3f} (base) -> "
            f"{record['direction_accuracy']:.3f}, {record['learn_s']:.1f} s learning")

    def stats(self) -> dict:
        return {"busy": self.busy, "rounds": self.rounds, "learn_s": self.learn_s, "version": self.version,
                "unknown_outcomes": self.unknown_outcomes, "options": asdict(self.options), **self.buffer.sizes()}
