"""Advice keyed by market context: the prompts of a key, the persistent advice store, and filling it ahead of
training with scripts/advise.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from agents.advice.table import SIDES
from agents.advisor.store import AdviceStore, KnownAdvice
from agents.config import ConfigError, load_config
from bridge.protocol import FIELD_INDEX, STATUS_OK

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["num_envs=32", "ppo.num_steps=20", "ppo.num_minibatches=2", "ppo.update_epochs=1", "total_steps=640",
         "network.actor_hidden=[32]", "network.critic_hidden=[32]", "data.source=synthetic:headlines",
         "data.synthetic_days=30", "checkpoint.eval_every_updates=0", "log.progress=false", "log.tensorboard=false",
         "llm=mock", "hybrid.link.budget=256"]


def answers(n_keys: int, keys: list[int]) -> KnownAdvice:
    a = KnownAdvice.empty(n_keys)
    rows = np.eye(6, dtype=np.float32)[np.arange(len(keys)) % 6]
    a.put(np.array(keys), rows, np.full(len(keys), 0.7, np.float32), np.full(len(keys), STATUS_OK, np.int32), 0)
    return a


def held(store: AdviceStore, a: KnownAdvice) -> AdviceStore:
    """The store holding `a`'s answers of version 0."""
    keys = np.flatnonzero(a.filled(0))
    store.keep(keys, a.probs[keys], a.confidence[keys], a.status[keys])
    return store


