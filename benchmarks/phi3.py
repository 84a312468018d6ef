"""Suite `phi3`: a Phi-3-mini-sized advisor on a GPU: how fast it answers in bf16, int8 and int4 (bitsandbytes),
what one LoRA learning round costs (QLoRA on the 4-bit base), and what it costs training at 4,096 envs.

    python scripts/benchmark.py phi3 --json results/phi3.json     # a CUDA GPU
    python scripts/benchmark.py phi3 --quick                      # a tiny Phi-3 on any machine: the same code paths

No weights can be fetched here, so the model is built: Phi-3-mini-4k-instruct's layer shapes
(llm_sidecar.models.PHI3_MINI) with random weights, and a real tokenizer so that prompts have realistic token
counts: the directory `BENCH_PHI3_TOKENIZER` names, by default the embedded SmolLM2's (49,152 tokens, where
Phi-3's own has 32,064). These are speeds only: a random model's answers mean nothing.
- `score`: score-mode prompts/s on distinct prompts, at micro-batches of 64 and 256 prompts per forward pass,
  with the peak GPU memory and the load time;
- `learning`: one LoRA learning round on synthetic experiences (bridge.learning's defaults, one epoch):
  seconds per learning step and for the round, validation passes included;
- `hybrid`: whole PPO updates at 4,096 envs with this advisor run as the main command runs its advisor (own
  process, async latency, auto budget), alternating with RL-only updates (benchmarks.hybrid.time_hybrid).
`BENCH_PHI3_QUANTIZE` (default none,int8,int4) and `BENCH_PHI3_PARTS` (default score,learning,hybrid) pick the
cases; `BENCH_PHI3_DIR` keeps the built model between runs (default: a temporary folder, removed at the end).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import BenchInputError, BenchOptions, fmt_range, peak_host_memory_mb, rates, table, timed_repeats

QUANTIZE = ("none", "int8", "int4")
PARTS = ("score", "learning", "hybrid")
MICRO_BATCHES = [64, 256]
PROMPTS_PER_CALL = 1024
LEARNING_EXAMPLES = 1024
QUICK_PROMPTS = 64  # --quick: enough for a learning round (16 training and 8 validation examples at least)
HYBRID_ENVS = [4096]
HYBRID_QUANTIZE = ("none", "int4")


def choices(variable: str, default: tuple[str, ...]) -> list[str]:
    """The comma-separated values of an environment variable, each one of `default`."""
    picked = [v for v in os.environ.get(variable, ",".join(default)).split(",") if v]
    unknown = sorted(set(picked) - set(default))
    if unknown:
        raise BenchInputError(f"{variable}: unknown {', '.join(unknown)}; choose from {', '.join(default)}")
    return picked


def build_model(quick: bool, folder: Path) -> tuple[Path, dict]:
    """The random-weight model's directory under `folder` (built there once) and what it is."""
    import torch

    from llm_sidecar.models import PHI3_MINI, TINY_PHI3, build_random_phi3, smollm2_dir

    shape = TINY_PHI3 if quick else PHI3_MINI
    path = folder / ("tiny" if quick else "mini")
    tokenizer = None
    if not quick:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(os.environ.get("BENCH_PHI3_TOKENIZER") or smollm2_dir())
    t0 = time.perf_counter()
    if not (path / "config.json").exists():
        cuda = torch.cuda.is_available()
        build_random_phi3(path, shape, tokenizer, device="cuda" if cuda else "cpu",
                          dtype="bfloat16" if cuda else "float32")  # fmt: skip
        release_gpu_memory()
    from safetensors import safe_open
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    params = 0
    for shard in path.glob("*.safetensors"):  # the headers alone: no weights are read
        with safe_open(shard, "pt") as f:
            params += sum(int(np.prod(f.get_slice(name).get_shape())) for name in f.keys())
    return path, {"model": "phi3-mini" if not quick else "phi3-tiny", "layers": config.num_hidden_layers,
                  "hidden": config.hidden_size, "vocab": config.vocab_size, "params": params,
                  "build_s": time.perf_counter() - t0}  # fmt: skip


