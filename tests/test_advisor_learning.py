"""An advisor that learns from outcomes (the market's move after each answer): the outcome and command channels of
the bridge, how the trainer turns a rollout into outcome rows, the sidecar's LoRA learner on the tiny random Phi-3, and a training
run whose advisor learns (adapters saved with checkpoints and restored by evaluation)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from agents.advisor.outcomes import outcome_rows
from agents.config import ConfigError, load_config
from agents.evaluation.saved_run import ablation_walks, agent_walk, load_run
from agents.training.loop import train
from bridge import BridgeConfig, PromptRenderer, SidecarClient, SidecarError
from bridge.transport import OUTCOME_FIELDS
from jaxenv.metrics import walk_metrics
from llm_sidecar.__main__ import example_fields
from llm_sidecar.backends import MockBackend
from llm_sidecar.learning import (
    EXPERIENCES_FILE,
    Experience,
    LearningOptions,
    load_experiences,
    move_targets,
    move_weights,
    usable,
)

RENDERER = PromptRenderer.from_yaml()


def outcome_batch(n: int, seq: int = 1) -> dict[str, np.ndarray]:
    rows = {name: np.zeros(n, dtype) for name, dtype in OUTCOME_FIELDS}
    return {**rows, "seq": np.full(n, seq), "row": np.arange(n), "move": np.linspace(-1, 1, n)}


def test_outcomes_and_commands_reach_the_sidecar_and_bad_commands_fail_loudly():
    with SidecarClient(BridgeConfig(name_prefix=f"jxfl{os.getpid()}_", outcome_capacity=8)) as client:
        client.start(backend="mock", prompts=RENDERER)
        assert client.send_outcomes(outcome_batch(5), wait_s=5.0) == 5
        # The next batch waits for the sidecar to take the previous one; 12 rows exceed the slab's 8.
        assert client.send_outcomes(outcome_batch(12, seq=2), wait_s=5.0) == 8
        assert client.counters["outcomes_sent"] == 13 and client.counters["outcomes_dropped"] == 4
        assert client.command("stats") == {"learning": False}
        assert client.command("learn") == {"started": False, "why": "learning is off"}
        with pytest.raises(SidecarError, match="unknown command"):
            client.command("fly")
        with pytest.raises(SidecarError, match="no learning adapter"):
            client.command("save", path="/tmp/nowhere")
        with pytest.raises(ValueError, match="lack column"):
            client.send_outcomes({"seq": np.zeros(1)})
        # Prompts are still answered after all that.
        fields, texts = example_fields(4)
        client.submit(np.arange(4), RENDERER.render(fields, texts))
        assert (client.collect(timeout_s=10.0).status == 0).all()


def test_outcome_rows_measure_the_markets_move_after_each_answered_keys_bar_inside_the_training_split():
    prices = np.arange(3000.0)  # each bar opens at its index and closes 0.5 above it, in a 2-point ATR
    market = SimpleNamespace(open=prices, close=prices + 0.5, atr=np.full(3000, 2.0))
    rendered = {0: 105, 1: 997, 2: 400}  # key -> the bar its prompt shows
    written = [(7, np.array([0, 1, 2]), np.array([0, 1, 2]))]
    rows = outcome_rows(written, lambda keys: np.array([rendered[k] for k in keys]), market, (100, 1000), 4)
    assert set(rows) == {name for name, _ in OUTCOME_FIELDS}
    assert rows["seq"].tolist() == [7, 7, 7] and rows["row"].tolist() == [0, 1, 2]
    # Rendered at bar 105: an order fills at bar 106's open (106), the window ends at bar 109's close (109.5): a move
    # of 3.5 points, 1.75 ATRs.
    assert rows["move"][0] == pytest.approx(1.75) and rows["move"][2] == pytest.approx(1.75)
    assert np.isnan(rows["move"][1])  # its window leaves the training split: never learned from
    assert len(outcome_rows([], lambda keys: keys, market, (100, 1000), 4)["seq"]) == 0


def test_each_version_is_judged_on_sessions_after_every_bar_an_outcome_reached_and_once():
    """The later-sessions judge (agents.advisor.later_sessions): its keys are the flat side's of the validation
    split; a key counts only if its session starts after the last bar any outcome sent reached, so no version is
    scored on a session at or before a bar it could have learned from; a version's figures come once, when it has
    answered every such key, with version 0's answers as the KL reference."""
    from agents.advice.table import SIDES, key_side, num_blocks
    from agents.advisor.later_sessions import LaterSessions, session_starts
    from agents.advisor.prompt_fields import PromptFieldBuilder
    from agents.advisor.store import KnownAdvice
    from jaxenv import load_market

    cfg = load_config(None, ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.query.bind_on=trust",
                             "hybrid.learning.judge_keys=64"])
    market = load_market(cfg.data)
    fields = PromptFieldBuilder(market, [], cfg.env.contracts_per_trade, cfg.hybrid.query.interval)
    later = LaterSessions(market, fields, cfg.hybrid.query.interval, cfg.hybrid.learning, seed=0)
    val_start, val_end = market.split_range("val")
    bars = fields.rendered_bar(later.keys)
    assert len(later.keys) == 64 and (key_side(later.keys) == 0).all()
    assert (bars >= val_start).all() and (bars + cfg.hybrid.learning.move_bars < val_end).all()
    starts = session_starts(market.sessions.session_id, bars)
    assert (market.sessions.session_id[starts] == market.sessions.session_id[bars]).all()
    assert (market.sessions.session_id[np.maximum(starts - 1, 0)] != market.sessions.session_id[starts]).all()
    assert later.eligible.all()  # outcomes lie in the training split, before every validation session
    cut = int(np.median(bars))  # an outcome reaching into the validation split (as a fold's might)
    later.learned(cut)
    assert later.eligible.any() and not later.eligible.all()
    assert (later.session_start[later.eligible] > cut).all()
    assert (starts[~later.eligible] <= cut).all()

    known = KnownAdvice.empty(num_blocks(market.num_bars, cfg.hybrid.query.interval) * SIDES)
    later2 = LaterSessions(market, fields, cfg.hybrid.query.interval, cfg.hybrid.learning, seed=0)
    assert later2.figures(known, 0) == {} and len(later2.due(known, 0)) == 64
    rise = later2.moves > 0
    buy_where_rose = np.where(rise[:, None], np.eye(6)[1] * 0.9 + 0.02, np.eye(6)[2] * 0.9 + 0.02).astype(np.float32)
    known.put(later2.keys, np.full((64, 6), 1 / 6, np.float32), np.zeros(64, np.float32), np.zeros(64, np.int32), 0)
    v0 = later2.figures(known, 0)
    assert v0["lora_later_version"] == 0 and v0["lora_later_keys"] == 64 and np.isnan(v0["lora_later_accuracy"])
    assert later2.figures(known, 0) == {} and len(later2.due(known, 0)) == 0  # once
    assert len(later2.due(known, 1)) == 64
    known.put(later2.keys, buy_where_rose, np.zeros(64, np.float32), np.zeros(64, np.int32), 1)
    v1 = later2.figures(known, 1)
    assert v1["lora_later_accuracy"] == 1.0 and v1["lora_later_loss"] < v0["lora_later_loss"]


