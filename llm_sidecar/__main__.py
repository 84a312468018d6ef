"""Command line of the LLM sidecar.

  python -m llm_sidecar serve ...     run as the trainer's sidecar (SidecarClient.start spawns this)
  python -m llm_sidecar ask ...       load a backend, advise on example prompts, print answers and timing
  python -m llm_sidecar convert       convert the embedded SmolLM2 GGUF to the local safetensors cache
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from bridge import ACTIONS, NUM_ACTIONS, PROMPT_FIELDS, STATUS_NAMES, PromptRenderer
from bridge.peer import add_transport_arguments
from bridge.prompts import DEFAULT_PROMPTS_PATH
from bridge.protocol import MOCK_ANSWERS


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("mock", "transformers"), default="mock", help="the advisor")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch size (prompts per forward pass)")
    parser.add_argument("--cache-size", type=int, default=65536, help="LRU answer-cache entries (0 = off)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--verbose", action="store_true", help="log every submission's timing")
    hf = parser.add_argument_group("transformers backend")
    hf.add_argument("--model", default="smollm2", help="'smollm2' (embedded), a local directory or a hub id")
    hf.add_argument("--mode", choices=("score", "generate"), default="score")
    hf.add_argument("--dtype", choices=("auto", "float32", "float16", "bfloat16"), default="auto")
    hf.add_argument("--quantize", choices=("none", "int8", "int4"), default="none", help="bitsandbytes quantization")
    hf.add_argument("--lora", default=None, help="a peft LoRA adapter directory")
    hf.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    hf.add_argument("--temperature", type=float, default=1.0, help="score mode softmax temperature")
    hf.add_argument("--score-tokens", choices=("first", "full"), default="first",
                    help=f"score mode: 'first' = one forward pass, one softmax over the {NUM_ACTIONS} labels' first-token "
                         "logits "
                         "(exact for one-token labels); 'full' = length-normalised log-likelihood of every label token")
    hf.add_argument("--action-labels", default=None,
                    help=f"score mode: the {NUM_ACTIONS} action names the system prompt uses, comma-separated, in "
                         f"{','.join(ACTIONS)} order (default: those names; `ask` reads --prompts)")
    hf.add_argument("--micro-batch", type=int, default=64, help="score mode: prompts per forward pass, length-sorted")
    hf.add_argument("--max-new-tokens", type=int, default=24, help="generate mode answer length")
    hf.add_argument("--sample", action="store_true", help="generate mode: sample instead of greedy")
    hf.add_argument("--no-prefix-cache", action="store_true", help="score mode: recompute the system prefix per batch")
    mock = parser.add_argument_group("mock backend (fault injection for tests)")
    mock.add_argument("--latency-s", type=float, default=0.0, help="sleep per prompt")
    mock.add_argument("--garbage-rate", type=float, default=0.0, help="fraction of unparseable answers")
    mock.add_argument("--crash-after", type=int, default=None, help="exit with code 70 after this many prompts")
    mock.add_argument("--mock-answers", choices=MOCK_ANSWERS, default="rules",
                      help="rules: read the prompt (indicators, position, headline); news: trade the headline alone "
                      "(HOLD without news); news_pass: the same, PASS (no view) without news; random: ignore it")


def make_backend(args: argparse.Namespace, system: str, answer_prefix: str):
    """Builds the backend the flags ask for. Torch is imported only here, so `mock` starts fast."""
    if args.backend == "mock":
        from llm_sidecar.backends import MockBackend

        return MockBackend(latency_s=args.latency_s, garbage_rate=args.garbage_rate, crash_after=args.crash_after,
                           answers=args.mock_answers)
    import torch

    from llm_sidecar.backends import TransformersBackend, TransformersOptions

    if args.threads:
        torch.set_num_threads(args.threads)
    options = TransformersOptions(
        model=args.model, mode=args.mode, dtype=args.dtype, quantize=args.quantize, lora=args.lora,
        device=args.device, temperature=args.temperature, max_new_tokens=args.max_new_tokens, sample=args.sample,
        prefix_cache=not args.no_prefix_cache, score_tokens=args.score_tokens, micro_batch=args.micro_batch,
    )  # fmt: skip
    if args.action_labels:
        options.action_labels = tuple(a.strip() for a in args.action_labels.split(","))
    return TransformersBackend(options, system, answer_prefix)


def example_fields(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Plausible random prompt fields and a small headline table, for `ask` and the benchmarks."""
    rng = np.random.default_rng(seed)
    columns = {
        "market": rng.integers(0, 4, n), "minute_of_day": rng.integers(570, 960, n),
        "price": rng.uniform(4000, 5000, n), "adx": rng.uniform(8, 50, n), "rsi": rng.uniform(10, 90, n),
        "vwap_dist": rng.normal(0, 0.4, n), "momentum": rng.normal(0, 0.8, n), "position": rng.integers(-1, 2, n),
        "unrealized_pnl": rng.normal(0, 250, n), "win_rate": rng.uniform(0.3, 0.7, n),
        "consecutive_losses": rng.integers(0, 5, n), "balance": rng.uniform(48000, 53000, n),
        "headline": rng.integers(-3, 3, n),
    }  # fmt: skip
    fields = np.stack([columns[name] for name in PROMPT_FIELDS], axis=1).astype(np.float32)
    texts = ["Fed signals a rate cut; stocks rally", "Tech earnings miss, futures slump", "Oil inventories surge"]
    return fields, texts


