"""Evaluation: baseline policies, walks of a split with the advisor (and its ablations), scoring a run's agent,
the end-of-run comparison, evaluating a saved run from its checkpoint, and the reports (tables, plots)."""
