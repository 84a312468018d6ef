"""The host training loop (Brax/Stoix style): jitted PPO updates, metrics, evaluation and checkpoints.

    cfg = load_config("configs/quick.yaml")
    result = train(cfg, "runs/quick")             # a new run
    result = train(None, "runs/quick", resume=True)  # continue it exactly where its last checkpoint left off

Between updates the host logs the update's metrics (metrics.jsonl, TensorBoard, progress bar), runs the
validation-split evaluation every M updates (keeping the best checkpoint) and saves a checkpoint every N
updates. Ctrl-C (SIGINT) or SIGTERM finishes the update in flight, saves a checkpoint and returns.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from agents.advice.acting import training_acting
from agents.advisor.later_sessions import LATER_SESSIONS_PLOT, plot_later_sessions
from agents.advisor.query_loop import InstrumentQueryLoops, QueryLoop
from agents.config import (
    RUN_CONFIG_FILE,
    CheckpointConfig,
    TrainConfig,
    TransferConfig,
    load_config,
    refuse_set_learning,
    save_config,
    to_dict,
)
from agents.devices.parallel import (
    barrier,
    broadcast_from_writer,
    from_host,
    is_writer,
    make_mesh,
    print_banner,
    to_host,
)
from agents.evaluation.saved_run import save_run_data
from agents.rl.networks import update_flops_per_step
from agents.rl.ppo import PPO, RunnerState, make_train
from agents.rl.sharding import state_shardings
from agents.runs.adapters import checkpoint_adapter
from agents.runs.checkpoints import RunCheckpoints
from agents.runs.lock import RunLock
from agents.runs.saved_runs import SavedPolicy
from agents.runs.storage import RunWriteError
from agents.runs.trials import record_trial
from agents.training.env_setup import EnvSetup, make_env_setup
from agents.training.metrics import HealthMonitor, MetricsLogger
from agents.training.transfer import frozen_steps, load_source, start_from
from agents.training.update import Update
from agents.training.validation import AgentEvaluator
from bridge import SidecarError


@dataclass
class TrainResult:
    run_dir: Path
    update: int  # updates completed
    interrupted: bool
    state: RunnerState
    last_metrics: dict
    best_score: float | None
    setup: EnvSetup
    stop_signal: int | None = None  # the signal that interrupted the run (SIGINT or SIGTERM)
    cfg: TrainConfig | None = None  # the run's config (a resumed run's as read from its folder)


# Ctrl-C, and the polite stop of `timeout`, `kill` and cluster schedulers before they preempt a job
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StopFlag:
    """While installed, SIGINT or SIGTERM sets a flag the loop checks between updates; a second one (of either)
    interrupts at once."""

    def __init__(self):
        self.set = False
        self.signum: int | None = None  # the signal that set it
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        def handler(signum, frame):
            self.set, self.signum = True, signum
            self.restore()
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            tqdm.write(f"{name}: finishing this update and saving a checkpoint (send it again to abort)",
                       file=sys.stderr)

        try:
            self._previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
        except ValueError:  # not the main thread: the signals keep their usual meaning
            self._previous = {}

    def restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}


def train(
    cfg: TrainConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    env_setup: EnvSetup | None = None,
    lock: RunLock | None = None,
    from_intact: bool = False,
    devices: str | None = None,
    mesh: Mesh | None = None,
) -> TrainResult:
    """Trains until cfg.num_updates (or `stop_after` more updates, or Ctrl-C). With `resume`, the config is read
    from RUN_DIR and the run continues from its latest finished checkpoint (with `from_intact`, from the newest
    intact one when that is damaged). `devices` replaces a resumed run's `devices` (checkpoints fit any count).
    `env_setup` and `mesh` (agents.devices.parallel.make_mesh): what the caller already built of `cfg`, made here
    otherwise.

    The run folder is locked first (`lock`, if the caller took it already) and unlocked on any exit: a second
    writer gets RunLocked. A new run that fails before its first update is logged (bad data, a model that does not
    load) leaves no run folder behind. With several processes (agents/devices/parallel.py) only process 0 locks and writes.

    The library's entry takes the whole config; its set-up hands each part below it the sections it reads."""
    run_dir = Path(run_dir)
    lock = lock or (RunLock.acquire(run_dir, create=not resume) if is_writer() else None)
    started = [False]  # set once the first update is logged: from then on a failure leaves a run to resume
    try:
        result = _train(cfg, run_dir, resume, stop_after, env_setup, from_intact, started, devices, mesh)
    except BaseException:
        if lock is not None:
            lock.release(discard=not resume and not started[0])
        raise
    if lock is not None:
        lock.release()
    return result


