"""What a run asks of its sidecar processes: how many advisor workers, the backend and its flags (`python -m
llm_sidecar serve`) for each, and the LoRA learner's options when the advisor learns from outcomes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from agents.advisor.numeric_mock import NumericMock, reads_fields
from agents.advisor.workers import AdvisorPool
from agents.config import ConfigError, HybridConfig
from agents.devices.gpus import visible_gpus
from agents.runs.adapters import starting_adapter
from bridge import BridgeConfig, PromptRenderer


def at_full_rate(hybrid: HybridConfig) -> HybridConfig:
    """The run's advisor settings at every core and normal priority: for work nothing else runs beside (a fill, an
    evaluation's walks); a training run's default is 1 thread at nice 19, the cores the trainer leaves."""
    sidecar = dataclasses.replace(hybrid.sidecar, threads=os.cpu_count() or 1, nice=0)
    return dataclasses.replace(hybrid, sidecar=sidecar)


def learning_options(hybrid: HybridConfig, seed: int) -> dict | None:
    """What the sidecar's LoRA learner gets (bridge.learning.LearningOptions fields and a seed), or None."""
    learning = hybrid.learning
    if not learning.enabled:
        return None
    return {**learning.options(), "seed": seed}


def sidecar_options(hybrid: HybridConfig, llm: str, adapter: str | None = None) -> tuple[str, dict]:
    """The backend and flags `SidecarClient.start` passes to `python -m llm_sidecar serve`; `adapter` replaces
    the run's starting adapter (a checkpoint's learned one)."""
    h = hybrid
    if llm == "mock":
        return "mock", {"latency_s": h.mock.latency_s or None, "answers": h.mock.answers}
    model = "smollm2" if llm == "smollm2" else llm
    adapter = adapter or starting_adapter(hybrid)
    if adapter and not Path(adapter).is_dir():
        raise ConfigError(f"hybrid.sidecar.adapter: no LoRA adapter directory at {adapter}")
    return "transformers", {
        "model": model,
        "mode": h.sidecar.mode,
        "quantize": None if h.sidecar.quantization == "none" else h.sidecar.quantization,
        "lora": adapter,
        "threads": h.sidecar.threads,
        "batch_size": h.sidecar.batch_size,
    }


def worker_count(hybrid: HybridConfig, llm: str, most: int) -> int:
    """Advisor workers for a link that asks at most `most` prompts per query step: `hybrid.sidecar.workers`, where
    auto = one per GPU (1 on CPU, for the mock advisor, and when the advisor learns: one learner)."""
    workers = hybrid.sidecar.workers
    if workers == "auto":
        n = 1 if llm == "mock" or hybrid.learning.enabled else max(visible_gpus(), 1)
    else:
        n = int(workers)
    return max(1, min(n, most))


def worker_options(hybrid: HybridConfig, llm: str, n: int, adapter: str | None = None) -> list[tuple[str, dict]]:
    """The backend and flags of each of `n` workers: the run's sidecar options, worker i on GPU i (round robin)
    when there are GPUs, at the run's OS niceness."""
    backend, options = sidecar_options(hybrid, llm, adapter)
    gpus = visible_gpus() if backend == "transformers" else 0
    nice = hybrid.sidecar.nice or None
    return [(backend, {**options, "nice": nice, **({"device": f"cuda:{i % gpus}"} if gpus else {})})
            for i in range(n)]


def start_advisor(hybrid: HybridConfig, llm: str, renderer: PromptRenderer, texts: list[str] | None, capacity: int,
                  adapter: str | None = None, log_stem: Path | None = None,
                  learning: dict | None = None) -> AdvisorPool | NumericMock:
    """The run's advisor, ready to answer submissions of up to `capacity` keys: the mock answering from the prompt
    fields in this process (reads_fields), or the sidecar workers answering rendered prompts over the bridge."""
    if reads_fields(hybrid, llm):
        return NumericMock(hybrid.mock.answers, renderer, texts)
    options = worker_options(hybrid, llm, worker_count(hybrid, llm, capacity), adapter)
    return AdvisorPool.start(options, BridgeConfig(capacity=capacity), log_stem, prompts=renderer, learning=learning)
