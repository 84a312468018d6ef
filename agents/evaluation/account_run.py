"""`scripts/evaluate.py` on a run trained on several instruments traded in one account (issue 77): the checkpoint's
policy restored, its heads acting one by one in the env's instrument order under the account's sequential masks (greedy
unless --sample: the act validation takes, agents.training.env_setup.EnvSetup.agent_act), walked over the run's split
(jaxenv.account_evaluate) with the env setup's baselines (flat, random-valid, always-long) on the same bars.

    run = load_account_run("runs/pair", "best")
    summary, trace = evaluate_account_run(run, "test", seeds=1)
    summary["agent"]["net_pnl"], summary["instruments"]["NQ"]["net_pnl"], summary["account"]["buy_and_hold"]

The summary is evaluate.py's ({"setup", "agent", "ablations", "baselines"}: the same table) with the set's buy-and-hold
as a baseline of its net P&L alone (each instrument's move held in the agent's size, no costs: the gate's bar),
`account` (the account's P&L against flat's and that buy-and-hold) and `instruments` (each instrument's figures of the
agent's first walk, keyed by symbol). The agent's PSR and DSR come from the account's P&L per session; what needs one
market is not walked (NOT_WALKED).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import pandas as pd

from agents.advice.acting import training_acting
from agents.config import TrainConfig
from agents.evaluation.saved_run import session_overfitting, summarize_walks
from agents.rl.account import AccountHeads
from agents.rl.ppo import make_train
from agents.runs.saved_runs import SavedPolicy, check_fits, load_run_config, restore_policy
from agents.training.env_setup import EnvSetup, make_env_setup
from jaxenv.account_evaluate import account_figures, held_set_pnl, instrument_trace, walk_account
from jaxenv.contracts import describe
from jaxenv.env import NO_EXIT
from jaxenv.metrics import Trace, trades_table

# What evaluate.py does for one instrument and not yet for an account: one note line says so
NOT_WALKED = ("the gated walk and its gate (trade.py does not trade an account yet), ablations (RL only), random "
              "episodes and --data; equity.png has no trade marks (trades.csv lists each instrument's)")


@dataclass
class AccountRun:
    """A set run's policy with the account env, its market set and the act to walk them."""

    cfg: TrainConfig
    saved: SavedPolicy
    setup: EnvSetup  # the run's env setup: AccountEnv, params, MarketSet, baselines
    act: Callable  # act((params, obs_norm), obs, state, params, key) -> actions [I]
    sampled: bool


def is_account_run(run_dir: str | Path) -> bool:
    """The run in `run_dir` trained on several instruments (data.instruments)."""
    return bool(load_run_config(run_dir).data.instruments)


def load_account_run(run_dir: str | Path, checkpoint: str = "best", sample: bool = False) -> AccountRun:
    """Restores a set run's checkpoint (network parameters and the per-feature normalisers) and rebuilds its env
    setup from its config as training did; CheckpointMismatch where the checkpoint does not fit the current network."""
    cfg = load_run_config(run_dir)
    saved = restore_policy(run_dir, checkpoint, cfg, account=True)
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, training_acting(cfg.hybrid, cfg.llm, setup.env),
                     num_envs=cfg.num_envs, num_updates=cfg.num_updates)
    check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions, AccountHeads(setup.env).example_obs())
    act = setup.agent_act(ppo, normalize_obs=cfg.ppo.normalize_obs, greedy=not sample)
    return AccountRun(cfg, saved, setup, act, sampled=sample)


