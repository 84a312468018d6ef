"""The placebo battery of the one sequential test (agents.evidence.eprocess): how often it passes on no edge, and how
soon on a real one, for the advice's record and the agent's gate alike.

- `streams`: sessions drawn from nulls whose mean is exactly 0 (or below) and whose shape is far from normal (+1 with
  probability 0.95 and −19 otherwise, its mirror, a lognormal and its mirror, a normal; losses beyond the trailing
  drawdown c: +250 / −4,750 with mean 0, +250 / −5,750 with mean −50, for c = $2,500; the committed default
  walk-forward's out-of-sample sessions drawn again, recentred to 0 and to −100), looked at after every session: more
  looks than any run makes.
- `record`: advice on price paths of the default market's training split, its keys answered a few at a time in a random
  order (the record counts the complete sessions in time order): the rules mock's answers and `news_pass`'s moved
  along the path, a coin per key, and a constant side (always BUY) on the path with a drift that does not beat the
  costs; and for reference the same side on a drift that beats them tenfold (it earns on paper: not a null, and how
  often it binds says what counting its large losses in full costs the test's power). Informed advice (`news_pass` on
  `synthetic:headlines_then_trend`) on 20 paths, answered as a default run answers them: how soon it binds.
- `policies`: the gate on a policy without an edge, random valid entries, walked on fresh paths of the default market.
- `agents` (--agents, trains runs): the gate on agents trained on the default noise market (other seeds) and on
  `synthetic:signal`, from their test split on through a fresh path; the informed advice's record in training.

    python scripts/evidence_battery.py --json docs/results/evidence-battery/battery.json
    python scripts/evidence_battery.py --agents --runs results/evidence-battery/runs \\
        --json docs/results/evidence-battery/battery.json      # + the trained agents (79 min on 2 cores, measured)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import norm
from tqdm import tqdm

from agents.advice.record import market_calls, record_scale
from agents.advice.table import SIDES, AdviceTable, num_blocks
from agents.advisor.numeric_mock import NumericMock
from agents.advisor.prompt_fields import PromptFieldBuilder
from agents.command_line import CommandParser
from agents.config import HybridConfig, load_config
from agents.evidence.eprocess import ALPHA, LOSS_BOUND, prefix_log_e, scale_of
from bridge.prompts import DEFAULT_PROMPTS_PATH, PromptRenderer
from bridge.protocol import BUY, NUM_ACTIONS, SELL, STATUS_OK
from jaxenv.config import EnvConfig, PropFirmRules
from jaxenv.env import TradingEnv
from jaxenv.market import load_market

BAR = math.log(1 / ALPHA)
RUN_LOOKS = 190  # query steps of the main command's run (50M steps of 4,096 envs × 64)
RUN_PER_LOOK = 1024  # keys answered per look by the mock in configs/record_bound.yaml, the bridge's most
FEW_PER_LOOK = 16  # "a few at a time": the keys of a slow advisor's query step
FRESH_DAYS = 120  # a fresh path's days: the sessions a gate keeps counting after the test split
SIGNAL = "configs/signal.yaml"  # the agents' config (3M steps): on synthetic:signal, and on the noise market
RECORD_BOUND = "configs/record_bound.yaml"  # the informed advice's config


def ever_passes(pnl: np.ndarray, scale: float, looks: np.ndarray | None = None) -> bool:
    """Whether the test passes at any look: after every session, or after the prefixes `looks` [L] (sessions)."""
    log_e = np.asarray(prefix_log_e(pnl, scale))
    return bool((log_e if looks is None else log_e[looks]).max() >= BAR)


# ---------------------------------------------------------------------------------------------------------- streams
def _lognormal(sigma: float, top: float, size, rng) -> np.ndarray:
    """exp(σZ) capped at `top`, less its exact mean, over `top`: mean 0, within [−1, 1], skewed right."""
    mean = (math.exp(sigma**2 / 2) * norm.cdf((math.log(top) - sigma**2) / sigma)
            + top * norm.sf(math.log(top) / sigma))
    return (np.minimum(np.exp(sigma * rng.standard_normal(size)), top) - mean) / top


# the noise market's out-of-sample sessions, committed beside the docs
DEFAULT_WALK_FORWARD = Path(__file__).resolve().parents[1] / "docs/results/walk-forward/default/walkforward.json"
DOLLARS = float(scale_of(PropFirmRules()))  # c of the default account: the nulls in dollars are drawn over it


def walk_forward_sessions(path: Path = DEFAULT_WALK_FORWARD) -> np.ndarray:
    """Every out-of-sample session's P&L of a committed walk-forward (every fold, arm and seed), in dollars."""
    runs = json.loads(path.read_text())["runs"]
    return np.array([pnl for fold in runs.values() for arm in fold.values() for run in arm.values()
                     for pnl in run["test"]["sessions"].values()], np.float64)


