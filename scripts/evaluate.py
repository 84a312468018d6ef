"""Evaluate a trained run from its checkpoint against baselines on the same bars, with reports
(the logic: agents/evaluation/cli.py; `--help` lists every flag).

    python scripts/evaluate.py --run-dir runs/x                          # best checkpoint, test split, greedy
    python scripts/evaluate.py --run-dir runs/x --checkpoint 40 --split val --json val.json
    python scripts/evaluate.py --run-dir runs/s0 --run-dir runs/s1 --run-dir runs/s2   # training seeds pooled
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from agents.evaluation.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
