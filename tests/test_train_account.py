"""train.py on several instruments traded in one account (issue 77): `--data SYMBOL=PATH` once per instrument trains
one account end to end (summary.json's account and per-symbol figures, the gate on the account's sessions), resumes,
evaluate.py walks it to train.py's test figures (and, for an account trained with advice, trade.py trades it as
evaluate.py walks it), and what is not built yet is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.config import load_config, to_dict
from agents.runs.saved_runs import restore_policy
from agents.runs.trials import _trial
from agents.training.loop import train
from tests.test_config import cli_main

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "configs" / "quick.yaml")
# 2 updates of 16 envs × 32 steps; the env's episode of 400 bars fits the pair's 20 sessions' splits
SMALL = ["--envs", "16", "--total-steps", "1024", "--set", "data.synthetic_days=20", "--set", "log.tensorboard=false",
         "--set", "checkpoint.every_updates=1", "--set", "checkpoint.eval_every_updates=1",
         "--set", "env.max_steps_in_episode=400", "--no-progress"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """NQ.csv and ES.csv of the synthetic pair, as scripts/write_market.py writes them."""
    out = tmp_path_factory.mktemp("pair")
    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "20", "--out", str(out)],
                   cwd=REPO, check=True, capture_output=True)
    return {"NQ": out / "NQ.csv", "ES": out / "ES.csv"}


def data_flags(pair: dict[str, Path]) -> list[str]:
    return [arg for symbol, path in pair.items() for arg in ("--data", f"{symbol}={path}")]


def test_two_files_train_one_account_that_resumes_and_reports_each_instrument(tmp_path, pair, capsys):
    run_dir = tmp_path / "runs" / "account"
    main = cli_main()
    overrides = ["llm=none", "num_envs=16", "total_steps=1024", "data.synthetic_days=20", "log.tensorboard=false",
                 "log.progress=false", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=1",
                 "env.max_steps_in_episode=400", f'data.instruments=["NQ={pair["NQ"]}", "ES={pair["ES"]}"]']
    cfg = load_config(QUICK, overrides)
    assert [item.contract.symbol for item in cfg.data.instruments] == ["NQ", "ES"]
    assert train(cfg, run_dir, stop_after=1).update == 1  # stopped after its first update ...
    assert main(["--resume", str(run_dir)]) == 0  # ... and resumed by train.py to its end
    out = capsys.readouterr().out
    assert "test the account's net P&L after costs: agent_latest" in out
    assert "account test (NQ + ES, best checkpoint): P&L" in out and "NQ: P&L" in out and "ES: P&L" in out
    assert "out of sample (test split of the account NQ + ES" in out
    assert "trade.py will paper-trade this agent until its record passes" in out  # the gate's line

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    assert len(lines[-1]["instrument_trades"]) == 2 and "val_net_pnl" in lines[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"agent_best", "agent_latest", "flat", "random_valid", "always_long"} == set(summary["test"])
    account = summary["account"]
    assert account["symbols"] == ["NQ", "ES"] and account["test"]["flat"] == 0.0
    figures = account["test"]["instruments"]
    assert set(figures) == {"NQ", "ES"} and {"net_pnl", "trades", "held_pnl"} <= set(figures["NQ"])
    assert sum(f["net_pnl"] for f in figures.values()) == pytest.approx(account["test"]["net_pnl"], abs=0.05)
    assert account["test"]["buy_and_hold"] == pytest.approx(sum(f["held_pnl"] for f in figures.values()))
    [trial] = [json.loads(line) for line in (run_dir.parent / "trials.jsonl").read_text().splitlines()]
    assert trial["data"] == f"NQ={pair['NQ']},ES={pair['ES']}"

    from agents.evaluation.cli import main as evaluate_main

    out = tmp_path / "eval"  # evaluate.py walks the account: best checkpoint, test split, greedy heads
    assert evaluate_main(["--run-dir", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Sharpe (daily)" in printed and f"account test (NQ + ES, best-{summary['best_update']}): P&L" in printed
    numbers = json.loads((out / "evaluation.json").read_text())
    assert numbers["setup"]["checkpoints"] == [f"best-{summary['best_update']}"]
    assert numbers["agent"]["net_pnl"] == pytest.approx(account["test"]["net_pnl"], abs=0.01)  # train.py's figure
    # the account's P&L steps are float32 equity (~$50k: a 0.4-cent ulp) differences, each instrument's its own marks
    assert sum(f["net_pnl"] for f in numbers["instruments"].values()) == pytest.approx(account["test"]["net_pnl"],
                                                                                        abs=0.05)
    assert numbers["account"]["buy_and_hold"] == pytest.approx(account["test"]["buy_and_hold"])
    assert set(numbers["baselines"]) == {"flat", "random_valid", "always_long", "buy_and_hold"}
    assert (out / "trades.csv").exists() and (out / "equity.png").exists()
    assert evaluate_main(["--run-dir", str(run_dir), "--data", str(pair["NQ"])]) == 2  # a bare file: one line
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {run_dir}: a run on several instruments (NQ, ES): give --data SYMBOL=PATH once per instrument, in "
        "the run's order"]


def test_an_account_trains_with_each_instruments_advice_and_evaluates_and_trades_as_it_acted(tmp_path, pair, capsys):
    run_dir = tmp_path / "runs" / "advised"
    overrides = ["llm=mock", "num_envs=16", "total_steps=1536", "log.tensorboard=false", "log.progress=false",
                 "checkpoint.every_updates=1", "checkpoint.eval_every_updates=1", "env.max_steps_in_episode=400",
                 f'data.instruments=["NQ={pair["NQ"]}", "ES={pair["ES"]}"]']
    assert train(load_config(QUICK, overrides), run_dir, stop_after=1).update == 1
    assert cli_main()(["--resume", str(run_dir)]) == 0  # the advice carry of each instrument restored
    capsys.readouterr()
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    # (the answers asked before the stop went with its process: the resumed run's second update has none in force)
    assert last["update"] == 3 and last["llm_prompts"] > 0 and last["advice_coverage"] > 0
    assert {"record_calls_NQ", "record_calls_ES"} <= set(last)  # each instrument's advice record
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"agent_best", "ablation_rl_only", "ablation_llm_only"} <= set(summary["test"])
    saved = restore_policy(run_dir, "best", account=True)
    assert len(saved.advice_record) == 2 and all("evidence" in record for record in saved.advice_record)

    from agents.evaluation.account_run import account_out_of_sample
    from agents.evaluation.cli import main as evaluate_main

    out = tmp_path / "eval"  # the agent walked with its advisors' advice, as it trained; the policy alone beside it
    assert evaluate_main(["--run-dir", str(run_dir), "--out", str(out), "--no-progress"]) == 0
    numbers = json.loads((out / "evaluation.json").read_text())
    assert numbers["agent"]["net_pnl"] == pytest.approx(summary["account"]["test"]["net_pnl"], abs=0.01)
    assert set(numbers["ablations"]) == {"rl_only", "llm_only"}
    # the gate's evidence starts from the agent's own test sessions, walked with its advice
    record = account_out_of_sample(run_dir, "best")
    assert sum(record.pnl) == pytest.approx(numbers["agent"]["net_pnl"], abs=0.05)

    # trade.py on the files' last rows, killed (SIGKILL) after some decisions and resumed, decides as evaluate.py walks
    # the same files: each instrument asks its own advisor as its blocks close and acts on the answers in force
    files = {}
    for symbol, path in pair.items():
        lines = path.read_text().splitlines(keepends=True)
        files[symbol] = tmp_path / f"{symbol}-traded.csv"
        files[symbol].write_text(lines[0] + "".join(lines[-700:]))
    assert evaluate_main(["--run-dir", str(run_dir), *data_flags(files), "--json", str(tmp_path / "files.json"),
                          "--out", str(tmp_path / "files"), "--no-progress"]) == 0
    walked = json.loads((tmp_path / "files.json").read_text())
    assert walked["agent"]["net_pnl"] != walked["ablations"]["rl_only"]["net_pnl"]  # the advice changes what it does
    traded = tmp_path / "traded"
    cmd = [sys.executable, "scripts/trade.py", "--run-dir", str(run_dir), *data_flags(files), "--out", str(traded),
           "--gate", "off", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    decisions = traded / "decisions.jsonl"
    while proc.poll() is None and (not decisions.exists() or decisions.read_bytes().count(b"\n") < 100):
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    resumed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed after" in resumed.stderr
    figures = json.loads((traded / "summary.json").read_text())
    assert figures["pnl"] == pytest.approx(walked["agent"]["net_pnl"], abs=1e-3)
    assert figures["trades"] == walked["agent"]["trades"] > 0
    for symbol, own in figures["instruments"].items():
        assert own["net_pnl"] == pytest.approx(walked["instruments"][symbol]["net_pnl"], abs=1e-3)
        assert own["trades"] == walked["instruments"][symbol]["trades"]
        assert own["advice_keys_read"] > 0 and own["advice_on_time"] == 1.0  # a replay waits for each answer
    lines = [json.loads(line) for line in decisions.read_text().splitlines()]
    assert len(lines) == figures["decisions"]
    assert any(set(line["advice"]) == set(line["trust"]) == {"NQ", "ES"} for line in lines)  # each head's advice, trust
    assert all(set(line["veto"]) == set(line["bound"]) == {"NQ", "ES"} for line in lines)


def test_a_first_run_from_the_command_line(tmp_path, pair, capsys):
    run_dir = tmp_path / "run"
    assert cli_main()(["--config", QUICK, *data_flags(pair), "--llm", "none", "--run-dir", str(run_dir), *SMALL]) == 0
    captured = capsys.readouterr()
    assert "instruments NQ, ES on one timeline" in captured.err  # the set's load report
    assert "account test (NQ + ES" in captured.out
    assert set(json.loads((run_dir / "summary.json").read_text())["account"]["test"]["instruments"]) == {"NQ", "ES"}


IN_CONFIG = f"{QUICK} with --set overrides: "  # a line of the config's own checks starts so


@pytest.mark.parametrize("flags, line", [
    (["--llm", "smollm2", "--set", "hybrid.learning.enabled=true", "--set", "hybrid.query.bind_on=trust"],
     "hybrid.learning.enabled: the advisors of several instruments do not learn from outcomes yet; set it to false"),
    (["--llm", "none", "--set", "env_name=CartPole-v1"], IN_CONFIG + "env_name: several instruments "
                                                         "(data.instruments) trade in the trading env: env_name must "
                                                         "be trading"),
    (["--llm", "none", "--init-from", "runs/x"], IN_CONFIG + "transfer.init_from: starting a run on several "
                                                 "instruments from another run's agent (--init-from) is not built yet"),
])
def test_what_is_not_built_for_a_set_is_refused_in_one_line(tmp_path, pair, capsys, flags, line):
    run_dir = tmp_path / "run"
    assert cli_main()(["--config", QUICK, *data_flags(pair), *flags, "--run-dir", str(run_dir)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"]
    assert not run_dir.exists()


def test_a_bare_path_mixed_with_symbol_path_is_one_line(tmp_path, pair, capsys):
    run_dir = tmp_path / "run"
    argv = ["--data", str(pair["NQ"]), "--data", f"ES={pair['ES']}", "--llm", "none", "--run-dir", str(run_dir)]
    assert cli_main()(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --data: {pair['NQ']} is one market's file but the others are SYMBOL=PATH")
    assert not run_dir.exists()


def test_items_of_neither_form_and_a_symbol_twice_are_named(capsys):
    argv = ["--data", "NQ=a.csv", "--data", "nq=b.csv", "--set", 'data.instruments=["NQ=a.csv", "ES", 5]',
            "--llm", "none"]
    assert cli_main()(argv[:4] + argv[6:]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: data.instruments[1]: NQ is given twice (also data.instruments[0]); each instrument once"]
    assert cli_main()(argv[4:]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: data.instruments[2]: expected SYMBOL=PATH, or a mapping {contract: SYMBOL or a full spec, source: "
        "PATH}, got int 5"]


def test_a_single_instruments_trial_digest_is_the_one_it_had_before_data_instruments():
    settings = to_dict(load_config(None, ["llm=none"]))
    before = {**settings, "data": {k: v for k, v in settings["data"].items() if k != "instruments"}}
    assert _trial(Path("a"), settings) == _trial(Path("a"), before)


def test_the_progress_bar_shows_each_instruments_advice_record():
    from agents.training.loop import _postfix

    figures = {"steps_per_s": 900.0}
    for symbol, log_e, bound in (("NQ", 3.2, 1), ("ES", -0.4, 0)):
        figures.update({f"record_log_e_{symbol}": log_e, f"record_log_e_bar_{symbol}": 3.0,
                        f"record_sessions_{symbol}": 12, f"record_bound_{symbol}": bound})
    bar = _postfix(figures, "score")
    assert "record NQ E 24.5/20 (12 sessions, bound)" in bar and "record ES E 0.67/20 (12 sessions)" in bar
