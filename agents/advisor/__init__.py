"""The advisor loop on the host: between jitted chunks a query step selects envs, renders their prompts and
exchanges them with the LLM sidecar (`link`); `query_loop` runs the hybrid update; `outcomes` measures what
followed each answer for advisor learning; `adapters` keeps the learned LoRA adapters beside checkpoints."""
