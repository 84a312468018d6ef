"""A synthetic market written as a user's files: bars.csv (OHLCV, stamps with their UTC offsets), news.csv (one row
per story, for a preset with news) and market.json (the preset, days, seed and instrument they were drawn with, so
that a fresh path of the same market can be written beside them). Loaded with data.news_items=1 and
data.news_max_age=4D, the files give the market of `synthetic:PRESET` with the same days and seed."""

from __future__ import annotations

import json
import os
from pathlib import Path


from jaxenv.contracts import get_contract
from jaxenv.synthetic import generate_market

BARS_FILE = "bars.csv"
NEWS_FILE = "news.csv"
MARKET_FILE = "market.json"
# what makes the files load as the synthetic market: one story in force at a time, kept over a weekend
NEWS_SETTINGS = {"data.news_items": 1, "data.news_max_age": "4D"}


def _replace(path: Path, write) -> None:
    """`path` whole or not at all: written under a temporary name, then renamed."""
    partial = path.with_name(f".{path.name}.partial")
    write(partial)
    os.replace(partial, path)


def write_market(out: Path, preset: str, contract: str, days: int, seed: int, split: str | None = None
                 ) -> tuple[Path, Path | None]:
    """Writes the market into folder `out`; returns (the bars file, the news file or None). market.json is written
    last: a folder with it holds a whole market. `split` (train, val or test): only that split's bars, after the
    history a file needs before its first decision (jaxenv.Market.first_decision_bar), so that evaluating or trading
    the file decides on every bar of the split; no market.json then."""
    bars, news = generate_market(preset, get_contract(contract), days, seed)
    if split is not None:
        from jaxenv.config import DataConfig
        from jaxenv.market import load_market

        market = load_market(DataConfig(source=f"synthetic:{preset}", contract=contract, synthetic_days=days,
                                        synthetic_seed=seed))
        if split not in market.splits:
            raise ValueError(f"split {split!r}: use one of {', '.join(market.splits)}")
        start, end = market.splits[split]
        bars = bars.iloc[max(start - market.first_decision_bar, 0) : end]
    out.mkdir(parents=True, exist_ok=True)
    _replace(out / BARS_FILE, lambda p: bars.to_csv(p, index=True))
    news_path = None
    if news is not None:
        news_path = out / NEWS_FILE
        _replace(news_path, lambda p: news[["timestamp", "headline"]].to_csv(p, index=False))
    if split is not None:
        return out / BARS_FILE, news_path
    spec = {"preset": preset, "contract": contract, "days": days, "seed": seed}
    _replace(out / MARKET_FILE, lambda p: p.write_text(json.dumps(spec, indent=1)))
    return out / BARS_FILE, news_path


def written_market(bars_file: str | Path) -> dict | None:
    """The preset, instrument, days and seed a bars file written by `write_market` was drawn with; None for any
    other file."""
    path = Path(bars_file).parent / MARKET_FILE
    if Path(bars_file).name != BARS_FILE or not path.exists():
        return None
    return json.loads(path.read_text())
