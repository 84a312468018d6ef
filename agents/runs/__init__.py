"""A run folder as other code reads and writes it: its orbax checkpoints (latest and best) and their manifests,
the lock that keeps one writer per folder, writes that fail cleanly, and restoring a saved policy with the config it
was trained with. Training writes run folders; evaluation and transfer read them."""