def _resampled(mean: float):
    """Sessions drawn with replacement from the default walk-forward's, recentred to `mean` dollars, over c."""
    def draw(size, rng):
        pool = walk_forward_sessions()
        return (rng.choice(pool - pool.mean() + mean, size) / DOLLARS).astype(np.float32)
    return draw


NULLS = {  # name -> draw(size, rng): session P&L over the scale c, mean 0 (or below)
    "+1 (0.95) / -19": lambda size, rng: np.where(rng.random(size) < 0.95, 1 / 19, -1.0),
    "-1 (0.95) / +19": lambda size, rng: np.where(rng.random(size) < 0.95, -1 / 19, 1.0),
    "lognormal, right skew": lambda size, rng: _lognormal(1.0, 20.0, size, rng),
    "lognormal, left skew": lambda size, rng: -_lognormal(1.0, 20.0, size, rng),
    "normal, sd 0.3": lambda size, rng: np.clip(0.3 * rng.standard_normal(size), -1, 1),
    # losses beyond c: the old test clipped them up to −c and passed on 81% and 83% of such paths
    "+250 (0.95) / -4,750, mean 0": lambda size, rng: np.where(rng.random(size) < 0.95, 250.0, -4_750.0) / DOLLARS,
    "+250 (0.95) / -5,750, mean -50": lambda size, rng: np.where(rng.random(size) < 0.95, 250.0, -5_750.0) / DOLLARS,
    "default walk-forward sessions, recentred to 0": _resampled(0.0),
    "default walk-forward sessions, recentred to -100": _resampled(-100.0),
}


