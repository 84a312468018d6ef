"""Filling the advice store ahead of training (`python scripts/advise.py`): every key (bar block × position side) of
the chosen splits that the store has no answer for is asked, in batches at the advisor's full rate, with a progress
bar. The store is saved every SAVE_EVERY_S seconds and on Ctrl-C, so a second run continues where the first
stopped. On several instruments (`--data NQ=a.csv --data ES=b.csv`) each instrument's store is filled in turn, its
keys on the set's joint timeline (agents.advisor.instrument_set)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from contextlib import closing

import numpy as np
from tqdm import tqdm

from agents.advice.table import walk_keys
from agents.advisor.advisor import Advisor, ask_every
from agents.advisor.sidecar import at_full_rate
from agents.advisor.store import store_root
from agents.command_line import CommandParser, data_overrides, print_error
from agents.config import ConfigError, HybridConfig, add_config_flags, config_overrides, load_config
from jaxenv.config import DataConfig, EnvConfig

SAVE_EVERY_S = 60.0
SPLITS = ("train", "val", "test")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__)
    ap.add_argument("--config", help="YAML config file, as for train.py (its data, advisor, template, interval)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key, e.g. --set hybrid.query.interval=10; repeatable")
    ap.add_argument("--splits", default="train,val,test",
                    help=f"comma-separated splits whose keys to fill, of {', '.join(SPLITS)} (default: all)")
    ap.add_argument("--batch", type=int, help="prompts per submission (default hybrid.link.max_budget)")
    ap.add_argument("--data", dest="data_items", action="append", metavar="PATH | SYMBOL=PATH",
                    help="the market: a CSV/Parquet file or synthetic:PRESET (data.source); or, repeated as "
                    "SYMBOL=PATH, the instruments of an account, each instrument's store filled in turn")
    add_config_flags(ap)  # every config key a flag, as train.py's: --data, --llm, --llm-adapter, --store, ...
    return ap.parse_args(argv)


def split_keys(market, splits: list[str], interval: int, entries_only: bool) -> np.ndarray:
    """The keys walks over `splits` read (agents.advice.table.walk_keys), each once."""
    keys = [walk_keys(*market.split_range(split), interval, entries_only) for split in splits]
    return np.unique(np.concatenate(keys))


def fill(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *config_overrides(args), *data_overrides(args.data_items)]
    cfg = load_config(args.config, overrides)
    hybrid = cfg.hybrid
    if not any(o.startswith(("hybrid.sidecar.threads=", "hybrid.sidecar.nice=")) for o in overrides):
        hybrid = at_full_rate(hybrid)  # nothing else runs beside a fill
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ConfigError(f"--splits: {', '.join(bad) or 'none given'}: choose among {', '.join(SPLITS)}")
    result = fill_store(hybrid, cfg.llm, cfg.env, cfg.data, splits, args.batch)
    if result["stopped"]:
        print("stopped (Ctrl-C): the answers so far are saved; run the same command again to continue",
              file=sys.stderr)
        return 130
    return 0


def fill_store(hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig, splits: list[str],
               batch: int | None = None, progress: bool = True) -> dict:
    """Asks every key of `splits` the run's store has no answer for; {asked, answered, seconds, keys_per_s, filled,
    keys, stopped} (filled: the store's share of the splits' keys after). On a set of instruments (data.instruments)
    each instrument's store is filled in turn (agents.advisor.instrument_set) and the figures are the sums, with
    each instrument's under `instruments`."""
    if llm == "none":
        raise ConfigError("--llm none: there is no advisor to ask")
    root = store_root(hybrid, llm)
    if root is None:
        raise ConfigError("hybrid.store: no store for this advisor (the mock's default); pass --store PATH")
    batch = int(batch or hybrid.link.max_budget)
    stopped: list[bool] = []  # Ctrl-C while asking: the batches in flight finish, the store is saved
    if not data.instruments:
        from jaxenv import load_market

        market = load_market(data)
        # its workers start when there is a key to ask
        advisor = Advisor.open(hybrid, llm, env, data, market, batch, None, start=False)
        try:
            return _fill(advisor, market, splits, hybrid, batch, progress, stopped, "")
        finally:
            advisor.close()  # saves the store
    from agents.advisor.instrument_set import each_advisor
    from jaxenv.market_set import load_market_set

    market_set = load_market_set([(item.contract, item.source) for item in data.instruments], data)
    each = {}
    with closing(each_advisor(hybrid, llm, env, data, market_set, batch, stop=lambda: bool(stopped),
                              start=False)) as advisors:
        for i, advisor in advisors:
            each[market_set.symbols[i]] = _fill(advisor, market_set.markets[i], splits, hybrid, batch, progress,
                                                stopped, f"{market_set.symbols[i]}: ")
    total = {name: sum(r[name] for r in each.values()) for name in ("asked", "answered", "seconds", "keys")}
    filled = sum(r["filled"] * r["keys"] for r in each.values()) / max(total["keys"], 1)  # of the instruments reached
    return {**total, "keys_per_s": total["answered"] / max(total["seconds"], 1e-9), "filled": filled,
            "stopped": bool(stopped), "instruments": each}


def _fill(advisor: Advisor, market, splits: list[str], hybrid: HybridConfig, batch: int, progress: bool,
          stopped: list[bool], label: str) -> dict:
    """Asks `advisor` every key of `splits` of `market` its store lacks, until `stopped` holds something; `label`
    starts its lines (an instrument of a set: its symbol)."""
    known = advisor.known  # the store's answers, and every answer this fill adds
    keys = split_keys(market, splits, hybrid.query.interval, hybrid.query.entries_only)
    todo = keys[~known.filled()[keys]]
    print(f"{label}advice store {advisor.store.dir}: {len(keys) - len(todo)} of {len(keys)} keys of "
          f"{', '.join(splits)} answered; asking {len(todo)}", file=sys.stderr)
    out = {"asked": int(len(todo)), "answered": 0, "seconds": 0.0, "keys_per_s": 0.0, "keys": int(len(keys)),
           "stopped": False}
    if not len(todo):
        return {**out, "filled": 1.0}
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), unit="key", desc=f"advising {label.rstrip(': ')}".strip(), disable=not progress)
    previous = signal.signal(signal.SIGINT, lambda *_: stopped.append(True))  # finish the batches in flight, save
    try:
        done = ask_every(advisor, todo, batch, on_progress=lambda n: bar.update(n - bar.n),
                         stop=lambda: bool(stopped), save_every_s=SAVE_EVERY_S)
    finally:
        signal.signal(signal.SIGINT, previous)
        bar.close()
    seconds = time.perf_counter() - t0
    filled = int(known.filled()[keys].sum())
    unanswered = "" if stopped or filled == len(keys) else (
        f"; {len(keys) - filled} got no answer (advisor errors: its log says why), run the same command again to ask "
        "them")
    print(f"{label}answered {done} keys in {seconds / 60:.1f} min ({done / max(seconds, 1e-9):.1f} keys/s); the store "
          f"holds {filled} of the {len(keys)} keys of {', '.join(splits)}{unanswered}", file=sys.stderr)
    return {**out, "answered": done, "seconds": seconds, "keys_per_s": done / max(seconds, 1e-9),
            "filled": float(known.filled()[keys].mean()), "stopped": bool(stopped)}


def main(argv: list[str] | None = None) -> int:
    from bridge import SidecarError
    from jaxenv import DataValidationError

    args = parse_args(argv)
    try:
        return fill(args)
    except (ConfigError, DataValidationError, FileNotFoundError, SidecarError) as e:
        print_error(e)
        return 2
