"""evaluate.py on a run trained on several instruments with --data SYMBOL=PATH once per instrument (issue 77): every
bar of those files walked by one account, the walk its gate would have traded, the checkpoint's out-of-sample record
kept in RUN/evidence, and a --data that does not fit the run refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.config import RUN_CONFIG_FILE, load_config, save_config
from agents.evaluation.cli import main as evaluate_main
from tests.test_config import cli_main
from tests.test_train_account import QUICK, REPO, SMALL, data_flags


@pytest.fixture(scope="module")
def account(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """A run of 2 updates of 16 envs on the synthetic pair's NQ.csv and ES.csv (20 sessions), and those files."""
    out = tmp_path_factory.mktemp("account")
    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "20", "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True)
    pair = {"NQ": out / "NQ.csv", "ES": out / "ES.csv"}
    run_dir = out / "run"
    assert cli_main()(["--config", QUICK, *data_flags(pair), "--llm", "none", "--run-dir", str(run_dir), *SMALL]) == 0
    return run_dir, pair


@pytest.fixture(scope="module")
def walked(account, tmp_path_factory) -> dict:
    """evaluate.py --data NQ=.. --data ES=.. on the run's own files, --split omitted: evaluation.json's figures."""
    run_dir, pair = account
    out = tmp_path_factory.mktemp("eval")
    argv = ["--run-dir", str(run_dir), *data_flags(pair), "--out", str(out), "--json", str(out / "e.json"),
            "--no-progress"]
    assert evaluate_main(argv) == 0
    assert (out / "trades.csv").exists() and (out / "table.md").read_text().count("gate (1):") == 1
    return json.loads((out / "e.json").read_text())


def test_every_bar_of_the_files_is_walked_by_one_account(account, walked):
    from agents.evaluation.account_run import account_out_of_sample

    run_dir, pair = account
    setup = walked["setup"]
    assert setup["split"] == "all" and setup["data"] == f"NQ={pair['NQ']},ES={pair['ES']}"
    # the account's P&L steps are float32 equity (~$50k: a 0.4-cent ulp) differences, each instrument's its own
    # marks: their rounding adds up over the walk's bars (0.34 over these 7,335)
    agent = walked["agent"]
    assert sum(f["net_pnl"] for f in walked["instruments"].values()) == pytest.approx(agent["net_pnl"],
                                                                                       abs=1e-4 * agent["bars"])
    test = account_out_of_sample(run_dir)  # the test split's sessions, walked by evaluate.py for the gate
    assert set(test.days) < set(walked["sessions"]["days"])
    assert "--data" not in walked["not_walked"] and "gated" not in walked["not_walked"]


def test_the_gated_walk_counts_each_out_of_sample_session_it_saw(walked):
    [gate] = walked["gate"]
    assert {"mode", "reason", "log_e", "sessions", "changes", "in_sample_sessions", "in_sample_end"} <= set(gate)
    days, end = walked["sessions"]["days"], gate["in_sample_end"]
    # the walk starts at the files' first bar: no record's session closed before it; the files end on a session's close
    assert gate["sessions"] == sum(day > end for day in days) > 0
    assert gate["in_sample_sessions"] == sum(day <= end for day in days) > 0
    gated = walked["gated"]
    assert gated["n"] == 1 and gated["trades"] <= walked["agent"]["trades"]
    if gate["mode"] == "paper" and not gate["changes"]:  # never live: nothing reached the broker
        assert gated["net_pnl"] == 0 and gated["trades"] == 0


@pytest.mark.parametrize("symbols, line", [
    (["NQ", "CL"], "--data: the run trades NQ, ES; got NQ, CL"),
    (["ES", "NQ"], "--data: the run trades NQ, ES; got ES, NQ"),
    (["NQ"], "--data: the run trades NQ, ES; got NQ "),
])
def test_a_symbol_set_other_than_the_runs_is_one_line(account, capsys, symbols, line):
    run_dir, pair = account
    flags = [arg for symbol in symbols for arg in ("--data", f"{symbol}={pair.get(symbol, pair['NQ'])}")]
    assert evaluate_main(["--run-dir", str(run_dir), *flags, "--no-progress"]) == 2
    [printed] = capsys.readouterr().err.strip().splitlines()
    assert printed.startswith(f"error: {line}")


