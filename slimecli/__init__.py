"""slimecli: a declarative command line for RL post-training of language models."""

__version__ = "0.1.0"
