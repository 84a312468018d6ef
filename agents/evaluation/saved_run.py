"""Evaluating trained runs from their checkpoints (`scripts/evaluate.py`).

The agent, its ablations and the baselines walk the same bars: a whole split (or file) bar by bar with one
account, or N random episodes of it. Every walk is a trace (`jaxenv.walk_split`'s columns) scored by
`jaxenv.metrics.walk_metrics`; walks of several evaluation seeds, episodes or run folders are summarised by
their mean and a 95% Student-t interval.

    runs = [load_run("runs/x", "best")]
    result = evaluate(runs, EvalOptions(split="test", seeds=3))
    result.summary()   # {"agent": {...}, "ablations": {...}, "baselines": {...}}

Policies are named walks `(bars, key) -> trace` in three groups. A hybrid run (one trained with an advisor)
walks with its advisor exactly as in training's evaluation (`agents.evaluation.advised_walk.AdvisedWalker`: its own sidecar,
query steps every k bars, one step of latency, strict waiting), and its ablations are the same walk with the
acting changed: RL only, LLM only, fused without and with the veto; their metrics add how the advice was used
(`ADVICE_METRICS`). A policy whose walk does not depend on the key (greedy acting, flat, buy-and-hold) is walked
once per set of bars, so repeating identical walks over seeds never narrows an interval.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich.progress import Progress
from scipy import stats

from agents.advice.acting import HybridActing, acting_of, training_acting
from agents.advice.usage import ADVICE_METRICS, walk_advice_metrics
from agents.config import ConfigError, TrainConfig, to_dict
from agents.evaluation.advised_walk import AdvisedWalker, run_ablations
from agents.evaluation.policies import flat_policy, make_act, random_valid_policy
from agents.evidence.eprocess import scale_of
from agents.evidence.gate import Gate, OutOfSample, gated_trace
from agents.evidence.overfitting import deflated_sharpe_ratio
from agents.rl.ppo import PPO, make_train
from agents.runs.saved_runs import SavedPolicy, check_fits, load_run_config, refuse_instrument_set, restore_policy
from agents.runs.trials import count_trials
from jaxenv import Market, TradingEnv, load_market, walk_split
from jaxenv.config import DataConfig
from jaxenv.contracts import describe
from jaxenv.evaluate import buy_and_hold, held_pnl
from jaxenv.metrics import METRICS, Trace, daily_pnl, step_days, walk_metrics
from jaxenv.sessions import DAILY, SessionInfo

Bars = tuple[int, int]  # [start, end) bar indices of one walk
WalkFn = Callable[[Bars, jax.Array], Trace]
GROUPS = ("agent", "gated", "ablations", "baselines")
GATED = "agent (gated)"  # the agent as trade.py's gate would have traded it (agents.evidence.gate)
EVIDENCE_DIR = "evidence"  # RUN/evidence/<checkpoint label>.json: a checkpoint's out-of-sample P&L per session
RUN_DATA_FILE = "data.json"  # RUN/data.json: what loading the run's data resolved, written beside config.yaml
# an agent walk's overfitting figures (agents.evidence.overfitting), per session
OVERFITTING_METRICS = {"psr": "P(true Sharpe per session > 0): the probabilistic Sharpe ratio",
                       "dsr": "the deflated Sharpe ratio: the PSR against the best of the trials on this data",
                       "trials": "runs trained on this data in the run's folder of runs (its trials.jsonl)"}


@dataclass(frozen=True)
class Policy:
    walk: WalkFn
    stochastic: bool  # the walk depends on its key (sampled actions): walked again for every evaluation seed


@dataclass
class EvalOptions:
    split: str = "test"  # val | test of the run's data, or "all": every bar of the data (with --data)
    episodes: int = 0  # > 0: this many random episodes of env.max_steps_in_episode bars instead of the whole split
    # evaluation seeds: seed i acts with PRNGKey(i) (folded with each walk's index) and draws episodes with numpy seed i
    seeds: int = 1
    progress: bool = True


@dataclass
class LoadedRun:
    """A run's trained policy with the env and market to walk, restored to act exactly as in training."""

    cfg: TrainConfig
    saved: SavedPolicy
    env: TradingEnv
    market: Market
    ppo: PPO
    act: Callable  # agents.evaluation.policies.make_act: act((params, obs_norm), obs, mask, key)
    sampled: bool  # act samples actions (else: the most probable one, as training's evaluation does by default)
    walker: AdvisedWalker  # walks the agent as it acts, with the run's advisor if it has one (close() stops it)

    @property
    def advised(self) -> bool:
        """The run has an advisor (llm other than none)."""
        return self.cfg.llm != "none"

    def close(self) -> None:
        self.walker.close()