def streams(paths: int, sessions: int, seed: int = 0) -> dict:
    """Each null's share of `paths` runs of `sessions` sessions on which the test ever passes (a look per session),
    its mean, and its share of sessions beyond the test's exact range (a loss over LOSS_BOUND·c)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, draw in NULLS.items():
        x = draw((paths, sessions), rng)
        out[name] = {"passed": float(np.mean([ever_passes(row, 1.0) for row in x])), "mean": float(x.mean()),
                     "beyond_bound": float(np.mean(x < -LOSS_BOUND))}
    return out


# ----------------------------------------------------------------------------------------------------------- record
@dataclass
class PricePath:
    """A market's training split as the record sees it: per block, a long call's paper move (× value) where a call
    would count, and its session."""

    blocks: np.ndarray  # the blocks whose call would count
    move_value: np.ndarray  # [K] a long call's move × value, before costs (0 where it would not count)
    cost: float  # a round trip's costs
    session: np.ndarray  # [K] the session of each block's decision bar, numbered from 0 in time order
    scale: float  # the e-process's range (agents.advice.record.record_scale)


def market_path(source: str, seed: int) -> tuple:
    """(config, market, PricePath) of the training split of synthetic `source` drawn with `seed`."""
    cfg = load_config(None, [f"data.source={source}", f"data.synthetic_seed={seed}", "llm=mock"])
    market = load_market(cfg.data)
    env = TradingEnv(cfg.env)
    params = env.make_params(market, "train")
    interval, horizon = cfg.hybrid.query.interval, cfg.hybrid.query.max_age
    blocks = num_blocks(market.num_bars, interval)
    flat = jnp.arange(blocks) * SIDES + 1
    buy = AdviceTable.create(blocks * SIDES).write(
        flat, jnp.asarray(np.eye(NUM_ACTIONS, dtype=np.float32)[np.full(blocks, BUY)]), jnp.ones(blocks),
        jnp.full(blocks, STATUS_OK), jnp.zeros(blocks, jnp.int32), jnp.ones(blocks, bool))
    calls = jax.device_get(market_calls(buy, params, interval, horizon))  # every block a long call: its move
    value = float(params.point_value * params.contracts)
    cost = float(2.0 * (params.commission_per_side * params.contracts + params.slippage * value))
    session = np.asarray(calls.session)
    counting = np.flatnonzero(calls.counts)
    return cfg, market, PricePath(counting, np.where(calls.counts, np.asarray(calls.pnl) + cost, 0.0), cost,
                                  np.unique(session, return_inverse=True)[1],
                                  float(record_scale(params, interval, horizon)))


def mock_sides(hybrid: HybridConfig, env: EnvConfig, market, answers: str) -> np.ndarray:
    """[K] the mock advisor's call per block's flat key: +1 BUY, −1 SELL, 0 none (PASS or another action)."""
    blocks = num_blocks(market.num_bars, hybrid.query.interval)
    renderer = PromptRenderer.from_yaml(DEFAULT_PROMPTS_PATH)
    fields = PromptFieldBuilder(market, list(renderer.markets), env.contracts_per_trade, hybrid.query.interval)
    keys = np.arange(blocks) * SIDES + 1
    mock = NumericMock(answers, renderer, list(market.text_table) or None)
    mock.submit(keys, fields.build(keys))
    got = mock.collect()
    named = np.argmax(got.probs, -1)
    ok = got.status == STATUS_OK
    return np.where(ok & (named == BUY), 1, np.where(ok & (named == SELL), -1, 0)).astype(np.int64)


def record_binds(path: PricePath, side: np.ndarray, rng: np.random.Generator, per_look: int,
                 looks: int | None = None) -> int | None:
    """The look at which the record first binds (1-based; None: never) when the split's keys are answered in a random
    order, `per_look` a look (for `looks` looks; all of them by default): each look counts the complete sessions in time
    order, as agents.advice.record does."""
    pnl = np.where(side != 0, side * path.move_value - path.cost, 0.0)[path.blocks]
    session = path.session[path.blocks]
    sessions = int(session.max()) + 1
    sums = np.bincount(session, weights=pnl, minlength=sessions)
    log_e = np.asarray(prefix_log_e(sums, path.scale))
    need = np.bincount(session, minlength=sessions)
    order = rng.permutation(len(path.blocks))
    total = -(-len(order) // per_look)
    for look in range(1, min(total, looks or total) + 1):
        have = np.bincount(session[order[: look * per_look]], minlength=sessions)
        complete = int(np.argmin(np.r_[have == need, False]))  # leading complete sessions
        if log_e[complete] >= BAR:
            return look
    return None


def shifted(side: np.ndarray, path: PricePath, shift: int) -> np.ndarray:
    """The sides moved `shift` blocks along the split's counting blocks (cyclically): each block gets another's call."""
    out = np.zeros_like(side)
    out[path.blocks] = np.roll(side[path.blocks], shift)
    return out


def drifted(path: PricePath, share_of_cost: float) -> PricePath:
    """The path with a drift added so that a long call's mean move is `share_of_cost` × its costs."""
    mean = path.move_value[path.blocks].mean()
    move = path.move_value.copy()
    move[path.blocks] += share_of_cost * path.cost - mean
    return PricePath(path.blocks, move, path.cost, path.session, path.scale)


