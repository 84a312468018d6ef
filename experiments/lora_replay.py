r"""What did the advisor's outcomes teach, and what would another objective learn from them? Reads the
experiences a run's LoRA learner saved beside an adapter (RUN/adapters/N/experiences.jsonl.gz) and prints, per
action taken, the mean PPO advantage and trade P&L after bullish and after bearish headlines (the signal a
round can learn the news from), and how often a closed trade, and the market's move after an answered prompt (the
`move` objective's label), went the way of its headline. Several adapter directories pool their experiences (as
if one run had collected them all; the walk uses the first run).
With --learn, it replays one learning round on those experiences, from the base SmolLM2 and with the options
given by --set, and scores the probe prompts (experiments/lora_probe.py) before and after. With --walk, the
advisor alone (LLM-only) also walks the run's validation split, frozen and with the replayed adapter, as
experiments/lora_headlines.py does. On a 2-core CPU: ~10 min a round on one run's ~400 experiences
(~24 min an epoch on five runs'), ~70 s a walk.

    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6 --learn \
        --set baseline=action --out /tmp/a
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6 --learn --walk \
        --set anchor_coef=5
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed{0,1,2}/adapters/6 --learn --walk \
        --set max_epochs=1
"""
import argparse
import dataclasses
import tempfile
from collections import deque
from pathlib import Path

import numpy as np

from bridge import PromptRenderer
from bridge.learning import LearningOptions
from bridge.protocol import ACTIONS, BUY, HOLD, SELL
from experiments.lora_probe import describe, probe_prompts, smollm2
from jaxenv.synthetic import headline_sentiment
from llm_sidecar.learning import Experience, LoraLearner, load_experiences, usable

TABLE_ACTIONS = (HOLD, BUY, SELL)  # the actions the outcome table has rows for


def outcome_table(experiences: list[Experience]) -> str:
    """Per action taken and headline sentiment: count, mean advantage, mean closed-trade P&L, share profitable
    (over the experiences whose advice was in force); then how often trades and market moves went the way of the
    headline."""
    agreement = headline_agreement(experiences)
    experiences = [e for e in experiences if e.in_force]
    sentiment = np.array([headline_sentiment(e.prompt) for e in experiences])
    action = np.array([e.action for e in experiences])
    advantage = np.array([e.advantage for e in experiences])
    pnl = np.array([e.trade_pnl for e in experiences])
    profitable = np.array([e.profitable for e in experiences])
    lines = ["| action | headline | n | mean advantage | mean trade P&L (closed) | profitable |", "|---|---|---|---|---|---|"]
    for a in TABLE_ACTIONS:
        name = ACTIONS[a]
        for s, news in ((1, "bullish"), (-1, "bearish")):
            m = (action == a) & (sentiment == s)
            closed = m & np.isfinite(pnl)
            lines.append(f"| {name} | {news} | {m.sum()} | {advantage[m].mean() if m.any() else float('nan'):+.3f} | "
                         f"{pnl[closed].mean() if closed.any() else float('nan'):+.1f} ({closed.sum()}) | "
                         f"{profitable[m].mean() if m.any() else float('nan'):.2f} |")
    lines.append("")
    for what, (share, n) in (("closed trades", agreement["trades"]),
                             ("market moves after the answered prompts", agreement["moves"])):
        lines.append(f"{what} agreeing with the headline: {share:.3f} of {n} "
                     f"(± {np.sqrt(share * (1 - share) / max(n, 1)):.3f}; 0.5 is no signal)")
    return "\n".join(lines)


