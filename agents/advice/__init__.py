"""Advice on the device, inside the jitted rollout: the advice table keyed by market context and the choice of keys
to ask, fusion of the policy with the advice (learned trust gate, rules, switch), the risk veto, the entry rules that
bind an env to its advice, the acting step that combines them, and the rates of how the advice was used."""
