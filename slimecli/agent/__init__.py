"""Agent back-ends: LLM API adapters over the rollout engine, CLI harnesses, sandboxes and token capture."""
