"""Has a learned advisor picked up the headline's direction? Scores bullish and bearish headline prompts with the
base SmolLM2 and each adapter given (the logic: experiments/lora_probe.py).

    python scripts/advisor_learning/lora_direction_probe.py results/lora_headlines/runs/seed0/adapters/6
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.lora_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
