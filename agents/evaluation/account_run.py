"""`scripts/evaluate.py` on a run trained on several instruments traded in one account (issue 77): the checkpoint's
policy restored, its heads acting one by one in the env's instrument order under the account's sequential masks (greedy
unless --sample: the act validation takes, agents.training.env_setup.EnvSetup.agent_act), walked over the run's split
(jaxenv.account_evaluate) with the env setup's baselines (flat, random-valid, always-long) on the same bars.

    run = load_account_run("runs/pair", "best")                          # or data=["NQ=a.csv", "ES=b.csv"]
    summary, trace = evaluate_account_run(run, "test", seeds=1)          # val | test | all (every bar of the files)
    summary["agent"]["net_pnl"], summary["instruments"]["NQ"]["net_pnl"], summary["account"]["buy_and_hold"]
    summary["gated"], summary["gate"][0]["sessions"]                     # the walk trade.py's gate would have traded

The summary is evaluate.py's ({"setup", "agent", "ablations", "baselines"}: the same table) with the set's buy-and-hold
as a baseline of its net P&L alone (each instrument's move held in the agent's size, no costs: the gate's bar),
`account` (the account's P&L against flat's and that buy-and-hold) and `instruments` (each instrument's figures of the
agent's first walk, keyed by symbol), plus `gated` and `gate` as for one instrument: the account walk as trade.py's
gate would have traded it (gated_account_walk), its evidence starting from the checkpoint's account P&L per test
session (account_out_of_sample, saved in RUN/evidence). The agent's PSR and DSR come from the account's P&L per session;
what needs one market is not walked (NOT_WALKED).
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
from agents.evaluation.account_advice import (
    advice_alone_act,
    advice_tables,
    advised_act,
    advised_carry,
    check_advisor,
)
from agents.evaluation.advised_walk import LLM_ONLY, RL_ONLY
from agents.evaluation.saved_run import (
    EVIDENCE_DIR,
    GATED,
    closes_session,
    in_sample_end,
    session_overfitting,
    summarize_walks,
)
from agents.evidence.eprocess import scale_of
from agents.evidence.gate import Gate, OutOfSample, gated_trace, live_part
from agents.rl.account import AccountHeads
from agents.rl.ppo import make_train
from agents.runs.saved_runs import SavedPolicy, check_fits, load_run_config, restore_policy
from agents.training.env_setup import EnvSetup, make_env_setup
from jaxenv.account_evaluate import (
    INSTRUMENT_COLUMNS,
    account_figures,
    account_metrics,
    held_set_pnl,
    instrument_trace,
    walk_account,
)
from jaxenv.config import DataConfig
from jaxenv.contracts import describe
from jaxenv.env import NO_EXIT
from jaxenv.market_set import MarketSet
from jaxenv.metrics import Trace, step_days, trades_table

# What evaluate.py does for one instrument and not yet for an account: one note line says so
NOT_WALKED = ("ablations but the policy alone and the advice alone, and random episodes; equity.png has no trade "
              "marks (trades.csv lists each instrument's)")
# The ablations an account is walked with: the policy alone (a run with an advisor) and the advice alone
ACCOUNT_ABLATIONS = (RL_ONLY, LLM_ONLY)
# An instrument column's value on a step the gate kept on paper (gated_account_walk): no position, trade, P&L or cost
PAPER = {"position": 0, "entry_side": 0, "exit_reason": NO_EXIT, "trade_pnl": 0.0, "instrument_pnl": 0.0,
         "instrument_commission": 0.0}


@dataclass
class AccountRun:
    """A set run's policy with the account env, its market set and the act to walk them."""

    cfg: TrainConfig
    saved: SavedPolicy
    setup: EnvSetup  # the run's env setup: AccountEnv, params, MarketSet, baselines
    act: Callable  # the policy alone: act((params, obs_norm), obs, state, params, key) -> actions [I]
    sampled: bool
    acting: Any = None  # a run with an advisor: how it acts with advice (agents.advice.account_acting.AccountActing)
    advised: Callable | None = None  # ... and the act of its walks (agents.evaluation.account_advice.advised_act)


