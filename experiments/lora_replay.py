r"""What did the advisor's outcomes teach, and what would a round with other options learn from them? Reads the
experiences a run's LoRA learner saved beside an adapter (RUN/adapters/N/experiences.jsonl.gz) and prints, after
bullish and after bearish headlines, how many answered prompts have a known market move, the mean move and the
share that rose, and how often the move went the way of its headline (the signal a round can learn the news from).
Several adapter directories pool their experiences (as if one run had collected them all; the walk uses the first
run).
With --learn, it replays one learning round on those experiences, from the base SmolLM2 and with the options
given by --set, and scores the probe prompts (experiments/lora_probe.py) before and after. With --walk, the
advisor alone (LLM-only) also walks the run's validation split, frozen and with the replayed adapter, as
experiments/lora_headlines.py does.

    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6 --learn \
        --set lr=1e-4 --out /tmp/a
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed{0,1,2}/adapters/6 --learn --walk
"""
import argparse
import dataclasses
import tempfile
from collections import deque
from pathlib import Path

import numpy as np

from bridge import PromptRenderer
from bridge.learning import LearningOptions
from experiments.lora_probe import describe, probe_prompts, smollm2
from jaxenv.synthetic import headline_sentiment
from llm_sidecar.learning import Experience, LoraLearner, load_experiences, usable


def outcome_table(experiences: list[Experience]) -> str:
    """Per headline sentiment: answered prompts with a known move, their mean move (ATRs) and the share that rose;
    then how often the move went the way of the headline."""
    known = [e for e in experiences if usable(e)]
    sentiment = np.array([headline_sentiment(e.prompt) for e in known])
    move = np.array([e.move for e in known])
    lines = ["| headline | n | mean move (ATRs) | rose |", "|---|---|---|---|"]
    for s, news in ((1, "bullish"), (-1, "bearish")):
        m = sentiment == s
        lines.append(f"| {news} | {m.sum()} | {move[m].mean() if m.any() else float('nan'):+.3f} | "
                     f"{(move[m] > 0).mean() if m.any() else float('nan'):.2f} |")
    share, n = headline_agreement(experiences)
    lines += ["", f"market moves after the answered prompts agreeing with the headline: {share:.3f} of {n} "
                  f"(± {np.sqrt(share * (1 - share) / max(n, 1)):.3f}; 0.5 is no signal)"]
    return "\n".join(lines)


def headline_agreement(experiences: list[Experience]) -> tuple[float, int]:
    """How much the outcomes can teach about the news: (share of answered prompts with a headline and a known,
    nonzero market move afterwards whose move went the headline's way, their count); 0.5 is no signal."""
    agree = []
    for e in experiences:
        news = headline_sentiment(e.prompt)
        if news and np.isfinite(e.move) and e.move != 0:
            agree.append(np.sign(e.move) == news)
    return (float(np.mean(agree)) if agree else float("nan")), len(agree)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="+", metavar="adapter",
                    help="adapter directories holding experiences.jsonl.gz (a run's adapters/N); several are pooled")
    ap.add_argument("--learn", action="store_true", help="replay a learning round on the experiences")
    ap.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                    help="a LearningOptions field for the replayed round, e.g. lr=1e-4 (repeatable)")
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
    # every experience with a known move, even beyond buffer_size (a run's buffer would have dropped the oldest)
    learner.buffer.train = deque(e for e in train if usable(e))
    learner.buffer.val = deque(e for e in val if usable(e))
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
    walks = {"frozen": run_ablations(run.cfg.hybrid)[FROZEN_ABLATION],
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

