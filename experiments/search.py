r"""A hyperparameter search that counts every trial it runs and deflates its own winner (docs/search.md).

The folds of a walk-forward (jaxenv.folds) are cut in two: the last `--held-out` folds are held out, the others are
the validation folds. Each trial is a walk-forward of the rl_only arm over the validation folds only, with the
trial's values of the search space's keys, run by the walk-forward's own code (experiments/walkforward.py: its runs
are jobs in OUT/trials/<number>/, run by --backend); its objective is the walk-forward's out-of-sample P&L per
session (the stitched test sessions of the validation folds, mean over seeds and sessions: `oos.per_session`). Optuna's
TPE sampler (seeded) proposes the trials; the study lives in OUT/study.db.

After the last trial, the winner (the best objective) walks forward over the held-out folds, which no trial touched,
and the report gives every trial's values and objective, the winner's held-out P&L with its interval over seeds and
sessions, its deflated Sharpe ratio over every trial the search's ledger counts (OUT/trials.jsonl: every config ×
seed any trial ran on this data) and the probability of backtest overfitting over the trials (CSCV on their
validation sessions), and says whether the held-out result passes as an edge after deflation (DSR >= 0.95).

    python scripts/search.py --config configs/signal.yaml --space configs/search/ppo.yaml --trials 16 --seeds 0-1 \
        --folds 4 --held-out 1 --out results/search/signal

Killed and run again with the same command, it goes on: finished trials are kept (Optuna's study), a trial that was
running is run again under its own number with its own values (its finished runs read back from its folder, an
unfinished run resumed from its checkpoint), then only the trials still missing are asked for. `--trials` may grow
between invocations; the other settings may not (one line says which differs). One search per folder at a time.

Writes to --out: study.db, trials.jsonl (the ledger), trials/<number>/ (each trial's walk-forward: walkforward.json,
table.md, runs/), held-out/<number>/ (the winner's walk-forward on the held-out folds), search.json, report.md and
trials.png (each trial's objective in order, the winner and its held-out figure marked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.command_line import print_error
from agents.config import ConfigError, load_config, to_dict
from agents.runs.backends import BackendOptions, add_backend_arguments
from experiments import walkforward
from experiments.fusion import BASELINE, flat_config
from jaxenv.folds import Fold

STUDY_FILE = "study.db"
STUDY_NAME = "search"
EDGE_DSR = 0.95  # the held-out result passes as an edge when its deflated Sharpe ratio reaches this
# keys a search may not vary: the seed is the trials' repetition, the data and its splits are the walk-forward's
FIXED_KEYS = ("seed", "data")
MISSING_OPTUNA = "the search needs optuna, which the default set-up does not install: pip install -e .[sweep]"


# ------------------------------------------------------------------------------------------------------ the space
class SpaceError(ValueError):
    """A search space file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Param:
    """One key of the search space: a number in [low, high] (an integer where the config's key is one; log-uniform
    with `log`), or one of `choices`."""

    key: str  # a config key, as --set takes it (ppo.lr)
    kind: str  # "float" | "int" | "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()  # as Optuna stores them: a number, bool or string as such, a list or mapping as its JSON

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)

    def override(self, value: Any) -> str:
        """The trial's value as a --set override."""
        return f"{self.key}={value if isinstance(value, str) else json.dumps(value)}"

    def describe(self) -> str:
        if self.kind == "choice":
            return f"one of {', '.join(map(str, self.choices))}"
        return f"{self.kind} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}"


