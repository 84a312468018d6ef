"""Trains arms × seeds of a config and reports each arm's test P&L, Sharpe, drawdown, trust and coverage with
bootstrap 95% intervals and paired differences against rl_only (the logic: experiments/fusion.py).

    python scripts/experiment.py --config configs/headlines.yaml --arms rl_only,news,random,shuffled --seeds 0-4 \
        --json docs/results/experiment-fusion-10-seeds/experiment.json --runs results/experiment-fusion/runs
    python scripts/experiment.py --quick --json /tmp/quick/experiment.json     # 2 seeds, tiny runs
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.fusion import main

if __name__ == "__main__":
    raise SystemExit(main())
