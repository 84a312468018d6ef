"""The host training loop (Brax/Stoix style): jitted PPO updates, metrics, evaluation and checkpoints.

    cfg = load_config("configs/quick.yaml")
    result = train(cfg, "runs/quick")             # a new run
    result = train(None, "runs/quick", resume=True)  # continue it exactly where its last checkpoint left off

Between updates the host logs the update's metrics (metrics.jsonl, TensorBoard, progress bar), runs the
validation-split evaluation every M updates (keeping the best checkpoint) and saves a checkpoint every N
updates. Ctrl-C (SIGINT) finishes the update in flight, saves a checkpoint and returns.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from tqdm import tqdm

from agents.advised_eval import AdvisedWalker, advised_summary, run_ablations
from agents.checkpoints import RunCheckpoints
from agents.config import ConfigError, TrainConfig, load_config, save_config
from agents.evaluation import Evaluator, always_when_valid, flat_policy, make_episode_evaluator, random_valid_policy
from agents.metrics import HealthMonitor, MetricsLogger
from agents.networks import update_flops_per_step
from agents.hybrid import QueryLoop, checkpoint_adapter, make_acting, prune_adapters
from agents.ppo import PPO, RunnerState, make_train
from agents.transfer import load_source, start_from
from bridge import SidecarError

CONFIG_FILE = "config.yaml"


@dataclass
class EnvSetup:
    env: Any  # a gymnax 1.0 Environment
    params: Any  # EnvParams used for training
    evaluate: Evaluator | None  # (act, act_params, key) -> {"score": ...}; None = no evaluation
    score_name: str  # the metrics key of the score: val_net_pnl or eval_return
    score_label: str  # what the score is, for people
    evaluate_test: Evaluator | None = None  # held-out split, only for the final summary (never for selection)
    market: Any = None  # the trading env's market (the hybrid loop renders prompts from it)
    baselines: dict[str, Callable] = field(default_factory=dict)  # name -> act, compared in the final summary


def make_env_setup(cfg: TrainConfig) -> EnvSetup:
    """The env `cfg.env_name` names: "trading" → jaxenv.TradingEnv on cfg.data; else a gymnax registry id."""
    if cfg.env_name == "trading":
        from jaxenv import TradingEnv, evaluate_policy, load_market
        from jaxenv.env import BUY, SELL

        market = load_market(cfg.data)
        env = TradingEnv(cfg.env)

        def on_split(split: str) -> Evaluator:
            def evaluate(act, act_params, key):
                result = evaluate_policy(env, market, split, act, key, policy_state=act_params)
                return {"score": result["net_pnl"], **result}

            return evaluate

        baselines = {"flat": flat_policy, "random_valid": random_valid_policy,
                     "always_long": always_when_valid(BUY), "always_short": always_when_valid(SELL)}
        return EnvSetup(env, env.make_params(market, "train"), on_split("val"), "val_net_pnl", "net P&L after costs",
                        on_split("test"), market=market, baselines=baselines)

    import gymnax

    if cfg.env_name not in gymnax.registered_envs:
        raise ConfigError(f"env_name: unknown env {cfg.env_name!r}; use 'trading' or a gymnax id such as CartPole-v1")
    env, params = gymnax.make(cfg.env_name)
    return EnvSetup(env, params, make_episode_evaluator(env, params, cfg.checkpoint.eval_episodes), "eval_return",
                    "mean return of fresh episodes", baselines={"action_0": flat_policy, "random": random_valid_policy})


@dataclass
class TrainResult:
    run_dir: Path
    update: int  # updates completed
    interrupted: bool
    state: RunnerState
    last_metrics: dict
    best_score: float | None
    setup: EnvSetup


class _StopFlag:
    """While installed, SIGINT sets a flag the loop checks between updates; a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.set = False
        self._previous = None

    def install(self) -> None:
        def handler(signum, frame):
            self.set = True
            signal.signal(signal.SIGINT, self._previous)
            print("\nCtrl-C: finishing this update and saving a checkpoint (press again to abort)", file=sys.stderr)

        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: Ctrl-C keeps its usual meaning
            self._previous = None

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def make_act(ppo: PPO, deterministic: bool) -> Callable:
    """act(act_params, obs, mask, key) for one env with act_params = (network params, obs normaliser); made once
    per run so evaluation compiles once."""

    def act(act_params, obs, mask, key):
        params, obs_norm = act_params
        return ppo.policy(params, obs_norm, obs, mask, key, deterministic)

    return act


