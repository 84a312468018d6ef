"""The advisor loop on the host: a query step collects answers into the advice table, picks the keys (bar block,
position side) to ask and exchanges their prompts with the LLM sidecar (`link`); `query_loop` runs the hybrid update;
`store` keeps the answers on disk and `fill` fills it ahead of training (scripts/advise.py); `outcomes` measures what
followed each answered key for advisor learning; `adapters` keeps the learned LoRA adapters beside checkpoints."""
