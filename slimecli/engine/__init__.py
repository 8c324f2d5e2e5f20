"""slimecli's embedded rollout engine: SGLang's native HTTP API over any HF causal LM, on CPU or one GPU.

Continuous batching: a scheduler thread prefills arriving requests, merges them into the running batch's
KV cache and decodes one token for every running request per step.
"""
