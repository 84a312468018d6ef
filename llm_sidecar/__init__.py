"""The PyTorch side: a process that answers rendered prompts with action probabilities. Never imports jax.

Spawned by bridge.SidecarClient.start() as `python -m llm_sidecar serve ...`; try a backend by hand with
`python -m llm_sidecar ask --backend transformers --model smollm2 -n 8`. Backends live in
llm_sidecar.backends (mock, transformers), model resolution in llm_sidecar.models, the loop in .server.
"""