def record(placebos: int, informed_seeds: list[int], rng_seed: int = 0) -> dict:
    """The record's binding rates on placebo advice, and how soon informed advice binds."""
    rng = np.random.default_rng(rng_seed)
    cfg, market, path = market_path("synthetic:default", 0)
    hcfg, hmarket, hpath = market_path("synthetic:headlines_then_trend", 0)
    blocks = num_blocks(market.num_bars, cfg.hybrid.query.interval)
    session_blocks = 390 // cfg.hybrid.query.interval
    rules = mock_sides(cfg.hybrid, cfg.env, market, "rules")
    news = mock_sides(hcfg.hybrid, hcfg.env, hmarket, "news_pass")
    always = np.ones(blocks, np.int64)

    def shifts(p: PricePath) -> np.ndarray:  # at least a session's blocks each way
        return rng.integers(session_blocks, len(p.blocks) - session_blocks, placebos)

    def coin() -> np.ndarray:
        out = np.zeros(blocks, np.int64)
        out[path.blocks] = rng.choice([-1, 1], len(path.blocks))
        return out

    cases = {  # name -> [(path, side)]: the no-edge cases, whose paper P&L has mean <= 0 after costs
        "rules shifted": [(path, shifted(rules, path, int(s))) for s in shifts(path)],
        "news_pass shifted": [(hpath, shifted(news, hpath, int(s))) for s in shifts(hpath)],
        "coin per key": [(path, coin()) for _ in range(placebos)],
        "always BUY, drift 0.8 × costs": [(drifted(path, 0.8), always)] * placebos,
    }
    out = {"per_look": FEW_PER_LOOK, "placebos": placebos, "no_edge": {}}
    for name, runs in tqdm(cases.items(), desc="record placebos", file=sys.stderr):
        bound = [record_binds(p, side, rng, FEW_PER_LOOK) is not None for p, side in runs]
        out["no_edge"][name] = {"bound": float(np.mean(bound))}
    beats = drifted(path, 10.0)  # not a null: always BUY where the drift beats the costs earns on paper, and binds
    out["always BUY, drift 10 × costs"] = {"bound": float(np.mean(
        [record_binds(beats, always, rng, FEW_PER_LOOK) is not None for _ in range(min(placebos, 20))]))}
    informed = []
    for seed in tqdm(informed_seeds, desc="informed advice", file=sys.stderr):
        icfg, imarket, ipath = market_path("synthetic:headlines_then_trend", seed)
        side = mock_sides(icfg.hybrid, icfg.env, imarket, "news_pass")
        informed.append({"seed": seed, "bound_at_look": record_binds(ipath, side, rng, RUN_PER_LOOK, RUN_LOOKS),
                         "calls": int((side[ipath.blocks] != 0).sum())})
    tenth = RUN_LOOKS // 10
    out["informed"] = {"paths": informed, "per_look": RUN_PER_LOOK, "tenth": tenth, "bound_within_tenth": float(np.mean(
        [r["bound_at_look"] is not None and r["bound_at_look"] <= tenth for r in informed]))}
    return out


# --------------------------------------------------------------------------------------------------------- policies
def session_pnl(trace: dict, market) -> np.ndarray:
    """A walk's P&L per trading day, in time order."""
    from jaxenv.metrics import daily_pnl

    return daily_pnl(trace, market.timestamps, market.sessions.day).to_numpy()


def random_policies(walks: int, days: int = FRESH_DAYS) -> dict:
    """The gate on random valid entries: `walks` walks, each on a fresh path of the default market, every session
    counted as it completes."""
    from agents.evaluation.policies import random_valid_policy
    from jaxenv.evaluate import walk_split

    cfg = load_config(None, ["llm=none"])
    env = TradingEnv(cfg.env)
    opened, pnl = [], []
    for i in tqdm(range(walks), desc="random entries", file=sys.stderr):
        market = load_market(load_config(None, ["llm=none", f"data.synthetic_days={days}",
                                                f"data.synthetic_seed={2000 + i}"]).data)
        trace = walk_split(env, market, (0, market.num_bars), random_valid_policy, jax.random.PRNGKey(i), ())
        daily = session_pnl(trace, market)
        opened.append(ever_passes(daily, float(scale_of(cfg.env.prop_firm))))
        pnl.append(float(daily.mean()))
    return {"walks": walks, "days": days, "opened": float(np.mean(opened)), "mean_session_pnl": float(np.mean(pnl))}


