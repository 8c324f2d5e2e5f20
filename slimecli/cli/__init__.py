"""The typer command line: one module per command family, each exposing register(app)."""
