"""Scoring a training run's agent on a split the way it acts, during training (validation every M updates picks the
best checkpoint) and at its end (training.comparison): the trading env's agent through the one walk every agent
takes (an `AdvisedWalker`: the policy alone, or with the run's advisor), whole or one ablation at a time; any other
gymnax env through the env setup's episode evaluator."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax

from agents.config import HybridConfig
from agents.evaluation.advised_walk import ABLATIONS, RL_ONLY, AdvisedWalker, advised_summary, run_ablations
from agents.evaluation.policies import Evaluator
from agents.rl.ppo import PPO, RunnerState
from agents.training.env_setup import EnvSetup
from jaxenv.config import DataConfig, EnvConfig
from jaxenv.metrics import walk_metrics


class AgentEvaluator:
    """Scores a run's network on a split the way the run acts. `ablation` (a key of
    agents.evaluation.advised_walk.run_ablations(hybrid)) scores one part of a hybrid agent."""

    def __init__(self, ppo: PPO, setup: EnvSetup, hybrid: HybridConfig, llm: str, env: EnvConfig, data: DataConfig,
                 adapter_for: Callable[[int], str | None] | None = None, log_dir: Path | None = None, *,
                 normalize_obs: bool, greedy: bool, progress: bool):
        """The run's `ppo` (agents.rl.ppo.PPO) in its env `setup`, with the run's config sections; `normalize_obs`:
        ppo.normalize_obs; `greedy`: checkpoint.eval_deterministic; `progress`: log.progress (an advised walk shows
        its own progress line). `adapter_for(update)`: the advisor's LoRA adapter at that update, for runs whose
        advisor learns. `log_dir`: where the walks' advisor logs (the run folder), instead of stderr under the
        progress bar."""
        self.setup = setup
        self.rules = env.prop_firm
        # the network alone, where no walker walks (an account: every head under its sequential mask, in order)
        self.act = setup.agent_act(ppo, normalize_obs=normalize_obs, greedy=greedy)
        self.advised = llm != "none" and hybrid.eval_with_advice  # walks ask the advisor and act fused
        self.adapter_for = adapter_for if hybrid.learning.enabled else None
        self.ablations = run_ablations(hybrid) if llm != "none" else {}
        self.walker = None if setup.market is None else AdvisedWalker(
            hybrid, llm, data, ppo, setup.env, setup.market, log_dir=log_dir, progress=progress,
            normalize_obs=normalize_obs, greedy=greedy)
        self.account = None  # an account with an advisor: its walks with advice, and its two ablations
        if setup.market_set is not None and llm != "none":
            from agents.evaluation.account_run import ACCOUNT_ABLATIONS, AdvisedAccountWalks

            self.ablations = {k: v for k, v in self.ablations.items() if k in ACCOUNT_ABLATIONS}
            self.account = AdvisedAccountWalks(ppo, setup, hybrid, llm, env, data, normalize_obs=normalize_obs,
                                               greedy=greedy, progress=progress)

    def splits(self) -> dict[str, Evaluator]:
        return {k: v for k, v in (("val", self.setup.evaluate), ("test", self.setup.evaluate_test)) if v is not None}

    def __call__(self, state: RunnerState, split: str, key: jax.Array, ablation: str | None = None) -> dict:
        if self.account is not None:  # an account with its advisor: advised, or one ablation
            return self.account(state, split, key, ablation if ablation else None if self.advised else RL_ONLY)
        if self.walker is None:  # a gymnax env without bars to walk, or an account's walk alone (its env setup's)
            return self.splits()[split](self.act, (state.params, state.obs_norm), key)
        changes = dict(self.ablations[ablation]) if ablation else {} if self.advised else dict(ABLATIONS[RL_ONLY])
        if self.adapter_for is not None and "adapter" not in changes:
            changes["adapter"] = self.adapter_for(int(state.update))
        record = state.hybrid.record if state.hybrid is not None else None  # the advice's record so far
        trace = self.walker.walk(state.params, state.obs_norm, split, key, record=record, **changes)
        market = self.setup.market
        if self.advised or ablation:
            result = advised_summary(trace, market.timestamps, self.rules, market.sessions.day)
        else:  # the policy alone: the figures of its walk, no advice to count
            result = walk_metrics(trace, market.timestamps, self.rules, market.sessions.day)
        return {"score": result["net_pnl"], **result}

    def close(self) -> None:
        if self.walker is not None:
            self.walker.close()