def load_run(run_dir: str | Path, checkpoint: str = "best", data: str | DataConfig | None = None,
             sample: bool = False) -> LoadedRun:
    """Restores params and observation normaliser of a run's checkpoint and rebuilds its env from its config
    (on `data` instead of the run's own data when given: a source, or a whole data config). Fails with a message
    saying what differs when the checkpoint does not fit the current code, config or data."""
    cfg = load_run_config(run_dir)
    refuse_instrument_set(cfg, run_dir, "this walk is one instrument's (evaluate.py walks an account: "
                          "agents.evaluation.account_run)")
    if isinstance(data, DataConfig):
        cfg = dataclasses.replace(cfg, data=data)
    elif data is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=data))
    saved = restore_policy(run_dir, checkpoint, cfg)
    env = TradingEnv(cfg.env)
    market = load_market(cfg.data)
    _, ppo = restore_agent(saved, env, env.make_params(market, (0, market.num_bars)))
    # an advisor's sidecar starts on the first walk with advice
    walker = AdvisedWalker(cfg.hybrid, cfg.llm, cfg.data, ppo, env, market, normalize_obs=cfg.ppo.normalize_obs,
                           greedy=cfg.checkpoint.eval_deterministic)
    return LoadedRun(cfg, saved, env, market, ppo, make_act(ppo, deterministic=not sample), sampled=sample,
                     walker=walker)


def save_run_data(run_dir: str | Path, market: Market) -> None:
    """What loading the run's data resolved, which its config does not say: the zone its naive stamps were read in
    (data.source_timezone=auto's pick included; "" where they carried offsets or were dates) and the bar interval.
    trade.py reads a file as training read the run's data, and refuses one of another interval."""
    record = {"source_timezone": market.stamps_zone, "interval_minutes": market.interval_minutes}
    (Path(run_dir) / RUN_DATA_FILE).write_text(json.dumps(record, indent=1))


