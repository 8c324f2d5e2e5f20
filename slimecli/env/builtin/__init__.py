"""Environments slimecli ships, written to its native protocol (examples for `docs/environments.md`)."""
