"""The environment a run trains on, with its evaluators and baselines: the trading env on the configured data,
or any gymnax registry environment (the PPO trainer is not tied to trading)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agents.config import ConfigError, TrainConfig
from agents.evaluation.policies import (
    Evaluator,
    always_when_valid,
    flat_policy,
    make_episode_evaluator,
    random_valid_policy,
)


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


def make_env_setup(cfg: TrainConfig) -> EnvSetup:
    """The env `cfg.env_name` names: "trading" → jaxenv.TradingEnv on cfg.data; else a gymnax registry id."""
    if cfg.env_name == "trading":
        from bridge.protocol import BUY, SELL
        from jaxenv import TradingEnv, evaluate_policy, load_market

        market = load_market(cfg.data)
        env = TradingEnv(cfg.env)

        def on_split(split: str) -> Evaluator:
            def evaluate(act, act_params, key):
                result = evaluate_policy(env, market, split, act, key, policy_state=act_params)
                return {"score": result["net_pnl"], **result}

            return evaluate

        baselines = {"flat": flat_policy, "random_valid": random_valid_policy,
                     "always_long": always_when_valid(BUY), "always_short": always_when_valid(SELL)}
        return EnvSetup(env, env.make_params(market, "train"), on_split("val"), "val_net_pnl", "net P&L after costs",
                        on_split("test"), market=market, baselines=baselines)

    import gymnax

    if cfg.env_name not in gymnax.registered_envs:
        raise ConfigError(f"env_name: unknown env {cfg.env_name!r}; use 'trading' or a gymnax id such as CartPole-v1")
    env, params = gymnax.make(cfg.env_name)
    return EnvSetup(env, params, make_episode_evaluator(env, params, cfg.checkpoint.eval_episodes), "eval_return",
                    "mean return of fresh episodes", baselines={"action_0": flat_policy, "random": random_valid_policy})
