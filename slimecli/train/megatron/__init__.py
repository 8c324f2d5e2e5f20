"""trainer=megatron: the megatron-core back-end (policy.py), its HF converter, vocab-parallel log-probs and CPU shim."""