class AgentEvaluator:
    """Scores a run's network on a split the way the run acts: the policy alone (the env setup's evaluator) or,
    for hybrid runs, with advice through an `AdvisedWalker` (its own sidecar, so training's pending queries are
    untouched). `ablation` (a key of agents.advised_eval.run_ablations(cfg)) scores one part of a hybrid agent."""

    def __init__(self, cfg: TrainConfig, ppo: PPO, setup: EnvSetup, adapter_for: Callable[[int], str | None] | None = None):
        """`adapter_for(update)`: the advisor's LoRA adapter at that update, for runs whose advisor learns."""
        self.setup = setup
        self.act = make_act(ppo, cfg.checkpoint.eval_deterministic)
        self.walker = None
        self.adapter_for = adapter_for if cfg.hybrid.learning.enabled else None
        self.ablations = run_ablations(cfg) if cfg.llm != "none" else {}
        if cfg.llm != "none" and cfg.hybrid.eval_with_advice and setup.market is not None:
            self.walker = AdvisedWalker(cfg, ppo, setup.env, setup.market)

    def splits(self) -> dict[str, Evaluator]:
        return {k: v for k, v in (("val", self.setup.evaluate), ("test", self.setup.evaluate_test)) if v is not None}

    def __call__(self, state: RunnerState, split: str, key: jax.Array, ablation: str | None = None) -> dict:
        if self.walker is None:
            return self.splits()[split](self.act, (state.params, state.obs_norm), key)
        changes = dict(self.ablations[ablation]) if ablation else {}
        if self.adapter_for is not None and "adapter" not in changes:
            changes["adapter"] = self.adapter_for(int(state.update))
        trace = self.walker.walk(state.params, state.obs_norm, split, key, **changes)
        result = advised_summary(trace)
        return {"score": result["net_pnl"], **result}

    def close(self) -> None:
        if self.walker is not None:
            self.walker.close()


