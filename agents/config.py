"""Typed training configuration: dataclasses with defaults, strict YAML loading and `--set key=value` overrides.

A wrong key or a value of the wrong type fails with a `ConfigError` naming the dotted key (e.g. `ppo.lr`),
so a typo in a YAML file never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.evidence.gate import GATE_BARS
from bridge.field_comments import field_comments
from bridge.learning import LearningOptions
from bridge.protocol import MOCK_ANSWERS
from jaxenv.config import (
    INSTRUMENT_FORMS,
    DataConfig,
    EnvConfig,
    InstrumentSource,
    PropFirmRules,
    check_rules,
    resolve_data_config,
    resolve_instruments,
    rules_fields,
)

MOCK_READS = ("fields", "text")  # hybrid.mock.reads


class ConfigError(ValueError):
    """A bad configuration key or value; the message names the dotted key. Several independent errors found in one
    pass are one ConfigError: `errors` holds them in order, and the message is them one per line."""

    def __init__(self, *errors: str):
        self.errors = list(dict.fromkeys(str(e) for e in errors))  # each once, in order
        super().__init__("\n".join(self.errors))


@dataclass
class PPOConfig:
    num_steps: int = 64  # rollout length T per env per update
    update_epochs: int = 4  # passes over each rollout
    num_minibatches: int = 4  # minibatches per pass
    lr: float = 3e-4  # Adam step size
    anneal_lr: bool = True  # linear decay to 0 over the run
    gamma: float = 0.99  # discount per env step
    gae_lambda: float = 0.95  # GAE's λ
    clip_eps: float = 0.2  # PPO's ratio clip
    clip_value: bool = False  # PPO2-style clipped value loss
    vf_coef: float = 0.5  # weight of the value loss
    ent_coef: float = 0.01  # weight of the entropy bonus
    max_grad_norm: float = 0.5  # global gradient-norm clip
    normalize_obs: bool = True  # running mean/std of observations, stored with the checkpoint
    scale_rewards: bool = False  # divide rewards by the running std of the discounted return
    normalize_advantages: bool = True  # per minibatch


@dataclass
class NetworkConfig:
    actor_hidden: list[int] = field(default_factory=lambda: [256, 256])  # the policy MLP's hidden widths
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])  # the value MLP's hidden widths
    activation: str = "tanh"  # tanh | relu


@dataclass
class CheckpointConfig:
    every_updates: int = 20  # save the latest state every N updates (and at the end / on Ctrl-C)
    keep: int = 3  # keep the last K periodic checkpoints
    eval_every_updates: int = 20  # validation-split evaluation every M updates; the best is kept apart; 0 = off
    eval_deterministic: bool = True  # evaluate the greedy (argmax) action rather than a sample
    eval_episodes: int = 16  # for envs without a validation split: episodes of fresh envs to average


@dataclass
class LogConfig:
    progress: bool = True  # progress bar with ETA on stderr
    tensorboard: bool = True  # curves in RUN_DIR/tb
    frozen_kl: float = 1e-6  # warn when approx_kl stays below this ...
    frozen_updates: int = 5  # ... for this many consecutive updates
    min_entropy_frac: float = 0.05  # warn when entropy < this × log(num_actions)
    short_episode_frac: float = 0.1  # warn when episodes end at < this × the env's episode limit ...
    warmup_updates: int = 10  # ... or any of the above, only after this many updates


@dataclass
class QueryConfig:
    """How advice is keyed and asked for (agents.advice.table) and how long it lasts."""

    # k: bars per block of the advice keys (bar block, position side): the answer about block b is in force during
    # block b + 1 (training asks once per update; an evaluation walk every k bars)
    interval: int = 5
    decay: float = 0.8  # confidence × decay per interval of age
    max_age_intervals: int = 6  # where a block's answer is missing, an older block's holds up to this many intervals
    entries_only: bool = False  # ask only flat keys (entry decisions): for advisors with nothing to say in a trade
    # a flat env with no answer in force may not enter while the key it reads now is in flight: the policy cannot
    # otherwise tell that advice is on its way, and entering first leaves the answer nothing to decide
    wait_for_answer: bool = False
    # a trade entered with advice in force keeps its bracket to the end: the policy may not move its stop
    # (MOVE_TO_BE, ENABLE_TRAIL, DISABLE_TRAIL). An advisor asked about entries only has nothing to say inside the
    # trade; its advice was the entry with the bracket, which the advice alone holds
    keep_advised_bracket: bool = False
    # a flat env enters only where valid advice names that side: the policy may still decline advice, but not trade
    # on its own where its trades would take the place of the advised ones. Where the answer in force is PASS (no
    # view), the policy enters alone
    advised_entries_only: bool = False
    # which envs the rules above (and the veto's near-limit rule) bind to their advice (agents.advice.rules):
    # always | trust (while the env's running trust gate is above min_trust) | record (while the advice's calls, one
    # per key however many envs read it, have earned on paper by a sequential test over sessions:
    # agents.advice.record). A gate drifts down where the rules already bind, so binding on trust undoes the rules
    # (docs/findings.md)
    bind_on: str = "record"
    min_trust: float = 0.05  # bind_on=trust: bound while the env's running trust is above this

    @property
    def max_age(self) -> int:
        """Env steps after which an answer has expired."""
        return self.interval * self.max_age_intervals


@dataclass
class VetoConfig:
    """The risk veto's rules (agents.advice.risk_veto)."""

    enabled: bool = True  # --no-veto turns it off
    # The rules judge the agent against the bracket's break-even win rate p0 = stop / (stop + target) ATR multiples
    # (1/3 for 1.5/3): `auto` thresholds fire on results that an agent winning at p0 shows with probability at most
    # `significance`. Fixed ones (3 losses, a 40% win rate) fired on most losing streaks of a profitable agent.
    significance: float = 0.05
    # fire at this many losses in a row; auto: the streak (1 − p0)^n <= significance (8 for 1.5/3); 0: off
    consecutive_losses: int | str = "auto"
    min_drawdown_buffer: float = 0.20  # fire below this share of the trailing drawdown left; 0 turns it off
    # fire when the last (5-10) trades won less than p0 minus this margin; auto: when so few wins have binomial
    # probability <= significance at p0 (for 1.5/3: no win in the last 8-10 trades); a margin >= p0 turns it off
    win_rate_margin: float | str = "auto"
    min_trades_for_win_rate: int = 5  # the win-rate rule waits for this many recent trades
    cooldown_bars: int = 30  # a veto lasts this many bars (or until the session ends)
    # within this share of the trailing drawdown, an env bound to its advice (query.bind_on record or trust) enters
    # only on the side the advice names; 0 turns it off
    advised_only_below: float = 0.5