def ask(args: argparse.Namespace) -> None:
    renderer = PromptRenderer.from_yaml(args.prompts)
    fields, texts = example_fields(args.n, args.seed)
    contexts = [p.decode() for p in renderer.render(fields, texts)]
    if args.backend == "transformers" and not args.action_labels:
        args.action_labels = ",".join(renderer.action_labels)
    backend = make_backend(args, renderer.system, renderer.answer_prefix)
    backend.advise(contexts[: min(2, len(contexts))])  # warm-up
    t0 = time.perf_counter()
    answers = [backend.advise(contexts[i : i + args.batch_size]) for i in range(0, len(contexts), args.batch_size)]
    elapsed = time.perf_counter() - t0
    rows = [(c, a, i) for a, batch in zip(answers, [contexts[i : i + args.batch_size]
                                                     for i in range(0, len(contexts), args.batch_size)])
            for i, c in enumerate(batch)]  # fmt: skip
    for context, batch, i in rows:
        status = STATUS_NAMES[batch.status[i]]
        action = ACTIONS[batch.action[i]] if batch.action[i] >= 0 else "-"
        probs = " ".join(f"{p:.2f}" for p in batch.probs[i])
        print(f"{context}\n  -> {action:13s} conf {batch.confidence[i]:.2f} [{probs}] {status}: "
              f"{batch.reasons[i].decode(errors='replace')[:80]}")
    print(f"{len(contexts)} prompts in {elapsed:.2f} s = {len(contexts) / elapsed:.1f} prompts/s", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llm_sidecar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="answer a SidecarClient over shared memory")
    add_transport_arguments(serve_parser)
    add_backend_arguments(serve_parser)
    serve_parser.add_argument("--nice", type=int, default=0,
                              help="raise the process's OS niceness by this much (19: only idle CPU time)")
    ask_parser = commands.add_parser("ask", help="advise on random example prompts and print the answers")
    add_backend_arguments(ask_parser)
    ask_parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS_PATH), help="prompt templates (YAML)")
    ask_parser.add_argument("-n", type=int, default=8, help="number of example prompts")
    ask_parser.add_argument("--seed", type=int, default=0)
    commands.add_parser("convert", help="convert the embedded SmolLM2 GGUF to the safetensors cache")
    args = parser.parse_args(argv)
    if args.command == "serve":
        from llm_sidecar.server import serve

        os.nice(args.nice)  # before torch starts its threads: they inherit it
        serve(args, make_backend)
    elif args.command == "ask":
        ask(args)
    else:
        from llm_sidecar.models import smollm2_dir

        print(smollm2_dir())


if __name__ == "__main__":
    main()