def is_account_run(run_dir: str | Path) -> bool:
    """The run in `run_dir` trained on several instruments (data.instruments)."""
    return bool(load_run_config(run_dir).data.instruments)


def load_account_run(run_dir: str | Path, checkpoint: str = "best", sample: bool = False,
                     data: list[str] | None = None) -> AccountRun:
    """Restores a set run's checkpoint (network parameters and the per-feature normalisers) and rebuilds its env
    setup from its config as training did, on `data` instead of the run's files when given (SYMBOL=PATH once per
    instrument, as --data gives them: account_data); CheckpointMismatch where the checkpoint does not fit the current
    network."""
    cfg = load_run_config(run_dir)
    if data is not None:
        cfg = dataclasses.replace(cfg, data=account_data(cfg.data, data))
    saved = restore_policy(run_dir, checkpoint, cfg, account=True)
    setup = make_env_setup(cfg.env_name, cfg.env, cfg.data, cfg.checkpoint.eval_episodes)
    acting = training_acting(cfg.hybrid, cfg.llm, setup.env)
    ppo = make_train(cfg.ppo, cfg.network, setup.env, setup.params, acting, num_envs=cfg.num_envs,
                     num_updates=cfg.num_updates)
    check_fits(saved, ppo.network, ppo.obs_dim, ppo.num_actions, AccountHeads(setup.env).example_obs())
    act = setup.agent_act(ppo, normalize_obs=cfg.ppo.normalize_obs, greedy=not sample)
    advised = None
    if acting is not None:  # the walks act as it trained: greedy over the fused distribution unless --sample
        acting = acting.walking(greedy=not sample)
        advised = advised_act(acting, ppo.network, cfg.ppo.normalize_obs)
    return AccountRun(cfg, saved, setup, act, sampled=sample, acting=acting, advised=advised)


def agent_policy(run: AccountRun, bounds: tuple[int, int], progress: bool = True) -> tuple:
    """(act, its policy state, its carry, the advice tables) of the run's agent walking joint bars `bounds`: a run
    with an advisor acts with its advice (its advisors first asked every key the walk reads that their stores lack:
    advice_tables), its record starting from the checkpoint's; a run without one, the policy alone (carry and tables
    None)."""
    policy = (run.saved.params, run.saved.obs_norm)
    if run.advised is None:
        return run.act, policy, None, None
    tables = advice_tables(run.cfg.hybrid, run.cfg.llm, run.cfg.env, run.cfg.data, run.setup.market_set, *bounds,
                           progress)
    return run.advised, policy, advised_carry(run.acting, run.setup.params, tables, run.saved.advice_record), tables


def account_data(data: DataConfig, items: list[str]) -> DataConfig:
    """The run's data config with each instrument's source replaced by the file of `items` (SYMBOL=PATH, one per
    instrument, in the run's order; symbols match whatever their case); its contracts and other keys kept. A
    ValueError, one line, names what does not match: "--data: the run trades NQ, ES; got NQ, CL"."""
    pairs = [item.partition("=")[::2] for item in items]
    bad = next((item for item, (symbol, path) in zip(items, pairs) if not symbol.strip() or not path.strip()), None)
    if bad is not None:
        raise ValueError(f"--data: expected SYMBOL=PATH once per instrument of the account, got {bad!r}")
    run = [item.contract.symbol for item in data.instruments]
    given = [symbol.strip() for symbol, _ in pairs]
    if [s.upper() for s in given] != [s.upper() for s in run]:
        raise ValueError(f"--data: the run trades {', '.join(run)}; got {', '.join(given)} (SYMBOL=PATH once per "
                         "instrument, in that order)")
    instruments = [dataclasses.replace(item, source=path.strip()) for item, (_, path) in zip(data.instruments, pairs)]
    return dataclasses.replace(data, instruments=instruments)


