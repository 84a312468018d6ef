"""Fill the advice store ahead of training: the advisor answers every key (bar block × position side) of a data
file's splits once, so training, evaluation and experiments on that data start with advice in force everywhere
(the logic: agents/advisor/fill.py; `--help` lists every flag). Ctrl-C saves; the same command continues.

    python scripts/advise.py                                   # the default market, SmolLM2, every split
    python scripts/advise.py --data my_bars.csv --splits train --llm /path/to/model
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from agents.advisor.fill import main

if __name__ == "__main__":
    raise SystemExit(main())