def test_a_bare_path_for_an_account_and_symbol_path_for_one_instrument_are_one_line(account, tmp_path, capsys):
    run_dir, pair = account
    assert evaluate_main(["--run-dir", str(run_dir), "--data", str(pair["NQ"]), "--data", f"ES={pair['ES']}"]) == 2
    [printed] = capsys.readouterr().err.strip().splitlines()
    assert printed == (f"error: {run_dir}: a run on several instruments (NQ, ES): give --data SYMBOL=PATH once per "
                       "instrument, in the run's order")
    single = tmp_path / "single"  # a run on one instrument: its config is all evaluate.py reads before refusing
    single.mkdir()
    save_config(load_config(QUICK, []), single / RUN_CONFIG_FILE)
    assert evaluate_main(["--run-dir", str(single), "--data", f"NQ={pair['NQ']}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --data: NQ={pair['NQ']} is SYMBOL=PATH, one instrument of an account, but the run trades one "
        "instrument: give one PATH"]
    assert evaluate_main(["--run-dir", str(single), "--advisor", "mock"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --advisor: a run on one instrument walks its own advisor's ablations; --advisor is for a run on "
        "several instruments"]


def test_the_out_of_sample_record_is_walked_once_then_read_from_the_run(account):
    from agents.evaluation.account_run import account_out_of_sample
    from agents.evaluation.saved_run import EVIDENCE_DIR

    run_dir, _ = account
    for old in (run_dir / EVIDENCE_DIR).glob("*.json"):
        old.unlink()
    first = account_out_of_sample(run_dir, "best")
    [path] = (run_dir / EVIDENCE_DIR).glob("best-*.json")
    written = path.stat().st_mtime_ns
    again = account_out_of_sample(run_dir, "best")
    assert path.stat().st_mtime_ns == written  # read back, not walked and saved again
    assert (again.days, again.pnl) == (first.days, first.pnl) and first.days
    assert again.held == again.buy_and_hold == first.held and again.in_sample_end == first.in_sample_end
    assert first.in_sample_end < first.days[0]  # the test split's sessions all come after the run's train and val


def test_a_gate_live_from_its_record_keeps_whole_trades_of_every_instrument(account):
    """A made-up record that has passed: the gate is live from the walk's first step and the gated walk keeps each
    step whole or takes it out whole; a switch to paper at a flat moment takes out every instrument's later trades
    whole, so their entries and exits still alternate and their P&L sums to the account's."""
    import jax
    import numpy as np
    import pandas as pd

    from agents.evaluation.account_run import (
        account_bounds,
        account_live_part,
        gated_account_walk,
        load_account_run,
    )
    from agents.evidence.gate import OutOfSample
    from jaxenv.account_evaluate import account_figures, walk_account

    run_dir, _ = account
    run = load_account_run(run_dir)
    market_set, env = run.setup.market_set, run.setup.env
    days = [str(d.date()) for d in pd.date_range("1999-01-01", periods=60)]
    record = OutOfSample(days, [5_000.0] * 60, "made up", buy_and_hold=[0.0] * 60, held=[0.0] * 60)
    trace = walk_account(env, market_set, account_bounds(market_set, "test"), run.act, jax.random.PRNGKey(0),
                         (run.saved.params, run.saved.obs_norm))
    gated, gate = gated_account_walk(run, trace, record)
    assert gate.sessions >= 60 and gated["pnl"][0] == trace["pnl"][0]  # live from the first decision
    kept = gated["pnl"] == trace["pnl"]
    assert np.all(kept | (gated["pnl"] == 0))
    assert np.array_equal(gated["position"], np.where(kept[:, None], trace["position"], 0))
    figures = account_figures(gated, market_set, env)  # each instrument's entries and exits still alternate
    assert sum(f["net_pnl"] for f in figures["instruments"].values()) == pytest.approx(figures["net_pnl"], abs=0.05)

    flat = np.abs(trace["position"]).sum(axis=1) == 0  # the account is flat after step i: step i + 1 may switch
    switch = 1 + int(np.flatnonzero(flat[len(flat) // 2:])[0]) + len(flat) // 2
    live = np.arange(len(flat)) < switch
    paper = account_live_part(trace, live)
    assert np.array_equal(paper["pnl"], np.where(live, trace["pnl"], 0)) and not paper["position"][switch:].any()
    halves = account_figures(paper, market_set, env), account_figures(trace, market_set, env)
    assert 0 < halves[0]["trades"] < halves[1]["trades"]
    assert sum(f["net_pnl"] for f in halves[0]["instruments"].values()) == pytest.approx(halves[0]["net_pnl"],
                                                                                          abs=0.05)


def test_the_advice_alone_trades_each_instrument_on_its_own_advice_in_force(account, tmp_path, capsys):
    """evaluate.py --advisor mock on a run trained without advice: the ablation llm_only is the account walked by each
    instrument's own advisor (its own keys and prompts), every entry on the side its instrument's answer in force
    names: block t // k - 1's flat key, rendered before bar t."""
    import jax
    import numpy as np

    from agents.evaluation.account_advice import advice_alone_act, advice_tables
    from agents.evaluation.account_run import account_bounds, load_account_run
    from bridge.protocol import BUY, SELL
    from jaxenv.account_evaluate import account_figures, walk_account

    run_dir, _ = account
    out = tmp_path / "eval"
    argv = ["--run-dir", str(run_dir), "--advisor", "mock", "--out", str(out), "--no-progress"]
    assert evaluate_main(argv) == 0
    assert "llm_only" in capsys.readouterr().out
    alone = json.loads((out / "evaluation.json").read_text())["ablations"]["llm_only"]

    run = load_account_run(run_dir)
    market_set, env, h = run.setup.market_set, run.setup.env, run.cfg.hybrid
    start, end = account_bounds(market_set, "test")
    tables = advice_tables(h, "mock", run.cfg.env, run.cfg.data, market_set, start, end, progress=False)
    assert not np.array_equal(tables.probs[0], tables.probs[1])  # NQ's answers are not ES's
    trace = walk_account(env, market_set, (start, end), advice_alone_act(env, h.query), jax.random.PRNGKey(0),
                         tables)
    assert alone["net_pnl"] == pytest.approx(account_figures(trace, market_set, env)["net_pnl"])
    t, actions = np.asarray(trace["t"]), np.asarray(trace["action"])
    flat_before = np.vstack([np.zeros((1, actions.shape[1])), np.asarray(trace["position"])[:-1]]) == 0
    entries = np.argwhere(((actions == BUY) | (actions == SELL)) & flat_before)
    assert len(entries) > 10
    probs = np.asarray(tables.probs)
    for row, i in entries:
        key = (t[row] // h.query.interval - 1) * 3 + 1  # the flat side's key of the block before bar t's
        assert actions[row, i] == (BUY if probs[i, key, BUY] >= probs[i, key, SELL] else SELL), (row, i)


@pytest.mark.parametrize("advisor, line", [
    ("none", "--advisor none: no advisor to walk; name one (mock, smollm2, a model path or hub id)"),
    ("./no_such_model", "llm: no model folder at ./no_such_model (a local model is a folder; a hub id is NAME or "
                        "ORG/NAME)"),
])
def test_an_advisor_that_cannot_advise_is_one_line(account, tmp_path, capsys, advisor, line):
    run_dir, _ = account
    out = tmp_path / "eval"
    assert evaluate_main(["--run-dir", str(run_dir), "--advisor", advisor, "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {line}"
    assert not out.exists()
