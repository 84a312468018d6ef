r"""Does the advice help, and does the help last? Trains every arm (a set of config overrides) for every seed, scores
each run's latest and best checkpoints, and writes per arm the mean and a bootstrap 95% interval over seeds of test
P&L, Sharpe, max drawdown, breaches, trust and coverage, the same runs' advice alone (`llm_only`), the veto on
against off, and the paired difference against `rl_only` (same seeds). P&L differences also get an interval over
seeds and market days (`ci95_days`): the test and validation splits are each one market path, and an edge that one
path shows and the other does not is not an edge. On a synthetic market (or one scripts/write_market.py wrote as
files), `--fresh-days N` also scores every run on N days of a fresh path of the same preset, for a market interval
from more days than a split holds.

    python scripts/experiment.py --config configs/headlines.yaml --arms rl_only,news,random,shuffled --seeds 0-4 \
        --json docs/results/experiment-fusion-10-seeds/experiment.json --runs results/experiment-fusion/runs
    python scripts/experiment.py --quick --json /tmp/q/experiment.json    # 2 seeds, tiny runs: a few minutes

Writes the JSON, `table.md` and `plot.png` beside it; runs go to `--runs` (default: beside the JSON, in runs/),
one folder per arm and seed (`news-s0`). Each run is a job (agents/runs/jobs.py: its folder's job.yaml says what it
trains and how it is scored), run by `--backend` with the same flags as walkforward.py's: local (one after another in
this process, seed-major), `processes --jobs N`, `ray` or `slurm` (docs/scale.md#many-runs-at-once); the report is
read from the folders whichever backend ran them. A second invocation resumes: a run with its evaluation saved
(`experiment_eval.json`) is read back (scored again, not trained, when an older version scored it), a run without
it is resumed from its latest checkpoint (train's --resume), and only missing runs start.

    python scripts/experiment.py --arms rl_only,news --seeds 0-4 --backend processes --jobs 4 \
        --json results/experiment-fusion/experiment.json
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.command_line import print_error
from agents.config import RUN_CONFIG_FILE, ConfigError, HybridConfig, load_config, to_dict
from agents.runs.backends import BackendOptions, add_backend_arguments
from agents.runs.jobs import Job, write_job
from jaxenv.config import DataConfig
from jaxenv.market_files import BARS_FILE, MARKET_FILE, NEWS_FILE, write_market, written_market

# the SmolLM2 adapter learned from outcomes on synthetic:headlines, shipped (docs/advisor-learning.md says how it was made)
LEARNED_ADAPTER = str(Path(__file__).resolve().parents[1] / "adapters" / "smollm2-headlines")
# arm -> config overrides (`--set` syntax). An arm names the advisor (and for the switch, the fusion); the agent's
# entry rules come from the config: configs/headlines.yaml (the learned mixture on synthetic:headlines) or
# configs/record_bound.yaml (the best agent: the mixture bound on the advice's record, on headlines_then_trend).
ARMS: dict[str, list[str]] = {
    # the policy alone: the baseline of every paired difference (on any config, one whose advisor learns included)
    "rl_only": ["llm=none", "hybrid.learning.enabled=false"],
    "advised": [],  # the config's own advisor and fusion, as configured (walkforward.py --llm names its advisor)
    "news": ["llm=mock", "hybrid.mock.answers=news"],  # the headline's direction (HOLD without news): informed
    "news_pass": ["llm=mock", "hybrid.mock.answers=news_pass"],  # ... PASS (no view) without news
    "random": ["llm=mock", "hybrid.mock.answers=random"],  # coin flips: no information, other statistics
    # the news advisor asked about the block a session earlier: its answers and statistics, none of its information
    "shuffled": ["llm=mock", "hybrid.mock.answers=news", "hybrid.shuffled=true"],
    # no trust to learn: the PASS advisor's view acts where it has one, the policy everywhere else, every env bound
    "news_pass_switch": ["llm=mock", "hybrid.mock.answers=news_pass", "hybrid.fusion=switch",
                         "hybrid.query.bind_on=always"],
    # the embedded SmolLM2 reading the prompt: as shipped; with the adapter it learned from outcomes on the headlines
    # market (LEARNED_ADAPTER, fixed); that advisor asked about other bars; and learning during the PPO run
    "frozen_smollm2": ["llm=smollm2", "hybrid.learning.enabled=false", "hybrid.sidecar.adapter="],
    "learned_smollm2": ["llm=smollm2", "hybrid.learning.enabled=false", f"hybrid.sidecar.adapter={LEARNED_ADAPTER}"],
    "shuffled_smollm2": ["llm=smollm2", "hybrid.learning.enabled=false", f"hybrid.sidecar.adapter={LEARNED_ADAPTER}",
                         "hybrid.shuffled=true"],
    "online_smollm2": ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.sidecar.adapter="],
    # its control: learning from moves permuted across sessions (it must not learn the headline)
    "online_placebo": ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.sidecar.adapter=",
                       "hybrid.learning.placebo=true"],
}
BASELINE = "rl_only"
ADVISED = "advised"  # the arm of the config's own advisor (walkforward.py refuses it where the config has llm: none)
CHECKPOINTS = ("latest", "best")
EVAL_FILE = "experiment_eval.json"  # a run's scored checkpoints: its presence means the run is finished
SCORE_FILE = EVAL_FILE  # as agents.runs.jobs asks a scorer
# the scoring's version: a run scored by an older one (without daily P&L or validation walks (2); without the veto
# switched on the fresh path, and before the veto's rule near the drawdown limit (3)) is scored again, untrained
EVAL_VERSION = 3
RESAMPLES = 10_000
# Market intervals resample blocks of consecutive trading days (circular): a regime lasts 60-180 bars, under half a
# session, so 3-day blocks keep what dependence there is between neighbouring days.
DAY_BLOCK = 3
# --fresh-days walks a path of the run's synthetic preset drawn with its data seed plus this: bars no run trained on
FRESH_SEED_OFFSET = 1000
# --quick: small envs and data, two updates with a checkpoint and a validation walk after each
QUICK_SEEDS = [0, 1]
QUICK_UPDATES = 2
QUICK_OVERRIDES = ["num_envs=64", "data.synthetic_days=20", "checkpoint.every_updates=1",
                   "checkpoint.eval_every_updates=1", "log.warmup_updates=0", "hybrid.link.budget=64"]
# figures per checkpoint: name -> (walk, metric); walks are on test unless named val_
FIGURES: dict[str, tuple[str, str]] = {
    "test_pnl": ("agent", "net_pnl"),
    "val_pnl": ("val_agent", "net_pnl"),
    "llm_only_val_pnl": ("val_llm_only", "net_pnl"),
    "fresh_pnl": ("fresh_agent", "net_pnl"),
    "llm_only_fresh_pnl": ("fresh_llm_only", "net_pnl"),
    "test_sharpe": ("agent", "sharpe_daily"),
    "test_max_drawdown": ("agent", "max_drawdown"),
    "test_breaches": ("agent", "breaches"),
    "test_trades": ("agent", "trades"),
    "trust": ("agent", "mean_trust"),
    "coverage": ("agent", "advice_coverage"),
    "wait_rate": ("agent", "wait_rate"),
    "bracket_kept_rate": ("agent", "bracket_kept_rate"),
    "bound_rate": ("agent", "bound_rate"),
    "llm_only_test_pnl": ("llm_only", "net_pnl"),
}
# the fused agent with the veto off and on, at the latest checkpoint: split -> (walk off, walk on)
VETO_WALKS = {"test": ("fused_no_veto", "fused_veto"), "fresh": ("fresh_fused_no_veto", "fresh_fused_veto")}
VETO_METRICS = {"pnl": "net_pnl", "breaches": "breaches", "max_drawdown": "max_drawdown"}
FIGURES.update({f"veto_{side}_{split}_{name}": (walk, metric) for split, walks in VETO_WALKS.items()
                for side, walk in zip(("off", "on"), walks) for name, metric in VETO_METRICS.items()})
# paired differences within an arm's runs: name -> (figure, figure subtracted)
PAIRED_WITHIN = {
    "paired_test_pnl_vs_llm_only": ("test_pnl", "llm_only_test_pnl"),
    "paired_val_pnl_vs_llm_only": ("val_pnl", "llm_only_val_pnl"),
    "paired_fresh_pnl_vs_llm_only": ("fresh_pnl", "llm_only_fresh_pnl"),
    **{f"paired_veto_{split}_{name}": (f"veto_on_{split}_{name}", f"veto_off_{split}_{name}")
       for split in VETO_WALKS for name in VETO_METRICS},
}


@dataclass
class Plan:
    config: str
    arms: list[str]
    seeds: list[int]
    json_path: Path
    runs_dir: Path
    overrides: list[str]  # applied after the arm's
    updates: int | None  # PPO updates per run; None: the config's total_steps
    partial: bool = False  # report the seeds every arm has finished; train and score nothing
    fresh_days: int = 0  # > 0: also score on this many days of a fresh path of the config's synthetic preset

    def run_dir(self, arm: str, seed: int) -> Path:
        """The folder of the run of `arm` with training seed `seed`."""
        return self.runs_dir / f"{arm}-s{seed}"


def parse_seeds(text: str) -> list[int]:
    """`0-4` or `0,2,3` (or a mix: `0-2,5`) → sorted distinct seeds."""
    seeds: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"--seeds {text!r}: use a range such as 0-4 or a list such as 0,1,2")
        seeds.update(range(int(lo), int(hi if sep else lo) + 1))
    if not seeds:
        raise ValueError(f"--seeds {text!r}: no seeds")
    return sorted(seeds)


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"--arms: unknown arm {', '.join(unknown) or repr(text)}; choose from {', '.join(ARMS)}")
    if BASELINE not in arms:
        arms.insert(0, BASELINE)  # every paired difference needs it
    return list(dict.fromkeys(arms))


def run_config(plan: Plan, arm: str, seed: int):
    overrides = [*ARMS[arm], f"seed={seed}", *plan.overrides]
    cfg = load_config(plan.config, overrides)
    if plan.updates is not None:
        cfg = load_config(plan.config, [*overrides, f"total_steps={plan.updates * cfg.steps_per_update}"])
    return cfg


REPORTING_KEYS = ("log.progress",)  # config keys that change how a run reports, not what it learns


def flat_config(settings: dict) -> dict[str, Any]:
    """A whole config as data (`settings`: agents.config.to_dict's) as {dotted key: value}."""
    def walk(d: dict, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(walk(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out
    return walk(settings, "")


def check_saved_runs(plan: Plan) -> None:
    """Every run folder this experiment would read back or resume was started with the config it asks for (the arm's
    overrides, the seed, --set, --quick/--updates): a run trained on another market or setting would make the
    results silently wrong. Raises ValueError naming the folder and the first differing key."""
    for seed in plan.seeds:
        for arm in plan.arms:
            path = plan.run_dir(arm, seed) / RUN_CONFIG_FILE
            if not path.exists():
                continue
            saved = flat_config(to_dict(load_config(path)))
            wanted = flat_config(to_dict(run_config(plan, arm, seed)))
            differ = [k for k in wanted if k not in REPORTING_KEYS and saved.get(k) != wanted[k]
                      and not (k.startswith("hybrid.") and wanted["llm"] == "none")]  # no advisor: no hybrid
            if differ:
                k = differ[0]
                more = f" (and {len(differ) - 1} more keys)" if len(differ) > 1 else ""
                raise ValueError(f"{path.parent}: trained with {k}={saved.get(k)!r} but this experiment asks for "
                                 f"{k}={wanted[k]!r}{more}; pass the settings it was trained with, or another --runs")


def fresh_market(data: DataConfig, days: int, offset: int = FRESH_SEED_OFFSET) -> DataConfig:
    """`days` of the run's synthetic preset on a path of its own (data seed + `offset`): the same market, bars no
    run trained on. A market written as files (scripts/write_market.py) gets its fresh path written as files beside
    it, read the same way."""
    written = written_market(data.source)
    if written is None:
        return dataclasses.replace(data, synthetic_days=days, synthetic_seed=data.synthetic_seed + offset)
    seed = written["seed"] + offset
    folder = Path(data.source).parent / f"fresh-{days}d-s{seed}"
    if not (folder / MARKET_FILE).exists():
        write_market(folder, written["preset"], written["contract"], days, seed)
    news = folder / NEWS_FILE
    return dataclasses.replace(data, source=str(folder / BARS_FILE), news=str(news) if data.news else "")


def veto_walks(hybrid: HybridConfig) -> tuple[str, str]:
    """(the walk the agent as trained is, the walk with its veto switched): fused_veto and fused_no_veto."""
    on, off = "fused_veto", "fused_no_veto"
    return (on, off) if hybrid.veto.enabled else (off, on)


def score_run(run_dir: Path, fresh_days: int = 0) -> dict[str, Any]:
    """Both checkpoints, greedy, each split walked whole (test and validation): the agent and, for an advised run,
    the advice alone; at the latest checkpoint also the fused agent with the veto switched on test (the agent is the
    fused agent with the veto as it trained). With `fresh_days`, the agent and the advice alone also walk that many
    days of a fresh path of the run's synthetic preset, and at the latest the fused agent with the veto switched.
    Each P&L walk keeps its daily P&L, for intervals over market days."""
    import jax

    from agents.advice.usage import walk_advice_metrics
    from agents.evaluation.advised_walk import LLM_ONLY
    from agents.evaluation.saved_run import ablation_walks, agent_walk, load_run, walk_bounds
    from agents.runs.saved_runs import restore_policy
    from jaxenv.metrics import daily_pnl, walk_metrics

    def score(run, walk, split: str) -> dict:
        market = run.market
        trace = walk(walk_bounds(market, split), jax.random.PRNGKey(0))
        m = walk_metrics(trace, market.timestamps, run.cfg.env.prop_firm, market.sessions.day)
        if "advice_valid" in trace:
            m.update(walk_advice_metrics(trace))
        m["daily_pnl"] = {str(day): float(pnl)
                          for day, pnl in daily_pnl(trace, market.timestamps, market.sessions.day).items()}
        return m

    out: dict[str, Any] = {"version": EVAL_VERSION, "fresh_days": fresh_days}
    latest = load_run(run_dir, "latest")  # its walker (compiled walks, advisor sidecar) serves both checkpoints
    policies = {"latest": latest.saved, "best": restore_policy(run_dir, "best", latest.cfg)}  # restored once

    def at(run, kind: str):
        return dataclasses.replace(run, saved=policies[kind])

    try:
        for kind in CHECKPOINTS:
            run = at(latest, kind)
            agent = agent_walk(run)
            walks = {"agent": score(run, agent, "test"), "val_agent": score(run, agent, "val")}
            if run.advised:
                ablations = ablation_walks(run)
                walks["llm_only"] = score(run, ablations[LLM_ONLY].walk, "test")
                walks["val_llm_only"] = score(run, ablations[LLM_ONLY].walk, "val")
                trained, switched = veto_walks(run.cfg.hybrid)
                walks[trained] = walks["agent"]
                if kind == "latest":
                    walks[switched] = score(run, ablations[switched].walk, "test")
            out[kind] = {"update": run.saved.step, "walks": walks}
    finally:
        latest.close()
    if fresh_days:
        fresh = load_run(run_dir, "latest", data=fresh_market(latest.cfg.data, fresh_days))
        try:
            for kind in CHECKPOINTS:
                run = at(fresh, kind)
                walks = out[kind]["walks"]
                walks["fresh_agent"] = score(run, agent_walk(run), "all")
                if run.advised:
                    ablations = ablation_walks(run)
                    walks["fresh_llm_only"] = score(run, ablations[LLM_ONLY].walk, "all")
                    if kind == "latest":
                        trained, switched = veto_walks(run.cfg.hybrid)
                        walks[f"fresh_{trained}"] = walks["fresh_agent"]
                        walks[f"fresh_{switched}"] = score(run, ablations[switched].walk, "all")
        finally:
            fresh.close()
    return out


def scored_as_asked(scores: dict[str, Any], fresh_days: int = 0) -> bool:
    """Saved scores hold every walk an experiment with `fresh_days` reports, as the current version walks them: its
    own, or version 2's for a run without an advisor (3 changed only the veto's walks). agents.runs.jobs scores a run
    again, untrained, when they do not."""
    if fresh_days not in (0, scores.get("fresh_days", 0)):
        return False
    advised = "llm_only" in scores.get("latest", {}).get("walks", {})
    return scores.get("version") == EVAL_VERSION or (scores.get("version") == 2 and not advised)


def plan_jobs(plan: Plan) -> list[Job]:
    """Every arm × seed as a job (agents.runs.jobs), seed-major: a stopped experiment leaves whole seeds."""
    return [Job(plan.run_dir(arm, seed), run_config(plan, arm, seed), __name__, {"fresh_days": plan.fresh_days},
                label=f"{arm}-s{seed}") for seed in plan.seeds for arm in plan.arms]


def collect(plan: Plan) -> dict[str, dict[int, dict]]:
    """Every run's saved scores, read back from its folder (whichever backend made them), as this experiment reports
    them: arm -> seed -> scores."""
    return {arm: {s: without_unasked_fresh(json.loads((plan.run_dir(arm, s) / EVAL_FILE).read_text()), plan.fresh_days)
                  for s in plan.seeds} for arm in plan.arms}


def without_unasked_fresh(scores: dict[str, Any], fresh_days: int) -> dict[str, Any]:
    """Scores of a run that another experiment walked on a fresh path, as this one (without --fresh-days) reports
    them: a report's fresh figures all come from the N days it names."""
    if fresh_days:
        return scores
    out = {**scores, "fresh_days": 0}
    for kind in CHECKPOINTS:
        walks = {name: w for name, w in scores[kind]["walks"].items() if not name.startswith("fresh_")}
        out[kind] = {**scores[kind], "walks": walks}
    return out


def bootstrap(values: list[float | None], seed: int = 0) -> dict[str, Any]:
    """Mean over seeds and the percentile-bootstrap 95% interval of that mean (RESAMPLES resamples of the seeds,
    seeded). Seeds where the figure is undefined are left out; none defined gives nulls."""
    v = np.asarray([x for x in values if x is not None], np.float64)
    if not len(v):
        return {"mean": None, "ci95": None, "n": 0}
    means = v[np.random.default_rng(seed).integers(0, len(v), (RESAMPLES, len(v)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(v.mean()), "ci95": [float(min(lo, v.mean())), float(max(hi, v.mean()))], "n": len(v)}


def seeds_and_days_interval(splits: list[np.ndarray], seed: int = 0) -> list[float]:
    """95% interval of the mean over seeds of the P&L summed over the days walked, from a bootstrap that resamples
    the seeds and, within each split, circular blocks of DAY_BLOCK consecutive days: training's noise and the
    market's. `splits` holds one seeds × days matrix of daily P&L per split walked; the splits' sums add up."""
    rng = np.random.default_rng(seed)
    n_seeds = splits[0].shape[0]
    picked_seeds = rng.integers(0, n_seeds, (RESAMPLES, n_seeds))
    totals = np.zeros(RESAMPLES)
    for daily in splits:
        days = daily.shape[1]
        block = min(DAY_BLOCK, days)
        starts = rng.integers(0, days, (RESAMPLES, -(-days // block)))
        picked_days = ((starts[:, :, None] + np.arange(block)) % days).reshape(RESAMPLES, -1)[:, :days]
        sums = daily[:, picked_days].sum(2)  # seeds × resamples: each seed's total on each resample of the days
        totals += np.take_along_axis(sums.T, picked_seeds, 1).mean(1)
    mean = sum(float(d.sum(1).mean()) for d in splits)
    lo, hi = np.percentile(totals, [2.5, 97.5])
    return [float(min(lo, mean)), float(max(hi, mean))]


def same_days(series: list[dict[str, float]]) -> list[str]:
    """The trading days every one of `series` walked, sorted; ValueError when they differ."""
    days = sorted(series[0])
    if any(sorted(d) != days for d in series):
        raise ValueError("the runs walked different trading days: were they trained on the same data?")
    return days


def day_matrix(series: list[dict[str, float] | None]) -> np.ndarray | None:
    """Seeds × days from each seed's {day: P&L}; None when a seed has no daily P&L (scored by an older version)."""
    if any(d is None for d in series):
        return None
    days = same_days(series)
    return np.asarray([[d[day] for day in days] for d in series], np.float64)


def difference(x: float | None, y: float | None) -> float | None:
    """x − y; None where either is undefined."""
    return None if x is None or y is None else x - y


def daily_difference(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None:
        return None
    return {day: a[day] - b[day] for day in same_days([a, b])}


def with_days(figure: dict[str, Any], splits: list[list[dict[str, float] | None]]) -> dict[str, Any]:
    """The figure with `ci95_days`, its interval over seeds and market days (None where a run lacks daily P&L)."""
    matrices = [day_matrix(per_seed) for per_seed in splits]
    figure["ci95_days"] = None if any(m is None for m in matrices) else seeds_and_days_interval(matrices)
    return figure


# figures that are a walk's P&L, whose daily P&L the scoring keeps -> the walk
DAILY_FIGURES = {"test_pnl": "agent", "val_pnl": "val_agent", "llm_only_test_pnl": "llm_only",
                 "llm_only_val_pnl": "val_llm_only", "fresh_pnl": "fresh_agent", "llm_only_fresh_pnl": "fresh_llm_only",
                 **{f"veto_{side}_fresh_pnl": walk for side, walk in zip(("off", "on"), VETO_WALKS["fresh"])}}


def per_seed_figures(scores: dict[str, Any], kind: str) -> dict[str, float | None]:
    walks = scores[kind]["walks"]
    return {name: walks.get(walk, {}).get(metric) for name, (walk, metric) in FIGURES.items()}


def per_seed_daily(scores: dict[str, Any], kind: str) -> dict[str, dict[str, float] | None]:
    walks = scores[kind]["walks"]
    return {name: walks.get(walk, {}).get("daily_pnl") for name, walk in DAILY_FIGURES.items()}


def summarize(results: dict[str, dict[int, dict]], seeds: list[int]) -> dict[str, Any]:
    """{arm: {"latest": {figure: {mean, ci95, n[, ci95_days]}, "paired_test_pnl_vs": {other arm: {...}}},
    "best": {...}, "runs": {seed: {...}}}}. `ci95` is over seeds; `ci95_days`, where daily P&L was kept, over seeds
    and market days (seeds_and_days_interval)."""
    arms: dict[str, Any] = {}
    daily: dict[tuple[str, str], dict[int, dict]] = {}  # (arm, checkpoint) -> seed -> figure -> {day: P&L}
    for arm, by_seed in results.items():
        arms[arm] = {"runs": {}}
        for kind in CHECKPOINTS:
            rows = {s: per_seed_figures(by_seed[s], kind) for s in seeds}
            days = {s: per_seed_daily(by_seed[s], kind) for s in seeds}
            base = {s: per_seed_figures(results[BASELINE][s], kind) for s in seeds}
            base_days = {s: per_seed_daily(results[BASELINE][s], kind) for s in seeds}
            for s in seeds:
                for split in ("test", "val", "fresh"):
                    pnl = f"{split}_pnl"
                    rows[s][f"paired_{pnl}_vs_rl_only"] = difference(rows[s][pnl], base[s][pnl])
                    days[s][f"paired_{pnl}_vs_rl_only"] = daily_difference(days[s][pnl], base_days[s][pnl])
                for name, (a, b) in PAIRED_WITHIN.items():
                    rows[s][name] = difference(rows[s][a], rows[s][b])
                    if a in DAILY_FIGURES and b in DAILY_FIGURES:
                        days[s][name] = daily_difference(days[s][a], days[s][b])
                x, y = rows[s]["paired_val_pnl_vs_llm_only"], rows[s]["paired_test_pnl_vs_llm_only"]
                rows[s]["paired_val_test_pnl_vs_llm_only"] = None if x is None or y is None else x + y
            figures = {name: bootstrap([rows[s][name] for s in seeds]) for name in rows[seeds[0]]}
            for name in days[seeds[0]]:
                with_days(figures[name], [[days[s][name] for s in seeds]])
            with_days(figures["paired_val_test_pnl_vs_llm_only"],
                      [[days[s][f"paired_{split}_pnl_vs_llm_only"] for s in seeds] for split in ("val", "test")])
            for split in VETO_WALKS:
                off, on = figures[f"veto_off_{split}_pnl"]["mean"], figures[f"veto_on_{split}_pnl"]["mean"]
                figures[veto_cost_name(split)] = None if off is None or on is None else (off - on) / abs(off)
            figures["updates"] = [by_seed[s][kind]["update"] for s in seeds]
            arms[arm][kind] = figures
            daily[arm, kind] = days
            for s in seeds:
                arms[arm]["runs"].setdefault(str(s), {})[kind] = rows[s]
    # Arm against arm, seed by seed: what the informed advice earns over a control that shares all the machinery.
    for arm, a in arms.items():
        for kind in CHECKPOINTS:
            a[kind]["paired_test_pnl_vs"] = {
                other: with_days(
                    bootstrap([a["runs"][str(s)][kind]["test_pnl"] - arms[other]["runs"][str(s)][kind]["test_pnl"]
                               for s in seeds]),
                    [[daily_difference(daily[arm, kind][s]["test_pnl"], daily[other, kind][s]["test_pnl"])
                      for s in seeds]])
                for other in arms if other not in (arm, BASELINE)}
    return arms


def veto_cost_name(split: str) -> str:
    """The figure of the veto's P&L cost on `split`: (off − on) / |off| of the mean P&L."""
    return "veto_pnl_cost" if split == "test" else f"veto_{split}_pnl_cost"


def _cell(f: dict[str, Any], money: bool = True, interval: str = "ci95") -> str:
    if f["mean"] is None or f.get(interval) is None:
        return "–"
    fmt = (lambda x: f"{x:,.0f}") if money else (lambda x: f"{x:.3f}")
    return f"{fmt(f['mean'])} [{fmt(f[interval][0])}, {fmt(f[interval][1])}]"


# the table of intervals over seeds and market days: column -> figure
DAY_COLUMNS = {"vs rl_only, test": "paired_test_pnl_vs_rl_only", "vs rl_only, val": "paired_val_pnl_vs_rl_only",
               "− advice alone, test": "paired_test_pnl_vs_llm_only",
               "− advice alone, val": "paired_val_pnl_vs_llm_only",
               "− advice alone, val + test": "paired_val_test_pnl_vs_llm_only",
               "P&L, fresh": "fresh_pnl", "advice alone, fresh": "llm_only_fresh_pnl",
               "vs rl_only, fresh": "paired_fresh_pnl_vs_rl_only", "− advice alone, fresh": "paired_fresh_pnl_vs_llm_only"}


def table(summary: dict[str, Any], command: str) -> str:
    """Markdown: one row per arm and checkpoint, each cell the mean over seeds [bootstrap 95% interval]; the veto's
    trade-off at the latest checkpoint."""
    head = ["arm", "checkpoint", "test P&L", "paired vs rl_only", "advice alone (llm_only)", "fused − advice alone",
            "val P&L", "Sharpe", "max drawdown", "breaches", "trades", "trust g", "coverage", "entries waited"]
    n = summary["arms"][BASELINE]["latest"]["test_pnl"]["n"]
    lines = [f"`{command}`", "",
             f"Mean over {n} seeds {summary['seeds']}"
             + (" (partial: the seeds every arm has finished so far)" if summary.get("partial") else "")
             + " [bootstrap 95% interval of the mean]; test split, greedy, whole split walked.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, a in summary["arms"].items():
        for kind in CHECKPOINTS:
            f = a[kind]
            cells = [arm, kind, _cell(f["test_pnl"]), _cell(f["paired_test_pnl_vs_rl_only"]),
                     _cell(f["llm_only_test_pnl"]), _cell(f["paired_test_pnl_vs_llm_only"]), _cell(f["val_pnl"]),
                     _cell(f["test_sharpe"], False), _cell(f["test_max_drawdown"]), _cell(f["test_breaches"], False),
                     _cell(f["test_trades"]), _cell(f["trust"], False), _cell(f["coverage"], False),
                     _cell(f["wait_rate"], False)]
            lines.append("| " + " | ".join(cells) + " |")
    others = [arm for arm in summary["arms"] if arm != BASELINE]
    columns = {column: figure for column, figure in DAY_COLUMNS.items()  # those some arm has
               if any(summary["arms"][arm][kind][figure].get("ci95_days") for arm in others for kind in CHECKPOINTS)}
    if columns:
        fresh = summary.get("fresh_days")
        lines += ["", f"P&L and paired differences with intervals over seeds and market days (a bootstrap resampling "
                  f"the seeds and blocks of {DAY_BLOCK} trading days; the seed-only interval above sees one market "
                  "path per split)" + (f"; fresh: {fresh} days of a path no run trained on" if fresh else "") + ":",
                  "", "| arm | checkpoint | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 2)]
        for arm in others:
            for kind in CHECKPOINTS:
                f = summary["arms"][arm][kind]
                lines.append(f"| {arm} | {kind} | "
                             + " | ".join(_cell(f[figure], interval="ci95_days") for figure in columns.values()) + " |")
    if len(others) > 1:
        lines += ["", "Arm against arm (row − column), test P&L at the latest checkpoint, paired by seed:", "",
                  "| row − column | " + " | ".join(others) + " |", "|" + "---|" * (len(others) + 1)]
        for arm in others:
            vs = summary["arms"][arm]["latest"]["paired_test_pnl_vs"]
            lines.append(f"| {arm} | " + " | ".join(_cell(vs[o]) if o in vs else "" for o in others) + " |")
    on_fresh = ("; also on the fresh path, {the interval over seeds and market days}" if summary.get("fresh_days")
                else "")
    lines += ["", "The risk veto: the fused agent with it off and on (the latest checkpoint, scored both "
              f"ways{on_fresh}):", "",
              ("| arm | split | P&L off | P&L on | on − off | P&L cost | breaches off | breaches on | on − off | "
               "max drawdown off | max drawdown on | on − off |"), "|" + "---|" * 12]
    for arm, a in summary["arms"].items():
        f = a["latest"]
        for split in VETO_WALKS:
            if f[f"veto_off_{split}_pnl"]["mean"] is None or f[f"veto_on_{split}_pnl"]["mean"] is None:
                continue
            paired = f[f"paired_veto_{split}_pnl"]
            lo_hi = paired.get("ci95_days")
            days = f" {{{lo_hi[0]:,.0f}, {lo_hi[1]:,.0f}}}" if lo_hi else ""
            cells = [arm, split]
            for name in VETO_METRICS:
                money = name != "breaches"
                cells += [_cell(f[f"veto_off_{split}_{name}"], money), _cell(f[f"veto_on_{split}_{name}"], money),
                          _cell(f[f"paired_veto_{split}_{name}"], money) + (days if name == "pnl" else "")]
                if name == "pnl":
                    cells.append(f"{f[veto_cost_name(split)]:.1%}")  # below 0: the veto gained
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: Path) -> None:
    """P&L per arm (fused agent and advice alone), means with their 95% intervals: on test at both checkpoints and,
    with --fresh-days, on the fresh path at the latest (its own scale: many more days than a split holds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summary["arms"])
    panels = [(kind, "test", f"{kind} checkpoint, test split") for kind in CHECKPOINTS]
    if summary.get("fresh_days"):
        panels.append(("latest", "fresh", f"latest checkpoint, fresh path\n(--fresh-days {summary['fresh_days']})"))
    fig, axes = plt.subplots(1, len(panels), figsize=(1 + (2 + 1.4 * len(arms)) * len(panels) / 2, 4))
    for ax, (kind, where, title) in zip(axes, panels):
        for offset, (figure, label) in zip((-0.2, 0.2), ((f"{where}_pnl", "agent"),
                                                          (f"llm_only_{where}_pnl", "advice alone"))):
            xs, means, errs = [], [], [[], []]
            for i, arm in enumerate(arms):
                f = summary["arms"][arm][kind][figure]
                if f["mean"] is None:
                    continue
                xs.append(i + offset)
                means.append(f["mean"])
                errs[0].append(f["mean"] - f["ci95"][0])
                errs[1].append(f["ci95"][1] - f["mean"])
            ax.bar(xs, means, width=0.38, yerr=errs, capsize=3, label=label)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(arms)), arms, rotation=20)
        ax.set_title(title)
    axes[0].set_ylabel("net P&L, $ (mean over seeds, 95% CI)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(plan: Plan, command: str, progress: bool = True, backend: BackendOptions = BackendOptions()
        ) -> dict[str, Any]:
    """Every arm × seed as a job (its folder's job.yaml written first), run by `backend` (agents.runs.backends:
    seed-major in this process, several processes at once, or Ray's or SLURM's; their own state beside the runs
    folder, in ray/ or slurm/), then the JSON, table and plot from the run folders. A run another process holds (its
    folder is locked) is taken up again after the others. JobsFailed (nothing written) when a run failed. --partial
    (plan.partial) reports the saved scores and runs nothing."""
    check_saved_runs(plan)
    if plan.partial:
        return report(plan, command, saved_results(plan))
    jobs = plan_jobs(plan)
    for job in jobs:
        write_job(job)
    outcome = backend.run(jobs, progress=progress, desc="runs", state_dir=plan.runs_dir.parent / backend.backend)
    outcome.check()
    return report(plan, command, collect(plan))


def saved_results(plan: Plan) -> dict[str, dict[int, dict]]:
    """The saved scores of the seeds that every arm has finished (a pairing needs them all)."""
    paths = {(arm, seed): plan.run_dir(arm, seed) / EVAL_FILE for arm in plan.arms for seed in plan.seeds}
    seeds = [s for s in plan.seeds if all(paths[arm, s].exists() for arm in plan.arms)]
    if not seeds:
        raise ValueError(f"--partial: no seed of {plan.seeds} has finished every arm in {plan.runs_dir}")
    plan.seeds = seeds
    return {arm: {s: without_unasked_fresh(json.loads(paths[arm, s].read_text()), plan.fresh_days) for s in seeds}
            for arm in plan.arms}


def report(plan: Plan, command: str, results: dict[str, dict[int, dict]]) -> dict[str, Any]:
    """Writes the JSON, table.md and plot.png of the runs' scores."""
    summary = {"command": command, "config": plan.config, "seeds": plan.seeds, "partial": plan.partial,
               "fresh_days": plan.fresh_days,
               "overrides": plan.overrides, "arm_overrides": {arm: ARMS[arm] for arm in plan.arms}, "resamples": RESAMPLES,
               "arms": summarize(results, plan.seeds)}
    plan.json_path.parent.mkdir(parents=True, exist_ok=True)
    plan.json_path.write_text(json.dumps(summary, indent=1))
    (plan.json_path.parent / "table.md").write_text(table(summary, command))
    plot(summary, plan.json_path.parent / "plot.png")
    return summary


def plan_from_args(args) -> Plan:
    """Checks the command line; a ValueError or ConfigError names the flag or key that is wrong."""
    if "experiment" not in Path(args.json).name:
        raise ValueError(f"--json {args.json}: the file name must contain 'experiment'")
    if not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: file not found")
    seeds = parse_seeds(args.seeds) if args.seeds else (QUICK_SEEDS if args.quick else parse_seeds("0-4"))
    json_path = Path(args.json)
    plan = Plan(args.config, parse_arms(args.arms), seeds, json_path,
                Path(args.runs) if args.runs else json_path.parent / "runs",
                [*(QUICK_OVERRIDES if args.quick else []), *(["log.progress=false"] if args.no_progress else []),
                 *args.overrides],
                QUICK_UPDATES if args.quick else args.updates, args.partial, args.fresh_days)
    for arm in plan.arms:  # every run's config is checked before the first one trains
        source = run_config(plan, arm, plan.seeds[0]).data.source
        if plan.fresh_days and not source.startswith("synthetic:") and written_market(source) is None:
            raise ValueError(f"--fresh-days: the runs trade {source}; a fresh path needs a synthetic:PRESET market "
                             "or one written by scripts/write_market.py")
    return plan


def parser():
    """experiment.py's command line."""
    from agents.command_line import CommandParser

    ap = CommandParser(description=__doc__)
    ap.add_argument("--config", default="configs/headlines.yaml", help="the runs' config (default: %(default)s)")
    ap.add_argument("--arms", default="rl_only,news,random,shuffled",
                    help=f"comma-separated arms from {', '.join(ARMS)}; rl_only is always added (default: %(default)s)")
    ap.add_argument("--seeds", help="training seeds: a range 0-4 or a list 0,1,2 (default: 0-4; --quick: 0-1)")
    ap.add_argument("--json", default="results/experiment-fusion/experiment.json",
                    help="the results' JSON; table.md and plot.png go beside it (default: %(default)s)")
    ap.add_argument("--runs", help="folder of the run folders (default: runs/ beside the JSON)")
    ap.add_argument("--updates", type=int, help="PPO updates per run instead of the config's total_steps")
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny runs: {QUICK_UPDATES} updates of 64 envs on 20 days of data, seeds 0-1 by default")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key of every run (after the arm's), as in train.py; repeatable")
    ap.add_argument("--partial", action="store_true",
                    help="report the seeds every arm has finished so far (e.g. while the experiment runs); trains nothing")
    ap.add_argument("--fresh-days", type=int, default=0, metavar="N",
                    help="also score every run on N days of a fresh path of its synthetic preset, bars no run trained "
                         "on: market intervals from N days instead of the test split's few (default: off)")
    add_backend_arguments(ap)  # --backend, --jobs, --ray-address, --slurm-*: walkforward.py's
    ap.add_argument("--no-progress", action="store_true", help="no progress bars (the experiment's and its runs')")
    return ap


def main(argv: list[str] | None = None) -> int:
    from agents.runs.backends import JobsFailed, backend_options

    args = parser().parse_args(argv)
    try:
        backend = backend_options(args)  # a bad flag or a missing package: one line, before anything is planned
        if args.updates is not None and args.updates < 1:
            raise ValueError("--updates: must be at least 1")
        if args.fresh_days < 0:
            raise ValueError("--fresh-days: must be 0 (off) or a number of days")
        plan = plan_from_args(args)
    except (ValueError, ConfigError) as e:
        print_error(e)
        return 2
    command = "python scripts/experiment.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        summary = run(plan, command, progress=not args.no_progress, backend=backend)
    except JobsFailed as e:  # each failed run and its log; the others are in their folders
        print_error(e)
        print(f"no table written: {len(e.failures)} run(s) failed; the same command runs them again and reads the "
              "others back", file=sys.stderr)
        return 1
    except ValueError as e:  # --partial with nothing finished, or runs trained with other settings
        print_error(e)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: the run in training keeps its checkpoints, finished runs their scores
        print(f"stopped: {e or 'interrupted; the same command resumes'}", file=sys.stderr)
        return 130
    print((plan.json_path.parent / "table.md").read_text())
    print(f"wrote {plan.json_path}, table.md and plot.png beside it; runs in {plan.runs_dir}")
    return 0 if summary else 1
