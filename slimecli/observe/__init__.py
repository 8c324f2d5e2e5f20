"""Observability: per-step metrics (JSON lines, TensorBoard) and the progress bar."""
