"""Does thinking change the advice? Score mode against reason-then-score for the embedded SmolLM2 on the headlines
preset: direction accuracy on held-out prompts, LLM-only P&L on validation and test windows, prompts/s (the logic:
experiments/reasoning_compare.py).

    python scripts/advisor_learning/reasoning_compare.py --seeds 0 1 2 --prompts 64 --tokens 48 --walk-bars 600
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.reasoning_compare import main

if __name__ == "__main__":
    raise SystemExit(main())