def test_the_store_keeps_answers_across_opens_and_sets_a_damaged_one_aside(tmp_path, capsys):
    ident = {"advisor": "x", "data": "y"}
    store = AdviceStore(tmp_path, ident, 30)
    assert not store.load().filled().any()  # nothing yet: empty, no error
    assert held(store, answers(30, [1, 4, 29])).save() == 3
    again = AdviceStore(tmp_path, ident, 30).load()
    assert np.flatnonzero(again.filled()).tolist() == [1, 4, 29] and again.probs[4].argmax() == 1
    assert AdviceStore(tmp_path, {**ident, "data": "z"}, 30).dir != store.dir  # other data: another store
    # a later version's answers (a LoRA round) are not the identity's: not saved
    learned = answers(30, [2])
    learned.put(np.array([7]), np.eye(6, dtype=np.float32)[:1], np.ones(1, np.float32), np.zeros(1, np.int32), 1)
    other = AdviceStore(tmp_path, ident, 30)
    other.load()
    assert held(other, learned).save() == 1  # key 2 only: the others are in the file already
    assert np.flatnonzero(AdviceStore(tmp_path, ident, 30).load().filled()).tolist() == [1, 2, 4, 29]
    # bytes flipped in the database: set aside with one line, never trusted
    raw = bytearray(store.path.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(64)
    raw[100] ^= 0xFF
    store.path.write_bytes(bytes(raw))
    capsys.readouterr()
    assert not AdviceStore(tmp_path, ident, 30).load().filled().any()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set aside" in err[0]
    assert not store.dir.exists() and len(list(tmp_path.glob("*.damaged-*"))) == 1


def test_holders_of_one_store_merge_their_answers_and_a_process_shares_one_holder(tmp_path):
    """Two holders that load the same store and save different keys leave both sets (the first format kept only the
    last saver's); within one process, every holder of an identity is the same object."""
    from agents.advisor.store import open_store

    ident = {"advisor": "x"}
    first, second = AdviceStore(tmp_path, ident, 50), AdviceStore(tmp_path, ident, 50)
    first.load(), second.load()
    held(first, answers(50, [1, 2, 3])).save()
    held(second, answers(50, [40, 41])).save()
    assert np.flatnonzero(AdviceStore(tmp_path, ident, 50).load().filled()).tolist() == [1, 2, 3, 40, 41]
    assert second.refresh() == 3 and second.answers.filled().sum() == 5  # it reads what the other added
    assert open_store(tmp_path, ident, 50) is open_store(tmp_path, ident, 50)


def test_a_process_killed_during_saves_leaves_a_store_with_every_answer_saved_before(tmp_path):
    """A writer that saves batch after batch is killed (SIGKILL) at a random moment: the store loads (nothing set
    aside) and holds every batch the writer had reported saved."""
    import random
    import signal
    import time

    script = f"""
import sys, numpy as np
sys.path.insert(0, {str(ROOT)!r})
from agents.advisor.store import AdviceStore
from bridge.protocol import STATUS_OK
store = AdviceStore({str(tmp_path)!r}, {{"advisor": "x"}}, 200_000)
rows = np.eye(6, dtype=np.float32)
for start in range(0, 200_000, 4000):
    keys = np.arange(start, start + 4000)
    store.keep(keys, rows[keys % 6], np.full(len(keys), 0.5, np.float32), np.full(len(keys), STATUS_OK, np.int32))
    store.save()
    print(start + 4000, flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    reported = 0
    deadline = time.monotonic() + random.uniform(3.0, 6.0)
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        reported = int(line) if line.strip() else reported
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert reported > 0
    loaded = AdviceStore(tmp_path, {"advisor": "x"}, 200_000).load()
    assert not list(tmp_path.glob("*.damaged-*"))
    assert loaded.filled()[:reported].all()
    n = int(loaded.filled().sum())
    assert n % 4000 == 0 and np.array_equal(np.flatnonzero(loaded.filled()), np.arange(n))  # whole saves only


FIRST_SAVE = f"""
import os, signal, sys, numpy as np
sys.path.insert(0, {str(ROOT)!r})
from agents.advisor.store import AdviceStore
from bridge.protocol import STATUS_OK
root, at = sys.argv[1], sys.argv[2]
connect = AdviceStore._connect
def hooked(self, *args, **kwargs):  # the save's connection, stopped at its COMMIT
    db = connect(self, *args, **kwargs)
    if at == "kill":
        db.execute("PRAGMA cache_size=2")  # the transaction's pages spill into the file before COMMIT
    def at_commit(sql):
        if sql == "COMMIT" and at == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if sql == "COMMIT":
            print("in", flush=True)
            sys.stdin.readline()
    db.set_trace_callback(at_commit)
    return db
AdviceStore._connect = hooked
store = AdviceStore(root, {{"advisor": "x"}}, 5000)
keys = np.arange(5000)
store.keep(keys, np.eye(6, dtype=np.float32)[keys % 6], np.full(5000, 0.5, np.float32),
           np.full(5000, STATUS_OK, np.int32))
print(store.save(), flush=True)
"""


def test_a_holder_reading_during_another_holders_first_save_finds_it_empty_and_the_save_goes_through(tmp_path, capsys):
    """Holder A (another process) is inside its first save's transaction: the file exists, its tables are not
    committed. Holder B reads then: an empty store, not a damaged one (before, B set the folder aside, A's save
    died with a disk I/O error and the store lost it)."""
    writer = subprocess.Popen([sys.executable, "-c", FIRST_SAVE, str(tmp_path), "pause"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "in\n"  # A holds its transaction open at COMMIT
        reader = AdviceStore(tmp_path, {"advisor": "x"}, 5000)
        assert reader.path.exists() and reader.refresh() == 0 and not reader.answers.filled().any()
        assert not list(tmp_path.glob("*.damaged-*")) and "set aside" not in capsys.readouterr().err
        out, err = writer.communicate("\n", timeout=120)
    finally:
        writer.kill()
    assert writer.returncode == 0 and out.split() == ["5000"], err
    assert reader.refresh() == 5000 and AdviceStore(tmp_path, {"advisor": "x"}, 5000).load().filled().all()


def test_a_store_left_by_a_writer_killed_in_its_first_save_reads_as_empty_and_takes_the_next_save(tmp_path, capsys):
    """A writer killed inside its first save leaves a file without committed tables (here with its pages half
    written and a hot journal), or one killed right after creating it an empty file or one without tables: each is
    an empty store, not a damaged one, and the next save works."""
    killed = subprocess.run([sys.executable, "-c", FIRST_SAVE, str(tmp_path), "kill"], capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    store = AdviceStore(tmp_path, {"advisor": "x"}, 5000)
    assert (store.dir / "answers.sqlite-journal").exists()  # the save's pages reached the file: a hot journal
    empty = AdviceStore(tmp_path / "empty", {"advisor": "x"}, 5000)
    empty.dir.mkdir(parents=True)
    empty.path.touch()  # killed right after the file was created
    bare = AdviceStore(tmp_path / "bare", {"advisor": "x"}, 5000)
    bare.dir.mkdir(parents=True)
    with closing(sqlite3.connect(bare.path)) as db:
        db.execute("PRAGMA user_version=1")  # a database with a first page and no tables
    for s in (store, empty, bare):
        assert not s.load().filled().any()
        assert held(s, answers(5000, [7, 4999])).save() == 2
        assert np.flatnonzero(AdviceStore(s.dir.parent, {"advisor": "x"}, 5000).load().filled()).tolist() == [7, 4999]
    assert not list(tmp_path.rglob("*.damaged-*")) and "set aside" not in capsys.readouterr().err


def test_a_save_whose_folder_is_set_aside_under_it_saves_into_a_new_one(tmp_path, monkeypatch):
    """Another holder sets the folder aside (it found it damaged) while this one's save is in its transaction: the
    save does not die (training's save_store would end the run), it saves every answer it holds into a new file."""
    store = held(AdviceStore(tmp_path, {"advisor": "x"}, 50), answers(50, [1, 2]))
    assert store.save() == 2
    connect = AdviceStore._connect

    def hooked(self, *args, **kwargs):
        db = connect(self, *args, **kwargs)
        db.set_trace_callback(lambda sql: sql == "COMMIT" and not aside and aside.append(
            store.dir.rename(store.dir.with_name(f"{store.dir.name}.damaged-x"))))
        return db

    aside = []
    monkeypatch.setattr(AdviceStore, "_connect", hooked)
    held(store, answers(50, [3]))
    store.save()
    monkeypatch.undo()
    assert aside and np.flatnonzero(AdviceStore(tmp_path, {"advisor": "x"}, 50).load().filled()).tolist() == [1, 2, 3]


def test_a_store_another_holder_keeps_locked_is_not_judged(tmp_path, monkeypatch, capsys):
    """A reader that cannot get at the file now (another holder keeps it locked past the wait) goes on with the answers
    it holds, with one line: the file is not set aside (before, it was, under the live holder)."""
    store = held(AdviceStore(tmp_path, {"advisor": "x"}, 20), answers(20, [1, 2]))
    assert store.save() == 2
    monkeypatch.setattr("agents.advisor.store.LOCK_TIMEOUT_S", 0.2)
    reader = AdviceStore(tmp_path, {"advisor": "x"}, 20)
    with closing(sqlite3.connect(store.path, isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        assert reader.refresh() == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read it now" in err[0] and not list(tmp_path.glob("*.damaged-*"))
    assert reader.refresh() == 2

def test_a_save_is_durable_and_a_holder_in_another_process_reads_it(tmp_path):
    """A save commits in the rollback journal with synchronous=EXTRA (the journal's deletion, its commit, is made
    durable too: FULL could lose the last save to a power cut), and a new holder in another process reads it."""
    store = held(AdviceStore(tmp_path, {"advisor": "x"}, 40), answers(40, [3, 5, 39]))
    assert store.save() == 3
    with closing(store._connect()) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 3  # EXTRA
    assert [p.name for p in store.dir.iterdir()] == ["answers.sqlite"]  # no journal left beside it
    read = subprocess.run([sys.executable, "-c", f"""
import sys, numpy as np
sys.path.insert(0, {str(ROOT)!r})
from agents.advisor.store import AdviceStore
print(np.flatnonzero(AdviceStore({str(tmp_path)!r}, {{"advisor": "x"}}, 40).load().filled()).tolist())
"""], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0 and read.stdout.strip() == "[3, 5, 39]", read.stderr


def test_a_local_model_folder_is_one_store_however_its_path_is_spelled(tmp_path, monkeypatch):
    """`m`, `./m`, `m/` and its absolute path name one model folder: one store (its identity names the folder's
    resolved path); another folder is another store, and a hub id is named as given."""
    from agents.advisor.store import identity
    from jaxenv import load_market

    market = load_market(load_config(None, SMALL).data)
    for name in ("m", "n"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("agents.devices.gpus.visible_gpus", lambda: 0)

    def store_of(llm: str) -> AdviceStore:
        cfg = load_config(None, SMALL + [f"llm={llm}"])
        ident = identity(cfg.hybrid, cfg.llm, cfg.env, market, "t", None, "p", tmp_path / "store")
        return AdviceStore(tmp_path / "store", ident, 10)

    spellings = {llm: store_of(llm) for llm in ("m", "./m", "m/", str(tmp_path / "m"), "n/../m")}
    assert len({s.dir for s in spellings.values()}) == 1
    assert spellings["m"].ident["advisor"]["llm"] == str(tmp_path.resolve() / "m")
    assert store_of("n").dir != spellings["m"].dir
    assert store_of("org/model").ident["advisor"]["llm"] == "org/model"


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

    from agents.advisor.advisor import prompt_template

    template = yaml.safe_load((ROOT / "configs" / "prompts.yaml").read_text())
    template["context"] += " bal{balance}"
    path = tmp_path / "prompts.yaml"
    path.write_text(yaml.safe_dump(template))
    cfg = load_config(None, [f"hybrid.link.prompts={path}"])
    with pytest.raises(ConfigError, match=r"prompts.yaml: context names balance"):
        prompt_template(cfg.hybrid, cfg.data)


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
    assert next(store.glob("*/answers.sqlite")).stat().st_size > 0
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


def test_two_fills_at_once_on_one_store_leave_the_union_of_their_answers(tmp_path):
    """scripts/advise.py twice at once on one store, different splits: every key of both is in the store after."""
    store = tmp_path / "store"
    slow = ["--set", "hybrid.mock.reads=text", "--set", "hybrid.mock.latency_s=0.002", "--batch", "64"]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "scripts" / "advise.py"), "--llm", "mock", "--data",
                               "synthetic:headlines", "--set", "data.synthetic_days=30", "--store", str(store),
                               "--splits", splits, *slow], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for splits in ("train", "val,test")]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    again = advise("--store", str(store), "--splits", "train,val,test")
    assert again.returncode == 0 and "asking 0" in again.stderr, again.stderr


def test_advise_refuses_a_bad_split_in_one_line(tmp_path):
    bad = advise("--store", str(tmp_path), "--splits", "train,holdout")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == "error: --splits: holdout: choose among train, val, test"


def test_answers_carry_the_version_that_gave_them_and_the_store_keeps_version_0_only(tmp_path):
    """The sidecar reports with each answer the advisor version that gave it (a learning advisor's adopted LoRA
    rounds): the table holds each key under that version, and the store, whose identity names the advisor as it
    started, keeps version 0's answers only: a learned answer is never stored as the frozen advisor's."""
    from agents.advisor.pacer import walk_pacer
    from bridge import BridgeConfig, SidecarClient
    from bridge.client import ECHO_PEER_COMMAND
    from jaxenv import load_market

    cfg = load_config(None, SMALL + [f"hybrid.store={tmp_path / 'store'}", "hybrid.mock.reads=text"])
    market = load_market(cfg.data)
    asked = {0: np.array([300, 301, 302]), 2: np.array([400, 401])}
    for version, keys in asked.items():
        client = SidecarClient(BridgeConfig(capacity=16)).start(command=(*ECHO_PEER_COMMAND, "--version", str(version)))
        link = walk_pacer(cfg.hybrid, cfg.llm, cfg.env, cfg.data, market, client=client)
        link.advisor.submit(keys, version=0)  # asked as version 0
        rows = link._collect(wait=True)
        assert rows[4].tolist() == [version] * len(keys) and (link.advisor.known.version[keys] == version).all()
        ident = link.advisor.store.ident
        link.close()
    stored = AdviceStore(tmp_path / "store", ident, link.num_keys).load()
    assert np.flatnonzero(stored.filled()).tolist() == asked[0].tolist()


GOLDEN_PROMPTS = [  # the default template's prompts of two keys of SMALL's market (flat at block 100, long at 130)
    b"11:24 NQ 18330 ADX32 RSI69 VWAP+0.9 mom+0.3 flat News: Amazon downgraded to sell on slowing growth",
    b"13:54 NQ 18208 ADX23 RSI51 VWAP+0.0 mom-0.2 long 1 News: Strong jobs data lifts risk appetite",
]


def test_the_store_identity_moves_with_the_prompt_format_the_model_files_and_the_device(tmp_path, monkeypatch):
    """A store's identity holds everything an answer depends on. The prompt format's digest moves with any change
    to a key's prompt (an indicator computed otherwise, another renderer), so a change in the code that makes prompts
    never serves the old prompts' answers; the golden prompts pin what the default template renders now (a change to
    them is a change of format: update them with it). The model's files and the device class move it too."""
    from agents.advisor.advisor import prompt_template
    from agents.advisor.prompt_fields import PromptFieldBuilder
    from agents.advisor.store import identity, model_digest, prompt_format_digest
    from jaxenv import load_market

    cfg = load_config(None, SMALL)
    market = load_market(cfg.data)
    renderer, template = prompt_template(cfg.hybrid, cfg.data)
    texts = list(market.text_table) or None
    fields = PromptFieldBuilder(market, list(renderer.markets), 1, 5)
    n = len(fields.split_start) * SIDES
    assert [bytes(p) for p in renderer.render(fields.build(np.array([100 * SIDES + 1, 130 * SIDES + 2])), texts)] \
        == GOLDEN_PROMPTS
    base = prompt_format_digest(fields, renderer, texts, n)
    assert prompt_format_digest(fields, renderer, texts, n) == base  # deterministic
    market.indicators["rsi14"] = market.indicators["rsi14"] + 0.5  # RSI computed otherwise: other prompts
    assert prompt_format_digest(fields, renderer, texts, n) != base
    market.indicators["rsi14"] = market.indicators["rsi14"] - 0.5
    monkeypatch.setattr(type(renderer), "render", lambda self, rows, texts=None: np.array([b"x"] * len(rows)))
    assert prompt_format_digest(fields, renderer, texts, n) != base  # another renderer
    monkeypatch.undo()

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    before = model_digest(str(model), tmp_path / "store")
    (model / "model.safetensors").write_bytes(b"retrained")
    assert model_digest(str(model), tmp_path / "store") != before
    smollm2 = load_config(None, SMALL + ["llm=smollm2"])
    on = {gpus: identity(smollm2.hybrid, smollm2.llm, smollm2.env, market, template, None, base, tmp_path / "store")
          for gpus in (0,)}
    monkeypatch.setattr("agents.devices.gpus.visible_gpus", lambda: 1)
    on[1] = identity(smollm2.hybrid, smollm2.llm, smollm2.env, market, template, None, base, tmp_path / "store")
    assert on[0]["advisor"]["device"] == "cpu" and on[1]["advisor"]["dtype"] == "bfloat16" and on[0] != on[1]
    learning = load_config(None, SMALL + ["llm=smollm2", "hybrid.learning.enabled=true", "hybrid.query.bind_on=trust"])
    assert identity(learning.hybrid, learning.llm, learning.env, market, template, None, base,
                    tmp_path / "store") != on[1]  # its own arm


def test_a_runs_training_and_its_walks_leave_both_splits_keys_in_the_store(tmp_path):
    """Training's link and the validation walks' share the run's store: after the run it holds the training keys
    training asked and the validation keys its walks asked (before, the last saver's answers replaced the other's)."""
    from agents.training.loop import train
    from jaxenv import load_market

    store = tmp_path / "store"
    train(load_config(None, [c for c in SMALL if not c.startswith(("total_steps", "checkpoint."))] + [
        "total_steps=1280", "checkpoint.eval_every_updates=1", f"hybrid.store={store}"]), tmp_path / "run")
    [folder] = [p for p in store.iterdir() if p.is_dir()]
    with sqlite3.connect(folder / "answers.sqlite") as db:
        keys = np.array([k for (k,) in db.execute("SELECT key FROM answers")])
    bars = keys // SIDES * 5 + 4  # each key's block's last bar
    market = load_market(load_config(None, SMALL).data)
    for split in ("train", "val"):
        start, end = market.split_range(split)
        assert ((bars >= start) & (bars < end)).sum() > 10, split


def test_advise_on_several_instruments_fills_a_store_per_instrument_whose_identity_names_the_set(tmp_path):
    """advise.py --data NQ=.. --data ES=..: each instrument's keys on the set's joint timeline, asked with prompts that
    name the instrument, into its own store whose identity holds the set; a second fill asks nothing."""
    from agents.advisor.fill import fill_store
    from agents.advisor.instrument_set import each_advisor
    from jaxenv.market_set import load_market_set

    out = tmp_path / "pair"
    subprocess.run([sys.executable, "scripts/write_market.py", "--preset", "pair", "--days", "20", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    store = tmp_path / "store"
    cfg = load_config(None, [f'data.instruments=["NQ={out / "NQ.csv"}", "ES={out / "ES.csv"}"]', "llm=mock",
                             f"hybrid.store={store}"])
    first = fill_store(cfg.hybrid, cfg.llm, cfg.env, cfg.data, ["val"], progress=False)
    assert set(first["instruments"]) == {"NQ", "ES"} and first["filled"] == 1.0
    assert first["asked"] == first["keys"] == 2 * first["instruments"]["NQ"]["keys"] > 0
    identities = []
    for path in sorted(store.glob("*/answers.sqlite")):
        with closing(sqlite3.connect(path)) as db:
            identities.append(json.loads(dict(db.execute("SELECT name, value FROM meta"))["identity"]))
    assert [ident["instruments"] for ident in identities] == [["NQ", "ES"], ["NQ", "ES"]]
    assert identities[0]["data"] != identities[1]["data"]  # each instrument's own bars
    more = fill_store(cfg.hybrid, cfg.llm, cfg.env, cfg.data, ["val", "train"], progress=False)["instruments"]
    for symbol, again in more.items():  # only the train split's keys are asked: val's are in the store
        assert again["asked"] == again["keys"] - first["instruments"][symbol]["keys"] > 0
    assert fill_store(cfg.hybrid, cfg.llm, cfg.env, cfg.data, ["val"], progress=False)["asked"] == 0

    market_set = load_market_set([(item.contract, item.source) for item in cfg.data.instruments], cfg.data)
    for i, advisor in each_advisor(cfg.hybrid, cfg.llm, cfg.env, cfg.data, market_set, 8, start=False):
        prompt = advisor.renderer.render(advisor.fields.build(np.array([300 * SIDES + 1])), advisor.texts)[0].decode()
        assert market_set.symbols[i] in prompt and market_set.symbols[1 - i] not in prompt