def _number(value: Any) -> float | None:
    """A bound as a number (YAML reads 1e-4 without a dot as a string); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _choice(value: Any) -> Any:
    """A choice as Optuna can store it: a list or mapping as its JSON text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def load_space(path: str | Path, config: str, overrides: list[str] = ()) -> list[Param]:
    """The search space in `path` (a YAML mapping: `KEY: {low, high, log}` or `KEY: [choices]`), each key checked
    against `config` (with `overrides`): it exists, its bounds and choices are values the key takes. A SpaceError
    names the file and the key that is wrong, in one line."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpaceError(f"--space {path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpaceError(f"--space {path}: cannot parse the YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict) or not raw:
        raise SpaceError(f"--space {path}: expected a mapping of config keys (ppo.lr: {{low: 1.0e-4, high: 1.0e-3, "
                         "log: true}, network.actor_hidden: [[64, 64], [128, 128]])")
    base = flat_config(to_dict(load_config(config, list(overrides))))
    set_keys = {o.split("=", 1)[0].strip() for o in overrides}
    params = []
    for key, spec in raw.items():
        where = f"--space {path}: {key}"
        key = str(key)
        if key.split(".", 1)[0] in FIXED_KEYS:
            raise SpaceError(f"{where}: the search does not vary {key.split('.', 1)[0]} (the seeds are --seeds, the "
                             "data --data and the folds)")
        if key in set_keys:
            raise SpaceError(f"{where}: also given with --set; a key is either searched or set")
        if key not in base:
            if any(k.startswith(key + ".") for k in base):
                raise SpaceError(f"{where}: a section, not a key; search its keys ({key}.NAME)")
            _check_value(config, overrides, key, "0", where)  # load_config names the unknown key and the valid ones
            raise SpaceError(f"{where}: not a config key")
        current = base[key]
        if isinstance(spec, list):
            if not spec:
                raise SpaceError(f"{where}: no choices in the list")
            choices = tuple(_choice(c) for c in spec)
            if len(set(map(str, choices))) < len(choices):
                raise SpaceError(f"{where}: a choice is listed twice")
            param = Param(key, "choice", choices=choices)
        elif isinstance(spec, dict):
            unknown = set(spec) - {"low", "high", "log"}
            if unknown or not {"low", "high"} <= set(spec):
                raise SpaceError(f"{where}: expected {{low: A, high: B}} with log: true|false optional, got "
                                 f"{', '.join(map(str, spec))}")
            low, high, log = _number(spec["low"]), _number(spec["high"]), spec.get("log", False)
            if low is None or high is None:
                raise SpaceError(f"{where}: low and high must be numbers, got {spec['low']!r} and {spec['high']!r}")
            if not isinstance(log, bool):
                raise SpaceError(f"{where}: log must be true or false, got {log!r}")
            if isinstance(current, bool) or not isinstance(current, (int, float)):
                raise SpaceError(f"{where}: the key holds {type(current).__name__} values; give a list of choices")
            kind = "int" if isinstance(current, int) else "float"
            if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
                raise SpaceError(f"{where}: the key is an integer; low and high must be integers")
            if not low < high:
                raise SpaceError(f"{where}: low {low:g} must be below high {high:g}")
            if log and low <= 0:
                raise SpaceError(f"{where}: log: true needs low above 0, got {low:g}")
            param = Param(key, kind, int(low) if kind == "int" else float(low),
                          int(high) if kind == "int" else float(high), log)
        else:
            raise SpaceError(f"{where}: expected {{low: A, high: B, log: true|false}} or a list of choices, got "
                             f"{spec!r}")
        values = param.choices if param.kind == "choice" else (param.low, param.high)
        for value in values:  # every choice and both bounds are values the key takes (types, cross-field rules)
            _check_value(config, overrides, key, param.override(value).split("=", 1)[1], where)
        params.append(param)
    return params


def _check_value(config: str, overrides: list[str], key: str, text: str, where: str) -> None:
    try:
        load_config(config, [*overrides, f"{key}={text}"])
    except ConfigError as e:
        raise SpaceError(f"{where}: {'; '.join(e.errors)}") from None


# ------------------------------------------------------------------------------------------------------ the folds
def split_folds(folds: list[Fold], held_out: int) -> tuple[list[Fold], list[Fold]]:
    """(validation folds, held-out folds): the last `held_out` folds are held out; a ValueError when no validation
    fold is left or none is held out."""
    if held_out < 1:
        raise ValueError(f"--held-out {held_out}: must be at least 1 (the winner is judged on folds no trial saw)")
    if held_out >= len(folds):
        raise ValueError(f"--held-out {held_out}: must be less than --folds {len(folds)} (the trials need at least one "
                         "validation fold)")
    return folds[:-held_out], folds[-held_out:]


@dataclass
class Search:
    base: walkforward.Plan  # every fold, the search's --set overrides, out = the search's folder
    space: list[Param]
    space_file: str
    trials: int  # complete trials wanted
    held_out: int
    sampler_seed: int = 0
    backend: BackendOptions = BackendOptions()  # what runs each trial's runs (--backend and its flags)
    progress: bool = True
    command: str = ""

    @property
    def out(self) -> Path:
        return self.base.out

    @property
    def validation_folds(self) -> list[Fold]:
        return split_folds(self.base.folds, self.held_out)[0]

    @property
    def held_out_folds(self) -> list[Fold]:
        return split_folds(self.base.folds, self.held_out)[1]

    def overrides(self, params: dict[str, Any]) -> list[str]:
        by_key = {p.key: p for p in self.space}
        return [by_key[k].override(v) for k, v in params.items()]

    def trial_plan(self, number: int, params: dict[str, Any]) -> walkforward.Plan:
        """Trial `number`'s walk-forward: the validation folds only, in OUT/trials/<number>/."""
        return dataclasses.replace(self.base, folds=self.validation_folds, out=self.out / "trials" / str(number),
                                   overrides=[*self.base.overrides, *self.overrides(params)])

    def held_out_plan(self, number: int, params: dict[str, Any]) -> walkforward.Plan:
        """Trial `number`'s values walked forward over the held-out folds, in OUT/held-out/<number>/."""
        return dataclasses.replace(self.base, folds=self.held_out_folds, out=self.out / "held-out" / str(number),
                                   overrides=[*self.base.overrides, *self.overrides(params)])

    def settings(self) -> dict[str, Any]:
        """What the study's trials depend on: a restarted search must ask for the same (--trials may differ)."""
        return {"config": self.base.config, "overrides": self.base.overrides, "seeds": self.base.seeds,
                "folds": [f.spec() for f in self.base.folds], "held_out": self.held_out,
                "space": [dataclasses.asdict(p) for p in self.space], "sampler_seed": self.sampler_seed}


