"""Write a synthetic market as files, to try the file loaders and news files on a market whose truth is known:
DIR/bars.csv (OHLCV, stamps with their UTC offsets, no headline column) and, for a preset with news, DIR/news.csv
(one row per story: the open stamp of the bar it arrives on, with its offset, and the headline). Loaded with
data.news_items=1 and data.news_max_age=4D they give the market of `--data synthetic:PRESET`.

    python scripts/write_market.py --preset headlines --days 60 --seed 0 --out data/headlines
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from jaxenv.contracts import InstrumentError, get_contract
from jaxenv.synthetic import PRESETS, generate_market


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="headlines", help=f"the synthetic preset: {', '.join(PRESETS)}")
    ap.add_argument("--days", type=int, default=120, help="trading days (sessions of 390 minute bars) to write")
    ap.add_argument("--seed", type=int, default=0, help="the seed the market is drawn with (data.synthetic_seed)")
    ap.add_argument("--contract", default="NQ", help="the built-in instrument whose tick and zone the bars use")
    ap.add_argument("--out", required=True, metavar="DIR", help="the folder to write bars.csv (and news.csv) to")
    return ap.parse_args(argv)


def write_csv(frame: pd.DataFrame, path: Path, index: bool) -> None:
    """`frame` as `path`, whole or not at all: written under a temporary name, then renamed."""
    partial = path.with_name(f".{path.name}.partial")
    frame.to_csv(partial, index=index)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.preset not in PRESETS:
        print(f"error: unknown synthetic preset {args.preset!r}; choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    try:
        contract = get_contract(args.contract)
        bars, news = generate_market(args.preset, contract, args.days, args.seed)
    except (InstrumentError, ValueError) as error:  # an unknown instrument, too few days
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(bars, out / "bars.csv", index=True)
    command = f"python scripts/train.py --data {out / 'bars.csv'} --set data.contract={contract.symbol}"
    wrote = f"{len(bars):,} bars to {out / 'bars.csv'}"
    if news is not None:
        write_csv(news[["timestamp", "headline"]], out / "news.csv", index=False)
        command += f" --set data.news={out / 'news.csv'} --set data.news_items=1 --set data.news_max_age=4D"
        wrote += f" and {len(news):,} stories to {out / 'news.csv'}"
    print(f"wrote {wrote}; the market of --data synthetic:{args.preset} (data.synthetic_days={args.days}, "
          f"data.synthetic_seed={args.seed}). Train on the files:\n  {command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
