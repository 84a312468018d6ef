r"""Throughput benchmarks: runs the suites in benchmarks/ (the runner: benchmarks/cli.py; `--help` lists every flag).

    python scripts/benchmark.py env --envs 256,1024,4096 --json results/env.json
    python scripts/benchmark.py env train --quick
    python scripts/benchmark.py all --markdown BENCHMARKS.md --json docs/results/benchmarks.json \
        --plot docs/results/benchmarks.png
    python scripts/benchmark.py --from-json docs/results/benchmarks.json --markdown BENCHMARKS.md   # re-render
"""

from agents.devices.gpus import leave_gpu_memory_to_advisor

leave_gpu_memory_to_advisor()  # before any import starts JAX's backend: the advisor shares the GPUs

from benchmarks.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
