"""Agent runs as a rollout kind of the trainer (rollout.generate=agent)."""
