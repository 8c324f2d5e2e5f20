"""A stand-in for the Claude Code CLI: one Messages request to the adapter it is pointed at, its text printed."""

from __future__ import annotations

SCRIPT = """#!{python}
import json, os, sys, urllib.request
body = {{"model": "slimecli", "max_tokens": {max_tokens}, "messages": [{{"role": "user", "content": sys.argv[sys.argv.index("-p") + 1]}}]}}
request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={{"content-type": "application/json",
                                          "x-api-key": os.environ["ANTHROPIC_API_KEY"]}})
reply = json.loads(urllib.request.urlopen(request, timeout={timeout_s}).read())
print("".join(block.get("text", "") for block in reply["content"]))
"""


def scripted_claude(python: str, max_tokens: int = 16, timeout_s: int = 120) -> str:
    """The script's text, run by ``python``; the prompt is the argument after -p, as the harness passes it."""
    return SCRIPT.format(python=python, max_tokens=max_tokens, timeout_s=timeout_s)
