"""A/B behind a findings line (docs/findings.md): the SmolLM2 sidecar at nice 19 (the default) or in the OS's idle
scheduling class (chrt -i), empty store, 4,096 envs, hybrid and RL-only updates alternating (benchmarks.hybrid).

    python docs/results/sidecar-sched-idle/ab.py nice19,idle,nice19,idle 8    # variants, timed updates each
"""
import json
import subprocess
import sys
from pathlib import Path

import benchmarks.hybrid as H
from agents.config import load_config
from agents.training.env_setup import make_env_setup

POLICY = {"v": "nice19"}


class Loop(H.QueryLoop):
    """The benchmark's query loop, its sidecar moved to SCHED_IDLE (every thread) once started, for variant `idle`."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if POLICY["v"] == "idle":
            for pid in self.client.sidecar_pids:
                subprocess.run(["chrt", "-a", "-i", "-p", "0", str(pid)], check=True)


H.QueryLoop = Loop
rl_cfg = load_config(None, H.base_overrides(256, 64) + ["llm=none"])
setup = make_env_setup(rl_cfg.env_name, rl_cfg.env, rl_cfg.data, rl_cfg.checkpoint.eval_episodes)
out = []
for variant in sys.argv[1].split(","):
    POLICY["v"] = variant
    row = {"variant": variant, **H.time_hybrid(H.ADVISORS["smollm2"], 4096, 64, int(sys.argv[2]), setup,
                                                ["hybrid.store="])}
    print({k: row[k] for k in ("variant", "ratio", "answers_per_s", "steps_per_s", "rl_only_steps_per_s")}, flush=True)
    out.append(row)
json.dump(out, open(Path(__file__).with_name("ab.json"), "w"), indent=1, default=float)