def parameters(about: dict) -> str:
    n = about["params"]
    return f"{n / 1e9:.2f}B parameters" if n >= 1e9 else f"{n / 1e6:.2f}M parameters"


def release_gpu_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_gpu_gb(reset: bool = False) -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return torch.cuda.max_memory_allocated() / 2**30


def load_backend(path: Path, quantize: str, micro_batch: int, renderer):
    from llm_sidecar.backends import TransformersBackend, TransformersOptions

    options = TransformersOptions(model=str(path), mode="score", quantize=quantize, micro_batch=micro_batch,
                                  action_labels=renderer.action_labels)
    return TransformersBackend(options, renderer.system, renderer.answer_prefix)


def score_rows(path: Path, quantize: str, opts: BenchOptions, renderer, contexts: list[str], about: dict) -> list[dict]:
    import torch

    peak_gpu_gb(reset=True)
    t0 = time.perf_counter()
    backend = load_backend(path, quantize, MICRO_BATCHES[0], renderer)
    load_s, weights_gb = time.perf_counter() - t0, peak_gpu_gb()
    rows = []
    for micro in [16] if opts.quick else MICRO_BATCHES:
        backend.options.micro_batch = micro
        last = {}

        def call(backend=backend):  # bound now: the model is deleted (del backend) once its rows are timed
            last["answers"] = backend.advise(contexts)
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        peak_gpu_gb(reset=True)
        timing = timed_repeats(call, 1 if opts.quick else opts.reps, warmup=1)
        answers = last["answers"]
        rows.append({"suite": "phi3", "case": "score", **about, "quantize": quantize, "micro_batch": micro,
                     "prompts": len(contexts), **rates(len(contexts), timing, "prompts"), **timing,
                     "tokens_per_prompt": answers.prompt_tokens / len(contexts),
                     "ok_fraction": float((answers.status == 0).mean()), "load_s": load_s,
                     "weights_gpu_gb": weights_gb, "peak_gpu_gb": peak_gpu_gb(), "device": gpu_name()})  # fmt: skip
    del backend
    release_gpu_memory()
    return rows


def learning_row(path: Path, quantize: str, opts: BenchOptions, renderer, contexts: list[str], about: dict) -> dict:
    """One round of llm_sidecar.learning.LoraLearner (the sidecar's own learner) on synthetic experiences."""
    import torch

    from bridge.learning import LearningOptions
    from llm_sidecar.learning import Experience, LoraLearner

    backend = load_backend(path, quantize, MICRO_BATCHES[0], renderer)
    options = LearningOptions(max_epochs=1, min_examples=16 if opts.quick else 64)
    learner = LoraLearner(backend, options)
    rng = np.random.default_rng(0)
    learner.buffer.add([Experience(text, np.full(6, 1 / 6, np.float32), float(rng.normal())) for text in contexts])
    peak_gpu_gb(reset=True)
    started = learner.start_round()
    if not started["started"]:
        raise RuntimeError(f"the learning round did not start: {started['why']}")
    t0 = time.perf_counter()
    learner.finish()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - t0
    record = learner.rounds[-1]
    del learner, backend
    release_gpu_memory()
    return {"suite": "phi3", "case": "learning", **about, "quantize": quantize, "round_s": wall_s,
            "steps": record["steps"], "batch_size": options.batch_size, "train_examples": record["train_examples"],
            "val_examples": record["val_examples"], "lora_rank": options.rank,
            "peak_gpu_gb": peak_gpu_gb(), "device": gpu_name()}  # fmt: skip