def test_a_negative_count_of_keys_to_judge_on_is_refused_naming_the_key(capsys):
    learning = ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.query.bind_on=trust"]
    with pytest.raises(ConfigError, match="hybrid.learning.judge_keys: must be >= 0"):
        load_config(None, [*learning, "hybrid.learning.judge_keys=-1"])
    assert load_config(None, [*learning, "hybrid.learning.judge_keys=0"]).hybrid.learning.judge_keys == 0
    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    done = subprocess.run([sys.executable, str(script), "--set", "llm=smollm2", "--set", "hybrid.learning.enabled=true",
                           "--set", "hybrid.query.bind_on=trust", "--set", "hybrid.learning.judge_keys=-1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "hybrid.learning.judge_keys" in done.stderr


def test_the_placebo_learns_every_move_from_another_session():
    """hybrid.learning.placebo: each row with a known move gets a known move of a row of another session; unknown
    moves stay unknown; one session alone leaves nothing to learn."""
    from agents.advisor.outcomes import permuted_across_sessions

    rng = np.random.default_rng(0)
    session = np.repeat(np.arange(6), [5, 3, 8, 1, 4, 6])
    move = rng.normal(size=len(session)).astype(np.float32)  # distinct values: each says where it came from
    move[[2, 9]] = np.nan
    out = permuted_across_sessions(move, session, np.random.default_rng(1))
    assert np.isnan(out[[2, 9]]).all() and np.isfinite(np.delete(out, [2, 9])).all()
    origin = {float(m): s for m, s in zip(move, session) if np.isfinite(m)}
    for value, own in zip(out, session):
        if np.isfinite(value):
            assert float(value) in origin and origin[float(value)] != own
    donors = {}
    for value, own in zip(out, session):  # each session's moves come from one other session
        if np.isfinite(value):
            donors.setdefault(own, set()).add(origin[float(value)])
    assert all(len(d) == 1 for d in donors.values())
    assert np.isnan(permuted_across_sessions(move[:5], session[:5], np.random.default_rng(1))).all()


def test_learning_config_needs_a_transformers_advisor_in_score_mode():
    with pytest.raises(ConfigError, match="hybrid.learning.enabled"):
        load_config(None, ["llm=mock", "hybrid.learning.enabled=true"])
    with pytest.raises(ConfigError, match="hybrid.learning.enabled"):
        load_config(None, ["llm=smollm2", "hybrid.sidecar.mode=generate", "hybrid.learning.enabled=true"])
    with pytest.raises(ConfigError, match="move_clip"):
        load_config(None, ["hybrid.learning.move_clip=0"])


def test_the_record_does_not_judge_an_advisor_that_learns_from_the_moves_it_scores():
    with pytest.raises(ConfigError, match="hybrid.query.bind_on: the record scores"):
        load_config(None, ["llm=smollm2", "hybrid.learning.enabled=true"])  # bind_on: record, the default
    assert load_config(None, ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.query.bind_on=trust"])


def test_the_learner_raises_the_side_the_market_took_after_every_answered_prompt_with_a_known_move():
    def experience(move: float) -> Experience:
        return Experience("p", np.full(6, 1 / 6, np.float32), move)

    train = [experience(1.0), experience(-2.0), experience(0.5), experience(-0.5)]
    assert move_targets(train).tolist() == [1, 2, 1, 2]  # BUY where it rose, SELL where it fell
    options = LearningOptions()
    w = move_weights(options, train)(train)
    rms = np.sqrt(np.mean([1.0, 4.0, 0.25, 0.25]))
    assert w == pytest.approx(np.abs([1.0, -2.0, 0.5, -0.5]) / rms)
    assert move_weights(options, train)([experience(1e9)])[0] == options.move_clip == 3.0  # clipped
    assert usable(experience(0.5)) and not usable(experience(float("nan")))  # an unknown move teaches nothing


def test_experiences_saved_by_earlier_versions_still_load():
    old = {"prompt": "p", "advice": [1 / 6] * 6, "action": 1, "reward": 0.0, "trade_pnl": None, "advantage": 0.3,
           "in_force": True, "move": -0.25}
    e = Experience.from_json(old)
    assert e.move == -0.25 and e.to_json() == {"prompt": "p", "advice": [round(1 / 6, 6)] * 6, "move": -0.25}
    assert not usable(Experience.from_json({k: v for k, v in old.items() if k != "move"}))  # saved before moves


def test_replay_script_tabulates_what_the_saved_outcomes_teach_pooled_over_runs(tmp_path):
    """scripts/advisor_learning/lora_replay.py reads the experiences saved beside adapters, pools several runs',
    splits them by headline direction, and says how often the market's move agreed with the headline."""
    def save(folder: Path, outcomes: tuple) -> str:
        folder.mkdir()
        rows = [Experience(f"News: {h}", np.full(6, 1 / 6, np.float32), move).to_json() for h, move in outcomes]
        with gzip.open(folder / EXPERIENCES_FILE, "wt") as f:
            f.writelines(json.dumps({**row, "held_out": False}) + "\n" for row in rows)
        return str(folder)

    bull, bear = "Apple beats earnings estimates, shares surge", "Hawkish Fed remarks spark a selloff"
    first = save(tmp_path / "a", ((bull, 1.0), (bear, -0.5), (bear, 0.3)))  # the market rose after bad news
    second = save(tmp_path / "b", ((bull, 0.2), (bear, -1.0), (bull, float("nan"))))  # an unknown move: not counted
    out = subprocess.run([sys.executable, "scripts/advisor_learning/lora_replay.py", first, second],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    assert "6 training and 0 held-out experiences" in out
    assert "| bullish | 2 | +0.600 | 1.00 |" in out
    assert "| bearish | 3 | -0.400 | 0.33 |" in out
    assert "market moves after the answered prompts agreeing with the headline: 0.800 of 5" in out


def test_the_experiment_table_gives_each_seed_and_the_mean_over_seeds():
    """Does learning help on average, not on a lucky seed: experiments/lora_headlines.py's table gives
    each walk's P&L with its standard error and ends with the mean P&L and direction accuracy over the seeds."""
    from experiments.lora_headlines import table

    def seed(s: int, learned_pnl: float, accuracy: float) -> dict:
        figures = {"frozen": {"p_buy_bull": 0.2, "p_buy_bear": 0.2, "top_hold": 0, "top_buy": 0, "top_sell": 1}}
        walks = {"val_frozen": {"net_pnl": -6000.0, "trades": 400, "trade_pnl_std": 600.0},
                 "val_learned": {"net_pnl": learned_pnl, "trades": 100, "trade_pnl_std": 500.0}}
        return {"seed": s, "walks": walks,
                "rounds": [{"direction_accuracy_base": 0.5, "direction_accuracy": accuracy + 0.1,
                            "val_loss_before": 1.0, "val_loss": 0.9, "kl_to_base": 0.1, "adopted": True}],
                "outcome_agreement": {"move_share": 0.6, "moves": 900},
                "probe": {**figures, "learned": figures["frozen"]}}

    lines = table([seed(0, 9000.0, 0.6), seed(1, -21000.0, 0.3)], ["val"]).splitlines()
    assert lines[2].startswith("| 0 | 0.600 of 900 | -6,000 ± 12.0k / 9,000 ± 5.0k | "  # std · √trades
                               "0.500 → 0.700 |")
    assert lines[-1].startswith("| mean |  | -6,000 / -6,000 | 0.500 → 0.550 |")


# ---- the learner on the tiny random Phi-3 --------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_sidecar.backends import TransformersBackend, TransformersOptions  # noqa: E402
from llm_sidecar.learning import LoraLearner  # noqa: E402
from llm_sidecar.models import build_tiny_phi3  # noqa: E402
from llm_sidecar.server import load_adapter, run_command  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_phi3(tmp_path_factory.mktemp("tiny_phi3")))


def tiny_backend(model: str, **options) -> TransformersBackend:
    return TransformersBackend(TransformersOptions(model=model, **options), RENDERER.system, RENDERER.answer_prefix)


def headline_moves(learner: LoraLearner, n: int, seed: int = 1) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Prompts after whose bullish headline ('rally') the market rose and after whose bearish one ('slump') it
    fell, fed to the learner as answered queries with their moves."""
    fields, texts = example_fields(n, seed=seed)
    prompts = [p.decode() for p in RENDERER.render(fields, texts)]
    rng = np.random.default_rng(seed)
    bull = np.array(["rally" in p for p in prompts])
    bear = np.array(["slump" in p for p in prompts])
    move = np.where(bull, 1.0, np.where(bear, -1.0, 0.0)) + rng.normal(0, 0.1, n)
    probs = learner.backend.advise(prompts).probs
    learner.memory.remember(1, prompts, probs)
    learner.add_outcomes({"seq": np.ones(n), "row": np.arange(n), "move": move})
    return prompts, bull, bear


def test_a_new_adapter_answers_like_the_base_model_and_a_saved_one_reloads_exactly(tiny_model, tmp_path):
    fields, texts = example_fields(16, seed=2)
    prompts = [p.decode() for p in RENDERER.render(fields, texts)]
    base = tiny_backend(tiny_model).advise(prompts).probs
    backend = tiny_backend(tiny_model)
    learner = LoraLearner(backend, LearningOptions(lr=5e-3, min_examples=16, batch_size=16, max_epochs=1))
    assert np.allclose(backend.advise(prompts).probs, base, atol=1e-6)  # B = 0: the base model's answers
    assert learner.start_round() == {"started": False, "why": "0 training / 0 validation examples; a round needs 16 / 8"}
    headline_moves(learner, 96)
    assert learner.start_round()["started"]
    learner.finish()
    # Whatever the round adopted, a saved adapter reloads to the same answers, at start or later by command.
    learner.save(tmp_path / "adapter")
    train, val = load_experiences(tmp_path / "adapter")  # what it learned from is kept beside it
    assert [e.prompt for e in train] == [e.prompt for e in learner.buffer.train] and len(train) + len(val) == 96
    assert [e.move for e in val] == pytest.approx([e.move for e in learner.buffer.val])
    serving = backend.advise(prompts).probs
    assert np.allclose(tiny_backend(tiny_model, lora=str(tmp_path / "adapter")).advise(prompts).probs, serving, atol=1e-5)
    fresh = tiny_backend(tiny_model)
    load_adapter(fresh, str(tmp_path / "adapter"))
    assert np.allclose(fresh.advise(prompts).probs, serving, atol=1e-5)
    load_adapter(fresh, None)
    assert np.allclose(fresh.advise(prompts).probs, base, atol=1e-5)
    record = learner.rounds[0]
    assert record["train_examples"] + record["val_examples"] == 96 and record["steps"] >= 1
    assert record["learn_s"] > 0 and np.isfinite(record["kl_to_base"])


def test_a_round_reuses_the_base_models_answers_and_learns_as_if_it_scored_them(tiny_model, tmp_path):
    """Answers given before any round was adopted are the base model's: a round reuses them instead of scoring
    its prompts again, and its figures are those of a round that scores them. Once a round is adopted, answers are
    the adapter's and are not taken for the base model's; nor are answers after a loaded adapter."""
    fields, texts = example_fields(96, seed=6)
    prompts = [p.decode() for p in RENDERER.render(fields, texts)]
    move = np.random.default_rng(1).uniform(0.5, 2.0, 96)
    records = []
    for reuse in (False, True):
        torch.manual_seed(0)
        backend = tiny_backend(tiny_model)
        learner = LoraLearner(backend, LearningOptions(lr=5e-3, min_examples=16, batch_size=16, max_epochs=1))
        assert learner.answers_are_base
        learner.memory.remember(1, prompts, backend.advise(prompts).probs, reuse and learner.answers_are_base)
        learner.add_outcomes({"seq": np.ones(96), "row": np.arange(96), "move": move})
        scored = []
        score = backend.action_scores
        backend.action_scores = lambda batch: scored.append(len(batch)) or score(batch)
        assert learner.start_round()["started"]
        learner.finish()
        records.append(learner.rounds[-1])
        scored_prompts = sum(scored)
    before, after = records
    assert after["adopted"] and not learner.answers_are_base
    for key in ("val_loss_before", "val_loss", "kl_to_base", "direction_accuracy_base", "direction_accuracy"):
        assert after[key] == pytest.approx(before[key], abs=1e-5, nan_ok=True), key
    # Scored in the round: the training steps' prompts and the held-out ones once, after the epoch.
    assert scored_prompts == after["train_examples"] + after["val_examples"]
    learner.save(tmp_path / "adapter")
    other = tiny_backend(tiny_model)
    fresh = LoraLearner(other, LearningOptions())
    path = str(tmp_path / "adapter")
    assert run_command({"op": "load", "path": path}, other, fresh) == {"loaded": path}
    assert not fresh.answers_are_base
    run_command({"op": "load", "path": None}, other, fresh)  # answers from the base model, adapters off
    assert fresh.answers_are_base


def test_the_learner_learns_from_every_answered_prompt_which_way_the_market_went(tiny_model):
    """After a round on prompts the market rose after, the advisor says BUY more and SELL less on prompts it did
    not train on; rows without a known move are not kept."""
    fields, texts = example_fields(96, seed=4)
    prompts = [p.decode() for p in RENDERER.render(fields, texts)]
    move = np.random.default_rng(0).uniform(0.5, 2.0, 96)
    move[:8] = np.nan
    torch.manual_seed(0)
    backend = tiny_backend(tiny_model)
    learner = LoraLearner(backend, LearningOptions(lr=5e-3, min_examples=16, batch_size=16, max_epochs=1))
    learner.memory.remember(1, prompts, backend.advise(prompts).probs)
    learner.add_outcomes({"seq": np.ones(96), "row": np.arange(96), "move": move})
    assert learner.buffer.sizes()["experiences_added"] == 88
    unseen = [p.decode() for p in RENDERER.render(*example_fields(16, seed=5))]
    before = backend.advise(unseen).probs
    assert learner.start_round()["started"]
    learner.finish()
    after = backend.advise(unseen).probs
    assert learner.rounds[-1]["adopted"] and learner.rounds[-1]["val_loss"] < learner.rounds[-1]["val_loss_before"]
    assert (after[:, 1] > before[:, 1]).all() and (after[:, 2] < before[:, 2]).all()
    assert learner.rounds[-1]["direction_accuracy"] == 1.0  # its top answers on held-out prompts: BUY, as it went


@pytest.mark.slow
def test_lora_learning_moves_answers_toward_the_side_the_market_took(tiny_model):
    """A shortened schedule: the held-out loss falls and the adapter raises P(BUY | bullish news) and
    P(SELL | bearish news), while KL to the base model stays bounded."""
    torch.manual_seed(0)
    backend = tiny_backend(tiny_model)
    learner = LoraLearner(backend, LearningOptions(lr=3e-3, min_examples=32, batch_size=32, max_epochs=4))
    prompts, bull, bear = headline_moves(learner, 400)
    before = backend.advise(prompts).probs
    learner.start_round()
    learner.finish()
    after = backend.advise(prompts).probs
    record = learner.rounds[-1]
    assert record["adopted"] and record["val_loss"] < record["val_loss_before"] - 0.05
    assert after[bull, 1].mean() > before[bull, 1].mean() + 0.05
    assert after[bear, 2].mean() > before[bear, 2].mean() + 0.05
    assert 0 < record["kl_to_base"] < 1.0


# ---- a training run whose advisor learns ----------------------------------------------------------------------

def tiny_learning_run(model: str) -> list[str]:
    return [f"llm={model}", "num_envs=8", "ppo.num_steps=40", "ppo.num_minibatches=2", "ppo.update_epochs=2",
            "network.actor_hidden=[16,16]", "network.critic_hidden=[16,16]", "log.progress=false",
            "log.tensorboard=false", "data.source=synthetic:headlines", "data.synthetic_days=20",
            "env.max_steps_in_episode=400", "checkpoint.every_updates=1", "checkpoint.eval_every_updates=2",
            "hybrid.link.budget=64", "hybrid.learning.enabled=true", "hybrid.query.bind_on=trust",
            "hybrid.learning.every_updates=1", "hybrid.learning.min_examples=8", "hybrid.learning.batch_size=8",
            "hybrid.learning.lr=1e-2", "hybrid.learning.move_bars=10", "total_steps=960",
            "hybrid.link.latency=strict"]  # the keys asked at one update are answered at the next: a round starts at 2


def test_a_run_whose_advisor_learns_saves_adapters_with_checkpoints_and_evaluation_restores_them(tiny_model, tmp_path,
                                                                                                 monkeypatch):
    """... and its stored answers are each the answer the advisor's version 0 gave (the store's identity names the
    advisor as it started): an answer of a learned version, which the sidecar reports with it, is never stored."""
    import sqlite3

    from agents.advisor.pacer import QueryPacer

    collected = []  # (the advisor's store, keys, versions, probs) as each sidecar answered

    collect = QueryPacer._collect

    def recording(self, wait, since_s=None):
        rows = collect(self, wait, since_s)
        ok = rows[3] == 0  # STATUS_OK
        collected.append((self.advisor.store and self.advisor.store.dir, rows[0][ok], rows[4][ok], rows[1][ok]))
        return rows

    monkeypatch.setattr(QueryPacer, "_collect", recording)
    run_dir = tmp_path / "run"
    train(load_config(None, tiny_learning_run(tiny_model)), run_dir)
    # the store of the advisor as it started (the walks with a checkpoint's learned adapter have stores of their own)
    [store] = [p.parent for p in (tmp_path / "advice_store").glob("*/answers.sqlite")
               if json.loads(dict(sqlite3.connect(p).execute("SELECT name, value FROM meta"))["identity"])[
                   "adapter"] == "none"]
    first = {}
    for where, keys, versions, probs in collected:
        for k, v, p in zip(keys.tolist(), versions.tolist(), probs):
            if where == store:
                first.setdefault((k, v), p)
    with sqlite3.connect(store / "answers.sqlite") as db:
        stored = {k: np.frombuffer(p, np.float32) for k, p in db.execute("SELECT key, probs FROM answers")}
    assert stored and all((k, 0) in first for k in stored)  # the store holds version 0's answers only
    assert all(np.allclose(stored[k], first[(k, 0)]) for k in stored)
    learned_only = {k for k, v in first if v > 0} - {k for k, v in first if v == 0}
    assert not learned_only & set(stored)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in logged] == [1, 2, 3]
    assert logged[0]["lora_outcomes_sent"] == 0  # nothing answered yet: the first update's keys come back at the next
    assert all(m["lora_outcomes_sent"] > 0 for m in logged[1:]) and logged[-1]["lora_rounds"] >= 1
    assert logged[1]["lora_round_started"] == 1.0
    # every round started has finished, the one started at the last update too (before the final checkpoint)
    assert logged[-1]["lora_rounds"] == sum(m.get("lora_round_started", 0.0) for m in logged)
    adapters = sorted(int(p.name) for p in (run_dir / "adapters").iterdir())
    assert adapters == [1, 2, 3]  # one per kept checkpoint (checkpoint.keep = 3 latest, and the best)
    assert all((run_dir / "adapters" / str(u) / "adapter_model.safetensors").exists() for u in adapters)
    evaluated = [m for m in logged if "val_net_pnl" in m]
    assert [m["update"] for m in evaluated] == [2, 3]
    for line in evaluated:  # each evaluated checkpoint, walked with the adapter saved beside it
        run = load_run(run_dir, str(line["update"]))
        try:
            trace = agent_walk(run)("val", jax.random.PRNGKey(0))
            agent = walk_metrics(trace, run.market.timestamps, run.cfg.env.prop_firm)
            assert agent["net_pnl"] == pytest.approx(line["val_net_pnl"], abs=1e-3)
            assert run.walker._adapter == str(run_dir / "adapters" / str(line["update"]))
        finally:
            run.close()
    run = load_run(run_dir, "best")
    try:
        assert "llm_only_frozen" in ablation_walks(run)
    finally:
        run.close()
    # every version judged on later sessions: version 0 at least, in metrics.jsonl and the run's plot
    from agents.advisor.later_sessions import LATER_SESSIONS_PLOT

    judged = [m for m in logged if "lora_later_version" in m]
    assert judged and judged[0]["lora_later_version"] == 0 and judged[0]["lora_later_keys"] > 0
    assert (run_dir / LATER_SESSIONS_PLOT).exists()
    # a resumed run's advisor starts from the adapter its checkpoint names, and learns on from it
    from agents.advisor import query_loop

    started = []
    init = query_loop.QueryLoop.__init__

    def starting(self, *args, adapter=None, **kwargs):
        started.append(adapter)
        init(self, *args, adapter=adapter, **kwargs)

    monkeypatch.setattr(query_loop.QueryLoop, "__init__", starting)
    train(None, run_dir, resume=True)
    assert started == [str(run_dir / "adapters" / "3")]


def test_rows_marked_think_get_a_chain_of_thought_answer_and_the_rest_the_usual_one():
    fields, texts = example_fields(4, seed=4)
    prompts = RENDERER.render(fields, texts)
    with SidecarClient(BridgeConfig(name_prefix=f"jxfr{os.getpid()}_")) as client:
        client.start(backend="mock", prompts=RENDERER)
        client.submit(np.arange(4), prompts, think=[True, False, True, False])
        answers = client.collect(timeout_s=10.0)
    assert (answers.status == 0).all()
    reasons = [r.decode() for r in answers.reasons]
    assert all("market analysis" in reasons[i] and "decision" in reasons[i] for i in (0, 2))
    assert not any("market analysis" in reasons[i] for i in (1, 3))
    # Reasoning ends in the same decision the mock gives in one line.
    assert (answers.action == MockBackend().advise([p.decode() for p in prompts]).action).all()


@pytest.mark.slow  # about a minute; tests/test_bridge_transport.py checks the sidecar outlives Ctrl-C by default
def test_ctrl_c_during_a_run_whose_advisor_learns_saves_the_checkpoint_with_the_last_finished_adapter(tiny_model,
                                                                                                       tmp_path):
    """Ctrl-C (to the whole process group, as a terminal sends it) while the advisor learns: the advisor keeps
    answering, the update in flight finishes, the checkpoint is saved with the serving adapter beside it, the run
    exits 130 with no traceback, and no shared memory is left."""
    import signal
    import time

    run_dir = tmp_path / "run"
    sets = [a for o in tiny_learning_run(tiny_model) if not o.startswith("total_steps") for a in ("--set", o)]
    cmd = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "train.py"), "--run-dir",
           str(run_dir), "--total-steps", "320000", *sets]
    trainer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            assert trainer.poll() is None, trainer.stderr.read()[-3000:]
            time.sleep(0.2)
        os.killpg(trainer.pid, signal.SIGINT)
        assert trainer.wait(timeout=600) == 130
        stderr = trainer.stderr.read()
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert "Traceback" not in stderr and "was not saved" not in stderr, stderr[-3000:]
    stopped = json.loads(metrics.read_text().splitlines()[-1])["update"]
    assert (run_dir / "adapters" / str(stopped) / "adapter_model.safetensors").exists()
    assert (run_dir / "checkpoints" / "latest" / str(stopped)).is_dir()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"jxf{trainer.pid}_")]
