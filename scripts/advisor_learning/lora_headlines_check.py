"""The sidecar's LoRA learner on the embedded SmolLM2 without the trainer: one learning round on hand-made
outcomes whose market rose after bullish and fell after bearish news (the logic: experiments/lora_check.py).

    python scripts/advisor_learning/lora_headlines_check.py
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.lora_check import main

if __name__ == "__main__":
    raise SystemExit(main())