def train(
    cfg: TrainConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    env_setup: EnvSetup | None = None,
) -> TrainResult:
    """Trains until cfg.num_updates (or `stop_after` more updates, or Ctrl-C). With `resume`, the config is read
    from RUN_DIR and the run continues from its latest finished checkpoint."""
    run_dir = Path(run_dir)
    if resume:
        if not (run_dir / CONFIG_FILE).exists():
            raise FileNotFoundError(f"--resume: {run_dir / CONFIG_FILE} not found; is {run_dir} a run folder?")
        cfg = load_config(run_dir / CONFIG_FILE)
    elif (run_dir / CONFIG_FILE).exists():
        raise FileExistsError(f"{run_dir} already holds a run; use --resume {run_dir} or another --run-dir")
    assert cfg is not None
    setup = env_setup or make_env_setup(cfg)  # before the run folder exists: bad data leaves nothing behind
    # --init-from: the source run is read and checked before the run folder exists too
    source = load_source(cfg, setup.env, setup.params) if cfg.transfer.init_from and not resume else None
    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / CONFIG_FILE)
    acting = make_acting(cfg, setup.env) if cfg.llm != "none" else None
    ppo = make_train(cfg, setup.env, setup.params, acting)
    ckpt = RunCheckpoints(run_dir, cfg.checkpoint.keep)

    init_key = jax.random.PRNGKey(cfg.seed)
    best_score: float | None = None
    if resume:
        state, host = ckpt.restore(jax.eval_shape(ppo.init, init_key))
        best_score = host.get("best_score")
        print(f"resumed {run_dir} at update {int(state.update)} / {cfg.num_updates}", file=sys.stderr)
    else:
        state = jax.jit(ppo.init)(init_key)
        if source is not None:
            state = start_from(state, source, cfg)
    start = int(state.update)

    flops = update_flops_per_step(cfg.network, ppo.obs_dim, ppo.num_actions, cfg.ppo.update_epochs)
    limit = getattr(setup.params, "max_steps_in_episode", None)
    health = HealthMonitor(cfg.log, ppo.num_actions, int(limit) if limit is not None else None)
    logger = MetricsLogger(run_dir, cfg.log.tensorboard, resume_update=start if resume else None)
    end = cfg.num_updates if stop_after is None else min(cfg.num_updates, start + stop_after)
    bar = tqdm(total=cfg.num_updates, initial=start, unit="upd", disable=not cfg.log.progress, dynamic_ncols=True)

    def host_state() -> dict:
        return {"update": int(state.update), "env_steps": int(state.update) * cfg.steps_per_update,
                "best_score": best_score, "seed": cfg.seed}

    metrics: dict = {}
    interrupted = False
    stop = _StopFlag()
    stop.install()  # from here on Ctrl-C stops at the next update boundary, with a checkpoint
    query_loop = None

    def adapter_now(update: int) -> str | None:  # the learning advisor's adapter, saved for this update
        return query_loop.save_adapter(run_dir, update)

    def save_checkpoint(update: int, best: bool = False) -> None:
        """A checkpoint, and beside it the learning advisor's adapter (adapters of dropped checkpoints go)."""
        (ckpt.save_best if best else ckpt.save_latest)(update, state, host_state())
        if query_loop is not None and query_loop.learning:
            query_loop.save_adapter(run_dir, update)
            prune_adapters(run_dir, set(ckpt.latest.all_steps()) | set(ckpt.best.all_steps()) | {update})

    evaluator = AgentEvaluator(cfg, ppo, setup, adapter_now)
    try:
        if acting is not None:  # chunks with LLM query steps between them; compiled on first use
            # A resumed run's advisor continues from the adapter it had learned by its checkpoint.
            resumed_adapter = checkpoint_adapter(cfg, run_dir, start) if resume else None
            query_loop = QueryLoop(cfg, ppo, setup.market, run_dir, adapter=resumed_adapter)
            update_fn, compile_s = query_loop.update, math.nan
        elif start < end:  # a finished run resumed has nothing to compile
            t0 = time.perf_counter()
            update_fn = jax.jit(ppo.update).lower(state).compile()
            compile_s = time.perf_counter() - t0
        for _ in range(start, end):
            if stop.set:
                interrupted = True
                break
            t_update = time.perf_counter()
            state, m = update_fn(state)
            m = jax.device_get(m)
            dt = time.perf_counter() - t_update
            update = int(state.update)
            metrics = _record(m, update, cfg, dt, flops)
            if update == start + 1:
                metrics["compile_s"] = compile_s
            if update == cfg.num_updates and query_loop is not None:
                # A round started at the last update would be lost; the final checkpoint's adapter includes it.
                metrics.update(query_loop.finish_round())

            if cfg.checkpoint.eval_every_updates and (
                update % cfg.checkpoint.eval_every_updates == 0 or update == cfg.num_updates
            ) and setup.evaluate is not None:
                result = evaluator(state, "val", jax.random.PRNGKey(cfg.seed + update))
                metrics.update({setup.score_name if k == "score" else f"eval_{k}": v for k, v in result.items()})
                if best_score is None or result["score"] > best_score:
                    best_score = float(result["score"])
                    save_checkpoint(update, best=True)

            warnings = health.check(metrics)
            if warnings:
                metrics["warnings"] = warnings
                for w in warnings:
                    bar.write(f"WARNING (update {update}): {w}")
            logger.log(metrics)
            bar.update(1)
            bar.set_postfix_str(_postfix(metrics, setup.score_name), refresh=False)

            if update % cfg.checkpoint.every_updates == 0 or update == cfg.num_updates:
                save_checkpoint(update)
        interrupted = interrupted or (stop.set and int(state.update) < end)
    finally:
        # Also on an exception: the last finished update is saved, then everything is flushed and closed.
        try:
            save_checkpoint(int(state.update))
        except SidecarError as error:  # the checkpoint is saved; only its adapter is missing
            print(f"WARNING: the advisor's adapter for update {int(state.update)} was not saved: {error}",
                  file=sys.stderr)
        finally:
            if query_loop is not None:
                query_loop.close()  # stops the sidecar and unlinks the shared memory
            evaluator.close()
        ckpt.wait()
        ckpt.close()
        logger.close()
        bar.close()
        stop.restore()

    update = int(state.update)
    if interrupted:
        print(f"interrupted at update {update}; checkpoint saved. Continue with: --resume {run_dir}", file=sys.stderr)
    return TrainResult(run_dir, update, interrupted, state, metrics, best_score, setup)