# ------------------------------------------------------------------------------------------------------ the study
def import_optuna():
    """optuna, or a ValueError saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise ValueError(MISSING_OPTUNA) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_study(out: Path, sampler_seed: int, settings: dict[str, Any] | None = None):
    """The search's study in OUT/study.db, made or loaded (TPE, maximising; run_trials seeds it before each trial); a
    ValueError names the first setting that differs from those the study was made with."""
    optuna = import_optuna()
    out.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(storage=f"sqlite:///{(out / STUDY_FILE).resolve()}", study_name=STUDY_NAME,
                                direction="maximize", sampler=optuna.samplers.TPESampler(seed=sampler_seed),
                                load_if_exists=True)
    if settings is not None:
        saved = study.user_attrs.get("settings")
        if saved is None:
            study.set_user_attr("settings", json.loads(json.dumps(settings)))
        else:
            differ = [k for k in settings if json.loads(json.dumps(settings[k])) != saved.get(k)]
            if differ:
                raise ValueError(f"{out / STUDY_FILE}: its trials were run with other {differ[0]} "
                                 f"({saved.get(differ[0])!r}, asked now: {settings[differ[0]]!r}); give the settings "
                                 "it was made with, or another --out")
    return study


def run_trials(study, space: list[Param], wanted: int, objective: Callable[[int, dict[str, Any]], float],
               say: Callable[[str], None] = lambda line: None, sampler_seed: int = 0) -> list[int]:
    """Brings the study to `wanted` complete trials: first each trial left running by a search that was killed (run
    again under its own number with its own values: its folder keeps what it finished), then new trials asked of the
    sampler until `wanted` are complete. `objective(number, params)` runs a trial; an exception leaves it running (the
    next invocation runs it again) and stops the search. Returns the numbers of the trials run here.

    Each new trial is asked of a TPE sampler seeded by `sampler_seed` and the trials the study holds: a sampler seeded
    once per process would, restarted, propose its first values again; this way a search killed and run again asks
    for what it would have asked for uninterrupted."""
    import optuna
    from optuna.trial import TrialState

    ran = []
    distributions = {p.key: p.distribution() for p in space}

    def complete() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if complete() >= wanted:
            break
        say(f"trial {stale.number}: was running when the search stopped; running it again with its values")
        study.tell(stale.number, objective(stale.number, dict(stale.params)))
        ran.append(stale.number)
    while complete() < wanted:
        study.sampler = optuna.samplers.TPESampler(seed=sampler_seed * 1_000_003 + len(study.trials))
        trial = study.ask(distributions)
        study.tell(trial.number, objective(trial.number, dict(trial.params)))
        ran.append(trial.number)
    return ran


# ------------------------------------------------------------------------------------------------------ a trial
def objective_of(summary: dict[str, Any]) -> float:
    """A walk-forward's objective: the rl_only arm's stitched out-of-sample P&L per session, mean over seeds."""
    return float(summary["summary"]["arms"][BASELINE]["oos"]["per_session"])


def run_trial(search: Search, number: int, params: dict[str, Any]) -> float:
    """Trial `number`: recorded in the search's ledger first (a trial killed mid-way was tried), then walked forward
    over the validation folds by the walk-forward's own code; returns its objective."""
    plan = search.trial_plan(number, params)
    walkforward.count_trials(dataclasses.replace(plan, out=search.out))  # OUT/trials.jsonl: every config × seed
    summary = walkforward.run(plan, f"{search.command} (trial {number})", progress=search.progress,
                              backend=search.backend)
    return objective_of(summary)