def _train(cfg: TrainConfig | None, run_dir: Path, resume: bool, stop_after: int | None, env_setup: EnvSetup | None,
           from_intact: bool, started: list[bool], devices: str | None, mesh: Mesh | None) -> TrainResult:
    """The host loop: the run's set-up once, then per update the jitted update and the hooks after it (`cfg`: the
    whole config, as train's)."""
    run, state = _set_up(cfg, run_dir, resume, stop_after, env_setup, from_intact, devices, mesh)
    cfg = run.cfg
    save, log = _Checkpoints(run), _Log(run.logger, run.ckpt, started, run.start)
    metrics: dict = {}
    failed = write_failed = False
    stop = _StopFlag()
    stop.install()  # from here on Ctrl-C or SIGTERM stops at the next update boundary, with a checkpoint
    evaluator = query_loop = None
    try:
        if run.acting is not None:  # chunks with LLM query steps between them; compiled on first use
            # A resumed run's advisor continues from the adapter it had learned by its checkpoint.
            adapter = checkpoint_adapter(cfg.hybrid, run_dir, run.start) if resume else None
            if run.setup.market_set is None:
                query_loop = QueryLoop(cfg.hybrid, cfg.llm, cfg.env, cfg.data, run.setup.market, run_dir,
                                       adapter=adapter, seed=cfg.seed, num_steps=cfg.ppo.num_steps)
            else:  # an account: one advisor per instrument
                query_loop = InstrumentQueryLoops(cfg.hybrid, cfg.llm, cfg.env, cfg.data, run.setup.market_set,
                                                  run_dir, seed=cfg.seed, num_steps=cfg.ppo.num_steps)
            save.with_advisor(query_loop)
        # validation walks: the policy alone, or with the advisor (a sidecar of the walks' own, at normal priority)
        evaluator = AgentEvaluator(run.ppo, run.setup, cfg.hybrid, cfg.llm, cfg.env, cfg.data, save.adapter,
                                   log_dir=run_dir if run.writer else None, normalize_obs=cfg.ppo.normalize_obs,
                                   greedy=cfg.checkpoint.eval_deterministic, progress=cfg.log.progress)
        step = _Step(Update(run.ppo, cfg.ppo.num_steps, run.setup.params, query_loop),
                     steps_per_update=cfg.steps_per_update, flops=run.flops, start=run.start)
        if query_loop is None and run.start < run.end:  # a finished run resumed has nothing to compile
            step.update_fn.compile(state, run.shardings)
        hooks = _hooks(run, save, log, evaluator, query_loop)
        for _ in range(run.start, run.end):
            if stop.set:  # Ctrl-C or SIGTERM: the update in flight was the last
                break
            state, metrics = step(state)
            for hook in hooks:
                hook(metrics["update"], state, metrics)
        interrupted = stop.set and int(state.update) < run.end
    except BaseException as error:
        failed, write_failed = True, isinstance(error, RunWriteError)
        raise
    finally:
        # Also on an exception: the last logged update is saved (not after a failed write, and not for a new run
        # that never got going: its folder is discarded), then everything is flushed and closed.
        try:
            if int(state.update) == log.last and not write_failed and (started[0] or resume or not failed):
                save(state)
        except SidecarError as error:  # the checkpoint is saved; only its adapter is missing
            tqdm.write(f"WARNING: the advisor's adapter for update {int(state.update)} was not saved: {error}",
                       file=sys.stderr)
        finally:
            for part in (evaluator, query_loop):  # the advisor's close stops its sidecar, unlinks the shared memory
                if part is not None:
                    part.close()
        _close(run, failed)
        stop.restore()
    if interrupted:
        print(f"interrupted at update {int(state.update)}; checkpoint saved. Continue with: --resume {run_dir}",
              file=sys.stderr)
    return TrainResult(run_dir, int(state.update), interrupted, state, metrics, save.best_score, run.setup,
                       stop.signum if interrupted else None, cfg)


