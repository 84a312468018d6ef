"""Training config: defaults, strict YAML loading, --set overrides, and the CLI's refusal of bad flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents.config import ConfigError, TrainConfig, load_config, save_config, to_dict

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_are_valid_and_sized_for_the_issue():
    cfg = load_config()
    assert cfg.network.actor_hidden == [256, 256] and cfg.network.critic_hidden == [256, 256]
    assert cfg.llm == "smollm2" and cfg.num_envs == 4096 and cfg.num_updates >= 1  # the main job: the full hybrid
    assert cfg.steps_per_update % cfg.ppo.num_minibatches == 0


def test_yaml_and_set_overrides_nested_keys(tmp_path):
    path = write(tmp_path, "num_envs: 8\nppo:\n  lr: 1e-4\n  num_steps: 16\nenv:\n  prop_firm:\n    max_contracts: 3\n")
    cfg = load_config(path, ["ppo.lr=2.5e-4", "network.actor_hidden=[64, 32]", "data.source=synthetic:signal",
                             "ppo.clip_value=true", "env.prop_firm.version=x"])
    assert cfg.num_envs == 8 and cfg.ppo.num_steps == 16
    assert cfg.ppo.lr == 2.5e-4  # --set wins over the file
    assert cfg.network.actor_hidden == [64, 32] and cfg.ppo.clip_value is True
    assert cfg.data.source == "synthetic:signal"
    assert cfg.env.prop_firm.max_contracts == 3 and cfg.env.prop_firm.version == "x"
    assert load_config(write(tmp_path, "ppo:\n  lr: 1e-4\n")).ppo.lr == 1e-4  # PyYAML reads 1e-4 as a string
    assert load_config(None, ["total_steps=2e6"]).total_steps == 2_000_000


@pytest.mark.parametrize(
    "text, key",
    [
        ("ppo:\n  lrr: 0.1\n", "ppo.lrr"),
        ("envs: 4\n", "envs"),
        ("env:\n  prop_firm:\n    max_contract: 3\n", "env.prop_firm.max_contract"),
    ],
)
def test_unknown_yaml_key_is_named(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f"unknown key '{key}'") as e:
        load_config(write(tmp_path, text))
    assert "cfg.yaml" in str(e.value)  # and the file


@pytest.mark.parametrize(
    "text, key",
    [
        ("ppo:\n  lr: fast\n", "ppo.lr"),
        ("num_envs: 8.5\n", "num_envs"),
        ("ppo:\n  anneal_lr: 1\n", "ppo.anneal_lr"),
        ("network:\n  actor_hidden: 256\n", "network.actor_hidden"),
        ("network:\n  actor_hidden: [256, big]\n", r"network.actor_hidden\[1\]"),
        ("ppo: 3\n", "ppo"),
        ("data:\n  date_format: 5\n", "data.date_format"),
    ],
)
def test_wrong_type_is_named(tmp_path, text, key):
    with pytest.raises(ConfigError, match=f"{key}: expected"):
        load_config(write(tmp_path, text))


def test_bad_set_overrides_are_named():
    with pytest.raises(ConfigError, match="unknown key 'ppo.lrr'"):
        load_config(None, ["ppo.lrr=1"])
    with pytest.raises(ConfigError, match="ppo.num_steps: expected int"):
        load_config(None, ["ppo.num_steps=abc"])
    with pytest.raises(ConfigError, match="ppo.clip_value: expected true or false"):
        load_config(None, ["ppo.clip_value=maybe"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["ppo.lr"])
    with pytest.raises(ConfigError, match="is a section"):
        load_config(None, ["ppo=1"])


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="ppo.num_minibatches"):
        load_config(None, ["num_envs=3", "ppo.num_steps=5", "ppo.num_minibatches=4"])
    with pytest.raises(ConfigError, match="total_steps"):
        load_config(None, ["num_envs=64", "ppo.num_steps=64", "total_steps=100"])
    with pytest.raises(ConfigError, match="hybrid.fusion: must be one of none, rules, switch, learned"):
        load_config(None, ["llm=mock", "hybrid.fusion=trust-me"])
    with pytest.raises(ConfigError, match="hybrid.query.interval: must be between 1 and ppo.num_steps = 64"):
        load_config(None, ["llm=mock", "hybrid.query.interval=70"])
    with pytest.raises(ConfigError, match="hybrid.query.bind_on: must be one of always, trust, record"):
        load_config(None, ["llm=mock", "hybrid.query.bind_on=gate"])
    with pytest.raises(ConfigError, match="hybrid.veto.advised_only_below: must be a share"):
        load_config(None, ["llm=mock", "hybrid.veto.advised_only_below=1.5"])
    with pytest.raises(ConfigError, match="hybrid.link.budget: must be a positive number or auto"):
        load_config(None, ["hybrid.link.budget=lots"])
    with pytest.raises(ConfigError, match="network.activation"):
        load_config(None, ["network.activation=gelu"])


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["seed=7", "ppo.lr=1e-5", "data.date_format=%Y", "network.critic_hidden=[8]"])
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    assert load_config(ROOT / "configs" / "default.yaml") == TrainConfig()  # the shipped default is the default


def test_the_shipped_default_config_is_generated_from_the_dataclasses():
    """configs/default.yaml lists every key with its default and a comment; regenerate it with
    `python -m agents.config > configs/default.yaml` when a field changes."""
    from agents.config import default_config_yaml

    assert (ROOT / "configs" / "default.yaml").read_text() == default_config_yaml()
    keys = [line for line in default_config_yaml().splitlines() if not line.startswith("#") and ": " in line]
    assert all("  # " in line for line in keys), [line for line in keys if "  # " not in line]


@pytest.mark.parametrize("name", ["default.yaml", "quick.yaml", "signal.yaml"])
def test_shipped_training_configs_load(name):
    load_config(ROOT / "configs" / name)


def cli_main():
    """scripts/train.py's main(), in-process (flag errors return before any JAX work)."""
    from agents.training.cli import main

    return main


