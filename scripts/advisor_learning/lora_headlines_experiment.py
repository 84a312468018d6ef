"""Does the advisor get better by learning from trading outcomes? Hybrid runs on synthetic:headlines, then the
advisor alone walks the validation split frozen and learned (the logic: experiments/lora_headlines.py).

    python scripts/advisor_learning/lora_headlines_experiment.py --seeds 0 1 2 --splits val test
    python scripts/advisor_learning/lora_headlines_experiment.py --seeds 0 --updates 32 --every 4 --out /tmp/lora
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.lora_headlines import main

if __name__ == "__main__":
    raise SystemExit(main())
