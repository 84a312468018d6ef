"""Write a synthetic market as files, to try the file loaders and news files on a market whose truth is known:
DIR/bars.csv (OHLCV, stamps with their UTC offsets, no headline column), for a preset with news DIR/news.csv (one
row per story: the open stamp of the bar it arrives on, with its offset, and the headline), and DIR/market.json
(what it was drawn with). Loaded with data.news_items=1 and data.news_max_age=4D they give the market of
`--data synthetic:PRESET`. A pair preset (pair, pair_signal) writes DIR/NQ.csv and DIR/ES.csv (one file per
instrument of --contract A,B, NQ,ES by default) and DIR/market.json, loaded as a set by
jaxenv.market_set.load_market_set([("NQ", "DIR/NQ.csv"), ("ES", "DIR/ES.csv")], data).

    python scripts/write_market.py --preset headlines --days 60 --seed 0 --out results/markets/headlines
    python scripts/write_market.py --preset pair_signal --days 60 --out results/markets/pair_signal
    python scripts/write_market.py --preset default --split test --out results/markets/default-test   # to trade
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

import argparse
import sys
from pathlib import Path

from agents.command_line import CommandParser
from jaxenv.contracts import InstrumentError
from jaxenv.market_files import NEWS_SETTINGS, write_market, write_pair
from jaxenv.synthetic import PAIR_PRESETS, PRESETS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__)
    ap.add_argument("--preset", default="headlines",
                    help=f"the synthetic preset: {', '.join(PRESETS)}; pairs of instruments: {', '.join(PAIR_PRESETS)}")
    ap.add_argument("--days", type=int, default=120, help="trading days (sessions of 390 minute bars) to write")
    ap.add_argument("--seed", type=int, default=0, help="the seed the market is drawn with (data.synthetic_seed)")
    ap.add_argument("--contract", default=None,
                    help="the built-in instrument whose tick and zone the bars use (NQ); a pair preset: two, A,B (NQ,ES)")
    ap.add_argument("--split", choices=["train", "val", "test"],
                    help="only this split's bars, after the history the first decision needs (test: for trade.py and "
                    "evaluate.py out of sample; a run trained on this market never counts its train or val sessions as "
                    "evidence)")
    ap.add_argument("--out", required=True, metavar="DIR", help="the folder to write bars.csv (and news.csv) to")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.preset in PAIR_PRESETS:
        return _main_pair(args)
    if args.preset not in PRESETS:
        print(f"error: unknown synthetic preset {args.preset!r}; choose one of {', '.join(PRESETS)} (pairs of "
              f"instruments: {', '.join(PAIR_PRESETS)})", file=sys.stderr)
        return 2
    args.contract = args.contract or "NQ"
    try:
        bars, news = write_market(Path(args.out), args.preset, args.contract, args.days, args.seed, args.split)
    except (InstrumentError, ValueError) as error:  # an unknown instrument, too few days
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.split:
        use = ("Trade a run on it" if args.split == "test" else
               "A run trained on this market trained or was chosen on these sessions: trade.py trades them but its gate "
               "never counts them. Trade a run on it")
        print(f"wrote {bars}: the {args.split} split of --data synthetic:{args.preset} (data.synthetic_days={args.days}, "
              f"data.synthetic_seed={args.seed}) after its history. {use}:\n  python scripts/trade.py "
              f"--run-dir RUN --data {bars}")
        return 0
    command = f"python scripts/train.py --data {bars} --set data.contract={args.contract.upper()}"
    if news is not None:
        command += f" --set data.news={news} " + " ".join(f"--set {k}={v}" for k, v in NEWS_SETTINGS.items())
    print(f"wrote {bars}{f' and {news}' if news else ''}: the market of --data synthetic:{args.preset} "
          f"(data.synthetic_days={args.days}, data.synthetic_seed={args.seed}). Train on the files:\n  {command}")
    return 0


def _main_pair(args: argparse.Namespace) -> int:
    """A pair preset: one bars file per instrument, and how to load them as a set."""
    if args.split:
        print(f"error: --split is for one instrument's presets, not the pair {args.preset}", file=sys.stderr)
        return 2
    contracts = tuple(name.strip() for name in (args.contract or "NQ,ES").split(","))
    try:
        first, second = write_pair(Path(args.out), args.preset, contracts, args.days, args.seed)
    except (InstrumentError, ValueError) as error:  # an unknown instrument, one instrument, too few days
        print(f"error: {error}", file=sys.stderr)
        return 2
    load = (f'load_market_set([("{first.stem}", "{first}"), ("{second.stem}", "{second}")], DataConfig())')
    train = f"python scripts/train.py --data {first.stem}={first} --data {second.stem}={second} --llm none"
    print(f"wrote {first} and {second}: the pair of synthetic:{args.preset} (data.synthetic_days={args.days}, "
          f"data.synthetic_seed={args.seed}). Load them as a set (jaxenv.market_set):\n  {load}\nor train one "
          f"account on them:\n  {train}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
