"""Trade a trained run on bars as they arrive: a replay of a file, or --follow for rows appended to it; paper broker,
decisions identical to evaluation (the logic: agents/trading/cli.py; `--help` lists every flag).

    python scripts/trade.py --run-dir runs/x --data bars.csv
    python scripts/trade.py --run-dir runs/x --data live.csv --follow
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from agents.trading.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
