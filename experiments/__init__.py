"""The advisor-learning experiments: does the LLM advisor get better by learning (LoRA) from trading outcomes?
lora_headlines runs the whole experiment (hybrid runs on synthetic:headlines, then the advisor alone walks the
validation split frozen and learned), lora_probe scores the direction probe's bullish and bearish headlines,
lora_replay tabulates and replays a run's saved experiences, and lora_check tries the learner alone on hand-made
outcomes. Each module has a `main(argv=None)`; the commands are under scripts/advisor_learning/.
"""