# ----------------------------------------------------------------------------------------------------------- agents
def trained_agents(runs: Path, noise_seeds: list[int], signal_seeds: list[int], informed_seeds: list[int]) -> dict:
    """Agents trained on the default noise market and on synthetic:signal (SIGNAL's config), each gated on its test
    split and then a fresh path of FRESH_DAYS; and the informed advice's record (RECORD_BOUND) at its runs' ends."""
    from agents.evaluation.saved_run import agent_walk, load_run, walk_bounds
    from agents.training.loop import train
    from experiments.fusion import fresh_market

    def trained(name: str, config: str, seed: int, extra: list[str]) -> Path:
        run = runs / f"{name}-s{seed}"
        resume = (run / "config.yaml").exists()
        if not (run / "summary.done").exists():
            train(None if resume else load_config(config, [f"seed={seed}", "log.progress=false", *extra]), run,
                  resume=resume)
            (run / "summary.done").write_text("")
        return run

    def gate(run: Path) -> dict:
        walked = load_run(run, "best")
        test = session_pnl(agent_walk(walked)(walk_bounds(walked.market, "test"), jax.random.PRNGKey(0)),
                           walked.market)
        fresh = load_run(run, "best", data=fresh_market(walked.cfg.data, FRESH_DAYS))
        later = session_pnl(agent_walk(fresh)(walk_bounds(fresh.market, "all"), jax.random.PRNGKey(0)), fresh.market)
        scale = float(scale_of(walked.cfg.env.prop_firm))
        log_e = np.asarray(prefix_log_e(np.r_[test, later], scale))
        first = int(np.argmax(log_e >= BAR)) if (log_e >= BAR).any() else None
        return {"opened": first is not None, "opened_after_sessions": first, "test_sessions": len(test),
                "test_pnl": float(test.sum()), "fresh_pnl": float(later.sum()), "log_e_after_test": float(log_e[len(test)]),
                "log_e_end": float(log_e[-1])}

    out: dict = {"noise": {}, "signal": {}, "informed_record": {}}
    for seed in tqdm(noise_seeds, desc="agents on the noise market", file=sys.stderr):
        out["noise"][seed] = gate(trained("noise", SIGNAL, seed, ["data.source=synthetic:default"]))
    for seed in tqdm(signal_seeds, desc="agents on synthetic:signal", file=sys.stderr):
        out["signal"][seed] = gate(trained("signal", SIGNAL, seed, []))
    for seed in tqdm(informed_seeds, desc="informed advice's record", file=sys.stderr):
        run = trained("news_pass", RECORD_BOUND, seed, [])
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        bound = [line["update"] for line in lines if line.get("record_bound")]
        out["informed_record"][seed] = {"bound": bool(lines[-1].get("record_bound")), "first_bound_update":
                                        bound[0] if bound else None, "updates": lines[-1]["update"],
                                        "log_e": lines[-1].get("record_log_e")}
    rate = lambda d: float(np.mean([v["opened"] for v in d.values()])) if d else None  # noqa: E731
    out["noise_opened"], out["signal_opened"] = rate(out["noise"]), rate(out["signal"])
    out["informed_bound"] = float(np.mean([v["bound"] for v in out["informed_record"].values()]))
    return out


def parse_seeds(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b) + 1)) if b else [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = CommandParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--paths", type=int, default=2000, help="streams: paths of each null (default 2000)")
    ap.add_argument("--sessions", type=int, default=500, help="streams: sessions a path (default 500)")
    ap.add_argument("--placebos", type=int, default=200, help="record: placebo advisors of each kind (default 200)")
    ap.add_argument("--informed", default="0-19", help="record: headlines_then_trend paths of informed advice")
    ap.add_argument("--walks", type=int, default=100, help="policies: random-entry walks (default 100)")
    ap.add_argument("--agents", action="store_true", help="also train and gate agents (see --runs)")
    ap.add_argument("--runs", default="results/evidence-battery/runs", help="--agents: the run folders")
    ap.add_argument("--noise-seeds", default="0-9", help="--agents: seeds of agents on the noise market")
    ap.add_argument("--signal-seeds", default="0-4", help="--agents: seeds of agents on synthetic:signal")
    ap.add_argument("--record-seeds", default="0-4", help=f"--agents: seeds of {RECORD_BOUND}'s informed advice")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args(argv)
    out = {"alpha": ALPHA, "streams": streams(args.paths, args.sessions),
           "record": record(args.placebos, parse_seeds(args.informed)), "policies": random_policies(args.walks)}
    if args.agents:
        out["agents"] = trained_agents(Path(args.runs), parse_seeds(args.noise_seeds), parse_seeds(args.signal_seeds),
                                       parse_seeds(args.record_seeds))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(path)
    return 0
