"""Sandboxes: where agent CLIs and graders run (bubblewrap isolation, a plain local subprocess, containers)."""