def hybrid_rows(path: Path, quantize: str, opts: BenchOptions, about: dict) -> list[dict]:
    from agents.advisor.fill import fill_store
    from agents.advisor.sidecar import at_full_rate
    from agents.config import load_config
    from agents.training.env_setup import make_env_setup
    from benchmarks.hybrid import QUICK_ENVS, QUICK_NUM_STEPS, STORES, base_overrides, time_hybrid

    num_steps = QUICK_NUM_STEPS if opts.quick else load_config(None, []).ppo.num_steps
    rl_cfg = load_config(None, base_overrides(256, num_steps) + ["llm=none"])
    setup = make_env_setup(rl_cfg.env_name, rl_cfg.env, rl_cfg.data, rl_cfg.checkpoint.eval_episodes)
    advisor = [f"llm={path}", f"hybrid.sidecar.quantization={quantize}", "hybrid.query.interval=5"]
    root = tempfile.mkdtemp(prefix="advice_store_")
    fill = None
    rows = []
    for n in opts.envs or (QUICK_ENVS if opts.quick else HYBRID_ENVS):
        for store in STORES:
            overrides = [f"hybrid.store={root if store == 'filled' else ''}"]
            if store == "filled" and fill is None:  # the train split's keys, as scripts/advise.py fills them
                cfg = load_config(None, base_overrides(n, num_steps) + advisor + overrides)
                fill = fill_store(at_full_rate(cfg.hybrid), cfg.llm, cfg.env, cfg.data, ["train"], progress=False)
            print(f"  phi3: hybrid at {n} envs, quantize={quantize}, {store} store, and RL only, alternating ...",
                  file=sys.stderr, flush=True)
            figures = time_hybrid(advisor, n, num_steps, opts.reps, setup, overrides)
            rows.append({"suite": "phi3", "case": "hybrid", **about, "quantize": quantize, "store": store, "envs": n,
                         "num_steps": num_steps, **figures,
                         **({"fill_s": fill["seconds"], "fill_keys": fill["answered"],
                             "fill_keys_per_s": fill["keys_per_s"]} if store == "filled" else {}),
                         "peak_host_mb": peak_host_memory_mb(), "device": gpu_name()})
    shutil.rmtree(root, ignore_errors=True)
    return rows


def run(opts: BenchOptions) -> list[dict]:
    import torch

    if not opts.quick and not torch.cuda.is_available():
        return [{"suite": "phi3", "skipped": "no CUDA GPU: a Phi-3-mini-sized model wants one (--quick runs a tiny "
                                             "Phi-3 through the same code on any machine)"}]
    quantizations = choices("BENCH_PHI3_QUANTIZE", QUANTIZE if torch.cuda.is_available() else ("none",))
    parts = choices("BENCH_PHI3_PARTS", PARTS)
    kept = os.environ.get("BENCH_PHI3_DIR")  # else a temporary folder: a Phi-3-mini in bf16 is 7.6 GB of disk
    with tempfile.TemporaryDirectory(prefix="phi3-") as scratch:
        return measure(opts, quantizations, parts, *build_model(opts.quick, Path(kept or scratch)))


def measure(opts: BenchOptions, quantizations: list[str], parts: list[str], path: Path, about: dict) -> list[dict]:
    """The chosen parts for each quantization, on the model at `path`."""
    from bridge import PromptRenderer
    from llm_sidecar.__main__ import example_fields

    print(f"  phi3: {about['model']} ({parameters(about)}) in {path}, {about['build_s']:.0f} s",
          file=sys.stderr, flush=True)
    renderer = PromptRenderer.from_yaml()
    n = QUICK_PROMPTS if opts.quick else max(PROMPTS_PER_CALL, LEARNING_EXAMPLES)
    fields, texts = example_fields(n, seed=1)
    contexts = [p.decode() for p in renderer.render(fields, texts)]
    if len(set(contexts)) != n:
        raise RuntimeError("the benchmark must time distinct prompts")
    rows = []
    for quantize in quantizations:
        if "score" in parts:
            print(f"  phi3: score mode, quantize={quantize} ...", file=sys.stderr, flush=True)
            rows += score_rows(path, quantize, opts, renderer, contexts[:PROMPTS_PER_CALL], about)
        if "learning" in parts and quantize in ("none", "int4"):  # int8 LoRA adds nothing QLoRA does not show
            print(f"  phi3: one learning round, quantize={quantize} ...", file=sys.stderr, flush=True)
            rows.append(learning_row(path, quantize, opts, renderer, contexts[:LEARNING_EXAMPLES], about))
    if "hybrid" in parts:
        for quantize in [q for q in quantizations if q in HYBRID_QUANTIZE]:
            rows += hybrid_rows(path, quantize, opts, about)
    return rows