@dataclass
class LearningConfig(LearningOptions):
    """LoRA learning of the advisor from the market's move after each answer (llm_sidecar.learning): the sidecar's
    options (bridge.learning.LearningOptions) and what the trainer alone uses."""

    enabled: bool = False  # needs a transformers advisor (smollm2, a model path) in score mode
    every_updates: int = 2  # M: a learning round starts after every M PPO updates (the sidecar runs it between answers)
    move_bars: int = 30  # bars over which the market's move after each answered key's bar is measured
    # keys of the validation split's sessions every advisor version answers, to be judged on sessions after every bar
    # it could have learned from (agents.advisor.later_sessions; lora_later_* in metrics.jsonl); 0: not judged
    judge_keys: int = 256
    # a control: every answered key learns the move after a key of another session (agents.advisor.outcomes
    # .permuted_across_sessions): the moves keep their distribution and lose what the prompt said
    placebo: bool = False


@dataclass
class ReasoningConfig:
    """Chain of thought (the prompt templates' `reasoning` section): every key is answered with a thought. A key is
    answered once for every env and run on its data (the advice store keeps it), so a thought's cost is paid once."""

    enabled: bool = False  # needs a prompt template with a `reasoning` section


@dataclass
class SidecarConfig:
    """The advisor processes (agents.advisor.sidecar starts them, agents.advisor.workers counts them): the model's
    settings and each process's share of the machine."""

    mode: str = "score"  # score | generate (transformers backends)
    quantization: str = "none"  # none | int8 | int4 (bitsandbytes; GPU)
    adapter: str = ""  # a peft LoRA adapter directory applied to a transformers advisor (--llm-adapter)
    # advisor processes, each with its own torch device and shared memory: a number, or auto (one per GPU, 1 on CPU)
    workers: str = "auto"
    threads: int = 1  # torch threads in each advisor process: the trainer needs the other cores
    nice: int = 19  # OS niceness of the advisor processes: they use the cores the trainer leaves idle
    batch_size: int = 64  # prompts per call of the advisor's backend


@dataclass
class MockConfig:
    """The mock advisor (`--llm mock`): what it answers and what it reads (agents.advisor.numeric_mock, or the
    sidecar's mock backend)."""

    # rules (indicators and headline) | news (the headline alone; HOLD without news) | news_pass (the same, PASS
    # without news: no view) | random
    answers: str = "rules"
    # fields (its rules applied to the prompt fields in the trainer's process: no text, no sidecar) | text (in a
    # sidecar process, reading the rendered prompts through the bridge as a model does: the same answers)
    reads: str = "fields"
    latency_s: float = 0.0  # reading text: injected latency per prompt (for tests)


@dataclass
class LinkConfig:
    """The query step's round trip to the advisor (agents.advisor.pacer): how many keys it asks, whether the trainer
    waits for the answers, the prompts it renders and what it logs."""

    # B: most envs asked per query step (per process), a number or `auto` (sized from the sidecar's rate)
    budget: str = "auto"
    max_budget: int = 1024  # the most `auto` may choose, and the bridge's capacity
    # strict: wait for the previous query step's answers (bit-reproducible); async: take what is ready (the trainer
    # never waits); auto: strict for the mock advisor, async for a model, which on a CPU would stall the trainer
    latency: str = "auto"
    strict_timeout_s: float = 120.0  # strict mode gives up on an answer after this long (counted as timeouts)
    prompts: str = ""  # prompt templates YAML; empty = configs/prompts.yaml
    log_llm: int = 0  # prompts and answers per update written to llm_log.jsonl


