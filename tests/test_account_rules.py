"""Account rules as named sets (env.prop_firm): apex-50k-2025, the default, and plain, a brokerage account without a
trailing drawdown, flat-by time or entry window. The names resolve, an unknown one is a one-line error, a plain account
is never breached and holds across a session's end, the gate's scale is finite, and the reports name the rules."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from agents.config import ConfigError, load_config, save_config
from agents.evidence.eprocess import scale_of
from agents.trading.cli import rules_line
from bridge.protocol import BUY, HOLD, SELL
from jaxenv.config import ACCOUNT_RULES, DataConfig, EnvConfig, PropFirmRules, rules_text
from jaxenv.env import EXIT_REASONS, TradingEnv
from jaxenv.evaluate import walk_split
from jaxenv.load_report import load_report
from jaxenv.market import market_from_frame
from tests.conftest import flat_frame
from tests.test_config import cli_main

APEX, PLAIN = ACCOUNT_RULES["apex-50k-2025"], ACCOUNT_RULES["plain"]
KNOWN = "(known: apex-50k-2025, plain)"


@pytest.fixture(scope="module")
def trend():
    """Four sessions of NQ minute bars rising half a point a bar, through the nights too: a long contract makes $10 a
    bar, a short one loses as much (a $2,500 drawdown in 250 bars, within a session)."""
    frame = flat_frame(days=4)
    price = 18_000.0 + 0.5 * np.arange(len(frame))
    frame["open"], frame["close"] = price, price + 0.5
    frame["high"], frame["low"] = price + 0.75, price - 0.25
    market = market_from_frame(frame, "trend", DataConfig(contract="NQ"))
    market.atr = np.full_like(market.atr, 10.0)
    return market


def always(side, obs, mask, key):
    """Enters on `side` (BUY or SELL) whenever the mask allows it."""
    return jnp.where(mask[side], side, HOLD)


def walk(market, rules: PropFirmRules, side: int) -> dict[str, np.ndarray]:
    """The whole market walked by one account that enters on `side` when it may, its stop and target out of reach."""
    env = TradingEnv(EnvConfig(stop_atr_mult=1000.0, target_atr_mult=1000.0, prop_firm=rules))
    return walk_split(env, market, (0, market.num_bars), always, jax.random.PRNGKey(0), jnp.int32(side))


def exits(trace) -> list[str]:
    return [EXIT_REASONS[r] for r in trace["exit_reason"] if r]


def test_the_names_resolve_apex_to_todays_defaults_and_plain_to_no_drawdown_flat_time_or_entry_window():
    assert list(ACCOUNT_RULES) == ["apex-50k-2025", "plain"]
    assert load_config(None, []).env.prop_firm == APEX == PropFirmRules()
    assert load_config(None, ["env.prop_firm=apex-50k-2025"]).env.prop_firm == APEX
    assert (APEX.starting_balance, APEX.trailing_drawdown, APEX.flat_by, APEX.timezone,
            APEX.no_entry_minutes_before_close, APEX.max_contracts) == (50_000.0, 2_500.0, "16:59", "America/New_York",
                                                                        15, 10)
    plain = load_config(None, ["env.prop_firm=plain"]).env.prop_firm
    assert plain == PLAIN and plain.version == "plain"
    assert math.isinf(plain.trailing_drawdown) and plain.flat_by == "" and plain.no_entry_minutes_before_close == 0
    assert (plain.starting_balance, plain.max_contracts) == (APEX.starting_balance, APEX.max_contracts)


def test_a_set_named_in_yaml_or_as_a_base_with_fields_changed_and_a_saved_run_config_load(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("env:\n  prop_firm: plain\n")
    assert load_config(path).env.prop_firm == PLAIN
    three = dataclasses.replace(PLAIN, max_contracts=3)
    path.write_text("env:\n  prop_firm:\n    base: plain\n    max_contracts: 3\n")
    assert load_config(path).env.prop_firm == three
    for overrides in (["env.prop_firm=plain", "env.prop_firm.max_contracts=3"],
                      ["env.prop_firm.max_contracts=3", "env.prop_firm=plain"]):  # whichever comes first
        assert load_config(None, overrides).env.prop_firm == three
    save_config(load_config(None, ["env.prop_firm=plain"]), tmp_path / "run.yaml")  # a run's config.yaml: .inf
    assert load_config(tmp_path / "run.yaml").env.prop_firm == PLAIN
    assert math.isinf(load_config(None, ["env.prop_firm.trailing_drawdown=.inf"]).env.prop_firm.trailing_drawdown)
    with pytest.raises(ConfigError, match=r"env.prop_firm.trailing_drawdown: must be > 0 \(.inf: none\), got 0.0"):
        load_config(None, ["env.prop_firm.trailing_drawdown=0"])


def test_an_unknown_name_is_a_one_line_config_error_naming_the_sets(tmp_path, capsys):
    with pytest.raises(ConfigError) as error:
        load_config(None, ["env.prop_firm=apex"])
    assert str(error.value) == f"env.prop_firm: unknown account rules 'apex' {KNOWN}"
    path = tmp_path / "config.yaml"
    path.write_text("env:\n  prop_firm:\n    base: nope\n    max_contracts: 3\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: env.prop_firm: unknown account rules 'nope' {KNOWN}"
    assert cli_main()(["--llm", "none", "--set", "env.prop_firm=apex"]) == 2
    assert capsys.readouterr().err == f"error: env.prop_firm: unknown account rules 'apex' {KNOWN}\n"


def test_a_plain_account_never_breaches_and_holds_across_session_ends_where_apex_flattens(trend):
    sessions = trend.sessions.session_id
    plain = load_config(None, ["env.prop_firm=plain"]).env.prop_firm  # the rules a user's flag gives
    apex_long, plain_long = walk(trend, APEX, BUY), walk(trend, plain, BUY)
    assert not apex_long["breach"].any() and not plain_long["breach"].any()
    closes = exits(apex_long)
    assert len(closes) >= 3 and set(closes) == {"session_close"}  # flat at every session's end, in again the next
    assert exits(plain_long) == [] and int((plain_long["entry_side"] != 0).sum()) == 1  # one entry, held
    held = sessions[plain_long["t"][plain_long["position"] == 1] + 1]
    assert len(np.unique(held)) == len(np.unique(sessions[plain_long["t"]]))  # into every session the walk covers

    apex_short, plain_short = walk(trend, APEX, SELL), walk(trend, plain, SELL)
    assert apex_short["breach"].any() and "breach" in exits(apex_short)
    assert not plain_short["breach"].any() and exits(plain_short) == []
    assert plain_short["equity"][-1] < PLAIN.starting_balance - 3 * APEX.trailing_drawdown  # a loss, not a breach
    assert np.isneginf(plain_short["threshold"]).all()


def test_a_plain_accounts_observation_is_finite_with_its_drawdown_buffer_full(trend):
    env = TradingEnv(EnvConfig(prop_firm=PLAIN))
    params = env.make_params(trend, "train")
    obs = np.asarray(env.get_obs(env.initial_state(jax.random.PRNGKey(0), params), params))
    assert np.isfinite(obs).all() and obs[env.observation_column("drawdown_buffer")] == 1.0


def test_the_evidence_scale_is_the_trailing_drawdown_or_five_percent_of_the_balance(trend):
    assert float(scale_of(APEX)) == 2_500.0
    assert float(scale_of(PLAIN)) == 2_500.0  # 5% of 50,000
    assert float(scale_of(dataclasses.replace(PLAIN, starting_balance=100_000.0))) == 5_000.0
    params = TradingEnv(EnvConfig(prop_firm=PLAIN)).make_params(trend, "train")
    assert float(jax.jit(scale_of)(params)) == 2_500.0  # the env's params, in jitted code


def test_the_load_report_and_a_trading_run_name_the_rules_in_force_and_the_flag(trend):
    assert ("\naccount     apex-50k-2025 (env.prop_firm): balance 50,000, trailing drawdown 2,500, futures flat by "
            "16:59 America/New_York, no entries in the last 15 minutes, at most 10 contracts (mini-equivalents); other "
            "account rules: --set env.prop_firm=plain\n") in load_report(trend)
    plain = load_report(trend, EnvConfig(prop_firm=PLAIN))
    assert ("\naccount     plain (env.prop_firm): balance 50,000, no trailing drawdown, no flat-by time, entries until "
            "the close, at most 10 contracts (mini-equivalents); other account rules: "
            "--set env.prop_firm=apex-50k-2025\n") in plain
    assert "positions may be held across sessions" in plain
    assert rules_line(PLAIN).startswith("rules: plain (balance 50,000, no trailing drawdown, no flat-by time, entries "
                                        "until the close, at most 10 contracts (mini-equivalents)) are enforced here; ")
    assert rules_line(APEX).startswith("rules: apex-50k-2025 (balance 50,000, trailing drawdown 2,500, futures flat "
                                       "by 16:59 America/New_York, no entries in the last 15 minutes, at most 10 "
                                       "contracts (mini-equivalents)) are enforced here; ")


# ------------------------------------------------------------------------------------------ the account's limits
def test_the_account_limits_load_from_yaml_and_set_the_account_envs_cap_and_pairs(tmp_path):
    """env.prop_firm's account limits through the real loader: the cap in tenths of a mini, the opposed pair."""
    from jaxenv.account_env import NO_CAP, AccountEnv
    from jaxenv.market_set import load_market_set

    path = tmp_path / "account.yaml"
    path.write_text("env:\n  prop_firm: {base: plain, max_contracts: 1.5, correlated: [[NQ, ES]]}\n")
    rules = load_config(path).env.prop_firm
    assert rules == dataclasses.replace(PLAIN, max_contracts=1.5, correlated=[["NQ", "ES"]])
    assert load_config(None, ["env.prop_firm=plain", "env.prop_firm.max_contracts=1.5",
                              "env.prop_firm.correlated=[[NQ,ES]]"]).env.prop_firm == rules  # the same by --set
    market_set = load_market_set([("NQ", "synthetic:pair"), ("ES", "synthetic:pair")], DataConfig(synthetic_days=4))
    params = AccountEnv(load_config(path).env).make_params(market_set, "train")
    assert int(params.cap_tenths) == 15 and not bool(params.half_size)
    assert np.asarray(params.opposed).tolist() == [[False, True], [True, False]]
    uncapped = load_config(None, ["env.prop_firm.max_contracts=.inf", "env.prop_firm.half_size_until_threshold=true"])
    params = AccountEnv(uncapped.env).make_params(market_set, "train")
    assert int(params.cap_tenths) == NO_CAP and bool(params.half_size) and not np.asarray(params.opposed).any()
    assert rules_text(rules).endswith("at most 1.5 contracts (mini-equivalents), never opposite sides on NQ/ES")
    assert rules_text(uncapped.env.prop_firm).endswith("no cap on contracts, half of them until the threshold locks")