def account_bounds(market_set: MarketSet, split: str) -> tuple[int, int]:
    """The [start, end) joint bars an account walks: a split of the run's (train | val | test), or "all": every bar from
    the first decision bar to the end, as saved_run.walk_bounds for one instrument."""
    if split not in ("train", "val", "test", "all"):
        raise ValueError(f"split {split!r}: use train, val, test or all")
    # the set's markets share its timeline, splits and warm-up: the first one clamps as each instrument's walk does
    return market_set.markets[0].split_range((0, market_set.num_bars) if split == "all" else split)


def evaluate_account_run(run: AccountRun, split: str, seeds: int = 1, advisor: str | None = None,
                         progress: bool = True) -> tuple[dict[str, Any], Trace]:
    """evaluate.py's summary of the account walking `split` (val | test | all: account_bounds; the module's docstring)
    and the agent's first walk. Seed i walks with PRNGKey(i); a walk the key cannot change (the greedy agent, flat,
    always-long, the advice alone) once. Each agent walk is also walked as its gate would have traded it
    (gated_account_walk). `advisor` (an llm: mock, smollm2, a model path): its advice alone on every instrument is
    walked too, as the ablation `llm_only` (agents.evaluation.account_advice), with the run's hybrid section."""
    env, market_set = run.setup.env, run.setup.market_set
    start, end = account_bounds(market_set, split)
    record = run_record(run)
    h = run.cfg.hybrid
    act, policy, carry, tables = agent_policy(run, (start, end), progress)
    # name: (act, its policy state, whether the key changes its walk, its carry)
    policies = {"agent": (act, policy, run.sampled, carry)}
    if run.advised is not None:  # the policy alone as the rl_only ablation; its advice alone comes with it
        policies[RL_ONLY] = (run.act, policy, run.sampled, None)
        if advisor is None:
            policies[LLM_ONLY] = (advice_alone_act(env, h.query), tables, False, None)
    policies.update({name: (act, (), name == "random_valid", None) for name, act in run.setup.baselines.items()})
    if advisor is not None:
        check_advisor(run.cfg, advisor)
        tables = advice_tables(h, advisor, run.cfg.env, run.cfg.data, market_set, start, end, progress)
        policies[LLM_ONLY] = (advice_alone_act(env, h.query), tables, False, None)
    walks: dict[str, list[dict]] = {}
    first: dict[str, dict] = {}
    gates: list[dict] = []
    trace = None
    for seed in range(seeds):
        for name, (act, policy_state, stochastic, carry) in policies.items():
            if seed and not stochastic:
                continue
            walked = walk_account(env, market_set, (start, end), act, jax.random.PRNGKey(seed), policy_state, carry)
            figures = account_figures(walked, market_set, env)
            if name == "agent":
                trace = walked if trace is None else trace
                figures.update(session_overfitting(np.asarray(figures["sessions"]["pnl"], np.float64),
                                                   run.saved.run_dir, run.cfg))
                gated, gate = gated_account_walk(run, walked, record)
                walks.setdefault(GATED, []).append(account_metrics(gated, market_set, env.config.prop_firm))
                gates.append(gate_entry(gate))
            first.setdefault(name, figures)
            walks.setdefault(name, []).append(figures)
    agent = first["agent"]
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
        "gated": summarize_walks(walks[GATED]),
        "gate": gates,
        "ablations": {k: summarize_walks(v) for k, v in walks.items() if k in ACCOUNT_ABLATIONS},
        "baselines": {**{k: summarize_walks(v) for k, v in walks.items()
                         if k not in ("agent", GATED, *ACCOUNT_ABLATIONS)},
                      "buy_and_hold": held},
        "account": {"net_pnl": agent["net_pnl"], "flat": first["flat"]["net_pnl"], "buy_and_hold": agent["held_pnl"],
                    "trades": agent["trades"], "instruments": agent["instruments"]},
        "instruments": agent["instruments"],
        "sessions": agent["sessions"],
        "not_walked": NOT_WALKED,
    }
    return summary, trace


