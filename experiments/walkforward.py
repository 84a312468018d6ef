r"""Walk-forward evaluation (docs/evaluation.md#walk-forward): does an agent's edge hold on sessions after the ones it
learned from, fold after fold?

For each fold (jaxenv.folds: a training window of whole sessions, its validation window cut from its end, a purge gap,
a test window), each arm of the config and each seed, a run trains on the fold's training window, its checkpoint is
chosen on the fold's validation window (the best), and it walks the fold's test window and, for the in-sample figure,
its own training window. The test windows back to back are one out-of-sample path per arm and seed: its P&L per
session, its equity curve, the evaluation's figures, each arm against flat (0), rl_only and its advice alone with
intervals over seeds and sessions, the probabilistic and deflated Sharpe ratios and the probability of backtest
overfitting over the arms and seeds (agents.evidence.overfitting).

    python scripts/walkforward.py --config configs/signal.yaml --arms rl_only --seeds 0-4 --folds 4 \
        --test-sessions 12 --out results/walk-forward/signal
    python scripts/walkforward.py --config configs/signal.yaml --data bars.csv --set data.contract=ES --out wf/es

Writes to --out: walkforward.json, table.md, equity.png, in_vs_out.png, trials.jsonl (every trial any walk-forward
in this folder ran: the deflated Sharpe ratio counts them) and runs/fold<K>/<arm>-s<seed>/ (<arm>-s<seed>-warm/ with
--warm-start: its own runs and trials, never a fresh walk-forward's read back). The same command resumes a stopped
walk-forward: a finished run's scores are read back, an unfinished run resumes from its checkpoint. Each run is a job
(agents/runs/jobs.py: its folder's job.yaml says what it trains and how it is scored); `--backend processes --jobs N`
runs N at once, each in a process of its own; `--backend ray` (a local Ray instance, or a cluster's with
--ray-address) and `--backend slurm` (a SLURM job array) need the `sweep` extra (docs/scale.md#many-runs-at-once);
the report is read from the folders whichever backend ran them.

    python scripts/walkforward.py --config configs/signal.yaml --seeds 0-4 --folds 4 --backend processes --jobs 4 \
        --out results/walk-forward/signal
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.command_line import data_overrides, print_error
from agents.config import RUN_CONFIG_FILE, ConfigError, load_config, refuse_set_learning, to_dict
from agents.runs.backends import BackendOptions, add_backend_arguments
from agents.runs.jobs import Job, write_job
from experiments.fusion import ADVISED, ARMS, BASELINE, flat_config, parse_seeds, seeds_and_days_interval
from jaxenv.folds import Fold, FoldPlan, plan_folds, session_starts

FLAT = "flat"  # never trades: 0 on every session, no run
BUY_AND_HOLD = "buy_and_hold"  # the market's own move on each test window (jaxenv.evaluate.buy_and_hold), no run
SCORE_FILE = "walkforward_eval.json"  # a run's scores: its presence means the run is finished
SCORE_VERSION = 2  # 2: buy-and-hold's sessions on the test window
TRIALS_FILE = "trials.jsonl"
# a run's config may differ from the plan's in these only (the gate's bar judges a run, it does not train it)
REPORTING_KEYS = ("log.progress", "transfer.init_from", "gate_against")


@dataclass
class Plan:
    config: str
    arms: list[str]  # fusion.ARMS (rl_only first); flat is walked, not trained
    seeds: list[int]
    folds: list[Fold]
    out: Path
    overrides: list[str]  # applied after the arm's
    warm_start: bool = False  # each fold continues from the previous fold's agent (its best checkpoint)
    llm: str | None = None  # --llm: the advised arm's advisor (None: the config's); part of the arm, before --set
    advisor: str | None = None  # several instruments: --llm's advisor, whose advice alone each run is scored with

    def arm_overrides(self, arm: str) -> list[str]:
        """The arm's overrides (fusion.ARMS), --llm's advisor for the advised arm included."""
        return [*ARMS[arm], *([f"llm={self.llm}"] if arm == ADVISED and self.llm is not None else [])]

    @property
    def score_options(self) -> dict[str, Any]:
        """The runs' scorer's options (score_run's keyword arguments)."""
        return {"advisor": self.advisor} if self.advisor else {}

    def run_dir(self, fold: Fold, arm: str, seed: int) -> Path:
        # a warm start's folders are its own: in a fresh walk-forward's --out it would read the fresh runs back
        return self.out / "runs" / f"fold{fold.index}" / f"{arm}-s{seed}{'-warm' if self.warm_start else ''}"

    def run_config(self, fold: Fold, arm: str, seed: int):
        overrides = [*self.arm_overrides(arm), f"seed={seed}", "log.progress=false", *self.overrides,
                     f"data.splits={fold.spec()}"]
        if self.warm_start and fold.index:
            overrides.append(f"transfer.init_from={self.run_dir(self.folds[fold.index - 1], arm, seed)}")
        return load_config(self.config, overrides)

    def trial(self, arm: str, seed: int) -> dict:
        """A trial, as the ledger counts it: the arm's config (every key but the fold's and the seed), whether each fold
        starts from the previous fold's agent, and the seed."""
        cfg = flat_config(to_dict(self.run_config(self.folds[0], arm, seed)))
        kept = {k: v for k, v in cfg.items() if k not in ("seed", "data.splits", *REPORTING_KEYS)}
        if not kept.get("data.instruments"):  # one instrument: its digest as before data.instruments existed
            kept.pop("data.instruments", None)
        if self.warm_start:  # fold 0 has no transfer.init_from to tell; fresh walk-forwards' digests stay as they were
            kept["warm_start"] = True
        digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return {"config": digest, "arm": arm, "seed": seed, "source": data_name(cfg)}


def data_name(flat: dict) -> str:
    """The data a trial ran on, as the ledger counts trials: data.source, or each instrument's SYMBOL=SOURCE of a set."""
    instruments = flat.get("data.instruments") or []
    if not instruments:
        return flat["data.source"]
    return ",".join(f"{i['contract']['symbol']}={i['source']}" for i in instruments)  # contracts resolved on load


# ----------------------------------------------------------------------------------------------------------- runs
def check_saved_runs(plan: Plan) -> None:
    """A run folder this walk-forward would resume or read was started with the config it asks for; a ValueError names
    the folder and the first key that differs."""
    for fold in plan.folds:
        for arm in plan.arms:
            for seed in plan.seeds:
                path = plan.run_dir(fold, arm, seed) / RUN_CONFIG_FILE
                if not path.exists():
                    continue
                saved = flat_config(to_dict(load_config(path)))
                wanted = flat_config(to_dict(plan.run_config(fold, arm, seed)))
                differ = [k for k in wanted if k not in REPORTING_KEYS and saved.get(k) != wanted[k]
                          and not (k.startswith("hybrid.") and wanted["llm"] == "none")]
                if differ:
                    k = differ[0]
                    raise ValueError(f"{path.parent}: trained with {k}={saved.get(k)!r}, this walk-forward asks for "
                                     f"{k}={wanted[k]!r}; give the settings it was trained with, or another --out")


def session_pnl(trace: dict, market) -> dict[str, float]:
    """A walk's P&L per trading day (a session, by the day it closes on)."""
    from jaxenv.metrics import daily_pnl

    return {str(day): float(pnl) for day, pnl in daily_pnl(trace, market.timestamps, market.sessions.day).items()}


def score_run(run_dir: Path, advisor: str | None = None) -> dict[str, Any]:
    """The run's best checkpoint (chosen on its fold's validation window), greedy, walked on its test window (out of
    sample) and its training window (in sample); a hybrid run's advice alone on the test window too; buy-and-hold's
    P&L per session on the test window. A run on several instruments: score_account_run (with `advisor`'s advice
    alone)."""
    import jax

    from agents.advice.usage import walk_advice_metrics
    from agents.evaluation.account_run import is_account_run
    from agents.evaluation.advised_walk import LLM_ONLY
    from agents.evaluation.saved_run import ablation_walks, agent_walk, load_run
    from jaxenv.evaluate import buy_and_hold
    from jaxenv.metrics import walk_metrics

    if is_account_run(run_dir):
        return score_account_run(run_dir, advisor)
    if advisor:
        raise ValueError(f"{run_dir}: an advisor's advice alone is scored beside runs on several instruments only")
    run = load_run(run_dir, "best")

    def walked(walk, split: str) -> dict:
        trace = walk(run.market.split_range(split), jax.random.PRNGKey(0))
        out = walk_metrics(trace, run.market.timestamps, run.cfg.env.prop_firm, run.market.sessions.day)
        if "advice_valid" in trace:
            out.update(walk_advice_metrics(trace))
        return {"metrics": out, "sessions": session_pnl(trace, run.market)}

    try:
        agent = agent_walk(run)
        scores = {"version": SCORE_VERSION, "checkpoint": run.saved.label,
                  "test": walked(agent, "test"), "train": walked(agent, "train"),
                  BUY_AND_HOLD: {"sessions": session_pnl(buy_and_hold(run.env, run.market, "test"), run.market)}}
        if run.advised:
            scores["advice_alone"] = walked(ablation_walks(run)[LLM_ONLY].walk, "test")
    finally:
        run.close()
    return scores


def score_account_run(run_dir: Path, advisor: str | None = None) -> dict[str, Any]:
    """score_run's scores of a run on several instruments in one account: the account walked greedy on its test and
    training windows (its P&L per session and walk metrics, each instrument's P&L and trades; a run with an advisor
    acting with its advice), the set's buy-and-hold per test session (each instrument held in the agent's size, no
    costs), and with `advisor` (an llm) the account walked on that advisor's advice alone on the test window
    (agents.evaluation.account_advice; `advice_alone_of` names it)."""
    import jax

    from agents.evaluation.account_run import account_bounds, agent_policy, load_account_run
    from jaxenv.account_evaluate import account_figures, walk_account

    from agents.evaluation.account_advice import advice_alone_act, advice_tables

    run = load_account_run(run_dir, "best")
    env, market_set, h = run.setup.env, run.setup.market_set, run.cfg.hybrid
    walks = {}  # name: (act, its policy state, the window, the act's carry); a run with an advisor acts with it
    for split in ("test", "train"):
        act, policy, carry, _ = agent_policy(run, account_bounds(market_set, split), progress=False)
        walks[split] = (act, policy, split, carry)
    if advisor:
        tables = advice_tables(h, advisor, run.cfg.env, run.cfg.data, market_set, *account_bounds(market_set, "test"),
                               progress=False)
        walks["advice_alone"] = (advice_alone_act(env, h.query), tables, "test", None)
    walked = {name: account_figures(walk_account(env, market_set, split, act, jax.random.PRNGKey(0), policy_state,
                                                 carry), market_set, env)
              for name, (act, policy_state, split, carry) in walks.items()}
    sessions = {name: dict(zip(f["sessions"]["days"], f["sessions"]["pnl"])) for name, f in walked.items()}
    metrics = {name: {k: v for k, v in f.items() if k not in ("sessions", "instruments")} for name, f in walked.items()}
    return {"version": SCORE_VERSION, "checkpoint": run.saved.label,
            **{name: {"metrics": metrics[name], "sessions": sessions[name],
                      "instruments": walked[name]["instruments"]} for name in walked},
            BUY_AND_HOLD: {"sessions": dict(zip(walked["test"]["sessions"]["days"],
                                                walked["test"]["sessions"]["held"]))},
            **({"advice_alone_of": advisor} if advisor else {})}


def scored_as_asked(scores: dict[str, Any], advisor: str | None = None) -> bool:
    """Saved scores stand when the current version made them, with `advisor`'s advice alone where one is asked
    (agents.runs.jobs: else the run is scored again)."""
    return scores.get("version") == SCORE_VERSION and scores.get("advice_alone_of") == advisor


def plan_jobs(plan: Plan) -> list[Job]:
    """Every fold × arm × seed as a job (agents.runs.jobs), fold-major: a warm start's run needs the previous fold's."""
    jobs = []
    for fold in plan.folds:
        for arm in plan.arms:
            for seed in plan.seeds:
                needs = (plan.run_dir(plan.folds[fold.index - 1], arm, seed),) if plan.warm_start and fold.index else ()
                jobs.append(Job(plan.run_dir(fold, arm, seed), plan.run_config(fold, arm, seed), __name__,
                                plan.score_options, needs=needs, label=f"fold {fold.index} {arm} seed {seed}"))
    return jobs


def collect(plan: Plan) -> dict[int, dict[str, dict[int, dict]]]:
    """Every run's saved scores, read back from its folder (whichever backend made them): fold -> arm -> seed."""
    return {f.index: {a: {s: json.loads((plan.run_dir(f, a, s) / SCORE_FILE).read_text()) for s in plan.seeds}
                      for a in plan.arms} for f in plan.folds}


# ---------------------------------------------------------------------------------------------------------- report
def stitched(results: dict, plan: Plan, arm: str, seed: int, walk: str = "test") -> tuple[list[str], np.ndarray]:
    """(days, P&L per session) of the test windows back to back: one out-of-sample path."""
    days, pnl = [], []
    for fold in plan.folds:
        scores = results[fold.index][arm if arm in plan.arms else BASELINE][seed]
        sessions = scores[walk]["sessions"]
        held = scores[BUY_AND_HOLD]["sessions"] if arm == BUY_AND_HOLD else {}
        days += list(sessions)
        pnl += [0.0 if arm == FLAT else held.get(d, 0.0) if arm == BUY_AND_HOLD else v for d, v in sessions.items()]
    return days, np.asarray(pnl, np.float64)


def path_figures(pnl: np.ndarray, folds: list[dict]) -> dict[str, float | None]:
    """The evaluation's figures of a stitched path (its sessions' P&L; `folds`: each fold's walk metrics)."""
    from agents.evidence.overfitting import probabilistic_sharpe_ratio
    from jaxenv.metrics import DAYS_PER_YEAR, max_drawdown

    sd = float(pnl.std(ddof=1)) if len(pnl) > 1 else 0.0
    return {"net_pnl": float(pnl.sum()), "pnl_per_session": float(pnl.mean()),
            "sharpe_session": float(pnl.mean() / sd) if sd > 0 else None,
            "sharpe_daily": float(pnl.mean() / sd * np.sqrt(DAYS_PER_YEAR)) if sd > 0 else None,
            "max_drawdown": max_drawdown(pnl), "sessions": len(pnl),
            "breaches": float(sum(f["breaches"] for f in folds)), "trades": float(sum(f["trades"] for f in folds)),
            "psr": _finite(probabilistic_sharpe_ratio(pnl)) if sd > 0 else None}


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def gate_verdict(days: list[str], pnl: np.ndarray, scale: float) -> dict[str, Any]:
    """The agent's gate (agents.evidence.gate) fed one stitched out-of-sample path, a session at a time in time order:
    whether it opened (and after how many sessions), and its state at the path's end. The path is each fold's agent on
    its own test window, not one agent's record: trade.py gates one agent on that agent's own."""
    from agents.evidence.eprocess import ALPHA, prefix_log_e
    from agents.evidence.gate import Gate, OutOfSample

    log_e = np.asarray(prefix_log_e(pnl, scale))[1:]
    opened = np.flatnonzero(log_e >= np.log(1 / ALPHA))
    gate = Gate.start(OutOfSample(list(days), [float(x) for x in pnl], "walk-forward"), scale)
    return {"opened": bool(len(opened)), "opened_after_sessions": int(opened[0]) + 1 if len(opened) else None,
            "live_at_end": gate.passing, "log_e_end": gate.log_e, "sessions": gate.sessions, "clipped": gate.clipped}


def interval(matrix: np.ndarray) -> dict[str, Any]:
    """Mean over seeds of the summed P&L of a seeds × sessions matrix, with its 95% interval over seeds and sessions."""
    return {"mean": float(matrix.sum(1).mean()), "ci95": seeds_and_days_interval([matrix]),
            "per_session": float(matrix.mean())}


def summarize(plan: Plan, results: dict, trials: int) -> dict[str, Any]:
    """Per arm: the stitched out-of-sample path per seed and pooled, against flat, rl_only and the advice alone;
    in-sample against out-of-sample per fold; DSR over `trials`; PBO over the arms and seeds."""
    from agents.evidence.eprocess import scale_of
    from agents.evidence.overfitting import deflated_sharpe_ratio, pbo_cscv

    arms = [*plan.arms, FLAT, BUY_AND_HOLD]
    benchmarks = (FLAT, BUY_AND_HOLD)  # walked, not trained
    first = plan.run_config(plan.folds[0], BASELINE, plan.seeds[0])
    scale, against = float(scale_of(first.env.prop_firm)), first.gate_against
    paths = {(arm, seed): stitched(results, plan, arm, seed) for arm in arms for seed in plan.seeds}
    days = paths[BASELINE, plan.seeds[0]][0]
    matrix = {arm: np.stack([paths[arm, s][1] for s in plan.seeds]) for arm in arms}
    trial_sharpe = [p.mean() / p.std(ddof=1) for (arm, _), (_, p) in paths.items()
                    if arm not in benchmarks and p.std() > 0]
    variance = float(np.var(trial_sharpe, ddof=1)) if len(trial_sharpe) > 1 else None
    out: dict[str, Any] = {"sessions": len(days), "first_day": days[0], "last_day": days[-1], "gate_against": against,
                           "arms": {}}
    # the gate's bar on each seed's path: flat's 0, or buy-and-hold's column (its costs paid once a test window)
    bar = {s: paths[BUY_AND_HOLD, s][1] if against == BUY_AND_HOLD else 0.0 for s in plan.seeds}
    for arm in arms:
        if arm in benchmarks:  # flat never trades; buy-and-hold's breaches are counted, not enforced: not shown
            fold_metrics = {s: [{"breaches": 0.0, "trades": 0.0}] * len(plan.folds) for s in plan.seeds}
        else:
            fold_metrics = {s: [results[f.index][arm][s]["test"]["metrics"] for f in plan.folds] for s in plan.seeds}
        per_seed = {s: path_figures(paths[arm, s][1], fold_metrics[s]) for s in plan.seeds}
        pooled = matrix[arm].mean(0)
        # flat makes 0 on every session: the out-of-sample P&L is the arm against flat
        a: dict[str, Any] = {"per_seed": per_seed, "oos": interval(matrix[arm]),
                             "pooled": path_figures(pooled, fold_metrics[plan.seeds[0]])}
        if arm != FLAT:
            a["vs_buy_and_hold"] = interval(matrix[arm] - matrix[BUY_AND_HOLD]) if arm != BUY_AND_HOLD else None
        if arm not in benchmarks:
            a["dsr"] = {s: deflated_sharpe_ratio(paths[arm, s][1], trials, variance) for s in plan.seeds}
            a["dsr_pooled"] = deflated_sharpe_ratio(pooled, trials, variance)
            a["gate"] = {s: gate_verdict(paths[arm, s][0], paths[arm, s][1] - bar[s], scale) for s in plan.seeds}
            a["gate_opened"] = float(np.mean([g["opened"] for g in a["gate"].values()]))
        if arm not in (BASELINE, *benchmarks):
            a["vs_rl_only"] = interval(matrix[arm] - matrix[BASELINE])
        if arm not in benchmarks and "advice_alone" in results[plan.folds[0].index][arm][plan.seeds[0]]:
            alone = np.stack([stitched(results, plan, arm, s, "advice_alone")[1] for s in plan.seeds])
            a["advice_alone"] = interval(alone)
            a["vs_advice_alone"] = interval(matrix[arm] - alone)
        if arm not in benchmarks:  # the memorising, as a number: P&L per session in sample and out of sample, per fold
            a["in_vs_out"] = []
            for fold in plan.folds:
                runs = [results[fold.index][arm][s] for s in plan.seeds]
                ins = [np.mean(list(r["train"]["sessions"].values())) for r in runs]
                outs = [np.mean(list(r["test"]["sessions"].values())) for r in runs]
                a["in_vs_out"].append({"fold": fold.index, "in_sample_per_session": float(np.mean(ins)),
                                       "out_of_sample_per_session": float(np.mean(outs)),
                                       "gap": float(np.mean(np.subtract(ins, outs)))})
        out["arms"][arm] = a
        if arm not in benchmarks and "instruments" in results[plan.folds[0].index][arm][plan.seeds[0]]["test"]:
            a["instruments"] = instrument_paths(results, plan, arm)
    columns = [(arm, s) for arm in arms if arm != BUY_AND_HOLD for s in plan.seeds]  # the trials, flat included
    performance = np.stack([paths[c][1] for c in columns], axis=1)
    blocks = min(16, len(days) - len(days) % 2)
    out["pbo"] = {**pbo_cscv(performance, blocks=blocks), "columns": [f"{a}-s{s}" for a, s in columns]}
    out["pbo"].pop("logits", None)
    return out


def instrument_paths(results: dict, plan: Plan, arm: str) -> dict[str, dict[str, float]]:
    """An account's instruments on the stitched test windows: each one's P&L and trades summed over the folds, mean over
    seeds."""
    per_seed = [[results[f.index][arm][s]["test"]["instruments"] for f in plan.folds] for s in plan.seeds]
    symbols = per_seed[0][0]
    return {symbol: {k: float(np.mean([sum(fold[symbol][k] for fold in folds) for folds in per_seed]))
                     for k in ("net_pnl", "trades", "held_pnl")} for symbol in symbols}


def table(summary: dict[str, Any], command: str) -> str:
    def cell(f: dict | None) -> str:
        if not f or f.get("mean") is None:
            return "–"
        lo, hi = f["ci95"]
        return f"{f['mean']:,.0f} [{lo:,.0f}, {hi:,.0f}]"

    def num(x, fmt="{:.2f}") -> str:
        return "–" if x is None else fmt.format(x)

    def gate_cell(gate: dict | None) -> str:
        if not gate:
            return "–"
        after = [g["opened_after_sessions"] for g in gate.values() if g["opened"]]
        return f"{len(after)}/{len(gate)}" + (f" (after {min(after)}-{max(after)} sessions)" if after else "")

    s = summary["summary"]
    agents = ("each fold's agent started from the previous fold's (--warm-start)" if summary.get("warm_start")
              else "a fresh agent per fold")
    lines = [f"`{command}`", "",
             f"{len(summary['folds'])} folds, {s['sessions']} out-of-sample sessions ({s['first_day']} to "
             f"{s['last_day']}), seeds {summary['seeds']}; P&L summed over the stitched test windows, mean over seeds "
             "[95% interval over seeds and sessions]; " + agents + "; best checkpoint of each fold, chosen on its "
             "validation window.",
             "", "| arm | out-of-sample P&L (vs flat) | per session | vs buy-and-hold | vs rl_only | advice alone | "
             "vs advice alone | Sharpe (annualised, pooled) | max drawdown (pooled) | breaches | trades | PSR (pooled) "
             f"| DSR (pooled) | gate on the stitched path against {s.get('gate_against', 'flat').replace('_', '-')} "
             "(seeds opened) |",
             "|" + "---|" * 14]
    for arm, a in s["arms"].items():
        pooled = a["pooled"]
        dsr = a.get("dsr_pooled", {}).get("dsr")
        per_seed = a["per_seed"].values()
        lines.append(f"| {arm} | {cell(a['oos'])} | {a['oos']['per_session']:,.0f} | "
                     f"{cell(a.get('vs_buy_and_hold'))} | {cell(a.get('vs_rl_only'))} | "
                     f"{cell(a.get('advice_alone'))} | {cell(a.get('vs_advice_alone'))} | "
                     f"{num(pooled['sharpe_daily'])} | {pooled['max_drawdown']:,.0f} | "
                     f"{np.mean([p['breaches'] for p in per_seed]):.1f} | {np.mean([p['trades'] for p in per_seed]):,.0f} | "
                     f"{num(pooled['psr'])} | {num(dsr)} | {gate_cell(a.get('gate'))} |")
    for arm, a in s["arms"].items():
        if "instruments" in a:
            lines += ["", f"{arm}: each instrument of the account on the stitched test windows, mean over seeds: " +
                      "; ".join(f"{sym} P&L {f['net_pnl']:,.0f} in {f['trades']:,.0f} trades (held {f['held_pnl']:,.0f})"
                                for sym, f in a["instruments"].items())]
    lines += ["", "In sample (the fold's training window) against out of sample (its test window), P&L per session, "
              "mean over seeds:", "", "| arm | " + " | ".join(f"fold {f['index']}" for f in summary["folds"]) + " |",
              "|" + "---|" * (len(summary["folds"]) + 1)]
    for arm, a in s["arms"].items():
        if "in_vs_out" in a:
            lines.append(f"| {arm} | " + " | ".join(f"{r['in_sample_per_session']:,.0f} → "
                                                    f"{r['out_of_sample_per_session']:,.0f}" for r in a["in_vs_out"]) + " |")
    pbo = s["pbo"]
    lines += ["", f"Probability of backtest overfitting (CSCV over {pbo['trials']} trials: every arm and seed, flat "
              f"included; {pbo['blocks']} blocks of sessions, {pbo['combinations']} combinations"
              f"{', sampled' if pbo['sampled'] else ''}): **{pbo['pbo']:.2f}**; the chosen trial lost out of sample in "
              f"{pbo['prob_oos_loss']:.0%} of combinations.",
              "The gate (agents.evidence.gate: the betting e-process on session P&L, gains counted up to the trailing "
              "drawdown and losses in full, bar 1/α = 20) fed each seed's stitched out-of-sample path a session at a "
              "time: the seeds on which it opened. The path is the folds' agents, one a fold, each on its own test "
              "window, back to back: no one agent traded it, so this is not what `trade.py` would send for any of "
              "them (it gates one agent on that agent's own out-of-sample record).",
              f"Trials counted for the deflated Sharpe ratio: {summary['trials']} (every arm × seed × config any "
              f"walk-forward in this folder ran: {TRIALS_FILE}).",
              time_line(summary["cost"])]
    return "\n".join(lines) + "\n"


def time_line(cost: dict) -> str:
    """Where the time went: every run's training and walks, and what this invocation added to its own runs."""
    line = (f"Time: every run's training {cost['all_runs_train_s'] / 60:,.1f} min and scoring walks "
            f"{cost['all_runs_score_s'] / 60:,.1f} min.")
    at_once = cost.get("processes", 1)
    if cost["runs_s"] and (at_once is None or at_once > 1):  # side by side: their times add up to more than the wall
        line += (f" This invocation: {cost['wall_s'] / 60:,.1f} min, its runs {cost['runs_s'] / 60:,.1f} min of run time "
                 f"over {f'up to {at_once} processes' if at_once else 'as many processes as the scheduler ran'} at once.")
    elif cost["runs_s"]:
        line += (f" This invocation: {cost['wall_s'] / 60:,.1f} min, of which its runs {cost['runs_s'] / 60:,.1f} min; the"
                 f" bookkeeping (plan, ledger, resumes read back, report, plots) added {cost['bookkeeping_s']:,.0f} s"
                 f" ({cost['bookkeeping_share']:.1%} of its runs).")
    else:
        every = cost["all_runs_train_s"] + cost["all_runs_score_s"]
        line += (f" This invocation read every run back: {cost['wall_s']:,.0f} s for the plan, the ledger, the report and"
                 f" the plots ({cost['wall_s'] / every:.2%} of the runs' time)." if every else "")
    return line


def plot(plan: Plan, summary: dict, results: dict, path: Path, in_vs_out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    edges = np.cumsum([len(results[f.index][BASELINE][plan.seeds[0]]["test"]["sessions"]) for f in plan.folds])
    for i, arm in enumerate([*plan.arms, FLAT, BUY_AND_HOLD]):
        color = f"C{i}"
        paths = np.stack([np.cumsum(stitched(results, plan, arm, s)[1]) for s in plan.seeds])
        for p in paths:
            ax.plot(p, color=color, lw=0.6, alpha=0.35)
        ax.plot(paths.mean(0), color=color, lw=2, label=f"{arm} (mean of {len(plan.seeds)} seeds)")
        # (a set's runs are each scored on the one advisor's advice alone: drawn once, beside the baseline)
        if (arm in plan.arms and "advice_alone" in results[plan.folds[0].index][arm][plan.seeds[0]]
                and not (plan.advisor and arm != BASELINE)):
            alone = np.stack([np.cumsum(stitched(results, plan, arm, s, "advice_alone")[1]) for s in plan.seeds])
            whose = f"{plan.advisor}'s" if plan.advisor else f"{arm}: its"  # a set's runs: the advisor named
            ax.plot(alone.mean(0), color=color, lw=1.5, ls="--", label=f"{whose} advice alone (mean of seeds)")
    for e in edges[:-1]:
        ax.axvline(e - 0.5, color="grey", lw=0.5, ls="--")
    ax.axhline(0, color="black", lw=0.5)
    days = stitched(results, plan, BASELINE, plan.seeds[0])[0]
    starts = [0, *edges[:-1]]
    ax.set_xticks(starts, [days[i] for i in starts])  # each fold's first session, by date
    ax.set_xlabel("out-of-sample session (test windows back to back; dashed: a new fold, labelled by its first day)")
    ax.set_ylabel("cumulative P&L, $")
    ax.legend()
    ax.set_title("walk-forward: the stitched out-of-sample path")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

    arms = [a for a in plan.arms]
    fig, axes = plt.subplots(1, len(arms), figsize=(4.5 * len(arms), 4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        rows = summary["summary"]["arms"][arm]["in_vs_out"]
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["in_sample_per_session"] for r in rows], width=0.4, label="in sample (training window)")
        ax.bar(x + 0.2, [r["out_of_sample_per_session"] for r in rows], width=0.4, label="out of sample (test window)")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(x, [f"fold {r['fold']}" for r in rows])
        ax.set_title(arm)
        ax.set_ylabel("P&L per session, $ (mean over seeds)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(in_vs_out, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------- run
def count_trials(plan: Plan) -> int:
    """Adds this walk-forward's trials to the folder's ledger (once each) and returns how many distinct trials it holds
    on this data."""
    path = plan.out / TRIALS_FILE
    seen = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    known = {json.dumps(t, sort_keys=True) for t in seen}
    new = [t for t in (plan.trial(arm, seed) for arm in plan.arms for seed in plan.seeds)
           if json.dumps(t, sort_keys=True) not in known]
    if new:
        plan.out.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.writelines(json.dumps(t, sort_keys=True) + "\n" for t in new)
    source = plan.trial(plan.arms[0], plan.seeds[0])["source"]
    return len({json.dumps(t, sort_keys=True) for t in seen + new if t["source"] == source})


def run(plan: Plan, command: str, progress: bool = True, backend: BackendOptions = BackendOptions()
        ) -> dict[str, Any]:
    """Every fold × arm × seed as a job (its folder's job.yaml written first), run by `backend` (agents.runs.backends:
    fold-major in this process, several processes at once, or Ray's or SLURM's; their own state in OUT/ray/ or
    OUT/slurm/), then the JSON, table and plots from the run folders. JobsFailed (nothing written) when a run
    failed."""
    t0 = time.perf_counter()
    check_saved_runs(plan)
    trials = count_trials(plan)
    jobs = plan_jobs(plan)
    for job in jobs:
        write_job(job)
    outcome = backend.run(jobs, progress=progress, desc="walk-forward", state_dir=plan.out / backend.backend)
    outcome.check()
    results = collect(plan)
    made = [results[f.index][a][s] for f in plan.folds for a in plan.arms for s in plan.seeds
            if plan.run_dir(f, a, s) in {job.run_dir for job in outcome.ran}]
    # this invocation's runs: what its bookkeeping is measured against
    train_s, score_s = sum(r.get("train_s", 0.0) for r in made), sum(r.get("score_s", 0.0) for r in made)
    summary = {"command": command, "config": plan.config, "arms": plan.arms, "seeds": plan.seeds,
               "overrides": plan.overrides, "llm": plan.llm, "advisor": plan.advisor, "warm_start": plan.warm_start,
               "trials": trials,
               "folds": [{"index": f.index, **dataclasses.asdict(f), "splits": f.spec()} for f in plan.folds]}
    summary["summary"] = summarize(plan, results, trials)
    summary["runs"] = {f"fold{f}": {arm: {str(s): {k: v for k, v in r.items() if k != "train"}
                                          for s, r in by_seed.items()} for arm, by_seed in by_arm.items()}
                       for f, by_arm in results.items()}
    plan.out.mkdir(parents=True, exist_ok=True)
    plot(plan, summary, results, plan.out / "equity.png", plan.out / "in_vs_out.png")
    wall = time.perf_counter() - t0  # all but writing the JSON and the table, which take milliseconds
    every = [r for by_arm in results.values() for by_seed in by_arm.values() for r in by_seed.values()]
    runs_s = train_s + score_s
    summary["cost"] = {"wall_s": wall, "runs_s": runs_s, "train_s": train_s, "score_s": score_s,
                       "processes": backend.processes,  # None: as many as Ray or SLURM ran
                       "bookkeeping_s": max(wall - runs_s, 0.0),
                       "bookkeeping_share": max(wall - runs_s, 0.0) / runs_s if runs_s else None,
                       "all_runs_train_s": float(sum(r.get("train_s", 0.0) for r in every)),
                       "all_runs_score_s": float(sum(r.get("score_s", 0.0) for r in every))}
    path = plan.out / "walkforward.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1, default=float))
    tmp.replace(path)
    (plan.out / "table.md").write_text(table(summary, command))
    return summary


def plan_from_args(args) -> Plan:
    """Checks the command line and the data against the fold plan; a ValueError or ConfigError names the flag, key or
    file that is wrong, in one line."""
    from jaxenv.market import load_market
    from jaxenv.market_set import load_market_set

    if not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: file not found")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"--arms: unknown arm {', '.join(unknown)}; choose from {', '.join(ARMS)} (flat is always "
                         "walked)")
    overrides = [*args.overrides, *data_overrides(args.data),
                 *([f"total_steps={args.total_steps}"] if args.total_steps else []),
                 *([f"num_envs={args.envs}"] if args.envs else [])]
    cfg = load_config(args.config, [*ARMS[BASELINE], *overrides])
    asked = args.llm not in (None, "none")
    # --llm names the advised arm's advisor: the arm runs; on several instruments every run is also scored with that
    # advisor's advice alone
    advisor = args.llm if asked and cfg.data.instruments else None
    if asked:
        arms.append(ADVISED)
    arms = list(dict.fromkeys([BASELINE, *arms]))
    if cfg.data.instruments:  # several instruments in one account: the set's joint timeline and sessions
        market = load_market_set([(i.contract, i.source) for i in cfg.data.instruments], cfg.data)
    else:  # a file that does not fit the run's instrument stops here, in one line
        market = load_market(cfg.data)
    sessions = len(session_starts(market.sessions.session_id)) - 1
    folds = plan_folds(sessions, FoldPlan(args.folds, args.test_sessions, args.val_sessions, args.purge,
                                          args.train_sessions, args.step))
    plan = Plan(args.config, arms, parse_seeds(args.seeds), folds, Path(args.out), overrides, args.warm_start,
                args.llm, advisor)
    if advisor:  # the advisor is checked as a run's llm would be, before the first run trains
        from agents.evaluation.account_advice import check_advisor

        check_advisor(plan.run_config(folds[-1], BASELINE, plan.seeds[0]), advisor)
    for arm in arms:  # every run's config is checked before the first trains
        run_cfg = plan.run_config(folds[-1], arm, plan.seeds[0])
        refuse_set_learning(run_cfg)
        if run_cfg.llm == "none" and arm == ADVISED:
            why = "--llm none trains no advisor" if args.llm == "none" else "the config trains no advisor (llm: none)"
            raise ValueError(f"--arms advised: {why}; name one with --llm")
    return plan


def parser():
    """walkforward.py's command line."""
    from agents.command_line import CommandParser

    ap = CommandParser(description=__doc__)
    ap.add_argument("--config", default="configs/signal.yaml", help="the runs' config (default: %(default)s)")
    ap.add_argument("--data", action="append", metavar="PATH | SYMBOL=PATH", help="the market: a CSV/Parquet file or "
                    "synthetic:PRESET; or, repeated as SYMBOL=PATH (--data NQ=nq.csv --data ES=es.csv), several "
                    "instruments traded in one account, as train.py's --data (default: the config's)")
    ap.add_argument("--arms", default="rl_only", help=f"comma-separated arms from {', '.join(ARMS)}; rl_only is "
                    "always trained and flat always walked; advised: the config's own advisor (default: %(default)s)")
    ap.add_argument("--llm", metavar="NAME", help="the advised arm's advisor: none | mock | smollm2 | a model path or "
                    "hub id (default: the config's llm); other than none it adds the advised arm to --arms (several "
                    "instruments: each run is also scored with its advice alone, the advised arm not being built)")
    ap.add_argument("--seeds", default="0-4", help="training seeds: a range 0-4 or a list 0,1,2 (default: %(default)s)")
    ap.add_argument("--folds", type=int, default=4, help="test windows, back to back at the data's end (default 4)")
    ap.add_argument("--test-sessions", type=int, default=12, help="sessions in a test window (default 12)")
    ap.add_argument("--val-sessions", type=int, default=12, help="the validation window that chooses each fold's "
                    "checkpoint, cut from the end of its training window (default 12)")
    ap.add_argument("--purge", type=int, default=1, help="sessions left out between a training window and its test "
                    "window (default 1)")
    ap.add_argument("--train-sessions", type=int, default=0, help="a sliding training window of this many sessions "
                    "(validation included); 0: anchored, every session before the purge (default)")
    ap.add_argument("--step", type=int, default=0, help="sessions between test windows' starts; 0: back to back")
    ap.add_argument("--warm-start", action="store_true", help="each fold starts from the previous fold's agent (its "
                    "best checkpoint) instead of a fresh one")
    ap.add_argument("--total-steps", type=int, help="env steps per run instead of the config's total_steps")
    ap.add_argument("--envs", type=int, help="environments per run instead of the config's num_envs (as train.py's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key of every run (after the arm's), as in train.py; repeatable")
    ap.add_argument("--out", default="results/walk-forward", help="the output folder (default: %(default)s)")
    add_backend_arguments(ap)  # --backend, --jobs, --ray-address, --slurm-*
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:

    from agents.runs.backends import JobsFailed, backend_options
    from jaxenv.data import DataValidationError

    args = parser().parse_args(argv)
    try:
        backend = backend_options(args)  # a bad flag or a missing package: one line, before anything is planned
        plan = plan_from_args(args)
    except (ValueError, ConfigError, DataValidationError, FileNotFoundError) as e:
        print_error(e)
        return 2
    command = "python scripts/walkforward.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                                                    else argv))
    try:
        run(plan, command, progress=not args.no_progress, backend=backend)
    except JobsFailed as e:  # each failed run and its log; the others are in their folders
        print_error(e)
        print(f"no table written: {len(e.failures)} run(s) failed; the same command runs them again and reads the "
              "others back", file=sys.stderr)
        return 1
    except ValueError as e:  # run folders trained with other settings
        print_error(e)
        return 2
    except KeyboardInterrupt as e:
        print(f"stopped: {e or 'interrupted; the same command resumes'}", file=sys.stderr)
        return 130
    print((plan.out / "table.md").read_text())
    print(f"wrote {plan.out}/: walkforward.json, table.md, equity.png, in_vs_out.png; runs in {plan.out / 'runs'}")
    return 0