def markdown(rows: list[dict]) -> str:
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        return f"Skipped: {skipped[0]['skipped']}."
    r0 = rows[0]
    parts = [
        f"{r0['model']}: Phi-3's architecture with {r0['layers']} layers {r0['hidden']:,} wide, random weights and a "
        f"{r0['vocab']:,}-token vocabulary ({parameters(r0)}), on {r0['device']}. Speeds only: a "
        "random model's answers mean nothing. `quantize none` is bf16 on a GPU (float32 on a CPU); int8 and int4 "
        "(NF4, double quantisation, bf16 compute) go through bitsandbytes."
    ]
    score = [r for r in rows if r["case"] == "score"]
    if score:
        parts.append(f"Score mode: {score[0]['prompts']:,} distinct prompts per call "
                     f"(~{score[0]['tokens_per_prompt']:.0f} tokens each beside the shared system prompt), one forward "
                     "pass per micro-batch of prompts, the system prompt's key/value cache reused.")
        parts.append(table(score, [
            ("quantize", lambda r: r["quantize"]), ("micro-batch", lambda r: r["micro_batch"]),
            ("prompts/s [min–max]", lambda r: fmt_range(r, "prompts_per_s")),
            ("s per call", lambda r: r["median_s"]), ("ok", lambda r: r["ok_fraction"]),
            ("weights GiB", lambda r: r["weights_gpu_gb"]), ("peak GiB", lambda r: r["peak_gpu_gb"]),
            ("load s", lambda r: r["load_s"]), ("reps", lambda r: r["reps"]),
        ]))  # fmt: skip
    learning = [r for r in rows if r["case"] == "learning"]
    if learning:
        parts.append("One LoRA learning round (llm_sidecar.learning.LoraLearner; QLoRA where the base is int4): "
                     "base log-probabilities, validation before and after, one epoch of learning steps.")
        parts.append(table(learning, [
            ("quantize", lambda r: r["quantize"]), ("LoRA rank", lambda r: r["lora_rank"]),
            ("examples train / val", lambda r: f"{r['train_examples']:,} / {r['val_examples']:,}"),
            ("steps × batch", lambda r: f"{r['steps']} × {r['batch_size']}"), ("round s", lambda r: r["round_s"]),
            ("s per step (round ÷ steps)", lambda r: r["round_s"] / max(r["steps"], 1)),
            ("peak GiB", lambda r: r["peak_gpu_gb"]),
        ]))  # fmt: skip
    hybrid = [r for r in rows if r["case"] == "hybrid"]
    if hybrid:
        parts.append("Training with this advisor in its own process as the main command runs one (async latency, "
                     "auto budget, one worker per GPU), alternating update by update with RL-only updates; "
                     "`ratio` = hybrid ÷ RL-only steps/s. store: `empty`, a fresh advice table; `filled`, the store "
                     "filled first for the train split (fill keys/s: that fill's rate).")
        parts.append(table(hybrid, [
            ("quantize", lambda r: r["quantize"]), ("envs", lambda r: r["envs"]),
            ("steps/s [min–max]", lambda r: fmt_range(r, "steps_per_s")),
            ("RL-only steps/s", lambda r: r["rl_only_steps_per_s"]), ("ratio", lambda r: r["ratio"]),
            ("coverage", lambda r: f"{r['coverage']:.2%}"), ("answers/s", lambda r: r["answers_per_s"]),
            ("store", lambda r: r.get("store", "per env")), ("fill keys/s", lambda r: r.get("fill_keys_per_s", "")),
            ("B", lambda r: r["budget"]),
            ("sidecar start s", lambda r: r["sidecar_start_s"]), ("reps", lambda r: r["reps"]),
        ]))  # fmt: skip
    return "\n\n".join(parts)
