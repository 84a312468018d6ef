"""The placebo battery of the one sequential test behind the advice's record and the agent's gate (the logic:
experiments/evidence_battery.py; `--help` lists every flag).

    python scripts/evidence_battery.py --json docs/results/evidence-battery/battery.json
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from experiments.evidence_battery import main

if __name__ == "__main__":
    raise SystemExit(main())
