"""One training update, built in one place (docs/design.md, "One training update, as data flows"): the rollout of T
steps and PPO's learning step as one jitted program, compiled ahead of the first update. An advisor plugs in around
it (agents.advisor.query_loop.QueryLoop): its query step before the program, its host work while the program runs
(rendering and sending the picked keys' prompts, outcomes for learning), its figures after. Without one (`--llm
none`) the program runs alone: the fastest path.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from agents.rl.ppo import PPO, RunnerState


class Advisor(Protocol):
    """What an update asks of an advisor plugged into it."""

    def before(self, rs: RunnerState) -> RunnerState: ...  # the query step: answers in, keys picked

    def during(self) -> None: ...  # host work while the device runs the program

    def after(self, rs: RunnerState, stats: dict) -> dict: ...  # its metrics, from the rollout's advice sums


class Update:
    """`update(rs) -> (rs, metrics)`: one PPO update with its advisor's work around it; metrics on the host. The
    market (`env_params`) is the program's argument, not a constant compiled into it."""

    def __init__(self, ppo: PPO, num_steps: int, env_params: Any, advisor: Advisor | None = None):
        def program(rs: RunnerState, env_params):
            rs, traj = ppo.rollout_chunk(rs, num_steps, env_params)
            # how the advice was used, summed over the rollout (none without an acting interface)
            stats = {} if traj.extras is None else jax.tree.map(jnp.sum, traj.extras.stats)
            rs, metrics = ppo.learn(rs, traj)
            return rs, metrics, stats

        self.advisor = advisor
        self.env_params = env_params
        self.program: Any = jax.jit(program)  # compiled at the first update, or ahead by compile()
        self._program = program
        self.compile_s = math.nan

    def compile(self, state: RunnerState, shardings: Any) -> Update:
        """Compiles the program ahead, for the run's layout (RL only: a hybrid run's first query step lays out its
        advice table first), so that the first update's time is a real one."""
        t0 = time.perf_counter()
        self.program = jax.jit(self._program, out_shardings=(shardings, None, None)).lower(
            state, self.env_params).compile()
        self.compile_s = time.perf_counter() - t0
        return self

    def __call__(self, rs: RunnerState) -> tuple[RunnerState, dict]:
        if self.advisor is not None:
            rs = self.advisor.before(rs)
        rs, metrics, stats = self.program(rs, self.env_params)
        if self.advisor is not None:
            self.advisor.during()  # dispatched: the host works while the device runs
        metrics, stats = jax.device_get((metrics, stats))
        metrics = dict(metrics)
        if self.advisor is not None:
            metrics.update(self.advisor.after(rs, stats))
        return rs, metrics
