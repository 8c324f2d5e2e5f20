"""HTTP plumbing the servers and clients share: JSON errors and body reading (server), retries (retry),
free ports (ports).

A low layer: it imports nothing else of slimecli, so the engine, the teacher, the reward client and the
agent adapters may all use it.
"""