@dataclass
class _Run:
    """What a run's set-up builds once, before its first update."""

    cfg: TrainConfig
    run_dir: Path
    resume: bool
    writer: bool  # process 0: it writes the run folder
    setup: EnvSetup
    acting: Any  # the advisor's acting interface; None without an advisor (--llm none)
    ppo: PPO
    ckpt: RunCheckpoints
    shardings: Any
    best_score: float | None  # its best validation score so far
    start: int  # the update it starts from
    end: int  # the update it stops at (cfg.num_updates, or sooner with stop_after)
    flops: int  # an update's flops per env step
    health: HealthMonitor
    logger: MetricsLogger | None  # process 0's
    bar: tqdm


def _set_up(cfg: TrainConfig | None, run_dir: Path, resume: bool, stop_after: int | None, env_setup: EnvSetup | None,
            from_intact: bool, devices: str | None, mesh: Mesh | None) -> tuple[_Run, RunnerState]:
    """The run's config, mesh, env, PPO, checkpoints, log and progress bar, and the state it starts from (not kept
    in _Run: the loop's updates replace it). A new run's folder is written here (config.yaml, its data's zone and
    interval), once its data and any --init-from source are checked. Like train, it takes the whole config (None
    for a resumed run: its folder's) and hands each part the sections it reads."""
    cfg = _run_config(run_dir, resume, devices) or cfg  # a resumed run's, or the new run's as given
    assert cfg is not None
    refuse_set_learning(cfg)
    # num_envs must split over the devices: before anything is written
    mesh = make_mesh(cfg.num_envs, cfg.devices) if mesh is None else mesh
    barrier("jaxfutures-run-checked")  # every process has looked at the folder before process 0 writes to it
    print_banner(mesh, cfg.llm)
    # before config.yaml is written: bad data leaves no run behind
    setup = env_setup or make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)

    def read_source() -> SavedPolicy:  # --init-from: the run it names, checked to fit this one
        return load_source(cfg.transfer, cfg.network, cfg.env_name, cfg.env.window, setup.env, setup.params)

    # --init-from: the source run is read and checked before config.yaml is written too
    source = read_source() if cfg.transfer.init_from and not resume else None
    writer = is_writer()
    if not resume and writer:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / RUN_CONFIG_FILE)
        if setup.market is not None:  # the stamps' zone and interval its data resolved: trade.py reads files so
            save_run_data(run_dir, setup.market)
    acting = training_acting(cfg.hybrid, cfg.llm, setup.env)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, acting, mesh, num_envs=cfg.num_envs,
                     num_updates=cfg.num_updates,
                     frozen_steps=frozen_steps(cfg.ppo, cfg.transfer, cfg.steps_per_update))
    ckpt = RunCheckpoints(run_dir, cfg.checkpoint.keep)

    shardings = state_shardings(jax.eval_shape(ppo.init, jax.random.PRNGKey(cfg.seed), setup.params), mesh,
                                cfg.num_envs)
    state, best_score = _starting_state(ppo, setup, ckpt, shardings, run_dir, resume, from_intact, source, read_source,
                                        cfg.transfer, seed=cfg.seed, num_updates=cfg.num_updates,
                                        steps_per_update=cfg.steps_per_update)
    start = int(state.update)

    limit = getattr(setup.params, "max_steps_in_episode", None)
    if setup.market_set is None:
        flops = update_flops_per_step(cfg.network, ppo.obs_dim, ppo.num_actions, cfg.ppo.update_epochs)
        health = HealthMonitor(cfg.log, ppo.num_actions, int(limit) if limit is not None else None)
    else:  # an account: each of its I heads reads [row_i, mean of rows, account block] (the critic fewer: counted as
        # many), and its entropy is summed over the heads, at most I·log(A) = log(A^I)
        heads = setup.market_set.num_instruments
        flops = heads * update_flops_per_step(cfg.network, 2 * ppo.obs_dim + setup.env.account_obs_size,
                                              ppo.num_actions, cfg.ppo.update_epochs)
        health = HealthMonitor(cfg.log, ppo.num_actions ** heads, int(limit))
    logger = MetricsLogger(run_dir, cfg.log.tensorboard, resume_update=start if resume else None) if writer else None
    end = cfg.num_updates if stop_after is None else min(cfg.num_updates, start + stop_after)
    bar = tqdm(total=cfg.num_updates, initial=start, unit="upd", disable=not (cfg.log.progress and writer),
               dynamic_ncols=True)
    return _Run(cfg, run_dir, resume, writer, setup, acting, ppo, ckpt, shardings, best_score, start, end, flops,
                health, logger, bar), state


