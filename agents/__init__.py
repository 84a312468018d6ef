"""The agent side of the gym, one concern per sub-package:

- `agents.rl`: the RL core (networks, observation normaliser, PPO); it imports nothing from the advice packages;
- `agents.advice`: advice on the device, inside the jitted rollout (advice table, fusion, risk veto, acting);
- `agents.advisor`: the advisor loop on the host (query steps, the sidecar link, outcomes, adapters);
- `agents.evaluation`: scoring policies, hybrid agents and saved runs on a split, and their reports;
- `agents.training`: a training run (the host loop, env set-up, checkpoints, metrics, transfer);
- `agents.config`: the run's typed config, shared by all of them.
"""
