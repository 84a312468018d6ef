"""Train a PPO agent on the futures-trading env (or any gymnax env) with thousands of envs in one jitted program.

    python scripts/train.py --envs 4096
    python scripts/train.py --config configs/signal.yaml --seed 1 --set ppo.lr=1e-4
    python scripts/train.py --resume runs/20250101-120000

Writes a run folder: config.yaml (the resolved config), metrics.jsonl, tb/ (TensorBoard), checkpoints/ and, at
the end, summary.json (the best checkpoint against flat and random-valid baselines on the validation split).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from agents.config import FUSION_MODES, LLM_CHOICES, RUN_CONFIG_FILE, ConfigError, load_config
from bridge.protocol import NUM_ACTIONS
from jaxenv.synthetic import PRESETS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config file; unset keys keep their defaults (see configs/default.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key, nested with dots, e.g. --set ppo.lr=1e-4; repeatable")
    ap.add_argument("--envs", type=int, help="number of parallel environments (config num_envs)")
    ap.add_argument("--total-steps", type=int, help="environment steps to train, all envs together (total_steps)")
    ap.add_argument("--seed", type=int, help="random seed for init, envs and sampling (seed)")
    ap.add_argument("--data", help="market data: a CSV/Parquet file or synthetic:PRESET "
                    f"({', '.join(PRESETS)}); sets data.source")
    ap.add_argument("--llm", help=f"LLM advisor: {', '.join(LLM_CHOICES)} (default smollm2, the embedded model; none: RL only, the fastest path)")
    ap.add_argument("--llm-mode", choices=["score", "generate"], help=f"score: one forward pass scores the "
                    f"{NUM_ACTIONS} actions; generate: text answers parsed (hybrid.llm_mode)")
    ap.add_argument("--quantization", choices=["none", "int8", "int4"], help="bitsandbytes quantization of the "
                    "advisor (GPU) (hybrid.quantization)")
    ap.add_argument("--llm-adapter", metavar="PATH", help="a peft LoRA adapter directory for the advisor; saved in "
                    "the run's config, so evaluation loads it too (hybrid.llm_adapter)")
    ap.add_argument("--fusion", choices=FUSION_MODES, help="how advice changes actions: learned trust gate mixing "
                    "the two distributions (default), the seeds' priority rules, switch (valid advice acts, the policy elsewhere), or "
                    "none (queries for statistics only)")
    ap.add_argument("--query-interval", type=int, help="bars per block of the advice keys, k: the answer about a block "
                    "is in force during the next (hybrid.query.interval)")
    ap.add_argument("--llm-budget", help="most envs asked per query step: a number or auto (hybrid.budget)")
    ap.add_argument("--latency", choices=["strict", "async", "auto"], help="strict: wait for the previous query "
                    "step's answers (reproducible); async: never wait; auto (default): strict for the mock advisor, "
                    "async for a model (hybrid.latency)")
    ap.add_argument("--advisor-workers", help="advisor processes: a number or auto = one per GPU, 1 on CPU "
                    "(hybrid.sidecar_workers)")
    ap.add_argument("--no-veto", action="store_true", help="turn the risk veto off (hybrid.veto.enabled=false)")
    ap.add_argument("--log-llm", type=int, metavar="N", help="write N prompts and answers per update to "
                    "llm_log.jsonl (hybrid.log_llm)")
    ap.add_argument("--date-format", help="strptime format of the data file's timestamps (data.date_format)")
    ap.add_argument("--run-dir", help="run folder to create (default runs/<date>-<time>)")
    ap.add_argument("--init-from", metavar="RUN_DIR", help="start the networks from RUN_DIR's best checkpoint, "
                    "e.g. a 261-feature policy from a 228-feature run (transfer.init_from; see transfer.* keys)")
    ap.add_argument("--resume", metavar="RUN_DIR",
                    help="continue RUN_DIR from its latest checkpoint with its saved config (other options unused)")
    ap.add_argument("--from-intact", action="store_true", help="with --resume: if the latest checkpoint is damaged, "
                    "continue from the newest intact one (damaged ones are moved to checkpoints/damaged/)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (log.progress=false)")
    from agents.devices.parallel import add_device_flags

    add_device_flags(ap, processes=True)
    return ap.parse_args(argv)


def start(args: argparse.Namespace):
    """A new run from defaults ← --config ← flags, or --resume."""
    from agents.training.loop import train

    if args.resume:
        given = [name for name in ("config", "envs", "total_steps", "seed", "data", "run_dir", "init_from")
                 if getattr(args, name)]
        if given or args.overrides:
            flags = ", ".join("--" + g.replace("_", "-") for g in given) or "--set"
            raise ConfigError(f"--resume continues with the run's saved config; drop {flags}")
        return train(None, args.resume, resume=True, from_intact=args.from_intact, devices=args.devices)
    if args.from_intact:
        raise ConfigError("--from-intact goes with --resume RUN_DIR")
    overrides = list(args.overrides)
    for flag, key in (("envs", "num_envs"), ("total_steps", "total_steps"), ("seed", "seed"),
                      ("data", "data.source"), ("llm", "llm"), ("llm_mode", "hybrid.llm_mode"),
                      ("quantization", "hybrid.quantization"), ("fusion", "hybrid.fusion"),
                      ("query_interval", "hybrid.query.interval"), ("llm_budget", "hybrid.budget"),
                      ("latency", "hybrid.latency"), ("advisor_workers", "hybrid.sidecar_workers"),
                      ("log_llm", "hybrid.log_llm"), ("date_format", "data.date_format"),
                      ("init_from", "transfer.init_from"), ("devices", "devices")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    if args.llm_adapter is not None:  # absolute, so the run's config finds it from anywhere
        overrides.append(f"hybrid.llm_adapter={Path(args.llm_adapter).resolve()}")
    if args.no_progress:
        overrides.append("log.progress=false")
    if args.no_veto:
        overrides.append("hybrid.veto.enabled=false")
    cfg = load_config(args.config, overrides)
    import jax

    if jax.process_count() > 1 and not args.run_dir:
        raise ConfigError("--run-dir: several processes must name the one run folder they share")
    run_dir = Path(args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    from agents.devices.parallel import is_writer, make_mesh
    from agents.runs.lock import RunLock
    from agents.training.env_setup import make_env_setup
    from jaxenv.load_report import load_report

    make_mesh(cfg)  # num_envs splits over the devices, or exit 2 before anything is written
    lock = RunLock.acquire(run_dir) if is_writer() else None  # one writer per run folder: before the data is loaded
    try:
        setup = make_env_setup(cfg)  # the data is loaded, checked and reported before anything is written
    except BaseException:
        if lock is not None:
            lock.release(discard=True)  # bad data leaves no run folder behind
        raise
    if setup.market is not None and is_writer():
        print(load_report(setup.market, cfg.env), file=sys.stderr)
    return train(cfg, run_dir, env_setup=setup, lock=lock)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from agents.devices.parallel import is_writer
    from agents.runs.integrity import CheckpointDamaged
    from agents.runs.lock import RunLocked
    from agents.runs.saved_runs import CheckpointMismatch
    from agents.runs.storage import RunWriteError
    from agents.training.comparison import final_comparison
    from bridge import SidecarError
    from jaxenv import DataValidationError

    try:
        result = start(args)
    except (ConfigError, DataValidationError, FileNotFoundError, FileExistsError, CheckpointMismatch,
            CheckpointDamaged, RunLocked, SidecarError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunWriteError as e:  # the run stopped; what was written before is whole and --resume continues it
        print(f"error: {e}", file=sys.stderr)
        return 1
    if result.interrupted:  # 130 after Ctrl-C, 143 after SIGTERM: the shell's code for a process the signal ended
        return 128 + (result.stop_signal or signal.SIGINT)
    if not is_writer():  # process 0 compares and writes summary.json
        return 0
    cfg = load_config(result.run_dir / RUN_CONFIG_FILE)
    summary = final_comparison(cfg, result.run_dir, result.setup)
    for split in ("val", "test"):
        if split in summary:
            scores = "  ".join(f"{who} {r['score']:.2f}" for who, r in summary[split].items())
            print(f"{split} {summary['score']}: {scores}")
    if "test" in summary:  # the trading env: what the agent shows out of sample, and what trade.py will do with it
        for line in out_of_sample_lines(cfg, result.run_dir):
            print(line)
    print(f"run folder: {result.run_dir}")
    return 0


def out_of_sample_lines(cfg, run_dir: Path) -> list[str]:
    """The best checkpoint against flat on the test split, its deflated Sharpe ratio and the gate's verdict."""
    from agents.evaluation.report import verdict_lines
    from agents.evaluation.saved_run import out_of_sample
    from agents.evidence.eprocess import scale_of
    from agents.runs.trials import count_trials

    return verdict_lines(out_of_sample(run_dir, "best"), count_trials(run_dir, cfg), scale_of(cfg.env.prop_firm),
                         "best")

