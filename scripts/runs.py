"""Training runs side by side, out of sample (the logic: agents/evaluation/runs_table.py; `--help` lists every flag).

    python scripts/runs.py                          # every run under runs/
    python scripts/runs.py runs/a runs/b --json runs.json
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from agents.evaluation.runs_table import main

if __name__ == "__main__":
    raise SystemExit(main())
