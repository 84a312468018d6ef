"""Bridge benchmark: round trip of N prompts x 512 bytes through shared memory with an echoing peer process,
plus prompt rendering. Run as `python scripts/benchmark.py bridge --json PATH`."""

from __future__ import annotations

import numpy as np

from benchmarks.common import BenchOptions, cpu_model, table, timed_repeats
from bridge import ECHO_PEER_COMMAND, BridgeConfig, PromptRenderer, SidecarClient
from llm_sidecar.__main__ import example_fields  # numpy only: torch is not imported

PROMPT_BYTES = 512
TARGET_MS = 1.0  # issue 4: 4096 prompts x 512 bytes in <= 1 ms


def run(opts: BenchOptions) -> list[dict]:
    counts = opts.envs or ([4096] if opts.quick else [256, 4096])
    reps = max(opts.reps, 20 if opts.quick else 100)  # a round trip takes ~1 ms; many reps steady the median
    results = []
    for n in counts:
        prompts = np.strings.ljust(np.array([b"prompt %07d |" % i for i in range(n)]), PROMPT_BYTES, b"x")
        as_list = prompts.tolist()
        keys = np.arange(n, dtype=np.int32)
        with SidecarClient(BridgeConfig(capacity=n, max_prompt_bytes=PROMPT_BYTES, reason_bytes=16)) as client:
            client.start(command=ECHO_PEER_COMMAND)
            for kind, batch in (("bytes_array", prompts), ("list_of_bytes", as_list)):
                def round_trip(batch=batch):
                    client.submit(keys, batch)
                    answers = client.collect(timeout_s=5.0)
                    assert answers.counts()["ok"] == n

                timing = timed_repeats(round_trip, reps, warmup=5)
                results.append({
                    "suite": "bridge", "case": "round_trip", "prompts": n, "prompt_bytes": PROMPT_BYTES,
                    "input": kind, "round_trip_ms": timing["median_s"] * 1e3, "target_ms": TARGET_MS,
                    "prompts_per_s": n / timing["median_s"],
                    "cpu": cpu_model(), **timing,
                })  # fmt: skip
        renderer = PromptRenderer.from_yaml()
        fields, texts = example_fields(n)
        timing = timed_repeats(lambda: renderer.render(fields, texts), reps, warmup=2)
        results.append({
            "suite": "bridge", "case": "render", "prompts": n, "render_ms": timing["median_s"] * 1e3,
            "prompts_per_s": n / timing["median_s"],
            "mean_prompt_bytes": float(np.mean([len(p) for p in renderer.render(fields, texts)])), **timing,
        })  # fmt: skip
    return results


def markdown(rows: list[dict]) -> str:
    ms = lambda r: f"{r['median_s'] * 1e3:.2f} [{r['min_s'] * 1e3:.2f}–{r['max_s'] * 1e3:.2f}]"  # noqa: E731
    trips = [r for r in rows if r["case"] == "round_trip"]
    renders = [r for r in rows if r["case"] == "render"]
    return "\n\n".join([
        f"Prompts of {PROMPT_BYTES} bytes round trip through shared memory to an echoing peer process (target "
        f"≤ {TARGET_MS:g} ms for 4096), from a numpy bytes array or a Python list of bytes (which adds packing); "
        "rendering prompt text from numeric fields.",
        table(trips, [("prompts", lambda r: r["prompts"]), ("input", lambda r: r["input"]),
                      ("round trip ms [min–max]", ms), ("prompts/s", lambda r: r["prompts_per_s"]),
                      ("reps", lambda r: r["reps"])]),
        table(renders, [("prompts", lambda r: r["prompts"]), ("render ms [min–max]", ms),
                        ("mean prompt bytes", lambda r: r["mean_prompt_bytes"]), ("reps", lambda r: r["reps"])]),
    ])  # fmt: skip
