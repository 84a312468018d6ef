"""Agents: PPO (networks, normalisation, checkpoints, the training loop) and the hybrid LLM-advice parts."""