def seed_paths(plan: walkforward.Plan) -> tuple[list[str], np.ndarray]:
    """(days, seeds × sessions P&L) of the rl_only arm's stitched test windows, read back from the plan's folders."""
    results = walkforward.collect(plan)
    days = walkforward.stitched(results, plan, BASELINE, plan.seeds[0])[0]
    return days, np.stack([walkforward.stitched(results, plan, BASELINE, s)[1] for s in plan.seeds])


# ------------------------------------------------------------------------------------------------------ the report
def sharpe(pnl: np.ndarray) -> float | None:
    sd = float(np.std(pnl, ddof=1)) if len(pnl) > 1 else 0.0
    return float(np.mean(pnl) / sd) if sd > 0 else None


def finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def report(search: Search, study) -> dict[str, Any]:
    """The winner on the held-out folds, its deflated Sharpe ratio over every trial counted, PBO over the trials;
    writes search.json, report.md and trials.png and returns the JSON's content."""
    from optuna.trial import TrialState

    from agents.evidence.overfitting import deflated_sharpe_ratio, pbo_cscv

    done = sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    winner = max(done, key=lambda t: (t.value, -t.number))  # the first of equal bests
    rows, columns, trial_sharpes = [], [], []
    for t in done:
        plan = search.trial_plan(t.number, t.params)
        days, matrix = seed_paths(plan)
        cost = json.loads((plan.out / "walkforward.json").read_text())["cost"]
        per_seed = [sharpe(row) for row in matrix]
        trial_sharpes += [s for s in per_seed if s is not None]
        columns.append(matrix.mean(0))
        rows.append({"number": t.number, "params": t.params, "objective": t.value,
                     "per_seed_per_session": [float(r.mean()) for r in matrix],
                     "sharpe_session_pooled": sharpe(matrix.mean(0)), "folder": str(plan.out),
                     "run_minutes": (cost["all_runs_train_s"] + cost["all_runs_score_s"]) / 60})
    validation_days = days

    # the winner on the held-out folds: the walk-forward's own run and figures
    held_plan = search.held_out_plan(winner.number, winner.params)
    held_summary = walkforward.run(held_plan, f"{search.command} (the winner, trial {winner.number}, on the held-out "
                                   "folds)", progress=search.progress, backend=search.backend)
    held_days, held_matrix = seed_paths(held_plan)
    held_arm = held_summary["summary"]["arms"][BASELINE]

    counted = walkforward.count_trials(dataclasses.replace(search.trial_plan(winner.number, winner.params),
                                                           out=search.out))  # adds nothing: the ledger's count
    variance = float(np.var(trial_sharpes, ddof=1)) if len(trial_sharpes) > 1 else None
    winner_validation = np.asarray(columns[done.index(winner)])
    # the winner's validation path was chosen among the trials: the deflated Sharpe ratio's own case, the trials'
    # Sharpe ratios (per seed, on those sessions) giving the variance
    dsr_validation = deflated_sharpe_ratio(winner_validation, counted, variance)
    # the held-out path was not chosen on, but it is the winner's of `counted` trials: deflated as if it had been,
    # against the null's variance for its own length (the trials' was measured on other sessions)
    dsr_held = deflated_sharpe_ratio(held_matrix.mean(0), counted)
    pbo = None
    if len(columns) >= 2 and len(validation_days) >= 2:
        blocks = min(16, len(validation_days) - len(validation_days) % 2)
        pbo = pbo_cscv(np.stack(columns, axis=1), blocks=blocks, metric=lambda rows: rows.mean(0))
        pbo.pop("logits", None)
    held_dsr = finite(dsr_held["dsr"])
    passes = held_dsr is not None and held_dsr >= EDGE_DSR
    runs_recorded = sum(len(p.read_text().splitlines()) for p in (search.out / "trials").glob("*/runs/*/trials.jsonl"))
    out = {
        "command": search.command, "settings": search.settings(), "space_file": search.space_file,
        "objective": "the rl_only arm's out-of-sample P&L per session on the validation folds' stitched test windows, "
                     "mean over seeds and sessions (walkforward.json: summary.arms.rl_only.oos.per_session)",
        "validation": {"folds": [f.index for f in search.validation_folds], "sessions": len(validation_days),
                       "first_day": validation_days[0], "last_day": validation_days[-1]},
        "held_out": {"folds": [f.index for f in search.held_out_folds], "sessions": len(held_days),
                     "first_day": held_days[0], "last_day": held_days[-1]},
        "trials": rows,
        "trials_complete": len(done),
        "trials_counted": counted,
        "runs_recorded": runs_recorded,
        "winner": {
            "number": winner.number, "params": winner.params, "validation_per_session": winner.value,
            "held_out": {"net_pnl": held_arm["oos"]["mean"], "ci95": held_arm["oos"]["ci95"],
                         "per_session": held_arm["oos"]["per_session"],
                         "per_seed_net_pnl": {str(s): float(r.sum()) for s, r in zip(search.base.seeds, held_matrix)},
                         "pooled": held_arm["pooled"], "folder": str(held_plan.out)},
            "dsr_held_out": {k: finite(v) if isinstance(v, float) else v for k, v in dsr_held.items()},
            "dsr_validation": {k: finite(v) if isinstance(v, float) else v for k, v in dsr_validation.items()},
        },
        "pbo": pbo,
        "edge": passes,
    }
    out["verdict"] = verdict(out)
    search.out.mkdir(parents=True, exist_ok=True)
    path = search.out / "search.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=float))
    tmp.replace(path)
    (search.out / "report.md").write_text(report_text(out))
    plot(out, search.out / "trials.png")
    return out