def _record(m: dict, update: int, cfg: TrainConfig, dt: float, flops: int) -> dict:
    """One metrics.jsonl line: counters and speed first, then the update's metrics; episode means are null
    when no episode ended during the update."""
    steps_per_s = cfg.steps_per_update / dt
    record: dict = {
        "update": update,
        "env_steps": update * cfg.steps_per_update,
        "steps_per_s": steps_per_s,
        "achieved_gflops": steps_per_s * flops / 1e9,
        "update_s": dt,
    }
    episodes = int(m["episodes"])
    for k, v in m.items():
        v = float(np.asarray(v))
        if k.startswith("episode_") or k == "win_rate":
            v = v if episodes > 0 else math.nan
        record[k] = v
    record["episodes"] = episodes
    return record


def _postfix(m: dict, score_name: str) -> str:
    parts = [f"{m['steps_per_s']:,.0f} steps/s"]
    for key, label in (("episode_return", "ret"), ("episode_pnl", "pnl"), ("entropy", "ent"), ("approx_kl", "kl"),
                       (score_name, "val")):
        v = m.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            parts.append(f"{label} {v:.3g}")
    return " ".join(parts)


def final_comparison(cfg: TrainConfig, run_dir: str | Path, setup: EnvSetup | None = None) -> dict:
    """Scores the run's best and latest checkpoints against the env's baselines (flat, random-valid, ...) with the run's
    evaluator (the validation split for the trading env, which also picked the best checkpoint) and, where the
    env has one, on the held-out test split. For hybrid runs the best checkpoint's parts are scored too (RL only,
    LLM only, fused with and without veto, and LLM only from the frozen advisor when it learned:
    agents.advised_eval.run_ablations). Writes RUN_DIR/summary.json."""
    setup = setup or make_env_setup(cfg)
    if setup.evaluate is None:
        return {}
    ppo = make_train(cfg, setup.env, setup.params, make_acting(cfg, setup.env) if cfg.llm != "none" else None)
    ckpt = RunCheckpoints(run_dir, cfg.checkpoint.keep)
    abstract = jax.eval_shape(ppo.init, jax.random.PRNGKey(cfg.seed))
    agents = {"latest": ckpt.restore(abstract)}
    if ckpt.best.latest_step() is not None:
        agents["best"] = ckpt.restore(abstract, best=True)
    ckpt.close()

    key = jax.random.PRNGKey(cfg.seed + 10_000)
    summary: dict = {"score": setup.score_label, **{f"{k}_update": host["update"] for k, (_, host) in agents.items()}}
    evaluator = AgentEvaluator(cfg, ppo, setup, lambda update: checkpoint_adapter(cfg, run_dir, update))
    try:
        for split, evaluate in evaluator.splits().items():
            scores = {f"agent_{k}": evaluator(state, split, key) for k, (state, _) in agents.items()}
            if evaluator.walker is not None:
                state = agents.get("best", agents["latest"])[0]
                scores.update({f"ablation_{name}": evaluator(state, split, key, name) for name in evaluator.ablations})
            scores.update({name: evaluate(baseline, (), key) for name, baseline in setup.baselines.items()})
            summary[split] = scores
    finally:
        evaluator.close()
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
