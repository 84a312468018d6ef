"""Devices and processes: the GPUs the advisor may use and JAX's share of their memory (gpus, imported before JAX
starts), the env mesh over local devices and the processes of a multi-host run (parallel), joining a
`jax.distributed` run from the command line (distributed). Nothing here is imported at package level, so
`agents.devices.gpus` stays importable without JAX."""
