"""Has a learned advisor picked up the headline's direction? Scores 120 flat-position prompts with
synthetic:headlines headlines (half bullish, half bearish) with the embedded SmolLM2, as the base model and with
each adapter given, and prints P(HOLD), P(BUY | bullish) vs P(BUY | bearish), P(SELL | bearish) vs
P(SELL | bullish), and the share of prompts per top action. ~1 min per adapter on a 2-core CPU.

    python scripts/lora_direction_probe.py results/lora_headlines/runs/seed0/adapters/6
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bridge import PROMPT_FIELDS, PromptRenderer  # noqa: E402
from jaxenv.synthetic import _COMPANIES, _NEGATIVE, _POSITIVE  # noqa: E402
from llm_sidecar.__main__ import example_fields  # noqa: E402
from llm_sidecar.backends import TransformersBackend, TransformersOptions  # noqa: E402

N_PROMPTS = 120


def probe_prompts(renderer: PromptRenderer) -> tuple[list[str], np.ndarray]:
    """Flat-position prompts, even rows with a bullish headline, odd rows with a bearish one."""
    rng = np.random.default_rng(1)
    bull = np.arange(N_PROMPTS) % 2 == 0
    heads = []
    for is_bull in bull:
        pool = _POSITIVE if is_bull else _NEGATIVE
        heads.append(pool[rng.integers(len(pool))].format(co=_COMPANIES[rng.integers(len(_COMPANIES))]))
    fields, _ = example_fields(N_PROMPTS, seed=5)
    fields[:, PROMPT_FIELDS.index("headline")] = np.arange(N_PROMPTS)
    fields[:, PROMPT_FIELDS.index("position")] = 0
    return [p.decode() for p in renderer.render(fields, heads)], bull


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="*", help="peft adapter directories (the base model is always scored first)")
    args = ap.parse_args()
    renderer = PromptRenderer.from_yaml()
    prompts, bull = probe_prompts(renderer)
    for adapter in [None, *args.adapters]:
        options = TransformersOptions(model="smollm2", lora=adapter, action_labels=tuple(renderer.action_labels))
        probs = TransformersBackend(options, renderer.system, renderer.answer_prefix).advise(prompts).probs
        top = probs.argmax(1)
        print(f"{adapter or 'base model'}: P(HOLD) {probs[:, 0].mean():.3f}  "
              f"P(BUY|bull) {probs[bull, 1].mean():.3f} vs P(BUY|bear) {probs[~bull, 1].mean():.3f}  "
              f"P(SELL|bear) {probs[~bull, 2].mean():.3f} vs P(SELL|bull) {probs[bull, 2].mean():.3f}  "
              f"top HOLD/BUY/SELL {(top == 0).mean():.2f}/{(top == 1).mean():.2f}/{(top == 2).mean():.2f}", flush=True)


if __name__ == "__main__":
    main()
