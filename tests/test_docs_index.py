"""The README's first screen and its index of the docs: what slimecli is and the two commands (the test command
the one `.ci/run` runs), every page of docs/ in one table and no second index, and a command that needs
something installed saying so on its line."""

from __future__ import annotations

import re

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_first_screen_says_what_slimecli_is_and_the_two_commands() -> None:
    first = "\n".join(README.splitlines()[:30])
    assert "slimecli is a declarative command line for reinforcement-learning post-training" in first
    assert re.search(r"^make train +# ", first, re.M) and re.search(r"^make test +# ", first, re.M)
    assert "wheelhouse" not in first and "gpu_check" not in first  # docs/gpu.md's business
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ",
                                                                                                               "cd "))]
    assert ci == ["make test"]  # the README's test command, as it is written there


def test_the_documentation_table_lists_every_page_of_docs() -> None:
    table = README[README.index("## Documentation"):]
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)\)", table))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert linked == pages, f"missing: {sorted(pages - linked)}, gone: {sorted(linked - pages)}"
    assert not (ROOT / "docs" / "README.md").exists()  # one index: the README's table


# What a command line asks for that a plain install on a lone machine lacks: an agent CLI, an extra, a server.
NEEDS = (r"\+recipe=swe_agent", r"\benv=(?:reasoning_gym|verifiers|openenv|skyrl_gym)\b", r"\bteacher\.url=",
         r"\btrainer=megatron\b", r"\brollout=sglang\b")


def test_a_readme_command_that_needs_something_says_so() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    silent = [line for block in blocks for line in block.splitlines()
              if re.match(r"(?:[A-Z_]+=\S+ )?slimecli (?:train|plan)\b", line)
              and any(re.search(pattern, line.split("#")[0]) and "needs" not in line.partition("#")[2]
                      for pattern in NEEDS)]
    assert not silent, silent