def _close(run: _Run, failed: bool) -> None:
    """Flushes and closes the run's checkpoints, its log (and plots the learning advisor's later sessions, unless
    the run failed) and its progress bar."""
    run.ckpt.wait()
    run.ckpt.close()
    if run.logger is not None:
        run.logger.close()
        if run.cfg.hybrid.learning.enabled and not failed:
            plot_later_sessions(run.run_dir / "metrics.jsonl", run.run_dir / LATER_SESSIONS_PLOT)
    run.bar.close()


class _Step:
    """`step(state) -> (state, metrics)`: one update (agents.training.update.Update) and its metrics.jsonl line
    (_record), with the compile time on the first update's."""

    def __init__(self, update_fn: Update, *, steps_per_update: int, flops: int, start: int):
        self.update_fn, self.steps_per_update, self.flops, self.start = update_fn, steps_per_update, flops, start

    def __call__(self, state: RunnerState) -> tuple[RunnerState, dict]:
        t_update = time.perf_counter()
        state, m = self.update_fn(state)
        dt = time.perf_counter() - t_update
        update = int(state.update)
        metrics = _record(m, update, dt, steps_per_update=self.steps_per_update, flops=self.flops)
        if update == self.start + 1:
            metrics["compile_s"] = self.update_fn.compile_s
        return state, metrics


class _Checkpoints:
    """`save(state, best=False)`: a checkpoint, and beside it the learning advisor's adapter (adapters of dropped
    checkpoints go). Whole arrays are saved (gathered from every process), so a run resumes on any number of
    devices. Every checkpoint records the run's best validation score so far (`best_score`)."""

    def __init__(self, run: _Run):
        self.ckpt, self.run_dir, self.writer = run.ckpt, run.run_dir, run.writer
        self.steps_per_update, self.seed = run.cfg.steps_per_update, run.cfg.seed
        self.best_score = run.best_score
        self.query_loop: QueryLoop | None = None  # the advisor, once started

    def offer_best(self, state: RunnerState, score: float) -> None:
        """Saves `state` as the best checkpoint if `score` beats the best so far."""
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            self(state, best=True)

    def __call__(self, state: RunnerState, best: bool = False) -> None:
        update = int(state.update)
        whole = to_host(state)
        if self.writer:
            host = {"update": update, "env_steps": update * self.steps_per_update, "best_score": self.best_score,
                    "seed": self.seed}
            (self.ckpt.save_best if best else self.ckpt.save_latest)(update, whole, host)
        barrier(f"jaxfutures-saved-{'best' if best else 'latest'}-{update}")
        if self.query_loop is not None:
            self.query_loop.checkpoint(self.run_dir, update,
                                       set(self.ckpt.latest.all_steps()) | set(self.ckpt.best.all_steps()))

    def with_advisor(self, query_loop: QueryLoop) -> None:
        """From now on each checkpoint saves the advisor's store and, for one that learns, its adapter too."""
        self.query_loop = query_loop

    def adapter(self, update: int) -> str | None:
        """The learning advisor's adapter, saved for this update (the validation walks advise with it)."""
        return self.query_loop.save_adapter(self.run_dir, update)


