"""`slimecli model init DIR`: write the tiny model's HF checkpoint directory explicitly."""

from __future__ import annotations

import typer

from slimecli.cli.common import command_group


def register(app: typer.Typer) -> None:
    model_app = command_group(app, "model", "The policy model: create the built-in tiny model.")

    @model_app.command("init", epilog="""[bold]Examples[/]

  slimecli model init runs/tiny-model

  slimecli model init /tmp/tiny --seed 3 --hidden-size 128 --num-layers 4""")
    def init(directory: str = typer.Argument(..., help="Directory to create (must be empty or absent)."),
             seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
             hidden_size: int = typer.Option(64, "--hidden-size"),
             num_layers: int = typer.Option(2, "--num-layers"),
             num_heads: int = typer.Option(4, "--num-heads"),
             num_kv_heads: int = typer.Option(2, "--num-kv-heads"),
             intermediate_size: int = typer.Option(128, "--intermediate-size"),
             max_position_embeddings: int = typer.Option(65536, "--max-position-embeddings")) -> None:
        """Create a tiny Qwen3-architecture checkpoint (config, safetensors, fast tokenizer, chat template)."""
        from pathlib import Path

        from slimecli.cli.common import fail

        out = Path(directory)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            fail(f"{out}: exists and is not an empty directory")
        from slimecli.model.tiny import create_tiny_model

        try:
            create_tiny_model(out, seed=seed, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                              num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                              max_position_embeddings=max_position_embeddings)
        except ValueError as exc:
            fail(str(exc))
        typer.echo(f"tiny model written to {out} (seed {seed}); use it with model.path={out}")

