"""Has a learned advisor picked up the headline's direction? Scores 120 flat-position prompts with
synthetic:headlines headlines (half bullish, half bearish) with the embedded SmolLM2, as the base model and with
each adapter given, and prints P(HOLD), P(BUY | bullish) vs P(BUY | bearish), P(SELL | bearish) vs
P(SELL | bullish), and the share of prompts per top action.

    python scripts/advisor_learning/lora_direction_probe.py results/lora_headlines/runs/seed0/adapters/6
"""
import argparse

import numpy as np

from bridge import PROMPT_FIELDS, PromptRenderer
from bridge.protocol import ACTIONS, BUY, HOLD, SELL
from jaxenv.synthetic import random_headline
from llm_sidecar.__main__ import example_fields
from llm_sidecar.backends import TransformersBackend, TransformersOptions

N_PROMPTS = 120


def flat_headline_prompts(renderer: PromptRenderer, n: int, rng: np.random.Generator,
                          fields_seed: int) -> tuple[list[str], np.ndarray]:
    """`n` flat-position prompts, even rows with a bullish headline (drawn from `rng`), odd rows with a bearish
    one; also the bullish rows' mask."""
    bull = np.arange(n) % 2 == 0
    heads = [random_headline(rng, bool(is_bull)) for is_bull in bull]
    fields, _ = example_fields(n, seed=fields_seed)
    fields[:, PROMPT_FIELDS.index("headline")] = np.arange(n)
    fields[:, PROMPT_FIELDS.index("position")] = 0
    return [p.decode() for p in renderer.render(fields, heads)], bull


def probe_prompts(renderer: PromptRenderer) -> tuple[list[str], np.ndarray]:
    """The probe's fixed prompts: N_PROMPTS flat ones, half bullish, half bearish."""
    return flat_headline_prompts(renderer, N_PROMPTS, np.random.default_rng(1), fields_seed=5)


def direction_figures(probs: np.ndarray, bull: np.ndarray) -> dict[str, float]:
    """Mean answer probabilities by headline direction, and the share of prompts per top action."""
    top = probs.argmax(1)
    return {"p_hold": float(probs[:, HOLD].mean()),
            "p_buy_bull": float(probs[bull, BUY].mean()), "p_buy_bear": float(probs[~bull, BUY].mean()),
            "p_sell_bear": float(probs[~bull, SELL].mean()), "p_sell_bull": float(probs[bull, SELL].mean()),
            **{f"top_{ACTIONS[a].lower()}": float((top == a).mean()) for a in (HOLD, BUY, SELL)}}


def describe(probs: np.ndarray, bull: np.ndarray) -> str:
    f = direction_figures(probs, bull)
    return (f"P(HOLD) {f['p_hold']:.3f}  P(BUY|bull) {f['p_buy_bull']:.3f} vs P(BUY|bear) {f['p_buy_bear']:.3f}  "
            f"P(SELL|bear) {f['p_sell_bear']:.3f} vs P(SELL|bull) {f['p_sell_bull']:.3f}  "
            f"top HOLD/BUY/SELL {f['top_hold']:.2f}/{f['top_buy']:.2f}/{f['top_sell']:.2f}")


def smollm2(renderer: PromptRenderer, adapter: str | None = None) -> TransformersBackend:
    """The embedded SmolLM2 advisor in score mode with `renderer`'s system prompt, with `adapter` (None: base)."""
    options = TransformersOptions(model="smollm2", lora=adapter, action_labels=tuple(renderer.action_labels))
    return TransformersBackend(options, renderer.system, renderer.answer_prefix)


def score(renderer: PromptRenderer, prompts: list[str], adapter: str | None) -> np.ndarray:
    """The embedded SmolLM2's answer probabilities [n, NUM_ACTIONS], with `adapter` (None: the base model)."""
    return smollm2(renderer, adapter).advise(prompts).probs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="*", help="peft adapter directories (the base model is always scored first)")
    args = ap.parse_args(argv)
    renderer = PromptRenderer.from_yaml()
    prompts, bull = probe_prompts(renderer)
    for adapter in [None, *args.adapters]:
        print(f"{adapter or 'base model'}: {describe(score(renderer, prompts, adapter), bull)}", flush=True)
    return 0