# The hooks: what the host does after each update, each called as hook(update, state, metrics) in _hooks' order;
# a hook adds its figures to the update's metrics before the metrics line is written.


def _hooks(run: _Run, save: _Checkpoints, log: _Log, evaluator: AgentEvaluator, query_loop: QueryLoop | None) -> list:
    cfg = run.cfg
    hooks = (
        _FinishRound(query_loop, cfg.num_updates) if query_loop is not None else None,
        _Validation(cfg.checkpoint, cfg.num_updates, cfg.seed, evaluator, run.setup, run.bar, save),
        _Health(run.health, run.bar, run.writer),
        log,
        _Trial(run.run_dir, to_dict(cfg), run.start + 1) if not run.resume and run.writer else None,
        _Bar(run.bar, run.setup.score_name),
        _Every(cfg.checkpoint, cfg.num_updates, save),
    )
    return [hook for hook in hooks if hook is not None]


class _FinishRound:
    """At the last update, the advisor's learning round in flight is finished: a round started at the last update
    would be lost; the final checkpoint's adapter includes it."""

    def __init__(self, query_loop: QueryLoop, num_updates: int):
        self.query_loop, self.num_updates = query_loop, num_updates

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        if update == self.num_updates:
            metrics.update(self.query_loop.finish_round())


class _Validation:
    """Every `eval_every_updates` updates and at the last: the validation split's walk, its figures into the
    metrics, and a best checkpoint when its score is the best so far. The walk has its own progress line: the
    bar's clock is moved on by the walk's time, so its rate and ETA are the updates' (the first advised walk can
    take minutes, and would otherwise read as hours left)."""

    def __init__(self, checkpoint: CheckpointConfig, num_updates: int, seed: int, evaluator: AgentEvaluator,
                 setup: EnvSetup, bar: tqdm, save: _Checkpoints):
        self.every, self.num_updates, self.seed = checkpoint.eval_every_updates, num_updates, seed
        self.evaluator, self.setup, self.bar, self.save = evaluator, setup, bar, save

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        if not (self.every and (update % self.every == 0 or update == self.num_updates)
                and self.setup.evaluate is not None):
            return
        # on this process's first device, from host copies of the (replicated) networks
        policy = state.replace(params=jax.device_get(state.params), obs_norm=jax.device_get(state.obs_norm))
        t_walk = time.perf_counter()
        result = self.evaluator(policy, "val", jax.random.PRNGKey(self.seed + update))
        if not self.bar.disable:
            walked = time.perf_counter() - t_walk
            self.bar.start_t += walked
            self.bar.last_print_t += walked
        # (an account's per-instrument and per-session figures stay out of the metrics line: summary.json has them)
        metrics.update({self.setup.score_name if k == "score" else f"eval_{k}": v for k, v in result.items()
                        if not isinstance(v, dict)})
        # every process walked; process 0's score decides, so all save (a collective) or none do
        score = broadcast_from_writer(float(result["score"]))
        self.save.offer_best(state, score)


class _Health:
    """The ways PPO runs go wrong (agents.training.metrics.HealthMonitor): warnings into the metrics, and on
    process 0 above the bar."""

    def __init__(self, monitor: HealthMonitor, bar: tqdm, writer: bool):
        self.monitor, self.bar, self.writer = monitor, bar, writer

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        warnings = self.monitor.check(metrics)
        if warnings:
            metrics["warnings"] = warnings
            for w in warnings if self.writer else ():
                self.bar.write(f"WARNING (update {update}): {w}")