def plural(n: int, word: str = "trial") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def verdict(out: dict[str, Any]) -> str:
    w = out["winner"]
    held, dsr = w["held_out"], w["dsr_held_out"]
    lo, hi = held["ci95"]
    figure = (f"held-out P&L {held['net_pnl']:,.0f} [{lo:,.0f}, {hi:,.0f}] over {out['held_out']['sessions']} sessions "
              f"({held['per_session']:,.0f} a session)")
    dsr_text = "undefined (its sessions' P&L never varied)" if dsr["dsr"] is None else f"{dsr['dsr']:.2f}"
    if out["edge"]:
        return (f"The winner (trial {w['number']}) passes as an edge after deflation: {figure}, deflated Sharpe ratio "
                f"{dsr_text} >= {EDGE_DSR} over {plural(out['trials_counted'])}.")
    return (f"The winner (trial {w['number']}) does not pass as an edge after deflation: {figure}, deflated Sharpe "
            f"ratio {dsr_text} < {EDGE_DSR} over {plural(out['trials_counted'])}.")


def report_text(out: dict[str, Any]) -> str:
    def num(x, fmt="{:.2f}") -> str:
        return "–" if x is None else fmt.format(x)

    w, v, h = out["winner"], out["validation"], out["held_out"]
    keys = [p["key"] for p in out["settings"]["space"]]
    lines = [f"`{out['command']}`", "", f"**{out['verdict']}**", "",
             f"{plural(out['trials_complete'])}, each a walk-forward of rl_only over the validation folds "
             f"{v['folds']} ({v['sessions']} test sessions, {v['first_day']} to {v['last_day']}), seeds "
             f"{out['settings']['seeds']}; objective: {out['objective']}. Held out: folds {h['folds']} ({h['sessions']} "
             f"sessions, {h['first_day']} to {h['last_day']}), walked by the winner only.", "",
             "| trial | " + " | ".join(keys) + " | objective ($ a session) | per seed | Sharpe a session (pooled) | "
             "run time (min) |", "|" + "---|" * (len(keys) + 5)]
    for r in out["trials"]:
        mark = " **(winner)**" if r["number"] == w["number"] else ""
        values = [num(r["params"][k], "{:.4g}") if isinstance(r["params"][k], float) else str(r["params"][k])
                  for k in keys]
        lines.append(f"| {r['number']}{mark} | " + " | ".join(values) + f" | {r['objective']:,.1f} | "
                     + ", ".join(f"{x:,.0f}" for x in r["per_seed_per_session"])
                     + f" | {num(r['sharpe_session_pooled'])} | {r['run_minutes']:.1f} |")
    held, dv, dh = w["held_out"], w["dsr_validation"], w["dsr_held_out"]
    lo, hi = held["ci95"]
    lines += ["", f"The winner, trial {w['number']}: " + ", ".join(f"{k}={w['params'][k]}" for k in keys)
              + f"; on the validation folds {w['validation_per_session']:,.1f} a session.",
              f"- Held out: P&L {held['net_pnl']:,.0f} [{lo:,.0f}, {hi:,.0f}] against flat's 0 (mean over seeds, 95% "
              f"interval over seeds and sessions), {held['per_session']:,.0f} a session; per seed "
              + ", ".join(f"{s}: {x:,.0f}" for s, x in held["per_seed_net_pnl"].items())
              + f"; annualised Sharpe (pooled) {num(held['pooled']['sharpe_daily'])}.",
              f"- Deflated Sharpe ratio of the held-out path (pooled over seeds) over {plural(out['trials_counted'])} "
              f"(every config × seed in the search's ledger, trials.jsonl): **{num(dh['dsr'])}** (PSR {num(dh['psr'])}; "
              f"its Sharpe a session {num(dh['sharpe'])} against {num(dh['sr_star'])}, the best of that many trials "
              "without an edge, the null's variance for its length).",
              f"- Deflated Sharpe ratio of the winner's validation path, the one it was chosen on: {num(dv['dsr'])} "
              f"(Sharpe a session {num(dv['sharpe'])} against {num(dv['sr_star'])}, with "
              + ("the trials' Sharpe ratios' variance)." if dv["variance_from"] == "trials" else
                 "the null's variance: fewer than 2 trials' Sharpe ratios).")
              ]
    pbo = out["pbo"]
    if pbo:
        lines.append(f"- Probability of backtest overfitting (CSCV over the {pbo['trials']} trials' validation "
                     f"sessions, mean over seeds; {pbo['blocks']} blocks, {pbo['combinations']} combinations"
                     f"{', sampled' if pbo['sampled'] else ''}; chosen by P&L per session, the objective): "
                     f"**{pbo['pbo']:.2f}**; the chosen trial lost out of sample in {pbo['prob_oos_loss']:.0%} of "
                     "combinations.")
    else:
        lines.append("- Probability of backtest overfitting: needs at least 2 trials.")
    lines += [f"- The runs' own ledgers (trials/*/runs/fold*/trials.jsonl) record {out['runs_recorded']} training "
              "runs.", "", "![trials](trials.png)"]
    return "\n".join(lines) + "\n"


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    numbers = [r["number"] for r in out["trials"]]
    values = [r["objective"] for r in out["trials"]]
    w = out["winner"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(numbers, values, "o", color="C0", label="trial: validation P&L a session (mean over seeds)")
    ax.step(numbers, np.maximum.accumulate(values), where="post", color="C0", lw=1, alpha=0.5, label="best so far")
    ax.plot([w["number"]], [w["validation_per_session"]], "*", ms=16, color="C1",
            label=f"winner (trial {w['number']})")
    ax.plot([w["number"]], [w["held_out"]["per_session"]], "D", ms=9, color="C3",
            label="winner on the held-out folds (DSR " + ("undefined" if w["dsr_held_out"]["dsr"] is None
                                                          else f"{w['dsr_held_out']['dsr']:.2f}") + ")")
    ax.axhline(0, color="black", lw=0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial, in the order run")
    ax.set_ylabel("out-of-sample P&L per session, $")
    ax.set_title(f"search: {out['trials_complete']} trials ({out['trials_counted']} counted for the DSR)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ the command
def parser() -> argparse.ArgumentParser:
    """search.py's command line."""
    from agents.command_line import CommandParser

    ap = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/signal.yaml", help="the runs' config (default: %(default)s)")
    ap.add_argument("--space", required=True, help="the search space: a YAML file of config keys, each "
                    "{low, high, log} or a list of choices (configs/search/ppo.yaml)")
    ap.add_argument("--trials", type=int, default=16, help="complete trials the study should hold; a restarted "
                    "search runs only the rest (default %(default)s)")
    ap.add_argument("--seeds", default="0-1", help="each trial's training seeds: 0-1 or 0,1 (default: %(default)s)")
    ap.add_argument("--folds", type=int, default=4, help="the walk-forward's folds, validation and held out together "
                    "(default %(default)s)")
    ap.add_argument("--held-out", type=int, default=1, help="the last folds, walked by the winner only "
                    "(default %(default)s)")
    ap.add_argument("--test-sessions", type=int, default=12, help="sessions in a test window (default 12)")
    ap.add_argument("--val-sessions", type=int, default=12, help="each fold's checkpoint-choosing window, cut from the "
                    "end of its training window (default 12)")
    ap.add_argument("--purge", type=int, default=1, help="sessions between a training window and its test window")
    ap.add_argument("--train-sessions", type=int, default=0, help="a sliding training window of this many sessions; "
                    "0: anchored (default)")
    ap.add_argument("--step", type=int, default=0, help="sessions between test windows' starts; 0: back to back")
    ap.add_argument("--data", action="append", metavar="PATH | SYMBOL=PATH", help="the market, as walkforward.py's "
                    "(default: the config's)")
    ap.add_argument("--total-steps", type=int, help="env steps per run instead of the config's total_steps")
    ap.add_argument("--envs", type=int, help="environments per run instead of the config's num_envs")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config key of every run (not one the space searches); repeatable")
    ap.add_argument("--sampler-seed", type=int, default=0, help="the TPE sampler's seed (default %(default)s)")
    ap.add_argument("--out", required=True, help="the search's folder (its study, trials and report)")
    add_backend_arguments(ap)  # what runs each trial's runs: --backend, --jobs, ... as walkforward.py's
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def search_from_args(args: argparse.Namespace, command: str) -> Search:
    """Checks the command line, the space and the data; a ValueError (SpaceError, ConfigError) in one line."""
    from agents.runs.backends import backend_options

    if not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: file not found")
    if args.trials < 1:
        raise ValueError(f"--trials {args.trials}: must be at least 1")
    backend = backend_options(args)  # a bad flag or a missing package, before the data is loaded
    split_folds(list(range(max(args.folds, 0))), args.held_out)  # before the data is loaded
    import_optuna()
    wf_args = argparse.Namespace(config=args.config, arms=BASELINE, llm=None, overrides=args.overrides,
                                 data=args.data, total_steps=args.total_steps, envs=args.envs, folds=args.folds,
                                 test_sessions=args.test_sessions, val_sessions=args.val_sessions, purge=args.purge,
                                 train_sessions=args.train_sessions, step=args.step, seeds=args.seeds,
                                 out=args.out, warm_start=False)
    base = walkforward.plan_from_args(wf_args)
    space = load_space(args.space, args.config, base.overrides)
    return Search(base, space, args.space, args.trials, args.held_out, args.sampler_seed, backend,
                  not args.no_progress, command)


def main(argv: list[str] | None = None) -> int:
    from agents.runs.backends import JobsFailed
    from agents.runs.lock import RunLock, RunLocked
    from jaxenv.data import DataValidationError

    args = parser().parse_args(argv)
    command = "python scripts/search.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        search = search_from_args(args, command)
    except (ValueError, ConfigError, DataValidationError, FileNotFoundError) as e:
        print_error(e)
        return 2

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        lock = RunLock.acquire(search.out, reason="two searches in one folder would run the same trials")
    except RunLocked as e:
        print_error(e)
        return 2
    try:
        study = open_study(search.out, search.sampler_seed, search.settings())

        def objective(number: int, params: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            say(f"trial {number}: " + ", ".join(f"{k}={v}" for k, v in params.items()))
            value = run_trial(search, number, params)
            say(f"trial {number}: {value:,.1f} a session on the validation folds ({time.perf_counter() - t0:,.0f} s)")
            return value

        ran = run_trials(study, search.space, search.trials, objective, say, search.sampler_seed)
        say(f"{len(ran)} trial(s) run now; the study holds {search.trials} complete: the winner on the held-out folds")
        out = report(search, study)
    except JobsFailed as e:
        print_error(e)
        print("stopped: a run failed; the same command runs the trial again, reading its finished runs back",
              file=sys.stderr)
        return 1
    except ValueError as e:  # a study or run folders made with other settings
        print_error(e)
        return 2
    except KeyboardInterrupt as e:
        print(f"stopped: {e or 'interrupted'}; the same command goes on from the trials the study has",
              file=sys.stderr)
        return 130
    finally:
        lock.release()
    print((search.out / "report.md").read_text())
    print(f"wrote {search.out}/: search.json, report.md, trials.png; the study in {STUDY_FILE}, the ledger in "
          f"trials.jsonl, each trial's walk-forward in trials/, the winner's held-out one in held-out/")
    return 0 if out else 1