def headline_agreement(experiences: list[Experience]) -> dict[str, tuple[float, int]]:
    """How much the outcomes can teach about the news, as (share that went the headline's way, count); 0.5 is no
    signal. `trades`: closed trades whose advice was in force, where the trade's side times the sign of its P&L
    is the market's direction. `moves`: answered prompts with a known, nonzero market move afterwards (the `move`
    objective's labels)."""
    side = {BUY: 1, SELL: -1}
    trades, moves = [], []
    for e in experiences:
        news = headline_sentiment(e.prompt)
        if not news:
            continue
        if e.in_force and e.action in side and np.isfinite(e.trade_pnl) and e.trade_pnl != 0:
            trades.append(side[e.action] * np.sign(e.trade_pnl) == news)
        if np.isfinite(e.move) and e.move != 0:
            moves.append(np.sign(e.move) == news)
    return {name: ((float(np.mean(agree)) if agree else float("nan")), len(agree))
            for name, agree in (("trades", trades), ("moves", moves))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="+", metavar="adapter",
                    help="adapter directories holding experiences.jsonl.gz (a run's adapters/N); several are pooled")
    ap.add_argument("--learn", action="store_true", help="replay a learning round on the experiences")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                    help="a LearningOptions field for the replayed round, e.g. baseline=action (repeatable)")
    ap.add_argument("--out", help="save the replayed round's adapter (and its experiences) here")
    ap.add_argument("--walk", action="store_true", help="with --learn: the advisor alone walks the run's validation "
                    "split (the run folder holding adapters/N), frozen and with the replayed adapter")
    args = ap.parse_args(argv)
    if args.walk and not args.learn:
        ap.error("--walk scores a replayed round: give --learn too")
    train, val = [], []
    for adapter in args.adapters:
        adapter_train, adapter_val = load_experiences(adapter)
        train, val = train + adapter_train, val + adapter_val
    print(f"{len(train)} training and {len(val)} held-out experiences from {', '.join(args.adapters)}\n")
    print(outcome_table(train + val), flush=True)
    if not args.learn:
        return 0
    import torch

    defaults = dataclasses.asdict(LearningOptions())
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            ap.error(f"--set wants OPTION=VALUE with OPTION one of {sorted(defaults)}, got {item!r}")
        overrides[key] = type(defaults[key])(value)  # the option's own type: '2e-4' is a float for lr
    options = LearningOptions.from_dict({**defaults, **overrides})
    torch.manual_seed(0)
    renderer = PromptRenderer.from_yaml()
    backend = smollm2(renderer)
    prompts, bull = probe_prompts(renderer)
    print("\nbase model:", describe(backend.advise(prompts).probs, bull), flush=True)
    learner = LoraLearner(backend, options)
    # every experience the objective can use, even beyond buffer_size (a run's buffer would have dropped the oldest)
    learner.buffer.train = deque(e for e in train if usable(options, e))
    learner.buffer.val = deque(e for e in val if usable(options, e))
    print(learner.start_round(), flush=True)
    learner.finish()
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in learner.rounds[-1].items()})
    print("learned:   ", describe(backend.advise(prompts).probs, bull), flush=True)
    out = args.out or (tempfile.mkdtemp(prefix="lora_replay_") if args.walk else None)
    if out:
        print("saved", learner.save(out))
    if args.walk:
        del learner, backend  # the walk's own sidecar loads the model again
        llm_only_walks(Path(args.adapters[0]).resolve().parents[1], out)
    return 0


def llm_only_walks(run_dir: Path, adapter: str) -> None:
    """Prints the advisor alone (its top action) over the run's validation split, frozen (the adapter the run
    started from, usually none) and with `adapter`: the experiment's and evaluation's llm_only ablations. One
    restored run and one sidecar serve both walks."""
    import jax

    from agents.evaluation.advised_walk import ABLATIONS, FROZEN_ABLATION, advised_summary, run_ablations
    from agents.evaluation.saved_run import advised_walk, load_run

    run = load_run(run_dir, "latest")
    walks = {"frozen": run_ablations(run.cfg)[FROZEN_ABLATION],
             "learned": {**ABLATIONS["llm_only"], "adapter": adapter}}
    bars, key = run.market.split_range("val"), jax.random.PRNGKey(run.cfg.seed + 10_000)  # the experiment's key
    try:
        for name, changes in walks.items():
            trace = advised_walk(run, **changes)(bars, key)
            figures = advised_summary(trace, run.market.timestamps, run.cfg.env.prop_firm, run.market.sessions.day)
            print(f"validation, LLM-only, {name}: net P&L {figures['net_pnl']:,.0f}, {figures['trades']:.0f} trades",
                  flush=True)
    finally:
        run.close()

