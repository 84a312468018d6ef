"""Advice keyed by market context: the prompts of a key, the persistent advice store, and filling it ahead of
training with scripts/advise.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.advice.table import SIDES
from agents.advisor.store import AdviceStore, Answers
from agents.config import ConfigError, load_config
from bridge.protocol import FIELD_INDEX, STATUS_OK

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["num_envs=32", "ppo.num_steps=20", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_steps=640",
         "network.actor_hidden=[32]", "network.critic_hidden=[32]", "data.source=synthetic:headlines",
         "data.synthetic_days=30", "checkpoint.eval_every_updates=0", "log.progress=false", "log.tensorboard=false",
         "llm=mock", "hybrid.budget=256"]


def answers(n_keys: int, keys: list[int]) -> Answers:
    a = Answers.empty(n_keys)
    rows = np.eye(6, dtype=np.float32)[np.arange(len(keys)) % 6]
    a.put(np.array(keys), rows, np.full(len(keys), 0.7, np.float32), np.full(len(keys), STATUS_OK, np.int32), 0)
    return a


def test_the_store_keeps_answers_across_opens_and_sets_a_damaged_one_aside(tmp_path, capsys):
    ident = {"advisor": "x", "data": "y"}
    store = AdviceStore(tmp_path, ident, 30)
    assert not store.load().filled().any()  # nothing yet: empty, no error
    assert store.save(answers(30, [1, 4, 29]))
    again = AdviceStore(tmp_path, ident, 30).load()
    assert np.flatnonzero(again.filled()).tolist() == [1, 4, 29] and again.probs[4].argmax() == 1
    assert AdviceStore(tmp_path, {**ident, "data": "z"}, 30).dir != store.dir  # other data: another store
    # a later version's answers (a LoRA round) are not the identity's: not saved
    learned = answers(30, [1, 4, 29])
    learned.put(np.array([7]), np.eye(6, dtype=np.float32)[:1], np.ones(1, np.float32), np.zeros(1, np.int32), 1)
    AdviceStore(tmp_path, ident, 30).save(learned)
    assert 7 not in np.flatnonzero(AdviceStore(tmp_path, ident, 30).load().filled())
    # bytes flipped in the answers file: set aside with one line, never trusted
    data = next(store.dir.glob("answers-*.npz"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    capsys.readouterr()
    assert not AdviceStore(tmp_path, ident, 30).load().filled().any()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0] and "set aside" in err[0]
    assert not store.dir.exists() and len(list(tmp_path.glob("*.damaged-*"))) == 1


def test_a_keys_prompt_shows_the_market_at_its_blocks_last_bar_and_no_accounts_figures():
    from agents.advisor.prompt_fields import PromptFieldBuilder
    from jaxenv import load_market

    cfg = load_config(None, SMALL)
    market = load_market(cfg.data)
    fields = PromptFieldBuilder(market, ["ES"], 1, 5)
    keys = np.array([100 * SIDES + 0, 100 * SIDES + 1, 101 * SIDES + 2])
    rows = fields.build(keys)
    assert fields.rendered_bar(keys).tolist() == [504, 504, 509]
    np.testing.assert_allclose(rows[:, FIELD_INDEX["price"]], market.close[[504, 504, 509]], rtol=1e-6)
    assert rows[:, FIELD_INDEX["position"]].tolist() == [-1, 0, 1]
    assert np.isnan(rows[:, FIELD_INDEX["balance"]]).all() and np.isnan(rows[:, FIELD_INDEX["unrealized_pnl"]]).all()


def test_a_template_naming_an_accounts_figures_is_refused_in_one_line(tmp_path):
    import yaml

    from agents.advisor.link import prompt_template

    template = yaml.safe_load((ROOT / "configs" / "prompts.yaml").read_text())
    template["context"] += " bal{balance}"
    path = tmp_path / "prompts.yaml"
    path.write_text(yaml.safe_dump(template))
    with pytest.raises(ConfigError, match=r"prompts.yaml: context names balance"):
        prompt_template(load_config(None, [f"hybrid.prompts={path}"]))


def advise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "advise.py"), "--llm", "mock",
                           "--data", "synthetic:headlines", "--set", "data.synthetic_days=30", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_advise_fills_the_store_once_and_training_starts_from_it(tmp_path):
    """scripts/advise.py asks each key of the chosen splits once (a second run asks only what is missing); a run on
    the same data and advisor starts with advice in force and asks almost nothing."""
    store = tmp_path / "store"
    first = advise("--store", str(store), "--splits", "val")
    assert first.returncode == 0, first.stderr
    manifest = json.loads(next(store.glob("*/manifest.json")).read_text())
    assert manifest["answered"] > 0
    second = advise("--store", str(store), "--splits", "val,train")
    assert second.returncode == 0, second.stderr
    asked_first = int(first.stderr.split("asking ")[1].split()[0])
    asked_second = int(second.stderr.split("asking ")[1].split()[0])
    assert f"{asked_first} of " in second.stderr  # the val keys were answered already
    assert asked_second > 0
    assert advise("--store", str(store), "--splits", "val,train").stderr.count("asking 0") == 1

    from agents.training.loop import train

    cold = train(load_config(None, SMALL + ["hybrid.store="]), tmp_path / "cold")
    warm = train(load_config(None, SMALL + [f"hybrid.store={store}"]), tmp_path / "warm")
    first_cold, first_warm = (json.loads((r.run_dir / "metrics.jsonl").read_text().splitlines()[0])
                              for r in (cold, warm))
    assert first_warm["advice_coverage"] > 0.9 > first_cold["advice_coverage"]
    assert first_warm["llm_prompts"] < first_cold["llm_prompts"]


def test_advise_refuses_a_bad_split_in_one_line(tmp_path):
    bad = advise("--store", str(tmp_path), "--splits", "train,holdout")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == "error: --splits: holdout: choose among train, val, test"