def run_data(run_dir: str | Path) -> dict:
    """The run's RUN_DATA_FILE; {} for a run trained before it was written (its files are read as before)."""
    path = Path(run_dir) / RUN_DATA_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def restore_agent(saved: SavedPolicy, env: TradingEnv, env_params) -> tuple[HybridActing, PPO]:
    """A saved policy as it acts, the one restore evaluate.py, trade.py and the Agent API share: how it acts
    (agents.advice.acting.acting_of: with its advisor, or the policy alone) and its network (the one it trained, the
    trust gate's parameters included), checked against the checkpoint (CheckpointMismatch says what differs)."""
    cfg = saved.cfg
    if cfg.env_name != "trading":
        raise ConfigError(f"{saved.run_dir}: a saved agent acts in the trading env; this run trained on "
                          f"{cfg.env_name!r}")
    ppo = make_train(cfg.ppo, cfg.network, env, env_params, training_acting(cfg.hybrid, cfg.llm, env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions)
    return acting_of(cfg.hybrid, cfg.llm, env), ppo


def out_of_sample(run_dir: str | Path, checkpoint: str = "best") -> OutOfSample:
    """The checkpoint's P&L per session on its run's test split, which it was neither trained on nor chosen on: where
    its gate's evidence starts (agents.evidence.gate). Walked once, then read from RUN/evidence/<label>.json."""
    run = load_run(run_dir, checkpoint)
    path = Path(run_dir) / EVIDENCE_DIR / f"{run.saved.label}.json"
    end = in_sample_end(run.market)
    bounds = walk_bounds(run.market, "test")
    try:
        saved = OutOfSample.load(path) if path.exists() else None
        if saved is not None and saved.buy_and_hold is not None and saved.held is not None:
            return dataclasses.replace(saved, in_sample_end=end)
        trace = None if saved is not None else agent_walk(run)(bounds, jax.random.PRNGKey(0))
    finally:
        run.close()
    if saved is None:
        daily = daily_pnl(trace, run.market.timestamps, run.market.sessions.day)
        saved = OutOfSample([str(d) for d in daily.index], daily.astype(float).tolist(),
                            f"test split of {run.cfg.data.source}")
    bought = buy_and_hold(run.env, run.market, bounds)
    moves = {"t": bought["t"], "pnl": held_pnl(run.market.close, bought["t"], run.market.contract,
                                                         run.cfg.env.contracts_per_trade)}
    by_day = lambda trace: daily_pnl(trace, run.market.timestamps, run.market.sessions.day).rename(str)  # noqa: E731
    bought, moves = by_day(bought), by_day(moves)
    record = dataclasses.replace(saved, in_sample_end=end, buy_and_hold=[float(bought.get(d, 0.0)) for d in saved.days],
                                 held=[float(moves.get(d, 0.0)) for d in saved.days])
    record.save(path)
    return record



def in_sample_end(market: Market) -> str:
    """The last session a run on `market` was trained or chosen on: the later end of its train and validation splits
    (OutOfSample.in_sample_end)."""
    last = max(end - 1 for name, (start, end) in market.splits.items() if name in ("train", "val") and end > start)
    return str(market.sessions.day[last])


def gated_walk(run: LoadedRun, trace: Trace, record: OutOfSample | None) -> tuple[Trace, Gate]:
    """The agent's walk as trade.py's gate would have traded it: the gate's evidence starts from the checkpoint's
    out-of-sample sessions that closed before the walk's first, and counts the walk's sessions as they complete."""
    days = np.asarray(step_days(trace, run.market.timestamps, run.market.sessions.day)).astype(str)
    gate = Gate.start(record.before(days[0]) if record is not None and len(days) else None,
                      scale_of(run.cfg.env.prop_firm), run.cfg.gate_against)
    last = int(np.asarray(trace["t"])[-1]) + 1 if len(days) else -1  # the bar the walk's last P&L is marked at
    held = held_pnl(run.market.close, np.asarray(trace["t"]), run.market.contract, run.cfg.env.contracts_per_trade)
    gated, _ = gated_trace(trace, days, gate, last >= 0 and closes_session(run.market.sessions, last), held)
    return gated, gate


def closes_session(sessions: SessionInfo, bar: int) -> bool:
    """Bar `bar` is its session's last: the next bar is another session's or, at the data's end, the calendar says
    the session ends with it (as trade.py's BarBook.next_session_id says of a feed's last bar)."""
    if bar + 1 < len(sessions.session_id):
        return bool(sessions.session_id[bar + 1] != sessions.session_id[bar])
    if sessions.interval_minutes >= DAILY:
        return True
    return int(sessions.minutes_into_session[bar]) + sessions.interval_minutes >= sessions.schedule.minutes


def overfitting_metrics(run: LoadedRun, trace: Trace) -> dict[str, float | None]:
    """The walk's PSR (its session P&L) and DSR over the trials on its run's data."""
    daily = daily_pnl(trace, run.market.timestamps, run.market.sessions.day).to_numpy(np.float64)
    return session_overfitting(daily, run.saved.run_dir, run.cfg)


def session_overfitting(daily: np.ndarray, run_dir: Path, cfg: TrainConfig) -> dict[str, float | None]:
    """OVERFITTING_METRICS of a walk's P&L per session (an account's included) over the trials on the data of the
    run in `run_dir` (config `cfg`)."""
    trials = count_trials(run_dir, to_dict(cfg))
    dsr = deflated_sharpe_ratio(daily, trials)
    finite = lambda x: float(x) if x is not None and np.isfinite(x) else None  # noqa: E731
    return {"psr": finite(dsr["psr"]), "dsr": finite(dsr["dsr"]), "trials": float(trials)}


def walk_bounds(market: Market, split: str) -> Bars:
    if split == "all":
        return market.split_range((0, market.num_bars))
    if split not in ("val", "test"):
        raise ValueError(f"split {split!r}: use val, test or all")
    return market.split_range(split)


def episode_bars(bounds: Bars, episodes: int, length: int, seed: int) -> list[Bars]:
    """The whole range, or `episodes` random windows of `length` steps inside it (the same for every policy)."""
    start, end = bounds
    if not episodes:
        return [bounds]
    if end - start < length + 1:
        raise ValueError(f"bars [{start}, {end}) are too few for an episode of {length} steps; use fewer steps "
                         "(env.max_steps_in_episode) or walk the whole split")
    starts = np.random.default_rng(seed).integers(start, end - length, size=episodes)
    return [(int(s), int(s) + length + 1) for s in starts]


def advised_walk(run: LoadedRun, **changes) -> WalkFn:
    """A walk with the run's advisor as it was at the checkpoint: the LoRA adapter it had learned by then (saved
    beside the checkpoint), unless `changes` names another `adapter`."""
    saved = run.saved
    changes.setdefault("adapter", saved.adapter)
    return lambda bars, key: run.walker.walk(saved.params, saved.obs_norm, bars, key, greedy=not run.sampled,
                                             record=saved.advice_record, **changes)


def agent_walk(run: LoadedRun) -> WalkFn:
    """The trained agent as it acts: the policy alone, or for a hybrid run policy, advice, fusion and veto."""
    return advised_walk(run)


def ablation_walks(run: LoadedRun) -> dict[str, Policy]:
    """A hybrid run's parts (agents.evaluation.advised_walk.run_ablations): RL only, LLM only (HOLD where there is no advice),
    fused without and with the veto, whatever the run trained with, and LLM only from the frozen advisor when it
    learned. An RL-only run (llm: none) has none."""
    if not run.advised:
        return {}
    return {name: Policy(advised_walk(run, **changes), stochastic=run.sampled)
            for name, changes in run_ablations(run.cfg.hybrid).items()}


def baseline_walks(env: TradingEnv, market: Market) -> dict[str, Policy]:
    return {
        "flat": Policy(lambda bars, key: walk_split(env, market, bars, flat_policy, key, ()), stochastic=False),
        "random_valid": Policy(lambda bars, key: walk_split(env, market, bars, random_valid_policy, key, ()),
                               stochastic=True),
        "buy_and_hold": Policy(lambda bars, key: buy_and_hold(env, market, bars), stochastic=False),
    }


def mean_and_interval(values: list[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean and 95% Student-t interval of the mean (None for fewer than two values)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, None
    half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))
    return mean, (mean - half, mean + half)


def summarize_walks(walks: list[dict]) -> dict[str, Any]:
    """Every metric's mean over the walks (over those where it is defined), `n` walks and, for n > 1, `ci95`."""
    out: dict[str, Any] = {}
    ci95: dict[str, list[float]] = {}
    for name in [*METRICS, *(m for m in (*ADVICE_METRICS, *OVERFITTING_METRICS) if m in walks[0])]:
        values = [w[name] for w in walks if w[name] is not None]
        out[name], interval = mean_and_interval(values) if values else (None, None)
        if interval is not None:
            ci95[name] = list(interval)
    out["n"] = len(walks)
    if len(walks) > 1:
        out["ci95"] = ci95
    return out


@dataclass
class Evaluation:
    runs: list[LoadedRun]
    options: EvalOptions
    walks: dict[str, dict[str, list[dict]]]  # group -> policy -> metrics of each walk
    first_traces: dict[str, Trace] = field(default_factory=dict)  # policy -> its first walk (plots, trades.csv)
    bars: list[Bars] = field(default_factory=list)  # the walks of seed 0
    gates: list[dict] = field(default_factory=list)  # each gated walk's gate at its end: mode, why, evidence

    def summary(self) -> dict[str, Any]:
        """{"agent": {...}, "ablations": {name: {...}}, "baselines": {name: {...}}} plus what was evaluated."""
        setup = {
            "runs": [str(r.saved.run_dir) for r in self.runs],
            "checkpoints": [r.saved.label for r in self.runs],
            "data": self.runs[0].cfg.data.source,
            "instrument": {"description": describe(self.runs[0].market.contract),
                           **dataclasses.asdict(self.runs[0].market.contract)},
            "split": self.options.split,
            "episodes": self.options.episodes,
            "seeds": self.options.seeds,
            "greedy": not any(run.sampled for run in self.runs),
            "bars": [list(b) for b in self.bars],
            "period": [str(self.runs[0].market.timestamps[min(start for start, _ in self.bars)]),
                       str(self.runs[0].market.timestamps[max(end for _, end in self.bars) - 1])],
        }
        return {
            "setup": setup,
            "agent": summarize_walks(self.walks["agent"]["agent"]),
            "gated": summarize_walks(self.walks["gated"][GATED]),
            "gate": self.gates,
            "ablations": {k: summarize_walks(v) for k, v in self.walks["ablations"].items()},
            "baselines": {k: summarize_walks(v) for k, v in self.walks["baselines"].items()},
        }


def check_comparable(runs: list[LoadedRun]) -> None:
    """Several run folders are pooled as seeds of one agent: they must trade the same market under the same rules."""
    for run in runs[1:]:
        for section in ("data", "env"):
            if getattr(run.cfg, section) != getattr(runs[0].cfg, section):
                raise ConfigError(f"{run.saved.run_dir} and {runs[0].saved.run_dir} differ in their {section} config; "
                                  "evaluate them separately")


def evaluate(runs: list[LoadedRun], options: EvalOptions) -> Evaluation:
    """Walks every policy on the same bars for each evaluation seed (and each run, for the agent and ablations)."""
    check_comparable(runs)
    first = runs[0]
    bounds = walk_bounds(first.market, options.split)
    timestamps, rules, days = first.market.timestamps, first.cfg.env.prop_firm, first.market.sessions.day
    length = first.env.episode_steps(first.market)
    result = Evaluation(runs, options, {g: {} for g in GROUPS}, bars=episode_bars(bounds, options.episodes, length, 0))
    with ExitStack() as cleanup, Progress(transient=True, disable=not options.progress) as progress:
        for run in runs:
            cleanup.callback(run.close)  # advisor sidecars stop even when a walk fails
        policies = [("agent", {"agent": Policy(agent_walk(run), stochastic=run.sampled)}) for run in runs]
        policies += [("ablations", ablation_walks(run)) for run in runs]
        policies.append(("baselines", baseline_walks(first.env, first.market)))
        new_bars_per_seed = options.episodes > 0
        jobs = [(group, name, policy.walk, seed)
                for seed in range(options.seeds) for group, named in policies for name, policy in named.items()
                if seed == 0 or policy.stochastic or new_bars_per_seed]
        task = progress.add_task("walking", total=len(jobs) * len(result.bars))
        owners = {id(named["agent"].walk): run for (_, named), run in zip(policies, runs)}  # agent walk -> its run
        records = {id(run): out_of_sample(run.saved.run_dir, str(run.saved.step)) for run in runs}
        for group, name, walk, seed in jobs:
            progress.update(task, description=f"{name} (seed {seed})")
            key = jax.random.PRNGKey(seed)
            for i, bars in enumerate(episode_bars(bounds, options.episodes, length, seed)):
                trace = walk(bars, jax.random.fold_in(key, i))
                metrics = walk_metrics(trace, timestamps, rules, days)
                if "advice_valid" in trace:
                    metrics.update(walk_advice_metrics(trace))
                result.walks[group].setdefault(name, []).append(metrics)
                result.first_traces.setdefault(name, trace)
                if group == "agent":  # the agent's evidence: its overfitting figures, and the walk its gate allows
                    run = owners[id(walk)]
                    metrics.update(overfitting_metrics(run, trace))
                    gated, gate = gated_walk(run, trace, records[id(run)])
                    result.walks["gated"].setdefault(GATED, []).append(walk_metrics(gated, timestamps, rules, days))
                    result.gates.append({"mode": gate.mode, "reason": gate.reason(), "log_e": gate.log_e,
                                         "sessions": gate.sessions, "in_sample_sessions": gate.in_sample,
                                         "in_sample_end": gate.in_sample_end, "changes": gate.history})
                progress.advance(task)
    return result
