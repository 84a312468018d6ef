"""Flags are spelled out in full and a mistyped one is answered in one line that names the flag meant: before, `--lr`
got argparse's usage and no hint of `--ppo.lr`, and `--total-step 512` was silently taken for `--total-steps`."""

from __future__ import annotations

import pytest

from agents.command_line import CommandParser


def refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_train_names_the_flag_meant_and_takes_no_prefix(capsys):
    from agents.training.cli import main

    assert "unknown flag --lr (did you mean --ppo.lr or " in refused(main, ["--lr", "1e-4"], capsys)
    assert "unknown flag --total-step (did you mean --total-steps?)" in refused(main, ["--total-step", "512"], capsys)
    assert "unknown flag --env (did you mean --envs?)" in refused(main, ["--env", "8"], capsys)


def test_walk_forward_takes_envs_like_train():
    from experiments import walkforward

    seen = {}

    def plan_from_args(args):
        seen["envs"] = args.envs
        raise ValueError("stop here")

    original, walkforward.plan_from_args = walkforward.plan_from_args, plan_from_args
    try:
        assert walkforward.main(["--envs", "64"]) == 2
    finally:
        walkforward.plan_from_args = original
    assert seen["envs"] == 64


def trials_main(argv):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "trials.py"
    spec = importlib.util.spec_from_file_location("trials_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def evaluate_main(argv):
    from agents.evaluation.cli import main

    return main(argv)


def trade_main(argv):
    from agents.trading.cli import main

    return main(argv)


@pytest.mark.parametrize("main, argv, meant", [
    (evaluate_main, ["--run-dir", "runs/x", "--dat", "bars.csv"], "--dat (did you mean --data?)"),
    (trade_main, ["--run-dir", "runs/x", "--data", "bars.csv", "--follo"], "--follo (did you mean --follow?)"),
    (trials_main, ["runs", "--hel"], "--hel (did you mean --help?)"),
])
def test_evaluate_trade_and_trials_take_no_prefix_and_name_the_flag_meant(main, argv, meant, capsys):
    assert f"error: unknown flag {meant}" in refused(main, argv, capsys)


def test_a_flag_far_from_every_other_gets_no_guess(capsys):
    parser = CommandParser(prog="tool")
    parser.add_argument("--out")
    assert refused(parser.parse_args, ["--zzzzzz"], capsys) == ("tool: error: unknown flag --zzzzzz; tool --help "
                                                                "lists them")