@pytest.mark.parametrize("override, message", [
    ("env.prop_firm.correlated=[[NQ,NQ]]",
     "env.prop_firm.correlated[0]: each pair names two different symbols ([[NQ, ES]]), got ['NQ', 'NQ']"),
    ("env.prop_firm.correlated=[[NQ,ES,YM]]",
     "env.prop_firm.correlated[0]: each pair names two different symbols ([[NQ, ES]]), got ['NQ', 'ES', 'YM']"),
    ("env.prop_firm.max_contracts=0", "env.prop_firm.max_contracts: must be > 0 (.inf: no cap), got 0.0"),
])
def test_bad_account_limits_are_refused_naming_the_key(override, message, capsys):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert str(error.value) == message
    with pytest.raises(ValueError, match=r"env.prop_firm.correlated\[0\]: each pair names two different symbols"):
        TradingEnv(EnvConfig(prop_firm=dataclasses.replace(APEX, correlated=[["ES", "es"]])))
    assert cli_main()(["--llm", "none", "--set", override]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_an_account_run_saved_before_its_cap_was_configurable_is_refused_in_one_line(tmp_path):
    """Such a run's config.yaml has every prop-firm field of then and no account limit: its account had no cap, and
    read now its max_contracts (10) would cap it and change its observation. A run of one instrument still loads."""
    from agents.runs.saved_runs import load_run_config

    def saved(name: str, instruments: list[str]) -> Path:
        cfg = load_config(None, ["llm=none"] + [f"data.instruments=[{','.join(instruments)}]"] * bool(instruments))
        run = tmp_path / name
        run.mkdir()
        save_config(cfg, run / "config.yaml")
        return run

    new_account = saved("new", ["NQ=a.csv", "ES=b.csv"])
    assert load_run_config(new_account).env.prop_firm == APEX  # a run saved now records its limits
    for name, instruments in (("old", ["NQ=a.csv", "ES=b.csv"]), ("old_single", [])):
        run = saved(name, instruments)
        raw = yaml.safe_load((run / "config.yaml").read_text())
        for key in ("half_size_until_threshold", "correlated"):
            del raw["env"]["prop_firm"][key]
        raw["env"]["prop_firm"]["max_contracts"] = 10  # as it was written then
        (run / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_run_config(tmp_path / "old_single").env.prop_firm == APEX
    with pytest.raises(ConfigError) as error:
        load_run_config(tmp_path / "old")
    lines = str(error.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / 'old' / 'config.yaml'}: trained before the account's "
                                                   "cap was configurable (env.prop_firm.max_contracts")
    assert "retrain it" in lines[0]
