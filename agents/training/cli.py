"""Train a PPO agent on the futures-trading env (or any gymnax env) with thousands of envs in one jitted program.

    python scripts/train.py --envs 4096
    python scripts/train.py --config configs/signal.yaml --seed 1 --set ppo.lr=1e-4
    python scripts/train.py --resume runs/20250101-120000
    python scripts/train.py --data NQ=nq.csv --data ES=es.csv --llm none   # several instruments, one account

Writes a run folder: config.yaml (the resolved config), metrics.jsonl, tb/ (TensorBoard), checkpoints/ and, at
the end, summary.json (the best checkpoint against flat and random-valid baselines on the validation split).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from agents.command_line import CommandParser, data_overrides, is_data_path, print_error
from agents.config import (
    FLAG_PREFIX,
    ConfigError,
    HybridConfig,
    add_config_flags,
    config_overrides,
    flag_name,
    load_config,
    refuse_set_learning,
    to_dict,
)
from jaxenv.config import EnvConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's options: the run's own (--config, --set, --run-dir, --resume, ...), the device flags, and one flag per
    config key, generated from the config's dataclasses with their comments as help (agents.config.add_config_flags:
    --ppo.lr, --hybrid.query.interval, ... and the short names --envs, --llm, --data, ...), each the same as --set."""
    ap = CommandParser(description=__doc__,
                       usage="%(prog)s [--config YAML] [--set KEY=VALUE] [--KEY VALUE ...] "
                                       "[--run-dir DIR | --resume DIR] (every config key is a flag: --help lists them)")
    ap.add_argument("--config", help="YAML config file; unset keys keep their defaults (see configs/default.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key, nested with dots, e.g. --set ppo.lr=1e-4; repeatable")
    ap.add_argument("--run-dir", help="run folder to create (default runs/<date>-<time>)")
    ap.add_argument("--resume", metavar="RUN_DIR",
                    help="continue RUN_DIR from its latest checkpoint with its saved config (other options unused)")
    ap.add_argument("--from-intact", action="store_true", help="with --resume: if the latest checkpoint is damaged, "
                    "continue from the newest intact one (damaged ones are moved to checkpoints/damaged/)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (log.progress=false)")
    ap.add_argument("--no-veto", action="store_true", help="turn the risk veto off (hybrid.veto.enabled=false)")
    ap.add_argument("--data", dest="data_items", action="append", metavar="PATH | SYMBOL=PATH",
                    help="the market: a CSV/Parquet file or synthetic:PRESET (data.source); or, repeated as "
                    "SYMBOL=PATH (e.g. --data NQ=nq.csv --data ES=es.csv), several instruments traded in one account, "
                    "in that order (data.instruments)")
    from agents.devices.parallel import add_device_flags

    add_device_flags(ap, processes=True)
    add_config_flags(ap)
    args = ap.parse_args(argv)
    if args.data_items and all(map(is_data_path, args.data_items)):  # one market: data.source's flag, as always
        setattr(args, FLAG_PREFIX + "data.source", args.data_items[-1])  # the last, as a flag given twice always took
        args.data_items = None
    return args


def absolute_adapter(override: str) -> str:
    """A `hybrid.sidecar.adapter=PATH` override with PATH made absolute, so the run's saved config finds it from anywhere;
    any other override as it is."""
    key, _, path = override.partition("=")
    return f"{key}={Path(path).resolve()}" if key == "hybrid.sidecar.adapter" and path else override


