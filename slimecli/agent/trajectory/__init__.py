"""What the adapters record of a session (token trajectories that become samples) and what a run keeps of it."""