class _Log:
    """The update's metrics line (metrics.jsonl and TensorBoard, process 0's `logger`); a failed write stops the
    run with a RunWriteError naming the last good checkpoint. `last`: the latest update logged (a checkpoint is only
    ever taken of such an update); `started[0]` is set at the first."""

    def __init__(self, logger: MetricsLogger | None, ckpt: RunCheckpoints, started: list[bool], start: int):
        self.logger, self.ckpt, self.started, self.last = logger, ckpt, started, start

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        try:
            if self.logger is not None:
                self.logger.log(metrics)
        except RunWriteError as error:
            good = self.ckpt.latest_good()
            raise RunWriteError(f"{error}; " + (f"the last good checkpoint is latest/{good}" if good is not None
                                                else "no checkpoint was saved yet")) from error
        self.last, self.started[0] = update, True


class _Trial:
    """A new run's trial on its data, recorded (process 0) once its first update is logged, for the deflated
    Sharpe ratio: a run that died before was never tried."""

    def __init__(self, run_dir: Path, settings: dict, first: int):
        """`settings`: the run's whole config as data (agents.config.to_dict), which its trial is a digest of."""
        self.run_dir, self.settings, self.first = run_dir, settings, first

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        if update == self.first:
            record_trial(self.run_dir, self.settings)


class _Bar:
    """The progress bar: an update done, and its figures (_postfix) with the latest validation score and the
    learning advisor's latest version judged on later sessions."""

    def __init__(self, bar: tqdm, score_name: str):
        self.bar, self.score_name = bar, score_name
        self.last_val: tuple[int, float] | None = None  # (update, score) of the latest validation walk
        self.last_later: tuple[float, float] | None = None  # (version, accuracy) of the latest judged on later sessions

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        self.bar.update(1)
        if metrics.get(self.score_name) is not None:
            self.last_val = (update, metrics[self.score_name])
        if "lora_later_accuracy" in metrics:
            self.last_later = (metrics["lora_later_version"], metrics["lora_later_accuracy"])
        self.bar.set_postfix_str(_postfix(metrics, self.score_name, self.last_val, self.last_later), refresh=False)


class _Every:
    """The periodic checkpoint: every `every_updates` updates, and at the last."""

    def __init__(self, checkpoint: CheckpointConfig, num_updates: int, save: _Checkpoints):
        self.every, self.num_updates, self.save = checkpoint.every_updates, num_updates, save

    def __call__(self, update: int, state: RunnerState, metrics: dict) -> None:
        if update % self.every == 0 or update == self.num_updates:
            self.save(state)


def _run_config(run_dir: Path, resume: bool, devices: str | None) -> TrainConfig | None:
    """A resumed run's config, from its folder (with `devices` replaced); None for a new run (whose config is the one
    given), once its folder is found to hold no run yet."""
    if resume:
        if not (run_dir / RUN_CONFIG_FILE).exists():
            raise FileNotFoundError(f"--resume: {run_dir / RUN_CONFIG_FILE} not found; is {run_dir} a run folder?")
        return load_config(run_dir / RUN_CONFIG_FILE, [f"devices={devices}"] if devices else None)
    if (run_dir / RUN_CONFIG_FILE).exists():
        raise FileExistsError(f"{run_dir} already holds a run; use --resume {run_dir} or another --run-dir")
    return None


