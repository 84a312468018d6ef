"""Throughput benchmark suites, run by `python scripts/benchmark.py SUITE ...` (the runner: benchmarks.cli). Each
suite module (env, train, hybrid, sb3, bridge, llm) exposes `run(opts: BenchOptions) -> list[dict]` and optionally
`markdown(rows) -> str` for its section of the report; benchmarks.common holds the shared options, repeated timing,
memory and machine facts. Suites import their heavy dependencies (JAX, torch, sb3-contrib) themselves, so a suite
whose stack is missing is skipped with the reason instead of breaking the others.
"""