def test_cli_rejects_bad_hybrid_values_and_bad_keys(capsys):
    main = cli_main()
    assert main(["--llm", "mock", "--query-interval", "0"]) == 2
    assert "hybrid.query.interval: must be between 1" in capsys.readouterr().err
    assert main(["--set", "ppo.lrr=1"]) == 2
    assert "unknown key 'ppo.lrr'" in capsys.readouterr().err
    assert main(["--resume", "runs/x", "--seed", "3"]) == 2
    assert "--seed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--total-steps" in out and "ppo.lr=1e-4" in out and "--resume RUN_DIR" in out


def test_an_unknown_synthetic_preset_exits_2_with_one_line_and_leaves_no_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli_main()(["--llm", "none", "--data", "synthetic:nope", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: data.source synthetic:nope: unknown synthetic preset 'nope'")
    assert "headlines_then_trend" in err[-1] and not any("Traceback" in line for line in err)
    assert not run_dir.exists()


def test_a_lora_adapter_goes_to_a_transformers_sidecar_and_is_checked(tmp_path):
    from agents.advisor.sidecar import sidecar_options

    cfg = load_config(None, ["llm=smollm2", f"hybrid.sidecar.adapter={tmp_path}"])
    plain = load_config(None, ["llm=smollm2"])
    assert sidecar_options(cfg.hybrid, cfg.llm) == ("transformers", {**sidecar_options(plain.hybrid, plain.llm)[1],
                                                                     "lora": str(tmp_path)})
    gone = load_config(None, ["llm=smollm2", f"hybrid.sidecar.adapter={tmp_path / 'gone'}"])
    with pytest.raises(ConfigError, match="no LoRA adapter directory at"):
        sidecar_options(gone.hybrid, gone.llm)
    with pytest.raises(ConfigError, match="hybrid.sidecar.adapter"):
        load_config(None, ["llm=mock", f"hybrid.sidecar.adapter={tmp_path}"])


def test_a_config_written_before_keys_were_removed_loads_as_it_acted_or_names_the_key(tmp_path):
    """Keys deleted with their rejected experiments: a saved config that holds one at its old default loads without
    it (a run's config.yaml holds every key); another value is one error naming the key. The trust-gated wait's
    threshold became hybrid.query.min_trust, and its 0 (every env bound) bind_on always."""
    def saved(**sections) -> Path:
        raw = to_dict(load_config(None, ["llm=mock"]))
        for dotted, value in sections.items():
            *keys, name = dotted.split("__")
            node = raw
            for key in keys:
                node = node[key]
            node[name] = value
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    old = dict(hybrid__advisor_share="auto", hybrid__advice_input=False, hybrid__gate_init_logit=-2.0,
               transfer__freeze_actor=False, data__timezone="", hybrid__query__bind_on="trust",
               hybrid__query__wait_min_trust=0.0)
    assert load_config(saved(**old)).hybrid.query.bind_on == "always"
    gated = load_config(saved(**{**old, "hybrid__query__wait_for_answer": True, "hybrid__query__wait_min_trust": 0.05}))
    assert (gated.hybrid.query.bind_on, gated.hybrid.query.min_trust) == ("trust", 0.05)
    with pytest.raises(ConfigError, match=r"hybrid.advice_input: no longer exists .* set it to True"):
        load_config(saved(**{**old, "hybrid__advice_input": True}))


def test_a_config_written_before_the_hybrid_keys_moved_loads_under_their_new_names(tmp_path):
    """A saved run's config.yaml from before the hybrid keys moved into the sections that read them (sidecar, mock,
    link) restores as it was written; a --set of an old name is one error naming the new one."""
    from agents.config import MOVED_KEYS

    raw = to_dict(load_config(None, ["llm=mock"]))
    hybrid = raw["hybrid"]
    for section in ("sidecar", "mock", "link"):
        del hybrid[section]
    hybrid.update(llm_mode="generate", quantization="int8", llm_adapter="", sidecar_workers="2", sidecar_threads=3,
                  sidecar_nice=5, sidecar_batch_size=16, mock_answers="news", mock_reads="text", mock_latency_s=0.01,
                  budget="64", max_budget=512, latency="strict", strict_timeout_s=30.0, prompts="", log_llm=4)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    h = load_config(path).hybrid
    assert (h.sidecar.mode, h.sidecar.quantization, h.sidecar.workers, h.sidecar.threads, h.sidecar.nice,
            h.sidecar.batch_size) == ("generate", "int8", "2", 3, 5, 16)
    assert (h.mock.answers, h.mock.reads, h.mock.latency_s) == ("news", "text", 0.01)
    assert (h.link.budget, h.link.max_budget, h.link.latency, h.link.strict_timeout_s, h.link.log_llm) == \
        ("64", 512, "strict", 30.0, 4)
    assert len(MOVED_KEYS) == 16
    with pytest.raises(ConfigError, match=r"^unknown key 'hybrid.mock_answers': it is hybrid.mock.answers now$"):
        load_config(None, ["llm=mock", "hybrid.mock_answers=news"])


def test_every_config_key_is_a_flag_of_train_py_with_its_comment_as_help(capsys):
    """Flags are generated from the config's dataclasses: each key --KEY (the same as --set KEY=VALUE), its comment
    the help, and the short names users know declared once (agents.config.FLAG_ALIASES)."""
    from agents.config import FLAG_ALIASES, config_keys, config_overrides
    from agents.training.cli import parse_args

    keys = [key for key, _, _ in config_keys()]
    args = parse_args(["--ppo.lr", "1e-4", "--envs", "64", "--hybrid.query.interval", "10", "--data", "synthetic:signal"])
    assert sorted(config_overrides(args)) == ["data.source=synthetic:signal", "hybrid.query.interval=10",
                                              "num_envs=64", "ppo.lr=1e-4"]
    assert load_config(None, config_overrides(args)) == load_config(None, ["ppo.lr=1e-4", "num_envs=64",
                                                                            "hybrid.query.interval=10",
                                                                            "data.source=synthetic:signal"])
    assert set(FLAG_ALIASES.values()) <= set(keys)
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    missing = [k for k in keys if f"--{k} " not in shown and k != "devices"]  # --devices: the device flags' own
    assert not missing, missing
    assert "--hybrid.query.wait_for_answer VALUE" in shown and "a flat env with no answer in force" in shown
