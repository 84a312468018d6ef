"""Filling the advice store ahead of training (`python scripts/advise.py`): every key (bar block × position side) of
the chosen splits that the store has no answer for is asked, in batches at the advisor's full rate, with a progress
bar. The store is saved every SAVE_EVERY_S seconds and on Ctrl-C, so a second run continues where the first
stopped."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np
from tqdm import tqdm

from agents.advice.table import answered, key_of
from agents.advisor.link import MAX_IN_FLIGHT, prompt_template
from agents.advisor.prompt_fields import PromptFieldBuilder
from agents.advisor.sidecar import start_advisor
from agents.advisor.store import open_market_store, store_root
from agents.config import ConfigError, load_config
from agents.runs.adapters import starting_adapter

SAVE_EVERY_S = 60.0
SPLITS = ("train", "val", "test")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config file, as for train.py (its data, advisor, template, interval)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key, e.g. --set hybrid.query.interval=10; repeatable")
    ap.add_argument("--data", help="market data: a CSV/Parquet file or synthetic:PRESET (data.source)")
    ap.add_argument("--llm", help="the advisor whose answers to store (llm; default smollm2)")
    ap.add_argument("--llm-adapter", metavar="PATH", help="a peft LoRA adapter directory (hybrid.llm_adapter)")
    ap.add_argument("--store", help="the store folder (hybrid.store; default runs/advice_store)")
    ap.add_argument("--splits", default="train,val,test",
                    help=f"comma-separated splits whose keys to fill, of {', '.join(SPLITS)} (default: all)")
    ap.add_argument("--batch", type=int, help="prompts per submission (default hybrid.max_budget)")
    return ap.parse_args(argv)


def split_keys(market, splits: list[str], interval: int, sides: tuple[int, ...]) -> np.ndarray:
    """The keys a walk over `splits` reads: block b's key is in force during block b + 1, so the blocks from the one
    before each split's first bar to the one before its last."""
    blocks = set()
    for split in splits:
        start, end = market.split_range(split)
        blocks.update(range(max(start // interval - 1, 0), max((end - 1) // interval, 0)))
    blocks = np.array(sorted(blocks), np.int64)
    return key_of(blocks[:, None], np.array(sides)[None, :]).reshape(-1)


def full_rate() -> list[str]:
    """The config overrides of a fill: nothing else runs, so the advisor takes every core at normal priority (a
    training run's default is 1 thread at nice 19)."""
    return [f"hybrid.sidecar_threads={os.cpu_count() or 1}", "hybrid.sidecar_nice=0"]


def fill(args: argparse.Namespace) -> int:
    overrides = [*full_rate(), *args.overrides]
    for flag, key in (("data", "data.source"), ("llm", "llm"), ("store", "hybrid.store"),
                      ("llm_adapter", "hybrid.llm_adapter")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    cfg = load_config(args.config, overrides)
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
    sides = (0,) if cfg.hybrid.query.entries_only else (-1, 0, 1)
    keys = split_keys(market, splits, k, sides)
    todo = keys[~known.filled()[keys]]
    print(f"advice store {store.dir}: {len(keys) - len(todo)} of {len(keys)} keys of {', '.join(splits)} answered; "
          f"asking {len(todo)}", file=sys.stderr)
    out = {"asked": int(len(todo)), "answered": 0, "seconds": 0.0, "keys_per_s": 0.0, "keys": int(len(keys)),
           "stopped": False}
    if not len(todo):
        return {**out, "filled": 1.0}
    batch = int(batch or cfg.hybrid.max_budget)
    pool = start_advisor(cfg, renderer, texts, batch)
    stopped = []
    previous = signal.signal(signal.SIGINT, lambda *_: stopped.append(True))  # finish the batch in flight, save
    t0, saved_at, done, in_flight = time.perf_counter(), time.perf_counter(), 0, 0
    bar = tqdm(total=len(todo), unit="key", desc="advising", disable=not progress)
    try:
        for start in range(0, len(todo), batch):
            if stopped:
                break
            chunk = todo[start:start + batch]
            rows = fields.build(chunk)
            pool.submit(chunk, rows if pool.reads_fields else renderer.render(rows, texts))
            in_flight += 1
            while in_flight >= MAX_IN_FLIGHT:
                done, in_flight = done + _take(pool, known), in_flight - 1
                bar.update(done - bar.n)
                if time.perf_counter() - saved_at > SAVE_EVERY_S:
                    store.save()
                    saved_at = time.perf_counter()
        while in_flight:
            done, in_flight = done + _take(pool, known), in_flight - 1
            bar.update(done - bar.n)
    finally:
        bar.close()
        store.save()
        pool.close()
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


def _take(pool, known) -> int:
    """Collects the oldest submission into `known`, waiting as long as the advisor takes (nothing else waits on a
    fill; a dead worker's rows come back as errors); how many of its keys got an answer."""
    status = known.keep(pool.collect(timeout_s=None), 0)
    return int(np.asarray(answered(status)).sum())


def main(argv: list[str] | None = None) -> int:
    from bridge import SidecarError
    from jaxenv import DataValidationError

    args = parse_args(argv)
    try:
        return fill(args)
    except (ConfigError, DataValidationError, FileNotFoundError, SidecarError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
