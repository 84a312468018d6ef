"""The RL core: actor-critic networks, the observation normaliser, PPO (`make_train` → pure, jitted update) and
the optimiser's freeze warm-up. Nothing here imports the advice or advisor packages: a hybrid run hands PPO an
acting object (agents.advice.acting.HybridActing) and, for learned fusion, the trust gate module."""
