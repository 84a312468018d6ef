"""Filling the advice store ahead of training (`python scripts/advise.py`): every key (bar block × position side) of
the chosen splits that the store has no answer for is asked, in batches at the advisor's full rate, with a progress
bar. The store is saved every SAVE_EVERY_S seconds and on Ctrl-C, so a second run continues where the first
stopped."""

from __future__ import annotations

import argparse
import signal
import sys
import time

import numpy as np
from tqdm import tqdm

from agents.advice.table import walk_keys
from agents.advisor.link import prompt_template
from agents.advisor.prompt_fields import PromptFieldBuilder
from agents.advisor.session import AdvisorSession
from agents.advisor.sidecar import at_full_rate, start_advisor
from agents.advisor.store import open_market_store, store_root
from agents.command_line import CommandParser, print_error
from agents.config import ConfigError, add_config_flags, config_overrides, load_config
from agents.runs.adapters import starting_adapter

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
    add_config_flags(ap)  # every config key a flag, as train.py's: --data, --llm, --llm-adapter, --store, ...
    return ap.parse_args(argv)


def split_keys(market, splits: list[str], interval: int, entries_only: bool) -> np.ndarray:
    """The keys walks over `splits` read (agents.advice.table.walk_keys), each once."""
    keys = [walk_keys(*market.split_range(split), interval, entries_only) for split in splits]
    return np.unique(np.concatenate(keys))


def fill(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *config_overrides(args)]
    cfg = load_config(args.config, overrides)
    if not any(o.startswith(("hybrid.sidecar.threads=", "hybrid.sidecar.nice=")) for o in overrides):
        cfg = at_full_rate(cfg)  # nothing else runs beside a fill
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    bad = [s for s in splits if s not in SPLITS]
    if bad or not splits:
        raise ConfigError(f"--splits: {', '.join(bad) or 'none given'}: choose among {', '.join(SPLITS)}")
    result = fill_store(cfg, splits, args.batch)
    if result["stopped"]:
        print("stopped (Ctrl-C): the answers so far are saved; run the same command again to continue",
              file=sys.stderr)
        return 130
    return 0


def fill_store(cfg, splits: list[str], batch: int | None = None, progress: bool = True) -> dict:
    """Asks every key of `splits` the run's store has no answer for; {asked, answered, seconds, keys_per_s, filled,
    keys, stopped} (filled: the store's share of the splits' keys after)."""
    if cfg.llm == "none":
        raise ConfigError("--llm none: there is no advisor to ask")
    root = store_root(cfg)
    if root is None:
        raise ConfigError("hybrid.store: no store for this advisor (the mock's default); pass --store PATH")

    from jaxenv import load_market

    market = load_market(cfg.data)
    k = cfg.hybrid.query.interval
    renderer, template = prompt_template(cfg)
    fields = PromptFieldBuilder(market, list(renderer.markets), cfg.env.contracts_per_trade, k,
                                cfg.hybrid.shuffled)
    texts = list(market.text_table) or None
    store = open_market_store(cfg, market, root, renderer, template, fields, starting_adapter(cfg))
    known = store.answers  # this process's holder: what the store holds, and every answer this fill adds
    fields.without_past(known)
    keys = split_keys(market, splits, k, cfg.hybrid.query.entries_only)
    todo = keys[~known.filled()[keys]]
    print(f"advice store {store.dir}: {len(keys) - len(todo)} of {len(keys)} keys of {', '.join(splits)} answered; "
          f"asking {len(todo)}", file=sys.stderr)
    out = {"asked": int(len(todo)), "answered": 0, "seconds": 0.0, "keys_per_s": 0.0, "keys": int(len(keys)),
           "stopped": False}
    if not len(todo):
        return {**out, "filled": 1.0}
    batch = int(batch or cfg.hybrid.link.max_budget)
    session = AdvisorSession(start_advisor(cfg, renderer, texts, batch), fields, renderer, texts, known, store)
    stopped = []
    previous = signal.signal(signal.SIGINT, lambda *_: stopped.append(True))  # finish the batches in flight, save
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), unit="key", desc="advising", disable=not progress)
    try:
        done = session.fill(todo, batch, on_progress=lambda n: bar.update(n - bar.n), stop=lambda: bool(stopped),
                            save_every_s=SAVE_EVERY_S)
    finally:
        bar.close()
        session.close()  # saves the store
        signal.signal(signal.SIGINT, previous)
    seconds = time.perf_counter() - t0
    filled = int(known.filled()[keys].sum())
    unanswered = "" if stopped or filled == len(keys) else (
        f"; {len(keys) - filled} got no answer (advisor errors: its log says why), run the same command again to ask "
        "them")
    print(f"answered {done} keys in {seconds / 60:.1f} min ({done / max(seconds, 1e-9):.1f} keys/s); the store "
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