def gate_entry(gate: Gate) -> dict:
    """A gated walk's gate at its end as evaluate.py's summary lists it (`gate`: the single-instrument walk's keys)."""
    return {"mode": gate.mode, "reason": gate.reason(), "log_e": gate.log_e, "sessions": gate.sessions,
            "in_sample_sessions": gate.in_sample, "in_sample_end": gate.in_sample_end, "changes": gate.history}


def account_out_of_sample(run_dir: str | Path, checkpoint: str = "best") -> OutOfSample:
    """The checkpoint's account P&L per session on its run's test split (greedy, PRNGKey(0)), with the set's
    buy-and-hold per session (account_figures' sessions "held": buy_and_hold and held alike, as train.py counts it):
    where its gate's evidence starts. Walked once, then read from RUN/evidence/<label>.json
    (saved_run.out_of_sample)."""
    return account_record(load_account_run(run_dir, checkpoint))


def account_record(run: AccountRun) -> OutOfSample:
    """account_out_of_sample of a greedy run loaded on its own files."""
    market_set = run.setup.market_set
    path = Path(run.saved.run_dir) / EVIDENCE_DIR / f"{run.saved.label}.json"
    end = in_sample_end(market_set)  # the set's splits and sessions are one timeline's
    if path.exists():
        saved = OutOfSample.load(path)
        if saved.buy_and_hold is not None and saved.held is not None:
            return dataclasses.replace(saved, in_sample_end=end)
    bounds = account_bounds(market_set, "test")
    act, policy, carry, _ = agent_policy(run, bounds, progress=False)  # the agent as evaluate.py walks it
    trace = walk_account(run.setup.env, market_set, bounds, act, jax.random.PRNGKey(0), policy, carry)
    sessions = account_figures(trace, market_set, run.setup.env)["sessions"]
    source = f"test split of the account {' + '.join(market_set.symbols)}"  # train.py's account_lines' words
    record = OutOfSample(sessions["days"], sessions["pnl"], source, end, buy_and_hold=sessions["held"],
                         held=sessions["held"])
    record.save(path)
    return record


def run_record(run: AccountRun) -> OutOfSample:
    """The out-of-sample record of the run's checkpoint: from `run` itself when it is greedy on the run's own files
    (no second restore), else account_out_of_sample."""
    own = load_run_config(run.saved.run_dir).data
    if not run.sampled and run.cfg.data == own:
        return account_record(run)
    return account_out_of_sample(run.saved.run_dir, str(run.saved.step))


def gated_account_walk(run: AccountRun, trace: Trace, record: OutOfSample | None) -> tuple[Trace, Gate]:
    """The account walk as trade.py's gate would have traded it (saved_run.gated_walk for an account): the gate's
    evidence starts from the checkpoint's out-of-sample sessions that closed before the walk's first, counts the
    walk's sessions as they complete against the set's buy-and-hold or flat (cfg.gate_against), and switches only
    while every instrument is flat. Returns the walk with its paper steps taken out (account and instrument columns:
    account_live_part) and the gate at the walk's end."""
    market_set = run.setup.market_set
    days = np.asarray(step_days(trace, market_set.timestamps, market_set.sessions.day)).astype(str)
    gate = Gate.start(record.before(days[0]) if record is not None and len(days) else None,
                      scale_of(run.cfg.env.prop_firm), run.cfg.gate_against)
    t = np.asarray(trace["t"])
    last = int(t[-1]) + 1 if len(days) else -1  # the bar the walk's last P&L is marked at
    held = held_set_pnl(market_set, t, run.cfg.env.contracts_per_trade).sum(axis=1)
    _, live = gated_trace(gate_view(trace), days, gate, last >= 0 and closes_session(market_set.sessions, last), held)
    return account_live_part(trace, live), gate


