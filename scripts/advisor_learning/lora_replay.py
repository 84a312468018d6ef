"""What did the advisor's outcomes teach? Tabulates the experiences saved beside a run's adapters and, with --learn,
replays a learning round on them (the logic: experiments/lora_replay.py).

    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6
    python scripts/advisor_learning/lora_replay.py results/lora_headlines/runs/seed0/adapters/6 --learn --walk
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.lora_replay import main

if __name__ == "__main__":
    raise SystemExit(main())
