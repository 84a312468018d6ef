"""Command line of the LLM sidecar.

  python -m llm_sidecar serve ...     run as the trainer's sidecar (SidecarClient.start spawns this)
  python -m llm_sidecar ask ...       load a backend, advise on example prompts, print answers and timing
  python -m llm_sidecar convert       convert the embedded SmolLM2 GGUF to the local safetensors cache
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import typing

import numpy as np

from bridge import ACTIONS, PROMPT_FIELDS, STATUS_NAMES, PromptRenderer
from bridge.field_comments import field_comments
from bridge.peer import add_transport_arguments
from bridge.prompts import DEFAULT_PROMPTS_PATH


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    from llm_sidecar.backends import MockOptions, TransformersOptions

    parser.add_argument("--backend", choices=("mock", "transformers"), default="mock", help="the advisor")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch size (prompts per forward pass)")
    parser.add_argument("--cache-size", type=int, default=65536, help="LRU answer-cache entries (0 = off)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--verbose", action="store_true", help="log every submission's timing")
    add_option_flags(parser.add_argument_group("transformers backend"), TransformersOptions)
    add_option_flags(parser.add_argument_group("mock backend (what it answers; fault injection for tests)"), MockOptions)


def add_option_flags(group, options: type) -> None:
    """A flag for every field of the backend's options dataclass, its help the field's comment: `--NAME VALUE` (its
    type from the annotation, choices from OPTION_CHOICES), `--NAME` for a field off by default, `--no-NAME` for one
    on by default, and the action labels comma-separated. backends.py imports torch only in a backend's constructor,
    so `--help` stays fast."""
    from llm_sidecar.backends import OPTION_CHOICES

    comments, hints = field_comments(options), typing.get_type_hints(options)
    for f in dataclasses.fields(options):
        flag, default, text = "--" + f.name.replace("_", "-"), f.default, comments.get(f.name, "").replace("%", "%%")
        if isinstance(default, bool):
            names = [flag] if not default else ["--no-" + f.name.replace("_", "-")]
            group.add_argument(*names, dest=f.name, action="store_false" if default else "store_true",
                               help=f"turns off: {text}" if default else text)
        elif isinstance(default, tuple):
            group.add_argument(flag, dest=f.name, default=None, type=lambda s: tuple(a.strip() for a in s.split(",")),
                               help=f"{text}, comma-separated, in {','.join(ACTIONS)} order (default: those names; "
                                    "`ask` reads --prompts)")
        else:
            given = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
            group.add_argument(flag, dest=f.name, default=default, type=given[0],
                               choices=OPTION_CHOICES.get(f.name), help=text)


def make_backend(args: argparse.Namespace, system: str, answer_prefix: str):
    """Builds the backend the flags ask for. Torch is imported only here, so `mock` starts fast."""
    if args.backend == "mock":
        from llm_sidecar.backends import MockBackend, MockOptions

        return MockBackend(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MockOptions)})
    import torch

    from llm_sidecar.backends import TransformersBackend, TransformersOptions

    if args.threads:
        torch.set_num_threads(args.threads)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TransformersOptions)}
    options = TransformersOptions(**{k: v for k, v in given.items() if v is not None})
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
        args.action_labels = tuple(renderer.action_labels)
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
