"""Training building blocks: advantages, losses, checkpoints, HF export for weight sync."""
