"""A training run: the host loop over jitted updates, the environment set-up, checkpoints, restoring saved
runs, the metrics log and health checks, and starting from another run's networks (transfer)."""
