"""Walk-forward evaluation: train every fold of whole sessions, choose each fold's checkpoint on its own validation
window, walk its test window; the test windows back to back are one out-of-sample path (the logic:
experiments/walkforward.py; `--help` lists every flag; docs/evaluation.md#walk-forward).

    python scripts/walkforward.py --config configs/signal.yaml --seeds 0-4 --folds 4 --out results/walk-forward/signal
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.walkforward import main

if __name__ == "__main__":
    raise SystemExit(main())
