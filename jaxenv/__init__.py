"""Pure-JAX trading environment (gymnax API) and its market data: futures, spot FX and cash equities.

    market = load_market(DataConfig(source="synthetic:signal"))   # or DataConfig(source="bars.csv", contract="6E")
    print(load_report(market))
    env = TradingEnv(EnvConfig())
    params = env.make_params(market, split="train")
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
    mask = env.action_mask(state, params)

    markets = load_market_set([("NQ", "NQ.csv"), ("ES", "ES.csv")], DataConfig())   # several instruments, one timeline
    account = AccountEnv(EnvConfig())               # one account trading them all, under EnvConfig.prop_firm's limits
    figures = evaluate_account(account, markets, "test", act, key)                   # its walk (jaxenv.account_evaluate)
"""

from jaxenv.account_env import AccountEnv
from jaxenv.account_evaluate import evaluate_account, walk_account
from jaxenv.config import DataConfig, EnvConfig, PropFirmRules
from jaxenv.contracts import CONTRACTS, ContractSpec, get_contract, resolve_contract
from jaxenv.data import DataValidationError
from jaxenv.env import EXIT_REASONS, EnvParams, EnvState, TradingEnv
from jaxenv.evaluate import evaluate_policy, walk_split
from jaxenv.load_report import load_report
from jaxenv.market import Market, load_market
from jaxenv.market_set import MarketSet, load_market_set

__all__ = [
    "AccountEnv",
    "CONTRACTS",
    "ContractSpec",
    "DataConfig",
    "DataValidationError",
    "EXIT_REASONS",
    "EnvConfig",
    "EnvParams",
    "EnvState",
    "Market",
    "MarketSet",
    "PropFirmRules",
    "TradingEnv",
    "evaluate_account",
    "evaluate_policy",
    "get_contract",
    "load_market",
    "load_market_set",
    "load_report",
    "resolve_contract",
    "walk_account",
    "walk_split",
]
