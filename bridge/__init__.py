"""The process boundary between the JAX trainer and the PyTorch LLM sidecar. Imports numpy and pyyaml only.

Public API (what the hybrid training loop uses):

    from bridge import BridgeConfig, PromptRenderer, SidecarClient, PROMPT_FIELDS

    renderer = PromptRenderer.from_yaml("configs/prompts.yaml")     # system + context templates
    with SidecarClient(BridgeConfig(capacity=4096)) as client:      # creates the shared memory
        client.start(backend="mock", prompts=renderer)              # spawns `python -m llm_sidecar serve`
        # or: client.start(backend="transformers", prompts=renderer, model="smollm2", mode="score")
        prompts = renderer.render(fields, texts)   # fields: float32 [N, len(PROMPT_FIELDS)]; texts: headlines
        seq = client.submit(keys, prompts)      # never blocks
        answers = client.collect(timeout_s=0.0)    # oldest pending submission; unanswered rows → timeout
        answers.probs, answers.confidence, answers.status   # [N, 6], [N], [N] (STATUS_OK ... BACKEND_ERROR)
        if not client.alive:
            client.restart(wait=False)             # the trainer goes on without advice meanwhile

`submit` may run once more before `collect` (at most two pending): docs/design.md's one-step latency.
`parse_answer(text)` reads `ACTION | confidence | reason` answers; `client.stats()` has the counters.
"""

from bridge.client import ECHO_PEER_COMMAND, SIDECAR_COMMAND, Answers, BridgeConfig, SidecarClient, SidecarError
from bridge.parsing import DEFAULT_CONFIDENCE, ParsedAnswer, answer_probabilities, parse_answer
from bridge.prompts import DEFAULT_PROMPTS_PATH, PromptInstrument, PromptRenderer
from bridge.protocol import (
    ACTIONS,
    NUM_ACTIONS,
    PROMPT_FIELDS,
    STATUS_BACKEND_ERROR,
    STATUS_NAMES,
    STATUS_NO_VIEW,
    STATUS_OK,
    STATUS_PARSE_ERROR,
    STATUS_TIMEOUT,
)

__all__ = [
    "ACTIONS", "NUM_ACTIONS", "PROMPT_FIELDS", "STATUS_OK", "STATUS_PARSE_ERROR", "STATUS_TIMEOUT",
    "STATUS_BACKEND_ERROR", "STATUS_NO_VIEW", "STATUS_NAMES", "BridgeConfig", "SidecarClient", "SidecarError", "Answers",
    "PromptRenderer", "PromptInstrument", "DEFAULT_PROMPTS_PATH", "parse_answer", "ParsedAnswer", "answer_probabilities",
    "DEFAULT_CONFIDENCE", "SIDECAR_COMMAND", "ECHO_PEER_COMMAND",
]  # fmt: skip
