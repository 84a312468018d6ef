"""Train a PPO agent on the futures-trading env with thousands of envs in one jitted program
(the logic: agents/training/cli.py; `--help` lists every flag).

    python scripts/train.py --envs 4096
    python scripts/train.py --config configs/signal.yaml --seed 1 --set ppo.lr=1e-4
    python scripts/train.py --resume runs/20250101-120000
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from agents.devices.distributed import join_from_argv

join_from_argv()  # several processes (--coordinator ...): before any import initialises a JAX backend

from agents.training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
