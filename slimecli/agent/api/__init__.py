"""The LLM API adapters the real CLIs talk to (Anthropic Messages, OpenAI Responses) over the rollout engine:
request fields, rendering, tool-call parsing and grammars, streaming, and the process that serves them."""
