"""HTTP plumbing the servers and clients share: JSON errors, body limits and strict body reading (server),
bearer-token auth (auth), connection limits and read timeouts (listen), paths named in requests (paths),
retries (retry), free ports (ports).

A low layer: it imports nothing else of slimecli, so the engine, the teacher, the reward client and the
agent adapters may all use it.
"""
