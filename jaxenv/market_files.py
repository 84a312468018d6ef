"""A synthetic market written as a user's files: bars.csv (OHLCV, stamps with their UTC offsets), news.csv (one row
per story, for a preset with news) and market.json (the preset, days, seed and instrument they were drawn with, so
that a fresh path of the same market can be written beside them). Loaded with data.news_items=1 and
data.news_max_age=4D, the files give the market of `synthetic:PRESET` with the same days and seed. A pair preset
(synthetic:pair, synthetic:pair_signal) writes one bars file per instrument instead, named by its symbol (NQ.csv,
ES.csv): jaxenv.market_set.load_market_set loads them as a set."""

from __future__ import annotations

import json
import os
from pathlib import Path


from jaxenv.contracts import get_contract
from jaxenv.synthetic import PAIR_PRESETS, generate_market, generate_pair

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


def write_pair(out: Path, preset: str, contracts: tuple[str, str], days: int, seed: int) -> tuple[Path, Path]:
    """Writes a pair preset (jaxenv.synthetic.PAIR_PRESETS) into folder `out`: one bars file per instrument, named
    by its symbol (NQ.csv, ES.csv), and market.json last. Returns the two bars files, in the pair's order; loaded
    with jaxenv.market_set.load_market_set([("NQ", "OUT/NQ.csv"), ("ES", "OUT/ES.csv")], data) they give the set
    of `synthetic:PRESET` with the same days and seed."""
    if preset not in PAIR_PRESETS:
        raise ValueError(f"unknown synthetic pair preset {preset!r}; choose one of {', '.join(PAIR_PRESETS)}")
    if len(contracts) != 2:
        raise ValueError(f"a pair preset needs two instruments (--contract NQ,ES), got {len(contracts)}")
    specs = tuple(get_contract(name) for name in contracts)
    if specs[0].symbol == specs[1].symbol:
        raise ValueError(f"a pair needs two different instruments, got {specs[0].symbol} twice")
    frames = generate_pair(preset, specs, days, seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = tuple(out / f"{spec.symbol}.csv" for spec in specs)
    for path, frame in zip(paths, frames):
        _replace(path, lambda p, frame=frame: frame.to_csv(p, index=True))
    spec = {"preset": preset, "contracts": [s.symbol for s in specs], "days": days, "seed": seed,
            "files": {s.symbol: path.name for s, path in zip(specs, paths)}}
    _replace(out / MARKET_FILE, lambda p: p.write_text(json.dumps(spec, indent=1)))
    return paths[0], paths[1]


def written_market(bars_file: str | Path) -> dict | None:
    """The preset, instrument, days and seed a bars file written by `write_market` was drawn with; None for any
    other file."""
    path = Path(bars_file).parent / MARKET_FILE
    if Path(bars_file).name != BARS_FILE or not path.exists():
        return None
    return json.loads(path.read_text())
