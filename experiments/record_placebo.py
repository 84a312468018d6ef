"""The advice record's placebo battery (agents.advice.record): how often its binding rule binds to advice without
information, and how soon to informed advice, on fixed price paths.

Advice here is a full table of flat-key answers from the mock advisor reading the prompt fields (as training's
default), or a placebo made from it: the same answers moved by a shift of whole blocks along the training split (they
keep their mix of sides and their runs, and lose their bars), or a coin per key (BUY or SELL). The record sees it as
training would, two ways:
- `fill`: the keys answered in a random order, `per_look` a look (an update's query step), for `looks` looks
  (the default run's 190 updates): every look counts every call answered so far;
- `walk`: the keys revealed in time order, the record looked at after every call settles (a walk's account, looking
  at each of its query steps): thousands of looks, the harsher test of a rule checked at every step.

    python experiments/record_placebo.py --placebos 200 --seeds 0-19 --json docs/results/record-evidence/placebo.json

It also measures why sessions are the record's clusters: over the placebos, the spread of the record's t when calls
are clustered by call, by run of neighbouring keys with the same side, and by session (a t that counts independent
evidence has spread 1 under no information).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.advice.record import RECORD_ALPHA, Tally, market_calls, settles  # noqa: E402
from agents.advice.table import SIDES, AdviceTable, num_blocks  # noqa: E402
from agents.advisor.numeric_mock import NumericMock  # noqa: E402
from agents.advisor.prompt_fields import PromptFieldBuilder  # noqa: E402
from agents.config import load_config  # noqa: E402
from bridge.prompts import DEFAULT_PROMPTS_PATH, PromptRenderer  # noqa: E402
from bridge.protocol import BUY, NUM_ACTIONS, SELL, STATUS_OK  # noqa: E402
from jaxenv.env import TradingEnv  # noqa: E402
from jaxenv.market import load_market  # noqa: E402

DEFAULT_LOOKS = 190  # updates of the main command's default run (50M steps of 4,096 envs × 64)
PER_LOOK = 1024  # keys answered per look: the mock's budget in configs/record_bound.yaml, the bridge's most


@dataclass
class PricePath:
    """One price path's calls, as the record computes them, for one set of flat-key sides."""

    params: object
    interval: int
    horizon: int
    blocks: np.ndarray  # the split's blocks whose call would count (its decision bar inside the split, entries allowed)
    move_value: np.ndarray  # [K] the block's paper move × value (0 where it cannot count)
    cost: float
    session: np.ndarray  # [K]
    settled_at: np.ndarray  # [K]


def market_path(source: str, seed: int, interval: int = 5, max_age_intervals: int = 6) -> tuple:
    """(market, env params of its training split, PricePath) for a synthetic market `source` drawn with `seed`."""
    cfg = load_config(None, [f"data.source={source}", f"data.synthetic_seed={seed}", "llm=mock"])
    market = load_market(cfg.data)
    env = TradingEnv(cfg.env)
    params = env.make_params(market, "train")
    horizon = interval * max_age_intervals
    blocks = num_blocks(market.num_bars, interval)
    probe = AdviceTable.create(blocks * SIDES)
    flat = np.arange(blocks) * SIDES + 1
    buy = probe.write(jnp.asarray(flat), jnp.asarray(np.eye(NUM_ACTIONS, dtype=np.float32)[np.full(blocks, BUY)]),
                      jnp.ones(blocks), jnp.full(blocks, STATUS_OK), jnp.zeros(blocks, jnp.int32), jnp.ones(blocks, bool))
    calls = jax.device_get(market_calls(buy, params, interval, horizon))  # every block a long call: its move
    value = float(params.point_value * params.contracts)
    cost = float(2.0 * (params.commission_per_side * params.contracts + params.slippage * value))
    move_value = np.where(calls.made, np.asarray(calls.pnl) + cost, 0.0)
    return cfg, market, PricePath(params, interval, horizon, np.flatnonzero(calls.made), move_value, cost,
                              np.asarray(calls.session), np.asarray(calls.settled_at))


