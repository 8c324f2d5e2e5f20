"""Launching: process specs, torchrun commands, the run directory, and the supervisor."""