def gate_view(trace: Trace) -> dict[str, np.ndarray]:
    """An account trace as gated_trace reads one instrument's: the account's columns, a position that is 0 only
    while the account is flat (the sum of the instruments' sizes), and no trades of its own."""
    n = len(trace["t"])
    view = {k: np.asarray(v) for k, v in trace.items() if k not in INSTRUMENT_COLUMNS}
    view.update(position=np.abs(np.asarray(trace["position"])).sum(axis=1), entry_side=np.zeros(n, np.int32),
                exit_reason=np.full(n, NO_EXIT), trade_pnl=np.zeros(n))
    return view


def account_live_part(trace: Trace, live: np.ndarray) -> dict[str, np.ndarray]:
    """The account trace with the steps the gate kept on paper taken out (gate.live_part for the account's columns,
    PAPER for each instrument's): what reached the broker. The gate switches only while the account is flat, so each
    trade is wholly live or wholly paper and every instrument's entries and exits still alternate."""
    live = np.asarray(live, bool)
    out = {k: v for k, v in live_part(gate_view(trace), live).items() if k not in ("entry_side", "exit_reason",
                                                                                    "trade_pnl")}
    for k in INSTRUMENT_COLUMNS:
        column = np.asarray(trace[k])
        out[k] = np.where(live[:, None], column, PAPER[k]).astype(column.dtype) if k in PAPER else column
    return out


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


class AdvisedAccountWalks:
    """Validation's walks of an account trained with advice (agents.training.validation.AgentEvaluator): the agent as
    it acts in training (advised_act, from the training state's advice records), or an ablation: the policy alone
    (RL_ONLY) or the advice alone (LLM_ONLY). Each split's advice is asked once (advice_tables) and kept: an account's
    advisors do not learn, so their answers do not change during a run."""

    def __init__(self, ppo: Any, setup: EnvSetup, cfg_hybrid: Any, llm: str, env_cfg: Any, data: DataConfig, *,
                 normalize_obs: bool, greedy: bool, progress: bool):
        self.setup, self.hybrid, self.llm, self.env_cfg, self.data = setup, cfg_hybrid, llm, env_cfg, data
        self.progress = progress
        self.acting = training_acting(cfg_hybrid, llm, setup.env).walking(greedy)
        self.advised = advised_act(self.acting, ppo.network, normalize_obs)
        self.alone = setup.agent_act(ppo, normalize_obs=normalize_obs, greedy=greedy)
        self.advice_alone = advice_alone_act(setup.env, cfg_hybrid.query)
        self.tables: dict[str, Any] = {}

    def _tables(self, split: str):
        """The split's advice, asked at its first walk that reads it (the policy alone asks nothing)."""
        if split not in self.tables:
            start, end = account_bounds(self.setup.market_set, split)
            self.tables[split] = advice_tables(self.hybrid, self.llm, self.env_cfg, self.data, self.setup.market_set,
                                               start, end, self.progress)
        return self.tables[split]

    def __call__(self, state: Any, split: str, key: jax.Array, ablation: str | None = None) -> dict:
        env, market_set = self.setup.env, self.setup.market_set
        policy = (state.params, state.obs_norm)
        if ablation == RL_ONLY:
            walked = walk_account(env, market_set, split, self.alone, key, policy)
        elif ablation == LLM_ONLY:
            walked = walk_account(env, market_set, split, self.advice_alone, key, self._tables(split))
        else:
            records = [carry.record for carry in state.hybrid] if state.hybrid is not None else None
            carry = advised_carry(self.acting, self.setup.params, self._tables(split), records)
            walked = walk_account(env, market_set, split, self.advised, key, policy, carry)
        result = account_figures(walked, market_set, env)
        return {"score": result["net_pnl"], **result}


__all__ = ["ACCOUNT_ABLATIONS", "NOT_WALKED", "AccountRun", "AdvisedAccountWalks", "account_bounds", "account_data",
           "account_out_of_sample", "account_trades", "account_views", "agent_policy", "evaluate_account_run", "gated_account_walk",
           "is_account_run", "load_account_run"]