def mock_sides(cfg, market, answers: str) -> np.ndarray:
    """[K] the mock advisor's call per block's flat key: +1 BUY, -1 SELL, 0 none (PASS or another action)."""
    blocks = num_blocks(market.num_bars, cfg.hybrid.query.interval)
    renderer = PromptRenderer.from_yaml(DEFAULT_PROMPTS_PATH)
    texts = list(market.text_table) or None
    fields = PromptFieldBuilder(market, list(renderer.markets), cfg.env.contracts_per_trade, cfg.hybrid.query.interval)
    keys = np.arange(blocks) * SIDES + 1
    mock = NumericMock(answers, renderer, texts)
    mock.submit(keys, fields.build(keys))
    got = mock.collect()
    named = np.argmax(got.probs, -1)
    ok = got.status == STATUS_OK
    return np.where(ok & (named == BUY), 1, np.where(ok & (named == SELL), -1, 0)).astype(np.int64)


def _session_sums(pnl: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    return np.bincount(cluster, weights=pnl, minlength=int(cluster.max()) + 1 if len(cluster) else 0)


def _binds(calls: np.ndarray, clusters: np.ndarray, total: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """The record's own rule (agents.advice.record.settles, from unbound) at each look."""
    t = Tally(*(jnp.asarray(x, jnp.float32) for x in (calls, clusters, total, squares)))
    return np.asarray(settles(t, jnp.zeros(len(calls), bool)))


def fill_looks(path: PricePath, side: np.ndarray, rng: np.random.Generator, looks: int = DEFAULT_LOOKS,
               per_look: int = PER_LOOK) -> np.ndarray:
    """[looks] bool: whether the record binds at each look of a run that answers the split's keys in a random order,
    `per_look` keys a look."""
    order = rng.permutation(path.blocks)
    pnl_all = side * path.move_value - path.cost * (side != 0)
    cluster_of = path.session - path.session.min()
    rows = []
    full = min(looks, -(-len(order) // per_look))
    for i in range(1, full + 1):
        seen = order[: i * per_look]
        seen = seen[side[seen] != 0]
        sums = _session_sums(pnl_all[seen], cluster_of[seen])
        counts = np.bincount(cluster_of[seen], minlength=len(sums))
        rows.append((len(seen), (counts > 0).sum(), sums.sum(), (sums**2).sum()))
    rows += [rows[-1]] * (looks - full)  # every key answered: the later looks see the same record
    return _binds(*np.array(rows, np.float64).T)


def walk_looks(path: PricePath, side: np.ndarray) -> np.ndarray:
    """[calls] bool: whether the record binds after each call settles, the calls revealed in time order (a look per
    call: more looks than a walk's query steps)."""
    made = path.blocks[side[path.blocks] != 0]
    made = made[np.argsort(path.settled_at[made], kind="stable")]
    if not len(made):
        return np.zeros(0, bool)
    pnl = side[made] * path.move_value[made] - path.cost
    cluster = path.session[made] - path.session[made].min()
    # V after each call: V grows by 2·(its session's sum before it)·x + x²
    before = np.zeros(len(made))
    running = np.zeros(int(cluster.max()) + 1)
    for i, (c, x) in enumerate(zip(cluster, pnl)):  # calls are a few thousand: a plain loop
        before[i] = running[c]
        running[c] += x
    squares = np.cumsum(2 * before * pnl + pnl**2)
    clusters = np.cumsum(np.r_[True, cluster[1:] != np.maximum.accumulate(cluster)[:-1]])
    return _binds(np.arange(1, len(made) + 1), clusters, np.cumsum(pnl), squares)


def shifted(side: np.ndarray, path: PricePath, shift: int) -> np.ndarray:
    """The sides moved `shift` blocks along the split's blocks (cyclically): each block gets another's call."""
    out = np.zeros_like(side)
    out[path.blocks] = np.roll(side[path.blocks], shift)
    return out


def coin(path: PricePath, rng: np.random.Generator, size: int) -> np.ndarray:
    out = np.zeros(size, np.int64)
    out[path.blocks] = rng.choice([-1, 1], len(path.blocks))
    return out


def shifts_for(path: PricePath, count: int, rng: np.random.Generator, session_blocks: int) -> np.ndarray:
    """`count` shifts of at least a session's blocks each way."""
    n = len(path.blocks)
    return rng.integers(session_blocks, n - session_blocks, count)


def cluster_spread(path: PricePath, sides: list[np.ndarray]) -> dict[str, float]:
    """The standard deviation over placebo sides of the record's t with calls clustered by call, by run of
    neighbouring keys with the same side, by session and by 5 sessions (1 where the clusters are independent)."""
    out: dict[str, list[float]] = {"call": [], "run": [], "session": [], "5 sessions": []}
    for side in sides:
        made = path.blocks[side[path.blocks] != 0]
        pnl = side[made] * path.move_value[made] - path.cost
        runs = np.cumsum(np.r_[True, (np.diff(made) != 1) | (np.diff(side[made]) != 0)])
        session = path.session[made] - path.session[made].min()
        for name, cluster in (("call", np.arange(len(made))), ("run", runs), ("session", session),
                              ("5 sessions", session // 5)):
            sums = _session_sums(pnl, cluster)
            out[name].append(sums.sum() / np.sqrt((sums**2).sum()))
    return {name: float(np.std(v)) for name, v in out.items()}


def battery(seeds: list[int], placebos: int, looks: int = DEFAULT_LOOKS, per_look: int = PER_LOOK,
            rng_seed: int = 0) -> dict:
    """The battery's figures: the placebos' binding rates on the default market's path (synthetic:default, seed 0)
    and the informed advice's (news_pass on synthetic:headlines_then_trend, one path per seed)."""
    rng = np.random.default_rng(rng_seed)
    cfg, market, path = market_path("synthetic:default", 0)
    session_blocks = 390 // path.interval
    k = num_blocks(market.num_bars, path.interval)
    rules = mock_sides(cfg, market, "rules")
    shifts = shifts_for(path, placebos, rng, session_blocks)
    placebo_sets = {
        "rules shifted": [shifted(rules, path, int(s)) for s in shifts],
        "coin per key": [coin(path, rng, k) for _ in range(placebos)],
    }
    hcfg, hmarket, hpath = market_path("synthetic:headlines_then_trend", 0)
    news = mock_sides(hcfg, hmarket, "news_pass")
    placebo_sets["news_pass shifted"] = [shifted(news, hpath, int(s)) for s in shifts_for(hpath, placebos, rng,
                                                                                         session_blocks)]
    out: dict = {"alpha": RECORD_ALPHA, "looks": looks, "per_look": per_look, "placebos": placebos, "placebo": {}}
    for name, sides in placebo_sets.items():
        p = hpath if name.startswith("news") else path
        fill = [fill_looks(p, s, rng, looks, per_look).any() for s in sides]
        walk = [walk_looks(p, s).any() for s in sides]
        out["placebo"][name] = {"fill_bound": float(np.mean(fill)), "walk_bound": float(np.mean(walk))}
    out["cluster_t_spread"] = {"rules shifted": cluster_spread(path, placebo_sets["rules shifted"]),
                               "coin per key": cluster_spread(path, placebo_sets["coin per key"])}
    informed = []
    for seed in seeds:
        icfg, imarket, ipath = market_path("synthetic:headlines_then_trend", seed)
        side = mock_sides(icfg, imarket, "news_pass")
        bound = fill_looks(ipath, side, rng, looks, per_look)
        first = int(np.argmax(bound)) + 1 if bound.any() else None
        informed.append({"seed": seed, "bound_at_look": first, "calls": int((side[ipath.blocks] != 0).sum())})
    tenth = looks // 10
    out["informed"] = {"seeds": informed,
                       "bound_within_tenth": float(np.mean([r["bound_at_look"] is not None and r["bound_at_look"] <= tenth
                                                            for r in informed])),
                       "tenth": tenth}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placebos", type=int, default=200, help="placebo advisors of each kind")
    ap.add_argument("--seeds", default="0-19", help="informed advice: market seeds of headlines_then_trend (A-B or a,b)")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args(argv)
    a, _, b = args.seeds.partition("-")
    seeds = list(range(int(a), int(b) + 1)) if b else [int(x) for x in args.seeds.split(",")]
    out = battery(seeds, args.placebos)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