@dataclass
class HybridConfig:
    """The LLM advisor and how its advice is used (`--llm` other than none): acting on it here, the rest by where it
    is read."""

    fusion: str = "learned"  # none | rules | switch | learned
    llm_weight: float = 0.3  # rules fusion: the weight of the LLM's confidence
    gate_lr_scale: float = 10.0  # learned fusion: the trust gate's learning rate is ppo.lr times this
    # a control: every key is answered from the prompt of the block one session earlier in the key's own split (same
    # side; PASS in a split's first session), so the advice keeps the advisor's own answers and statistics and loses
    # what it knew about its bar, reading nothing of the future
    shuffled: bool = False
    eval_with_advice: bool = True  # validation walks query the advisor and act fused (else: the RL policy alone)
    # the persistent advice store (agents.advisor.store): a folder, '' for none, or auto: runs/advice_store for a
    # model advisor, none for the mock (it answers faster than a store is read)
    store: str = "auto"
    sidecar: SidecarConfig = field(default_factory=SidecarConfig)
    mock: MockConfig = field(default_factory=MockConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    veto: VetoConfig = field(default_factory=VetoConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)


@dataclass
class TransferConfig:
    """Starting from another run's networks (`--init-from`), e.g. a 261-feature policy from a 228-feature one."""

    init_from: str = ""  # run folder whose checkpoint initialises the networks; empty = a fresh init
    checkpoint: str = "best"  # best (latest when the run has none) | latest | an update number
    # Env steps at the start during which the copied weights stay frozen and only the new input columns (and
    # layers the source lacks) learn; 0 = no warm-up. It must end before the run does.
    freeze_steps: int = 0


@dataclass
class TrainConfig:
    env_name: str = "trading"  # "trading" (jaxenv.TradingEnv) or any gymnax id, e.g. CartPole-v1
    num_envs: int = 4096  # environments stepped together (split over the devices)
    total_steps: int = 50_000_000  # env steps (all envs together); rounded down to whole updates
    seed: int = 0  # initialisation, envs and sampling
    llm: str = "smollm2"  # the embedded advisor | none (RL only, the fastest path) | mock | a model path or hub id
    # Local devices each process shards its envs over: all, or a count (agents/devices/parallel.py; docs/scale.md). A
    # checkpoint does not depend on it, so a run may resume with another (train.py --resume RUN --devices N).
    devices: str = "all"
    # The bar the gate's evidence must beat (agents/evidence/gate.py): flat (0 a session) or buy_and_hold (the market's
    # move in each session, held in the size the agent trades). evaluate.py and trade.py gate a run on its own bar.
    gate_against: str = "flat"
    ppo: PPOConfig = field(default_factory=PPOConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.ppo.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.steps_per_update

    @property
    def minibatch_size(self) -> int:
        return self.steps_per_update // self.ppo.num_minibatches


LLM_CHOICES = ("none", "mock", "smollm2", "PATH_OR_HUB_ID")
FUSION_MODES = ("none", "rules", "switch", "learned")
ADVISED_FUSIONS = ("rules", "switch", "learned")  # the modes in which advice changes what the agent does
GATED_FUSIONS = ("learned",)  # the modes with a trust gate, trained with the policy
BIND_ON = ("always", "trust", "record")  # hybrid.query.bind_on
LATENCY_MODES = ("strict", "async", "auto")
ACTIVATIONS = ("tanh", "relu")


def freeze_updates(transfer: TransferConfig, steps_per_update: int) -> int:
    """Updates the transfer warm-up lasts: a partly frozen update counts as frozen."""
    return -(-transfer.freeze_steps // steps_per_update)


def _is_local_path(llm: str) -> bool:
    """`llm` names a folder rather than a hub id (NAME or ORG/NAME) or a built-in choice."""
    if llm in ("none", "mock", "smollm2"):
        return False
    return llm.startswith(("/", "./", "../", "~")) or llm.count("/") > 1 or Path(llm).expanduser().exists()


def refuse_set_learning(cfg: TrainConfig) -> None:
    """Training with advice on several instruments (data.instruments) has one advisor per instrument, and none of
    them learns from outcomes yet. Every path that trains calls this; the configs themselves stay valid, so
    scripts/advise.py reads the same config."""
    if cfg.data.instruments and cfg.llm != "none" and cfg.hybrid.learning.enabled:
        raise ConfigError("hybrid.learning.enabled: the advisors of several instruments do not learn from outcomes "
                          "yet; set it to false")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Cross-field checks that types alone cannot express: every failed one, in one ConfigError (one line each, in
    the checks' order). They need a whole config of the right types, so load_config runs them only after the keys
    and types all passed."""
    p = cfg.ppo
    counts = [f"{key}: must be >= 1, got {count}" for count, key in ((cfg.num_envs, "num_envs"),
                                                                      (p.num_steps, "ppo.num_steps")) if count < 1]
    if counts:  # the checks below divide by them
        raise ConfigError(*counts)
    frozen = freeze_updates(cfg.transfer, cfg.steps_per_update)  # updates of the transfer warm-up
    checks = [
        (p.update_epochs >= 1, "ppo.update_epochs", "must be >= 1"),
        (p.num_minibatches >= 1 and cfg.steps_per_update % p.num_minibatches == 0, "ppo.num_minibatches",
         f"must divide num_envs × ppo.num_steps = {cfg.steps_per_update}"),
        (cfg.num_updates >= 1, "total_steps",
         f"must cover at least one update of num_envs × ppo.num_steps = {cfg.steps_per_update} steps"),
        (p.lr > 0, "ppo.lr", "must be > 0"),
        (0 <= p.gamma <= 1 and 0 <= p.gae_lambda <= 1, "ppo.gamma", "gamma and gae_lambda must be in [0, 1]"),
        (cfg.network.activation in ACTIVATIONS, "network.activation", f"must be one of {', '.join(ACTIVATIONS)}"),
        (all(h >= 1 for h in cfg.network.actor_hidden + cfg.network.critic_hidden), "network",
         "hidden sizes must be >= 1"),
        (cfg.checkpoint.every_updates >= 1, "checkpoint.every_updates", "must be >= 1"),
        (cfg.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1"),
        (cfg.checkpoint.eval_every_updates >= 0, "checkpoint.eval_every_updates", "must be >= 0"),
        (bool(cfg.llm.strip()), "llm", "must be none, mock, smollm2 or a model path / hub id"),
        (not _is_local_path(cfg.llm) or Path(cfg.llm).expanduser().is_dir(), "llm",
         f"no model folder at {cfg.llm} (a local model is a folder; a hub id is NAME or ORG/NAME)"),
        (cfg.llm == "none" or cfg.env_name == "trading", "llm", "the LLM advisor needs the trading env; use --llm none (llm=none) with other envs"),
        (cfg.gate_against in GATE_BARS, "gate_against", f"must be one of {', '.join(GATE_BARS)}"),
        # several instruments in one account (data.instruments): on the trading env, from scratch for now (their
        # advisors do not learn: refuse_set_learning)
        (not cfg.data.instruments or cfg.env_name == "trading", "env_name",
         "several instruments (data.instruments) trade in the trading env: env_name must be trading"),
        (not cfg.data.instruments or not cfg.transfer.init_from, "transfer.init_from",
         "starting a run on several instruments from another run's agent (--init-from) is not built yet"),
        (cfg.devices == "all" or (cfg.devices.isdigit() and int(cfg.devices) > 0), "devices",
         "must be all or a positive number of local devices"),
        (cfg.hybrid.fusion in FUSION_MODES, "hybrid.fusion", f"must be one of {', '.join(FUSION_MODES)}"),
        (cfg.hybrid.link.latency in LATENCY_MODES, "hybrid.link.latency", f"must be one of {', '.join(LATENCY_MODES)}"),
        (cfg.hybrid.gate_lr_scale > 0, "hybrid.gate_lr_scale", "must be > 0"),
        (not cfg.hybrid.sidecar.adapter or cfg.llm not in ("none", "mock"), "hybrid.sidecar.adapter",
         "a LoRA adapter needs a transformers advisor (--llm smollm2 or a model path / hub id)"),
        (cfg.hybrid.link.budget == "auto" or (cfg.hybrid.link.budget.isdigit() and int(cfg.hybrid.link.budget) > 0),
         "hybrid.link.budget", "must be a positive number or auto"),
        (cfg.hybrid.sidecar.workers == "auto" or (cfg.hybrid.sidecar.workers.isdigit()
                                                   and int(cfg.hybrid.sidecar.workers) > 0),
         "hybrid.sidecar.workers", "must be a positive number or auto"),
        (not cfg.hybrid.learning.enabled or cfg.hybrid.sidecar.workers in ("auto", "1"), "hybrid.sidecar.workers",
         "LoRA learning (hybrid.learning.enabled) trains one advisor: use 1 worker (or auto)"),
        (0 <= cfg.hybrid.sidecar.nice <= 19, "hybrid.sidecar.nice", "must be between 0 and 19"),
        (cfg.hybrid.veto.consecutive_losses == "auto" or str(cfg.hybrid.veto.consecutive_losses).isdigit(),
         "hybrid.veto.consecutive_losses", "must be a number >= 0 (0: off) or auto"),
        (cfg.hybrid.veto.win_rate_margin == "auto" or _is_number(cfg.hybrid.veto.win_rate_margin),
         "hybrid.veto.win_rate_margin", "must be a number or auto"),
        (0 < cfg.hybrid.veto.significance < 1, "hybrid.veto.significance", "must be between 0 and 1"),
        (0 <= cfg.hybrid.veto.advised_only_below <= 1, "hybrid.veto.advised_only_below",
         "must be a share of the trailing drawdown in [0, 1] (0: off)"),
        (1 <= cfg.hybrid.query.interval <= p.num_steps, "hybrid.query.interval",
         f"must be between 1 and ppo.num_steps = {p.num_steps}"),
        (0 <= cfg.hybrid.query.min_trust < 1, "hybrid.query.min_trust", "must be in [0, 1)"),
        (cfg.hybrid.query.bind_on in BIND_ON, "hybrid.query.bind_on", f"must be one of {', '.join(BIND_ON)}"),
        (cfg.hybrid.sidecar.quantization in ("none", "int8", "int4"), "hybrid.sidecar.quantization", "must be none, int8 or int4"),
        (cfg.hybrid.sidecar.mode in ("score", "generate"), "hybrid.sidecar.mode", "must be score or generate"),
        (not cfg.hybrid.learning.enabled or (cfg.llm not in ("none", "mock") and cfg.hybrid.sidecar.mode == "score"),
         "hybrid.learning.enabled", "LoRA learning needs a transformers advisor (smollm2 or a model path) in score mode"),
        (not (cfg.hybrid.learning.enabled and cfg.hybrid.query.bind_on == "record"), "hybrid.query.bind_on",
         "the record scores the advice's calls on the market's moves, and an advisor that learns (hybrid.learning) "
         "re-answers keys with adapters trained on those very moves: bind on trust or always, or turn learning off"),
        (not (cfg.hybrid.learning.enabled and cfg.hybrid.shuffled), "hybrid.shuffled",
         "the shuffled control asks about other bars, so it cannot learn from outcomes: turn hybrid.learning off"),
        (cfg.hybrid.learning.every_updates >= 1, "hybrid.learning.every_updates", "must be >= 1"),
        (cfg.hybrid.learning.move_bars >= 1, "hybrid.learning.move_bars", "must be >= 1"),
        (cfg.hybrid.learning.judge_keys >= 0, "hybrid.learning.judge_keys", "must be >= 0 (0: versions not judged)"),
        (cfg.hybrid.mock.answers in MOCK_ANSWERS, "hybrid.mock.answers", f"must be one of {', '.join(MOCK_ANSWERS)}"),
        (cfg.hybrid.mock.reads in MOCK_READS, "hybrid.mock.reads", f"must be one of {', '.join(MOCK_READS)}"),
        (cfg.llm != "mock" or cfg.hybrid.mock.reads == "text" or not (cfg.hybrid.mock.latency_s or
                                                                       cfg.hybrid.reasoning.enabled),
         "hybrid.mock.reads", "an injected latency or reasoning needs the mock in its own process: set it to text"),
        (cfg.transfer.checkpoint in ("best", "latest") or cfg.transfer.checkpoint.isdigit(), "transfer.checkpoint",
         "must be best, latest or an update number"),
        (cfg.transfer.freeze_steps >= 0, "transfer.freeze_steps", "must be >= 0"),
        (cfg.transfer.freeze_steps == 0 or bool(cfg.transfer.init_from), "transfer.freeze_steps",
         "freezes copied layers, so it needs transfer.init_from (--init-from RUN)"),
        (frozen < cfg.num_updates or cfg.transfer.freeze_steps == 0, "transfer.freeze_steps",
         f"a warm-up of {cfg.transfer.freeze_steps} steps ({frozen} updates of {cfg.steps_per_update}) "
         f"would freeze the copied layers for the whole run of {cfg.total_steps} steps ({cfg.num_updates} updates); "
         "use fewer freeze steps or more total_steps"),
    ]
    errors = [f"{key}: {msg}" for ok, key, msg in checks if not ok]
    try:
        cfg.hybrid.learning.check()
    except ValueError as error:
        errors.append(f"hybrid.learning.{error}")
    try:
        check_rules(cfg.env.prop_firm)
    except ValueError as error:
        errors.append(str(error))
    try:
        # The instrument by name becomes its full specification, so a run's config.yaml records the values it traded.
        data = resolve_data_config(cfg.data)
    except ValueError as error:
        errors.append(str(error))
    try:  # each instrument of a set too
        instruments = resolve_instruments(cfg.data.instruments)
    except ValueError as error:
        errors += str(error).splitlines()
    if errors:
        raise ConfigError(*errors)
    return dataclasses.replace(cfg, data=dataclasses.replace(data, instruments=instruments))


# ---------------------------------------------------------------------------------------------------------
# dict <-> dataclass with type checking


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_number(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`; returns it converted (int→float, nested dicts→dataclasses)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        sections = [arm for arm in typing.get_args(tp) if dataclasses.is_dataclass(arm)]
        if isinstance(value, dict) and len(sections) == 1:  # a mapping is that section: its errors name its keys
            from jaxenv.contracts import ContractSpec, InstrumentError, expand_base

            if "base" in value and sections[0] is ContractSpec:  # a built-in instrument with some fields changed
                try:
                    value = expand_base(value)
                except InstrumentError as error:
                    raise ConfigError(error.keyed(key)) from None
            return _coerce(value, sections[0], key)
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError:
                pass
        expected = INSTRUMENT_FORMS if InstrumentSource in sections else _type_name(tp)
        raise ConfigError(f"{key}: expected {expected}, got {type(value).__name__} {value!r}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp,) = typing.get_args(tp)
        items, errors = [], []
        for i, v in enumerate(value):  # every wrong item named
            try:
                items.append(_coerce(v, item_tp, f"{key}[{i}]"))
            except ConfigError as error:
                errors += error.errors
        if errors:
            raise ConfigError(*errors)
        return items
    if tp is PropFirmRules and (isinstance(value, str) or (isinstance(value, dict) and "base" in value)):
        try:  # account rules by name, or a named set with some of its fields changed
            value = rules_fields(value)
        except ValueError as error:
            raise ConfigError(f"{key}: {error}") from None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {type(value).__name__}")
        return from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):  # PyYAML reads 1e6 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():  # 5.0e6 in YAML is a float
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"{key}: unsupported annotation {tp!r}")
    hint = ""
    if tp is str and isinstance(value, int):
        hint = " (quote times of day in YAML: '18:00' unquoted reads as a number)"
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}{hint}")


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Builds dataclass `cls` from a (partial) dict; unknown keys and wrong types raise one ConfigError naming every
    one of them (one line each, nested sections' included)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    errors, kwargs = [], {}
    for k, v in data.items():  # in the file's order
        if k not in names:
            errors.append(f"unknown key '{prefix}{k}' (valid keys here: {', '.join(names)})")
            continue
        try:
            kwargs[k] = _coerce(v, hints[k], f"{prefix}{k}")
        except ConfigError as error:
            errors += error.errors
    if errors:
        raise ConfigError(*errors)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def _parse_scalar(text: str, tp: Any, key: str) -> Any:
    """Parses the right-hand side of `--set key=value` for a field annotated `tp`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and text.lower() in ("none", "null", "~"):
        return None
    if tp is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {text!r}")
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    if union and any(dataclasses.is_dataclass(arm) for arm in typing.get_args(tp)) and text.lstrip().startswith("{"):
        try:  # a name or a whole section as a YAML flow mapping: data.contract="{symbol: X, tick_size: 0.01}"
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{key}: cannot parse {text!r}: {e}") from None
    if tp is str or (union and str in typing.get_args(tp)):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{key}: cannot parse {text!r}: {e}") from None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Applies `a.b.c=value` strings onto a nested dict (in place), checking each key against TrainConfig: the good
    ones are applied, and every bad one is named in one ConfigError (one line each, in order)."""
    errors = []
    for item in overrides:
        try:
            _apply_override(raw, item)
        except ConfigError as error:
            errors += error.errors
    if errors:
        raise ConfigError(*errors)
    return raw


def _apply_override(raw: dict, item: str) -> None:
    """One `a.b.c=value` of apply_overrides."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, text = item.split("=", 1)
    key = key.strip()
    if key in MOVED_KEYS:
        raise ConfigError(f"unknown key '{key}': it is {MOVED_KEYS[key]} now")
    parts = key.split(".")
    cls: Any = TrainConfig
    node = raw
    for depth, part in enumerate(parts):
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints:
            where = ".".join(parts[:depth]) or "the top level"
            valid = ", ".join(hints) if hints else "none"
            raise ConfigError(f"unknown key '{key}' (no '{part}' in {where}; valid: {valid})")
        tp = hints[part]
        # a name or a section (data.contract): its fields set one by one change the named one's
        arms = [arm for arm in typing.get_args(tp) if dataclasses.is_dataclass(arm)]
        named_section = arms[0] if len(arms) == 1 and str in typing.get_args(tp) else None
        if depth == len(parts) - 1:
            changed = node.get(part)
            if tp is PropFirmRules:  # account rules by name: env.prop_firm=plain
                if isinstance(changed, dict):
                    changed["base"] = text  # the fields already set stay set, whichever --set came first
                else:
                    node[part] = text
                continue
            if dataclasses.is_dataclass(tp):
                raise ConfigError(f"{key}: is a section; set one of its fields, e.g. {key}.<field>=...")
            value = _parse_scalar(text, tp, key)
            if named_section and isinstance(value, str) and isinstance(changed, dict) and "base" in changed:
                changed["base"] = value  # the fields already set stay set, whichever --set came first
            else:
                node[part] = value
        else:
            if named_section:
                current = node.get(part, getattr(cls(), part))
                node[part] = current if isinstance(current, dict) else {"base": current}
                tp = named_section
            elif tp is PropFirmRules and isinstance(node.get(part), str):
                node[part] = {"base": node[part]}  # a named set, some of its fields changed
            if not dataclasses.is_dataclass(tp):
                raise ConfigError(f"unknown key '{key}' ('{'.'.join(parts[:depth + 1])}' is not a section)")
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # the file's section is not a mapping: from_dict names it in these words
                section = ".".join(parts[:depth + 1])
                raise ConfigError(f"{section}: expected a mapping of {tp.__name__} fields, got {type(node).__name__}")
            cls = tp


RUN_CONFIG_FILE = "config.yaml"  # RUN_DIR/config.yaml: the resolved config a run was started with

# Keys deleted with the experiments that rejected them (docs/findings.md), each with the values under which a config
# that still holds it acts as it did (its old default): such a config, a saved run's among them, loads without it;
# any other value is an error naming the key.
REMOVED_KEYS: dict[str, Any] = {
    "data.timezone": lambda value, raw: True,  # it could only be "" or the exchange's zone, which the contract holds
    "hybrid.advisor_share": lambda value, raw: value == "auto",
    "hybrid.advice_input": lambda value, raw: value is False,
    "hybrid.gate_init_logit": lambda value, raw: value == -2.0,
    "transfer.freeze_actor": lambda value, raw: value is False,
    # the learning objectives that learned from the advice's own trades, and their options: only `move` is left
    "hybrid.learning.objective": lambda value, raw: value == "move" or not _learns(raw),
    "hybrid.learning.baseline": lambda value, raw: value == "none" or not _learns(raw),
    "hybrid.learning.anchor_coef": lambda value, raw: value == 0 or not _learns(raw),
    # per-env queries, replaced by advice keyed by market context (agents.advice.table): nothing left to set
    "hybrid.query.cooldown": lambda value, raw: True,
    "hybrid.query.uncertainty_threshold": lambda value, raw: True,
    "hybrid.query.max_stretch": lambda value, raw: True,
    "hybrid.reasoning.policy_confidence": lambda value, raw: True,
    "hybrid.reasoning.per_episode": lambda value, raw: True,
    # the record's fading tally of per-env calls, replaced by one call per key over sessions (agents.advice.record)
    "hybrid.query.record_calls": lambda value, raw: True,
}


# Keys moved from the hybrid section into the section of the code that reads them: a config written before, a saved
# run's among them, is read under the new names; a --set of an old name is refused with its new one.
MOVED_KEYS = {
    **{f"hybrid.{old}": f"hybrid.sidecar.{new}" for old, new in (
        ("llm_mode", "mode"), ("quantization", "quantization"), ("llm_adapter", "adapter"),
        ("sidecar_workers", "workers"), ("sidecar_threads", "threads"), ("sidecar_nice", "nice"),
        ("sidecar_batch_size", "batch_size"))},
    **{f"hybrid.mock_{name}": f"hybrid.mock.{name}" for name in ("answers", "reads", "latency_s")},
    **{f"hybrid.{name}": f"hybrid.link.{name}" for name in (
        "budget", "max_budget", "latency", "strict_timeout_s", "prompts", "log_llm")},
}


# A run's config.yaml writes out every field of its prop-firm rules. One of several instruments (data.instruments)
# written before the account's limits were these rules' fields holds exactly the fields below, none of ACCOUNT_LIMITS:
# its account had no cap then, and its max_contracts (10) bound contracts_per_trade alone. Read now, that 10 would cap
# the account and change the observation's cap features (jaxenv.account_env.ACCOUNT_FEATURES): such a config is
# refused, never read silently with another meaning.
RULES_BEFORE_ACCOUNT_LIMITS = ("version", "starting_balance", "trailing_drawdown", "trail_stop_offset",
                               "profit_target", "max_contracts", "flat_by", "timezone", "no_entry_minutes_before_close")
ACCOUNT_LIMITS = ("half_size_until_threshold", "correlated")  # the fields such a config lacks
UNCAPPED_ACCOUNT_RUN = ("trained before the account's cap was configurable (env.prop_firm.max_contracts; its account "
                        "had no cap); retrain it (to train anew from this config, add env.prop_firm.correlated: [])")


def uncapped_account_run(raw: dict) -> bool:
    """`raw` (a loaded YAML mapping) is the saved config of a run on several instruments written before the account's
    limits were prop-firm rules (RULES_BEFORE_ACCOUNT_LIMITS). A config of one instrument never is."""
    data, env = raw.get("data"), raw.get("env")
    if not (isinstance(data, dict) and data.get("instruments") and isinstance(env, dict)):
        return False
    rules = env.get("prop_firm")
    return (isinstance(rules, dict) and "base" not in rules and set(RULES_BEFORE_ACCOUNT_LIMITS) <= set(rules)
            and not set(ACCOUNT_LIMITS) & set(rules))


def _learns(raw: dict) -> bool:
    return bool(raw.get("hybrid", {}).get("learning", {}).get("enabled", False))


def _pop(raw: dict, key: str) -> tuple[bool, Any]:
    """(found, value) of the dotted `key` in `raw`, removed from it."""
    *sections, name = key.split(".")
    node = raw
    for section in sections:
        node = node.get(section)
        if not isinstance(node, dict):
            return False, None
    return (True, node.pop(name)) if name in node else (False, None)


def drop_removed_keys(raw: dict) -> dict:
    """`raw` (a loaded YAML mapping) without the keys deleted since it was written, where that changes nothing, and
    with moved keys (MOVED_KEYS) under their new names; a ConfigError names a deleted key whose value no longer has a
    meaning, and a run on several instruments saved before its account's cap was configurable
    (uncapped_account_run). `learning.advantage_clip` became
    `learning.move_clip`; `query.wait_min_trust` became `query.min_trust`, and its 0 (every env bound)
    `query.bind_on: always`."""
    errors = []  # every deleted key set to a value that no longer has a meaning, raised together at the end
    if uncapped_account_run(raw):
        errors.append(UNCAPPED_ACCOUNT_RUN)
    for key, harmless in REMOVED_KEYS.items():
        found, value = _pop(raw, key)
        if found and not harmless(value, raw):
            errors.append(f"{key}: no longer exists (removed with the experiment that rejected it: "
                          f"docs/findings.md); this config set it to {value!r}")
    found, clip = _pop(raw, "hybrid.learning.advantage_clip")  # the clip of the move objective's weights too
    if found:
        raw["hybrid"]["learning"].setdefault("move_clip", clip)
    found, wait_min_trust = _pop(raw, "hybrid.query.wait_min_trust")
    if found:  # a config of the trust-gated wait: bound on trust only where a gated fusion waited with a threshold
        query = raw["hybrid"]["query"]
        gated = raw["hybrid"].get("fusion", HybridConfig.fusion) in GATED_FUSIONS
        if query.get("bind_on", "trust") == "trust":
            on_trust = gated and query.get("wait_for_answer", False) and wait_min_trust > 0
            query["bind_on"] = "trust" if on_trust else "always"
        query.setdefault("min_trust", wait_min_trust if wait_min_trust > 0 else QueryConfig.min_trust)
    for old, new in MOVED_KEYS.items():
        found, value = _pop(raw, old)
        if found:
            *sections, name = new.split(".")
            node = raw
            for section in sections:
                node = node.setdefault(section, {})
            node.setdefault(name, value)
    if errors:
        raise ConfigError(*errors)
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                only: tuple[str, ...] | None = None) -> TrainConfig:
    """Defaults ← YAML file ← `--set` overrides, checked and validated. Every independent error is named in one
    ConfigError (one line each): the file's deleted keys, the overrides' unknown keys and bad values, then the merged
    config's unknown keys and wrong types. A file that is missing, does not parse or is not a mapping stops there.
    `only` (top-level keys): the config of those keys of the file and the overrides alone, the rest defaults."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: cannot parse the YAML: {' '.join(str(error).split())}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        raw = loaded
    overrides = overrides or []
    if only is not None:
        raw = {key: value for key, value in raw.items() if key in only}
        overrides = [o for o in overrides if o.split("=", 1)[0].strip().split(".", 1)[0] in only]
    errors = []
    for step in (drop_removed_keys, lambda raw: apply_overrides(raw, overrides)):
        try:
            step(raw)
        except ConfigError as e:
            errors += e.errors
    try:
        cfg = from_dict(TrainConfig, raw)
    except ConfigError as e:
        errors += e.errors
    # validate's cross-field checks need a whole config of the right types: they run only when every key and type
    # above passed (their errors come on the next run, after these are fixed)
    try:
        if errors:
            raise ConfigError(*errors)
        return validate(cfg)
    except ConfigError as e:
        if path is None:
            raise
        where = f"{path} with --set overrides" if overrides else str(path)
        raise ConfigError(*(f"{where}: {line}" for line in e.errors)) from None


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ---------------------------------------------------------------------------------------------------------
# command-line flags, generated from the dataclasses: one per key, each the same as `--set KEY=VALUE`

# The short flags users know, each an alias of one config key, declared once for every command line that takes them.
FLAG_ALIASES = {
    "envs": "num_envs", "total-steps": "total_steps", "seed": "seed", "data": "data.source", "llm": "llm",
    "llm-mode": "hybrid.sidecar.mode", "quantization": "hybrid.sidecar.quantization",
    "llm-adapter": "hybrid.sidecar.adapter", "advisor-workers": "hybrid.sidecar.workers",
    "fusion": "hybrid.fusion", "query-interval": "hybrid.query.interval", "llm-budget": "hybrid.link.budget",
    "latency": "hybrid.link.latency", "log-llm": "hybrid.link.log_llm",
    "date-format": "data.date_format", "init-from": "transfer.init_from", "store": "hybrid.store",
    "gate-against": "gate_against",
}
FLAG_PREFIX = "config:"  # the argparse dest of a key's flag


def config_keys(obj: Any = None, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted key, its comment, its default) of every leaf of TrainConfig, in the order of configs/default.yaml."""
    obj = TrainConfig() if obj is None else obj
    comments = field_comments(type(obj))
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and f.name != "contract":  # a contract is named, or given as a mapping
            out += config_keys(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", comments.get(f.name, ""), getattr(value, "symbol", value)))
    return out


def add_config_flags(ap, aliases: dict[str, str] | None = None) -> None:
    """A flag for every config key (`--ppo.lr 1e-4`, `--hybrid.query.interval 10`: the same as `--set KEY=VALUE`),
    its help the key's comment in agents/config.py, one group per section, with `aliases` (default FLAG_ALIASES) as
    the short names. A key the parser has a flag of already keeps its own."""
    aliases = FLAG_ALIASES if aliases is None else aliases
    if ap.usage is None:  # a hundred and more flags: the usage line names the kind, --help lists them
        ap.usage = "%(prog)s [options] [--KEY VALUE ...] (every config key is a flag: --help lists them)"
    groups: dict[str, Any] = {}
    for key, comment, default in config_keys():
        names = dict.fromkeys([f"--{key}", *(f"--{a}" for a, k in aliases.items() if k == key)])
        names = [n for n in names if n not in ap._option_string_actions]
        if not names:
            continue
        section = key.rsplit(".", 1)[0] if "." in key else "run"
        if section not in groups:
            groups[section] = ap.add_argument_group(f"config: {section}" + ("" if section == "run" else ".*"))
        shown = "" if default in ("", None) else f" (default: {default})"
        groups[section].add_argument(*names, dest=FLAG_PREFIX + key, metavar="VALUE",
                                     help=(comment + shown).replace("%", "%%"))


def flag_name(key: str) -> str:
    """The flag a user knows a config key by: its short alias where it has one, else --KEY."""
    return "--" + next((alias for alias, k in FLAG_ALIASES.items() if k == key), key)


def config_overrides(args) -> list[str]:
    """The `--set KEY=VALUE` overrides of the config flags given on the command line."""
    return [f"{dest[len(FLAG_PREFIX):]}={value}" for dest, value in vars(args).items()
            if dest.startswith(FLAG_PREFIX) and value is not None]


# ---------------------------------------------------------------------------------------------------------
# configs/default.yaml, generated from the dataclasses: `python -m agents.config > configs/default.yaml`


def default_config_yaml() -> str:
    """Every key of TrainConfig with its default and its comment, as YAML."""
    lines = ["# Every key with its default: generated from agents/config.py and jaxenv/config.py by",
             "# `python -m agents.config > configs/default.yaml` (tests/test_config.py checks it is current).",
             "# Override any key in a YAML file (--config) or on the command line: --set ppo.lr=1e-4."]

    def section(obj: Any, depth: int) -> None:
        comments = field_comments(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            comment = comments.get(f.name, "")
            pad = "  " * depth
            if f.name == "contract" and not isinstance(value, str):
                value = value.symbol  # the instrument by name; a mapping of ContractSpec fields names a new one
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{f.name}:" + (f"  # {comment}" if comment else ""))
                section(value, depth + 1)
                continue
            text = yaml.safe_dump({f.name: value}, default_flow_style=True, width=1000).strip()[1:-1]
            lines.append(f"{pad}{text}" + (f"  # {comment}" if comment else ""))

    section(TrainConfig(), 0)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(default_config_yaml(), end="")