def _starting_state(ppo, setup: EnvSetup, ckpt: RunCheckpoints, shardings, run_dir: Path, resume: bool,
                    from_intact: bool, source: SavedPolicy | None, read_source: Callable[[], SavedPolicy],
                    transfer: TransferConfig, *, seed: int, num_updates: int,
                    steps_per_update: int) -> tuple[RunnerState, float | None]:
    """(the state the run starts from, its best validation score so far): a resumed run's latest checkpoint (the
    newest intact one with `from_intact`), or a fresh init, its networks copied from `source` (--init-from; a resumed
    run that starts over reads it with `read_source()`)."""
    init_key = jax.random.PRNGKey(seed)
    jitted = jax.jit(ppo.init, out_shardings=shardings)  # each process computes only its own envs' shards

    def init(key):
        return jitted(key, setup.params)

    def transferred(state: RunnerState, source) -> RunnerState:  # on whole arrays, then over the mesh again
        whole = jax.tree.map(jax.numpy.asarray, to_host(state))
        return from_host(start_from(whole, source, transfer, steps_per_update), shardings)

    if resume and ckpt.latest_step() is None and not ckpt.root.joinpath("damaged").exists():
        # It stopped before its first checkpoint (e.g. the disk was full): the run starts over, as it began.
        print(f"note: {run_dir} has no checkpoint yet; starting it again from update 0", file=sys.stderr)
        state = init(init_key)
        if transfer.init_from:
            state = transferred(state, read_source())
        return state, None
    if resume:
        try:
            # Process 0 first (it sets damaged or unfinished checkpoints aside), then the others read what is left.
            for turn in (True, False):
                if is_writer() == turn:
                    state, host = ckpt.restore(jax.eval_shape(ppo.init, init_key, setup.params),
                                               from_intact=from_intact)
                barrier(f"jaxfutures-restored-{turn}")
        except BaseException:
            ckpt.close()
            raise
        state = from_host(state, shardings)  # checkpoints hold whole arrays: laid out for this run's devices
        print(f"resumed {run_dir} at update {int(state.update)} / {num_updates}", file=sys.stderr)
        return state, host.get("best_score")
    state = init(init_key)
    return (transferred(state, source) if source is not None else state), None


def _record(m: dict, update: int, dt: float, *, steps_per_update: int, flops: int) -> dict:
    """One metrics.jsonl line: counters and speed first, then the update's metrics; episode means are null
    when no episode ended during the update."""
    steps_per_s = steps_per_update / dt
    record: dict = {
        "update": update,
        "env_steps": update * steps_per_update,
        "steps_per_s": steps_per_s,
        "achieved_gflops": steps_per_s * flops / 1e9,
        "update_s": dt,
    }
    episodes = int(m["episodes"])
    for k, v in m.items():
        if np.ndim(v):  # an account's per-instrument figures [I] (instrument_trades, instrument_pnl): a list
            record[k] = np.asarray(v, np.float64).tolist()
            continue
        v = float(np.asarray(v))
        if k.startswith("episode_") or k == "win_rate":
            v = v if episodes > 0 else math.nan
        record[k] = v
    record["episodes"] = episodes
    return record


def _postfix(m: dict, score_name: str, last_val: tuple[int, float] | None = None,
             last_later: tuple[float, float] | None = None) -> str:
    """The bar's figures. `pnl` is in-sample (the training envs' episodes); beside it, on every update, the latest
    out-of-sample one: the validation walk's score and the update it was taken at; for an advisor that learns, its
    version in force, its rounds and the latest version judged on later sessions (`last_later`: version, accuracy)."""
    parts = [f"{m['steps_per_s']:,.0f} steps/s"]
    for key, label in (("episode_return", "ret"), ("episode_pnl", "pnl (train)"), ("entropy", "ent"),
                       ("approx_kl", "kl")):
        v = m.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            parts.append(f"{label} {v:.3g}")
    if last_val is not None:
        parts.append(f"val {last_val[1]:.3g} @{last_val[0]}")
    if "llm_rate" in m:  # a hybrid run: the share of decisions advised, and the advisor's answers per second
        parts.append(f"advised {m['advice_coverage']:.1%} at {m['llm_rate']:.1f}/s")
    if "lora_version" in m:
        parts.append(f"advisor v{m['lora_version']:.0f} ({m['lora_rounds']:.0f} rounds"
                     + (f", v{last_later[0]:.0f} later acc {last_later[1]:.2f})" if last_later else ")"))
    # bind_on=record: the advice's evidence E, its bar and sessions, and whether it binds (an account's per instrument:
    # record_log_e_NQ, ...)
    for suffix in ("",) if "record_log_e" in m else [k[len("record_sessions"):] for k in m
                                                       if k.startswith("record_sessions_")]:
        parts.append(f"record{suffix.replace('_', ' ')} E {math.exp(m['record_log_e' + suffix]):.3g}/"
                     f"{math.exp(m['record_log_e_bar' + suffix]):.0f} ({m['record_sessions' + suffix]:.0f} sessions"
                     f"{', bound' if m['record_bound' + suffix] else ''})")
    return " ".join(parts)


