"""The environment a run trains on, with its evaluators and baselines: the trading env on the configured data (one
instrument, or several traded in one account: data.instruments), or any gymnax registry environment (the PPO trainer
is not tied to trading)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agents.config import ConfigError
from agents.evaluation.policies import (
    Evaluator,
    always_when_valid,
    flat_policy,
    make_account_act,
    make_act,
    make_episode_evaluator,
    random_valid_policy,
)
from jaxenv.config import DataConfig, EnvConfig


@dataclass
class EnvSetup:
    env: Any  # a gymnax 1.0 Environment
    params: Any  # EnvParams used for training
    evaluate: Evaluator | None  # (act, act_params, key) -> {"score": ...}; None = no evaluation
    score_name: str  # the metrics key of the score: val_net_pnl or eval_return
    score_label: str  # what the score is, for people
    evaluate_test: Evaluator | None = None  # held-out split, only for the final summary (never for selection)
    market: Any = None  # the trading env's market (the hybrid loop renders prompts from it)
    baselines: dict[str, Callable] = field(default_factory=dict)  # name -> act, compared in the final summary
    # several instruments in one account (data.instruments): their jaxenv.market_set.MarketSet; `market` is then None
    market_set: Any = None

    def agent_act(self, ppo: Any, *, normalize_obs: bool, greedy: bool) -> Callable:
        """The run's network `ppo` (agents.rl.ppo.PPO) acting alone as this env's walks take an act: validation's and
        the end-of-run comparison's where no advised walker walks (a gymnax env, an account), and evaluate.py's walk of
        an account. An account's heads choose one by one in the env's instrument order under its sequential masks,
        greedy where `greedy` (agents.evaluation.policies.make_account_act: act(policy_state, obs, state, params,
        key)); one env's act is make_act's (act(policy_state, obs, mask, key)). policy_state: (network params, obs
        normaliser). Build it once per run: each walk compiles once per act."""
        if self.market_set is not None:
            return make_account_act(ppo, self.env, normalize_obs, greedy)
        return make_act(ppo, greedy)


def make_env_setup(env_name: str, env: EnvConfig, data: DataConfig, eval_episodes: int) -> EnvSetup:
    """The env `env_name` names: "trading" → jaxenv.TradingEnv of config `env` on `data` (with data.instruments, an
    account over several: account_setup); else a gymnax registry id, evaluated over `eval_episodes` fresh episodes
    (checkpoint.eval_episodes)."""
    if data.instruments:
        if env_name != "trading":
            raise ConfigError("env_name: several instruments (data.instruments) trade in the trading env: "
                              "env_name must be trading")
        return account_setup(env, data)
    if env_name == "trading":
        from bridge.protocol import BUY, SELL
        from jaxenv import TradingEnv, evaluate_policy, load_market

        market = load_market(data)
        trading = TradingEnv(env)

        def on_split(split: str) -> Evaluator:
            def evaluate(act, act_params, key):
                result = evaluate_policy(trading, market, split, act, key, policy_state=act_params)
                return {"score": result["net_pnl"], **result}

            return evaluate

        baselines = {"flat": flat_policy, "random_valid": random_valid_policy,
                     "always_long": always_when_valid(BUY), "always_short": always_when_valid(SELL)}
        return EnvSetup(trading, trading.make_params(market, "train"), on_split("val"), "val_net_pnl",
                        "net P&L after costs", on_split("test"), market=market, baselines=baselines)

    import gymnax

    if env_name not in gymnax.registered_envs:
        raise ConfigError(f"env_name: unknown env {env_name!r}; use 'trading' or a gymnax id such as CartPole-v1")
    gym_env, params = gymnax.make(env_name)
    return EnvSetup(gym_env, params, make_episode_evaluator(gym_env, params, eval_episodes), "eval_return",
                    "mean return of fresh episodes", baselines={"action_0": flat_policy, "random": random_valid_policy})


def account_setup(env: EnvConfig, data: DataConfig) -> EnvSetup:
    """Several instruments traded in one account (jaxenv.account_env.AccountEnv under the prop firm of `env`, its
    limits across instruments too: env.prop_firm.max_contracts, half_size_until_threshold, correlated) on the
    MarketSet of data.instruments (each loaded with `data`'s other keys). Each split is scored by the account walking
    it (jaxenv.account_evaluate.evaluate_account: its net P&L after costs, every instrument's figures, each session's
    P&L and the set's buy-and-hold); the act a walk takes is account_evaluate's: act(policy_state, obs, state, params,
    key) -> actions [I] (agents.evaluation.policies.make_account_act for the agent)."""
    from agents.evaluation.policies import account_always, account_flat, account_random_valid
    from bridge.protocol import BUY
    from jaxenv.account_env import AccountEnv
    from jaxenv.account_evaluate import evaluate_account
    from jaxenv.market_set import load_market_set

    market_set = load_market_set([(item.contract, item.source) for item in data.instruments], data)
    account = AccountEnv(env)

    def on_split(split: str) -> Evaluator:
        def evaluate(act, act_params, key):
            result = evaluate_account(account, market_set, split, act, key, policy_state=act_params)
            return {"score": result["net_pnl"], **result}

        return evaluate

    baselines = {"flat": account_flat, "random_valid": account_random_valid(account),
                 "always_long": account_always(account, BUY)}
    return EnvSetup(account, account.make_params(market_set, "train"), on_split("val"), "val_net_pnl",
                    "the account's net P&L after costs", on_split("test"), baselines=baselines, market_set=market_set)
