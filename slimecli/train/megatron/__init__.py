"""trainer=megatron: the megatron-core policy back-end (policy.py) and its vocab-parallel log-probs."""
