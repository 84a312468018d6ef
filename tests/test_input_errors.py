"""train.py names every input error in one run where they are independent (issue 75): every unknown key and wrong
type of the config, every failed cross-field check, and the data's error next to the config's; exit 2, nothing
written. None of these runs trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.config import ConfigError, load_config
from jaxenv import DataValidationError, load_market
from jaxenv.config import DataConfig

QUICK = ["--llm", "none", "--envs", "8", "--total-steps", "512", "--no-progress"]


def errors(capsys, argv: list[str]) -> list[str]:
    """train.py's stderr lines for `argv`: exit 2, each line an `error: `, no traceback."""
    from agents.training.cli import main

    assert main([*QUICK, *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), lines
    return lines


def bad_csv(tmp_path: Path) -> tuple[Path, str]:
    """Bars without a volume column, and the loader's refusal of them (today's wording)."""
    path = tmp_path / "bars.csv"
    path.write_text("timestamp,open,high,low,close\n2024-01-02 09:30,100,101,99,100.5\n2024-01-02 09:31,100.5,102,"
                    "100,101\n")
    with pytest.raises(DataValidationError, match=r"bars\.csv: missing column\(s\) volume") as refused:
        load_market(DataConfig(source=str(path)))
    return path, str(refused.value)


def test_every_unknown_key_and_wrong_type_of_a_yaml_file_in_one_run(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("ppo:\n  lrr: 0.1\n  num_steps: abc\nnetwork:\n  activashun: relu\n")
    lines = errors(capsys, ["--config", str(path), "--run-dir", str(tmp_path / "run")])
    assert len(lines) == 3, lines
    where = f"error: {path} with --set overrides"  # the flags are overrides
    assert lines[0].startswith(f"{where}: unknown key 'ppo.lrr' (valid keys here: ")
    assert lines[1] == f"{where}: ppo.num_steps: expected int, got str 'abc'"
    assert lines[2].startswith(f"{where}: unknown key 'network.activashun' (valid keys here: ")
    assert not (tmp_path / "run").exists()


def test_every_bad_override_in_one_pass():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ppo.lrr=1", "ppo.num_steps=abc", "ppo.clip_value=maybe", "ppo.lr", "ppo=1",
                           "hybrid.mock_answers=news"])
    assert [line.split(" (")[0].split(":")[0] for line in e.value.errors] == [
        "unknown key 'ppo.lrr'", "ppo.clip_value", "--set expects key=value, got 'ppo.lr'", "ppo",
        "unknown key 'hybrid.mock_answers'", "ppo.num_steps"]  # the overrides' own errors, then the merged config's
    assert str(e.value) == "\n".join(e.value.errors)


def test_a_single_error_keeps_its_one_line():
    with pytest.raises(ConfigError, match=r"^ppo.lr: must be > 0$") as e:
        load_config(None, ["ppo.lr=-1"])
    assert e.value.errors == ["ppo.lr: must be > 0"]


def test_a_yaml_file_that_does_not_parse_stops_there(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("ppo:\n  lr: [1\n  lrr: 2\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: cannot parse the YAML: ") as e:
        load_config(path, ["ppo.lrr=1"])
    assert len(e.value.errors) == 1


def test_a_section_of_the_wrong_type_is_one_error(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("ppo: 3\nnetwork:\n  activashun: relu\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, ["ppo.lr=1e-4"])
    assert e.value.errors == [
        f"{path} with --set overrides: ppo: expected a mapping of PPOConfig fields, got int",
        f"{path} with --set overrides: unknown key 'network.activashun' (valid keys here: actor_hidden, critic_hidden, "
        "activation)"]


def test_every_failed_cross_field_check_in_one_run(tmp_path, capsys):
    lines = errors(capsys, ["--set", "ppo.lr=-1", "--set", "hybrid.sidecar.nice=30", "--run-dir",
                            str(tmp_path / "run")])
    assert lines == ["error: ppo.lr: must be > 0", "error: hybrid.sidecar.nice: must be between 0 and 19"]
    assert not (tmp_path / "run").exists()


def test_a_config_error_and_a_data_error_in_one_run_and_no_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    data, refusal = bad_csv(tmp_path)
    lines = errors(capsys, ["--set", "ppo.lr=-1", "--data", str(data), "--run-dir", str(run_dir)])
    assert lines == ["error: ppo.lr: must be > 0", f"error: {refusal}"]
    assert not run_dir.exists()


def test_errors_in_the_data_sections_themselves_are_not_repeated(tmp_path, capsys):
    lines = errors(capsys, ["--set", "ppo.lr=-1", "--set", "data.synthetic_days=many", "--run-dir",
                            str(tmp_path / "run")])
    assert lines == ["error: data.synthetic_days: expected int, got str 'many'"]  # types first; no data line


def test_a_valid_config_with_bad_data_gives_the_data_error_alone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    data, refusal = bad_csv(tmp_path)
    lines = errors(capsys, ["--data", str(data), "--run-dir", str(run_dir)])
    assert lines == [f"error: {refusal}"]
    assert not run_dir.exists()


def test_the_data_a_yaml_file_names_is_checked_next_to_its_config_errors(tmp_path, capsys):
    data, refusal = bad_csv(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(f"ppo:\n  lr: -1\ndata:\n  source: {data}\n")
    lines = errors(capsys, ["--config", str(path), "--run-dir", str(tmp_path / "run")])
    assert lines == [f"error: {path} with --set overrides: ppo.lr: must be > 0", f"error: {refusal}"]
    assert not (tmp_path / "run").exists()
