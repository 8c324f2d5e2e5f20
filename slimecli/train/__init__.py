"""The trainer worker: the loop and its stages, the coordinator, back-ends, losses, advantages, weight sync."""
