"""Teacher server: TP-sharded log-probs and sampling over HTTP, and the client the trainer uses."""