def evaluate_account_run(run: AccountRun, split: str, seeds: int = 1) -> tuple[dict[str, Any], Trace]:
    """evaluate.py's summary of the account walking `split` (val | test; the module's docstring) and the agent's first
    walk. Seed i walks with PRNGKey(i); a walk the key cannot change (the greedy agent, flat, always-long) once."""
    env, market_set = run.setup.env, run.setup.market_set
    if split not in ("val", "test"):
        raise ValueError(f"split {split!r}: use val or test")
    policies = {"agent": (run.act, (run.saved.params, run.saved.obs_norm), run.sampled),
                **{name: (act, (), name == "random_valid") for name, act in run.setup.baselines.items()}}
    walks: dict[str, list[dict]] = {}
    first: dict[str, dict] = {}
    trace = None
    for seed in range(seeds):
        for name, (act, policy_state, stochastic) in policies.items():
            if seed and not stochastic:
                continue
            walked = walk_account(env, market_set, split, act, jax.random.PRNGKey(seed), policy_state)
            figures = account_figures(walked, market_set, env)
            if name == "agent":
                trace = walked if trace is None else trace
                figures.update(session_overfitting(np.asarray(figures["sessions"]["pnl"], np.float64),
                                                   run.saved.run_dir, run.cfg))
            first.setdefault(name, figures)
            walks.setdefault(name, []).append(figures)
    agent = first["agent"]
    start, end = market_set.splits[split]
    setup = {
        "runs": [str(run.saved.run_dir)],
        "checkpoints": [run.saved.label],
        "data": ",".join(f"{symbol}={source}" for symbol, source in zip(market_set.symbols, market_set.sources)),
        "instrument": {"description": "one account: " + "; ".join(describe(m.contract) for m in market_set.markets)},
        "contracts": {s: dataclasses.asdict(m.contract) for s, m in zip(market_set.symbols, market_set.markets)},
        "split": split, "episodes": 0, "seeds": seeds, "greedy": not run.sampled, "bars": [[start, end]],
        "period": [str(market_set.timestamps[start]), str(market_set.timestamps[end - 1])],
    }
    held = {"net_pnl": agent["held_pnl"], "n": 1}  # the set's buy-and-hold: its net P&L alone, no walk of its own
    summary = {
        "setup": setup,
        "agent": summarize_walks(walks["agent"]),
        "ablations": {},
        "baselines": {**{k: summarize_walks(v) for k, v in walks.items() if k != "agent"}, "buy_and_hold": held},
        "account": {"net_pnl": agent["net_pnl"], "flat": first["flat"]["net_pnl"], "buy_and_hold": agent["held_pnl"],
                    "trades": agent["trades"], "instruments": agent["instruments"]},
        "instruments": agent["instruments"],
        "sessions": agent["sessions"],
        "not_walked": NOT_WALKED,
    }
    return summary, trace


def account_trades(run: AccountRun, trace: Trace) -> pd.DataFrame:
    """Every instrument's closed trades of an account walk (trades_table's columns after `symbol`), by exit time, with
    each instrument's prices at its own tick precision (agents.evaluation.report.priced)."""
    from agents.evaluation.report import priced

    market_set, contracts = run.setup.market_set, run.cfg.env.contracts_per_trade
    tables = [priced(trades_table(instrument_trace(trace, i), market_set.timestamps, contracts), market.contract)
              .assign(symbol=symbol) for i, (symbol, market) in enumerate(zip(market_set.symbols, market_set.markets))]
    trades = pd.concat(tables, ignore_index=True).sort_values("exit_time", kind="stable")
    return trades[["symbol", *(c for c in trades.columns if c != "symbol")]]


def account_views(run: AccountRun, trace: Trace) -> tuple[Trace, Trace]:
    """The agent's walk as the one-instrument plots read it (the account's equity, threshold and breaches; no trade
    marks), and the set's buy-and-hold P&L per step on the same steps."""
    n = len(trace["t"])
    account = {k: np.asarray(trace[k]) for k in ("t", "pnl", "equity", "threshold", "breach")}
    account.update(entry_side=np.zeros(n, np.int32), exit_reason=np.full(n, NO_EXIT), trade_pnl=np.zeros(n))
    held = held_set_pnl(run.setup.market_set, account["t"], run.cfg.env.contracts_per_trade).sum(axis=1)
    return account, {"t": account["t"], "pnl": held}


__all__ = ["NOT_WALKED", "AccountRun", "account_trades", "account_views", "evaluate_account_run",
           "is_account_run", "load_account_run"]
