"""SWE tasks: task rows, the built-in task sets, fresh workspaces for the agent, and grading."""
