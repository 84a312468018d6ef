"""A check of the sidecar's LoRA learner on the embedded SmolLM2, without the trainer: 400 flat-position prompts
with the synthetic:headlines headlines (half bullish, half bearish), outcomes whose market moved with the headline
(a move of +1 ATR after bullish news and -1 after bearish news, noise 0.5), one learning round with the default
LearningOptions; prints the round's figures and how the answers moved on the held-out and training prompts.
Minutes on a CPU.

    python scripts/advisor_learning/lora_headlines_check.py
"""
import argparse
import time

import numpy as np

from bridge import PromptRenderer
from bridge.learning import LearningOptions
from bridge.protocol import BUY, SELL
from experiments.lora_probe import flat_headline_prompts, smollm2
from llm_sidecar.learning import LoraLearner, held_out


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import torch

    torch.set_num_threads(2)
    R = PromptRenderer.from_yaml()
    n = 400
    rng = np.random.default_rng(0)
    prompts, bull = flat_headline_prompts(R, n, rng, fields_seed=3)
    b = smollm2(R)
    L = LoraLearner(b, LearningOptions(min_examples=64))
    before = b.advise(prompts).probs
    move = np.where(bull, 1.0, -1.0) + rng.normal(0, 0.5, n)
    L.memory.remember(1, prompts, before)
    L.add_outcomes({"seq": np.ones(n), "row": np.arange(n), "move": move})
    print(L.buffer.sizes(), L.start_round(), flush=True)
    t0 = time.time()
    L.finish()
    print("round wall s %.1f" % (time.time() - t0))
    after = b.advise(prompts).probs
    val = np.array([held_out(p, 0.2) for p in prompts])
    r = L.rounds[-1]
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    for name, m in (("held-out", val), ("train", ~val)):
        print(name, "P(BUY|bull) %.3f -> %.3f  P(SELL|bear) %.3f -> %.3f  argmax-correct %.3f -> %.3f" % (
            before[m & bull, BUY].mean(), after[m & bull, BUY].mean(),
            before[m & ~bull, SELL].mean(), after[m & ~bull, SELL].mean(),
            np.mean(np.where(bull[m], before[m].argmax(1) == BUY, before[m].argmax(1) == SELL)),
            np.mean(np.where(bull[m], after[m].argmax(1) == BUY, after[m].argmax(1) == SELL))))
    return 0
