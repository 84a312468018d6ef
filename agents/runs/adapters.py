"""Where the advisor's LoRA adapters live in a run folder: the one a run starts from (`--llm-adapter`) and the
one it had learned by each checkpoint (RUN_DIR/adapters/<update>/), pruned with the checkpoints they belong to."""

from __future__ import annotations

import shutil
from pathlib import Path

from agents.config import HybridConfig

ADAPTERS_DIR = "adapters"  # RUN_DIR/adapters/<update>/: the advisor's learned LoRA adapter at each checkpoint


def adapter_dir(run_dir: str | Path, update: int) -> Path:
    return Path(run_dir) / ADAPTERS_DIR / str(int(update))


def starting_adapter(hybrid: HybridConfig) -> str | None:
    """The LoRA adapter the advisor starts from (--llm-adapter), or None for the base model."""
    return hybrid.sidecar.adapter or None


def checkpoint_adapter(hybrid: HybridConfig, run_dir: str | Path, update: int) -> str | None:
    """The adapter the advisor answered with at checkpoint `update`: the one learned by then (saved beside the
    checkpoint), else the one it started from."""
    learned = adapter_dir(run_dir, update)
    if (learned / "adapter_config.json").exists():
        return str(learned)
    return starting_adapter(hybrid)


def prune_adapters(run_dir: Path, keep: set[int]) -> None:
    """Removes saved adapters whose checkpoint is gone (orbax keeps the last K and the best)."""
    root = Path(run_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.name.isdigit() and int(path.name) not in keep:
            shutil.rmtree(path, ignore_errors=True)
