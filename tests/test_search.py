"""The hyperparameter search (experiments/search.py): its space file and the errors naming the key, the validation /
held-out split of the folds (no held-out session reaches a trial's runs), a killed study going on from the trials it
has (Optuna with a fake objective: skipped where optuna, an optional extra, is not installed), and one tiny real
search end to end (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_walkforward import TINY

CONFIG = "configs/quick.yaml"
TINY = [o for o in TINY if not o.startswith("network.actor_hidden")]  # the shipped space searches it


def space_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_the_shipped_space_parses_into_values_each_key_takes():
    from agents.config import load_config
    from experiments.search import load_space

    space = {p.key: p for p in load_space("configs/search/ppo.yaml", CONFIG)}
    assert set(space) == {"ppo.lr", "ppo.ent_coef", "ppo.gae_lambda", "network.actor_hidden"}
    assert space["ppo.lr"].kind == "float" and space["ppo.lr"].log and space["ppo.lr"].low == 1e-4
    assert space["ppo.gae_lambda"].kind == "float" and not space["ppo.gae_lambda"].log
    hidden = space["network.actor_hidden"]
    assert hidden.kind == "choice" and hidden.choices == ("[32, 32]", "[64, 64]", "[128, 128]")
    cfg = load_config(CONFIG, [hidden.override("[32, 32]"), space["ppo.lr"].override(2.5e-4)])
    assert cfg.network.actor_hidden == [32, 32] and cfg.ppo.lr == 2.5e-4


def test_an_integer_key_gets_integer_bounds_and_plain_choices_stay_values(tmp_path):
    from experiments.search import load_space

    (epochs, clip) = load_space(space_file(tmp_path, "ppo.update_epochs: {low: 1, high: 4}\n"
                                                    "ppo.clip_value: [true, false]\n"), CONFIG)
    assert (epochs.kind, epochs.low, epochs.high) == ("int", 1, 4)
    assert clip.choices == (True, False) and clip.override(True) == "ppo.clip_value=true"


@pytest.mark.parametrize("text, problem", [
    ("ppo.lrr: {low: 1.0e-4, high: 1.0e-3}\n", "ppo.lrr: .*unknown key 'ppo.lrr'"),
    ("ppo.lr: {low: 1.0e-3, high: 1.0e-4}\n", "ppo.lr: low 0.001 must be below high 0.0001"),
    ("ppo.ent_coef: {low: 0, high: 0.1, log: true}\n", "ppo.ent_coef: log: true needs low above 0"),
    ("ppo.update_epochs: {low: 1.5, high: 4}\n", "ppo.update_epochs: the key is an integer"),
    ("ppo.lr: {low: 1.0e-4}\n", r"ppo.lr: expected \{low: A, high: B\}"),
    ("ppo.lr: {low: 1.0e-4, high: 1.0e-3, lg: true}\n", r"ppo.lr: expected \{low: A, high: B\}"),
    ("ppo.lr: {low: small, high: 1.0e-3}\n", "ppo.lr: low and high must be numbers"),
    ("ppo.lr: 0.001\n", "ppo.lr: expected .* or a list of choices"),
    ("network.actor_hidden: []\n", "network.actor_hidden: no choices"),
    ("network.actor_hidden: {low: 1, high: 4}\n", "network.actor_hidden: the key holds list values"),
    ("ppo.num_minibatches: [2, 3]\n", "ppo.num_minibatches: .*must divide"),  # a value the key cannot take
    ("ppo: [1]\n", "ppo: a section, not a key"),
    ("seed: [0, 1]\n", "seed: the search does not vary seed"),
    ("data.synthetic_days: [30, 60]\n", "data.synthetic_days: the search does not vary data"),
    ("- ppo.lr\n", "expected a mapping of config keys"),
    ("ppo.lr: {low: [\n", "cannot parse the YAML"),
])
def test_a_bad_space_file_is_refused_in_one_line_naming_the_key(tmp_path, text, problem):
    from experiments.search import SpaceError, load_space

    path = space_file(tmp_path, text)
    with pytest.raises(SpaceError, match=problem) as error:
        load_space(path, CONFIG)
    assert str(error.value).startswith(f"--space {path}") and "\n" not in str(error.value)


def test_a_searched_key_may_not_also_be_set(tmp_path):
    from experiments.search import SpaceError, load_space

    with pytest.raises(SpaceError, match="ppo.lr: also given with --set"):
        load_space(space_file(tmp_path, "ppo.lr: {low: 1.0e-4, high: 1.0e-3}\n"), CONFIG, ["ppo.lr=0.001"])


def search_of(out: Path, folds: int = 3, held_out: int = 1, seeds=(0, 1)):
    """A Search over 30 synthetic days cut into `folds` folds of 3 test sessions, the shipped space; nothing runs."""
    from experiments.search import Search, load_space
    from experiments.walkforward import Plan
    from jaxenv.folds import FoldPlan, plan_folds

    overrides = [*TINY, "total_steps=256"]
    base = Plan(CONFIG, ["rl_only"], list(seeds), plan_folds(30, FoldPlan(folds, 3, 3)), out, overrides)
    return Search(base, load_space("configs/search/ppo.yaml", CONFIG, overrides), "configs/search/ppo.yaml", 4,
                  held_out)


@pytest.mark.parametrize("folds, held_out", [(3, 1), (4, 2)])
def test_no_held_out_session_reaches_a_trials_runs(tmp_path, folds, held_out):
    from experiments.walkforward import plan_jobs
    from jaxenv.folds import parse_splits

    search = search_of(tmp_path / "s", folds, held_out)
    held = search.held_out_folds
    assert [f.index for f in held] == list(range(folds - held_out, folds))
    assert [f.index for f in search.validation_folds] == list(range(folds - held_out))
    first_held = min(f.test[0] for f in held)
    params = {"ppo.lr": 2e-4, "ppo.ent_coef": 1e-3, "ppo.gae_lambda": 0.9, "network.actor_hidden": "[32, 32]"}
    jobs = plan_jobs(search.trial_plan(5, params))
    assert len(jobs) == (folds - held_out) * 2  # validation folds × seeds
    for job in jobs:
        assert job.run_dir.is_relative_to(search.out / "trials" / "5")
        assert job.run_dir.parent.name in {f"fold{f.index}" for f in search.validation_folds}
        spans = parse_splits(job.config.data.splits)
        assert max(b for _, b in spans.values()) <= first_held  # every session it trains, chooses or tests on
        assert job.config.ppo.lr == 2e-4 and job.config.network.actor_hidden == [32, 32]
    winner = plan_jobs(search.held_out_plan(5, params))
    assert {j.run_dir.parent.name for j in winner} == {f"fold{f.index}" for f in held}
    assert all(j.run_dir.is_relative_to(search.out / "held-out" / "5") for j in winner)
    # two trials' values are two configurations in the ledger; the held-out run is the winner's own
    other = search.trial_plan(6, {**params, "ppo.lr": 3e-4})
    assert other.trial("rl_only", 0)["config"] != search.trial_plan(5, params).trial("rl_only", 0)["config"]
    assert search.held_out_plan(5, params).trial("rl_only", 0) == search.trial_plan(5, params).trial("rl_only", 0)


@pytest.mark.parametrize("folds, held_out, problem", [(3, 3, "--held-out 3: must be less than --folds 3"),
                                                     (3, 0, "--held-out 0: must be at least 1")])
def test_held_out_folds_that_leave_no_validation_fold_are_refused(tmp_path, capsys, folds, held_out, problem):
    from experiments.search import main

    out = tmp_path / "s"
    assert main(["--config", CONFIG, "--space", "configs/search/ppo.yaml", "--folds", str(folds), "--held-out",
                 str(held_out), "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {problem} " + (
        "(the trials need at least one validation fold)" if held_out else
        "(the winner is judged on folds no trial saw)")]
    assert not out.exists()


def test_without_optuna_the_search_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import sys

    from experiments.search import main

    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    assert main(["--config", CONFIG, "--space", "configs/search/ppo.yaml", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith("pip install -e .[sweep]")


def test_a_bad_space_file_stops_the_command_in_one_line(tmp_path, capsys):
    pytest.importorskip("optuna")
    from experiments.search import main

    bad = space_file(tmp_path, "ppo.lrr: {low: 1.0e-4, high: 1.0e-3}\n")
    out = tmp_path / "s"
    assert main(["--config", CONFIG, "--space", str(bad), "--folds", "3", "--test-sessions", "3", "--val-sessions",
                 "3", "--out", str(out), *(f"--set={o}" for o in TINY)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --space {bad}: ppo.lrr:") and not out.exists()


def test_a_killed_study_runs_its_running_trial_again_then_only_the_missing_ones(tmp_path):
    pytest.importorskip("optuna")
    from optuna.trial import TrialState

    from experiments.search import open_study, run_trials

    space = search_of(tmp_path / "s").space
    calls: list[tuple[int, dict]] = []

    def fake(number, params):  # a trial's objective without training: a function of its values
        calls.append((number, params))
        return -abs(params["ppo.lr"] - 5e-4) * 1e4

    def killed_at_the_third(number, params):
        if len(calls) == 2:
            calls.append((number, params))
            raise KeyboardInterrupt
        return fake(number, params)

    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        run_trials(open_study(out, 0), space, 3, killed_at_the_third)
    study = open_study(out, 0)  # a new process: the study from its file
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    killed = calls[-1]
    calls.clear()
    assert run_trials(study, space, 5, fake) == [2, 3, 4]
    assert calls[0] == killed  # the trial that was running, again, under its own number with its own values
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    calls.clear()
    assert run_trials(open_study(out, 0), space, 5, fake) == [] and not calls  # nothing missing: nothing run
    assert run_trials(open_study(out, 0), space, 6, fake) == [5]


def test_a_restarted_search_asks_for_the_values_an_uninterrupted_one_would(tmp_path):
    pytest.importorskip("optuna")
    from experiments.search import open_study, run_trials

    space = search_of(tmp_path / "s").space

    def fake(number, params):
        return -abs(params["ppo.lr"] - 5e-4) * 1e4 + params["ppo.gae_lambda"]

    whole = open_study(tmp_path / "whole", 7)
    run_trials(whole, space, 5, fake, sampler_seed=7)
    for wanted in (2, 3, 5):  # three invocations, each in a new process as far as the study knows
        run_trials(open_study(tmp_path / "parts", 7), space, wanted, fake, sampler_seed=7)
    parts = open_study(tmp_path / "parts", 7)
    assert [t.params for t in parts.trials] == [t.params for t in whole.trials]
    assert len({json.dumps(t.params, sort_keys=True) for t in whole.trials}) == 5  # no values proposed twice


def test_a_study_made_with_other_settings_is_refused(tmp_path):
    pytest.importorskip("optuna")
    from experiments.search import open_study

    search = search_of(tmp_path / "s")
    open_study(search.out, 0, search.settings())
    open_study(search.out, 0, search.settings())  # the same settings: loaded
    other = search_of(tmp_path / "s", seeds=(0, 1, 2))
    with pytest.raises(ValueError, match="study.db: its trials were run with other seeds"):
        open_study(other.out, 0, other.settings())


@pytest.mark.slow
def test_a_tiny_search_end_to_end_counts_every_trial_and_reads_everything_back(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    from agents.runs import jobs
    from experiments.search import main

    out = tmp_path / "search"
    argv = ["--config", CONFIG, "--space", "configs/search/ppo.yaml", "--trials", "2", "--seeds", "0", "--folds",
            "3", "--held-out", "1", "--test-sessions", "3", "--val-sessions", "3", "--total-steps", "256", "--out",
            str(out), "--no-progress", *(f"--set={o}" for o in TINY)]
    assert main(argv) == 0
    result = json.loads((out / "search.json").read_text())
    assert [t["number"] for t in result["trials"]] == [0, 1] and result["trials_counted"] == 2
    assert result["validation"]["folds"] == [0, 1] and result["held_out"]["folds"] == [2]
    assert result["validation"]["last_day"] < result["held_out"]["first_day"]
    winner = result["winner"]
    assert winner["number"] == max(result["trials"], key=lambda t: t["objective"])["number"]
    assert 0 <= (winner["dsr_held_out"]["dsr"] or 0) <= 1 and winner["dsr_held_out"]["trials"] == 2
    assert 0 <= result["pbo"]["pbo"] <= 1 and result["pbo"]["trials"] == 2
    assert isinstance(result["edge"], bool) and "as an edge after deflation" in result["verdict"]
    ledger = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len({t["config"] for t in ledger}) == 2 and result["runs_recorded"] == 4  # 2 trials × 2 validation folds
    assert {p.name for p in (out / "trials" / "0" / "runs").iterdir()} == {"fold0", "fold1"}
    assert {p.name for p in (out / "held-out" / str(winner["number"]) / "runs").iterdir()} == {"fold2"}
    assert {"report.md", "trials.png", "study.db"} <= {p.name for p in out.iterdir()}
    # run again: every trial and the held-out walk are read back, nothing trains
    monkeypatch.setattr(jobs, "run_job", lambda *a: pytest.fail("trained or scored a run again"))
    assert main(argv) == 0
    assert json.loads((out / "search.json").read_text())["winner"] == winner
