"""What a run asks of its sidecar process: the backend and its flags (`python -m llm_sidecar serve`), and the
LoRA learner's options when the advisor learns from outcomes."""

from __future__ import annotations

from pathlib import Path

from agents.advisor.adapters import starting_adapter
from agents.config import ConfigError


def learning_options(cfg) -> dict | None:
    """What the sidecar's LoRA learner gets (bridge.learning.LearningOptions fields and a seed), or None."""
    learning = cfg.hybrid.learning
    if not learning.enabled:
        return None
    return {**learning.options(), "seed": cfg.seed}


def sidecar_options(cfg, adapter: str | None = None) -> tuple[str, dict]:
    """The backend and flags `SidecarClient.start` passes to `python -m llm_sidecar serve`; `adapter` replaces
    the run's starting adapter (a checkpoint's learned one)."""
    h = cfg.hybrid
    if cfg.llm == "mock":
        return "mock", {"latency_s": h.mock_latency_s or None, "mock_answers": h.mock_answers}
    model = "smollm2" if cfg.llm == "smollm2" else cfg.llm
    adapter = adapter or starting_adapter(cfg)
    if adapter and not Path(adapter).is_dir():
        raise ConfigError(f"hybrid.llm_adapter: no LoRA adapter directory at {adapter}")
    return "transformers", {
        "model": model,
        "mode": h.llm_mode,
        "quantize": None if h.quantization == "none" else h.quantization,
        "lora": adapter,
        "threads": h.sidecar_threads,
        "batch_size": h.sidecar_batch_size,
    }
