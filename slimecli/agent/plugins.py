"""The agents and the rollout kind this package provides, declared lazily (slimecli.config.registry): nothing is
imported here. An agent is its CLI harness class, with the class of the API adapter that CLI talks to."""

from slimecli.config.registry import AGENTS, GENERATE_KINDS

AGENTS.builtin("claude_code", "slimecli.agent.harness.clis:ClaudeCodeHarness",
               adapter="slimecli.agent.api.anthropic:AnthropicAdapter")
AGENTS.builtin("codex", "slimecli.agent.harness.clis:CodexHarness", adapter="slimecli.agent.api.responses:ResponsesAdapter")
# rollout.generate=agent: every task worked by n agent runs, in sandboxes, graded by its tests
GENERATE_KINDS.builtin("agent", "slimecli.agent.training.collector:agent_collector")