def start(args: argparse.Namespace):
    """A new run from defaults ← --config ← --set ← the config flags, or --resume."""
    from agents.training.loop import train

    flags = [*config_overrides(args), *data_overrides(args.data_items)]
    if args.resume:
        given = [f"--{name.replace('_', '-')}" for name in ("config", "run_dir") if getattr(args, name)]
        given += dict.fromkeys("--data" if o.startswith("data.instruments=") else flag_name(o.split("=", 1)[0])
                               for o in flags)
        if given or args.overrides:
            raise ConfigError(f"--resume continues with the run's saved config; drop {', '.join(given) or '--set'}")
        return train(None, args.resume, resume=True, from_intact=args.from_intact, devices=args.devices)
    if args.from_intact:
        raise ConfigError("--from-intact goes with --resume RUN_DIR")
    overrides = [absolute_adapter(o) for o in (*args.overrides, *flags)]
    if args.devices is not None:
        overrides.append(f"devices={args.devices}")
    if args.no_progress:
        overrides.append("log.progress=false")
    if args.no_veto:
        overrides.append("hybrid.veto.enabled=false")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as error:  # the data is checked too, so that one run names every input error
        raise ConfigError(*error.errors, *data_errors(args.config, overrides)) from None
    refuse_set_learning(cfg)
    import jax

    if jax.process_count() > 1 and not args.run_dir:
        raise ConfigError("--run-dir: several processes must name the one run folder they share")
    run_dir = Path(args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    from agents.devices.parallel import is_writer, make_mesh
    from agents.runs.lock import RunLock
    from agents.training.env_setup import make_env_setup
    from jaxenv.load_report import account_text, load_report

    # num_envs splits over the devices, or exit 2 before anything is written
    mesh = make_mesh(cfg.num_envs, cfg.devices)
    lock = RunLock.acquire(run_dir) if is_writer() else None  # one writer per run folder: before the data is loaded
    try:
        # the data is loaded, checked and reported before anything is written
        setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    except BaseException:
        if lock is not None:
            lock.release(discard=True)  # bad data leaves no run folder behind
        raise
    if setup.market_set is not None and is_writer():  # several instruments: the set's own report
        print("\n".join([*setup.market_set.report, f"{'account':<11} {account_text(cfg.env.prop_firm)}"]),
              file=sys.stderr)
    if setup.market is not None and is_writer():
        print(load_report(setup.market, cfg.env), file=sys.stderr)
        if cfg.llm not in ("none", "mock"):
            print(walk_keys_note(cfg.hybrid, cfg.llm, setup.market), file=sys.stderr)
    return train(cfg, run_dir, env_setup=setup, lock=lock, mesh=mesh)


DATA_SECTIONS = ("env_name", "env", "data")  # the config the data loader reads: the env, its instrument and the data


def data_errors(config: str | None, overrides: list[str]) -> list[str]:
    """For a config with errors: the data's error, if it has one, as the run would have met it once those are fixed
    (today's wording, one line), so that one run names every input error. The data is loaded and checked (no env
    built) as the config's DATA_SECTIONS alone name it on the defaults; none where those sections have errors
    themselves (the config's own lines name them) or the env is not the trading env."""
    from jaxenv import DataValidationError, load_market
    from jaxenv.market_set import load_market_set

    try:
        cfg = load_config(config, overrides, only=DATA_SECTIONS)
    except ConfigError:
        return []
    if cfg.env_name != "trading":
        return []
    try:
        if cfg.data.instruments:
            load_market_set([(item.contract, item.source) for item in cfg.data.instruments], cfg.data)
        else:
            load_market(cfg.data)
    except (DataValidationError, FileNotFoundError) as error:
        return [str(error)]
    return []


def walk_keys_note(hybrid: HybridConfig, llm: str, market) -> str:
    """A model advisor's walks ask every key they read before they read it: the validation split's at the first
    validation walk (the trainer waits) and the test split's at the end; say so up front, with how many."""
    from agents.advice.table import walk_keys
    from agents.advisor.store import store_root

    def keys(split: str) -> int:
        start, end = market.split_range(split)
        return len(walk_keys(start, end, hybrid.query.interval, hybrid.query.entries_only)) if end > start else 0

    return (f"advisor     the walks ask {llm} up to {keys('val'):,} validation keys (the first validation walk, "
            f"training waits) and {keys('test'):,} test keys (the end-of-run comparison): minutes on a CPU the first "
            f"time, none once the advice store ({store_root(hybrid, llm) or 'off'}) holds them; scripts/advise.py can "
            "ask them ahead")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from agents.devices.parallel import is_writer
    from agents.runs.integrity import CheckpointDamaged
    from agents.runs.lock import RunLocked
    from agents.runs.saved_runs import CheckpointMismatch
    from agents.runs.storage import RunWriteError
    from agents.runs.trials import count_trials
    from agents.training.comparison import final_comparison
    from bridge import SidecarError
    from jaxenv import DataValidationError

    try:
        result = start(args)
    except (ConfigError, DataValidationError, FileNotFoundError, FileExistsError, CheckpointMismatch,
            CheckpointDamaged, RunLocked, SidecarError) as e:
        print_error(e)  # every input error of a ConfigError: a line each
        return 2
    except RunWriteError as e:  # the run stopped; what was written before is whole and --resume continues it
        print_error(e)
        return 1
    if result.interrupted:  # 130 after Ctrl-C, 143 after SIGTERM: the shell's code for a process the signal ended
        return 128 + (result.stop_signal or signal.SIGINT)
    if not is_writer():  # process 0 compares and writes summary.json
        return 0
    cfg = result.cfg  # the run's resolved config, as saved in RUN_DIR/config.yaml
    summary = final_comparison(cfg, result.run_dir, result.setup)
    for split in ("val", "test"):
        if split in summary:
            scores = "  ".join(f"{who} {r['score']:.2f}" for who, r in summary[split].items())
            print(f"{split} {summary['score']}: {scores}")
    if "account" in summary:  # several instruments in one account: its figures, and the gate on its sessions
        trials = count_trials(result.run_dir, to_dict(cfg))
        for line in account_lines(summary, result.setup.market_set, trials, cfg.env, cfg.gate_against):
            print(line)
    elif "test" in summary:  # the trading env: what the agent shows out of sample, and what trade.py will do with it
        trials = count_trials(result.run_dir, to_dict(cfg))
        for line in out_of_sample_lines(result.run_dir, trials, cfg.env, cfg.gate_against):
            print(line)
    print(f"run folder: {result.run_dir}")
    return 0


def out_of_sample_lines(run_dir: Path, trials: int, env: EnvConfig, gate_against: str) -> list[str]:
    """The best checkpoint against flat on the test split, its deflated Sharpe ratio over `trials`
    (agents.runs.trials.count_trials) and the gate's verdict against the bar `gate_against`."""
    from agents.evaluation.report import verdict_lines
    from agents.evaluation.saved_run import out_of_sample
    from agents.evidence.eprocess import scale_of

    return verdict_lines(out_of_sample(run_dir, "best"), trials, scale_of(env.prop_firm), "best", gate_against)



def account_lines(summary: dict, market_set, trials: int, env: EnvConfig, gate_against: str) -> list[str]:
    """An account of several instruments at the end of its run: its test P&L against flat and the set's buy-and-hold,
    each instrument's P&L and trades, then the out-of-sample verdict and the gate's (agents.evaluation.report's lines)
    on the account's P&L per test session, against the set's buy-and-hold per session (the record trade.py's gate
    starts from: agents.evaluation.account_run.account_out_of_sample walks the same split)."""
    from agents.evaluation.report import account_lines as figure_lines
    from agents.evaluation.report import verdict_lines
    from agents.evaluation.saved_run import in_sample_end
    from agents.evidence.eprocess import scale_of
    from agents.evidence.gate import OutOfSample

    account = summary["account"]
    if "test" not in account:
        return []
    test = account["test"]
    checkpoint = test["agent"].removeprefix("agent_")
    names = " + ".join(account["symbols"])
    lines = figure_lines(test, f"test ({names}, {checkpoint} checkpoint)")
    sessions = summary["test"][test["agent"]]["sessions"]
    if not sessions["days"]:
        return lines
    record = OutOfSample(sessions["days"], sessions["pnl"], f"test split of the account {names}",
                         in_sample_end(market_set), buy_and_hold=sessions["held"], held=sessions["held"])
    verdict = verdict_lines(record, trials, scale_of(env.prop_firm), checkpoint, gate_against)
    return lines + verdict
