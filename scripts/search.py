"""A hyperparameter search whose trials are walk-forwards over the validation folds, whose winner is walked on the
held-out folds and deflated by every trial it tried (the logic: experiments/search.py; `--help` lists every flag;
docs/search.md). Needs optuna: pip install -e .[sweep].

    python scripts/search.py --config configs/signal.yaml --space configs/search/ppo.yaml --trials 16 --seeds 0-1 \
        --folds 4 --held-out 1 --out results/search/signal
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.search import main

if __name__ == "__main__":
    raise SystemExit(main())
