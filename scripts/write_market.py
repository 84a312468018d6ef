"""Write a synthetic market as files, to try the file loaders and news files on a market whose truth is known:
DIR/bars.csv (OHLCV, stamps with their UTC offsets, no headline column), for a preset with news DIR/news.csv (one
row per story: the open stamp of the bar it arrives on, with its offset, and the headline), and DIR/market.json
(what it was drawn with). Loaded with data.news_items=1 and data.news_max_age=4D they give the market of
`--data synthetic:PRESET`.

    python scripts/write_market.py --preset headlines --days 60 --seed 0 --out results/markets/headlines
    python scripts/write_market.py --preset default --split test --out results/markets/default-test   # to trade
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

import argparse
import sys
from pathlib import Path

from agents.command_line import CommandParser
from jaxenv.contracts import InstrumentError
from jaxenv.market_files import NEWS_SETTINGS, write_market
from jaxenv.synthetic import PRESETS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = CommandParser(description=__doc__)
    ap.add_argument("--preset", default="headlines", help=f"the synthetic preset: {', '.join(PRESETS)}")
    ap.add_argument("--days", type=int, default=120, help="trading days (sessions of 390 minute bars) to write")
    ap.add_argument("--seed", type=int, default=0, help="the seed the market is drawn with (data.synthetic_seed)")
    ap.add_argument("--contract", default="NQ", help="the built-in instrument whose tick and zone the bars use")
    ap.add_argument("--split", choices=["train", "val", "test"],
                    help="only this split's bars, after the history the first decision needs (test: for trade.py and "
                    "evaluate.py out of sample; a run trained on this market never counts its train or val sessions as "
                    "evidence)")
    ap.add_argument("--out", required=True, metavar="DIR", help="the folder to write bars.csv (and news.csv) to")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.preset not in PRESETS:
        print(f"error: unknown synthetic preset {args.preset!r}; choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
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


if __name__ == "__main__":
    raise SystemExit(main())
