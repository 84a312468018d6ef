"""Pure-JAX trading environment (gymnax API) and its market data: futures, spot FX and cash equities.

    market = load_market(DataConfig(source="synthetic:signal"))   # or DataConfig(source="bars.csv", contract="6E")
    print(load_report(market))
    env = TradingEnv(EnvConfig())
    params = env.make_params(market, split="train")
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
    mask = env.action_mask(state, params)
"""

from jaxenv.config import DataConfig, EnvConfig, PropFirmRules
from jaxenv.contracts import CONTRACTS, ContractSpec, get_contract, resolve_contract
from jaxenv.data import DataValidationError
from jaxenv.env import EXIT_REASONS, EnvParams, EnvState, TradingEnv
from jaxenv.evaluate import evaluate_policy, walk_split
from jaxenv.load_report import load_report
from jaxenv.market import Market, load_market

__all__ = [
    "CONTRACTS",
    "ContractSpec",
    "DataConfig",
    "DataValidationError",
    "EXIT_REASONS",
    "EnvConfig",
    "EnvParams",
    "EnvState",
    "Market",
    "PropFirmRules",
    "TradingEnv",
    "evaluate_policy",
    "get_contract",
    "load_market",
    "load_report",
    "resolve_contract",
    "walk_split",
]
