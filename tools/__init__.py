"""Developer tools: they regenerate files that ship in the package (python -m tools.NAME); never imported by it."""
