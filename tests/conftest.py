"""Fixtures shared by the tests. Helpers (run the CLI, free ports, waiting) live in tests/helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import free_port


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly created tiny model directory (seed 0), shared by the tests that only read it."""
    from slimecli.model.tiny import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="session")
def tok(tiny: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))
