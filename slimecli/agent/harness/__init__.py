"""The agent CLIs themselves: pinned installs, their lifecycle in a sandbox, and one task run end to end."""
