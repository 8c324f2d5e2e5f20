"""`slimecli tasks synth`: SWE tasks made from any Python repository whose tests pass.

The repository's suite runs once at base with per-test coverage; functions the passing tests cover are broken
by small AST mutations, and a break is kept when it makes 1..K of those tests fail and leaves the rest passing.
Each kept break becomes a task whose base is the broken code and whose gold patch undoes it.

  source    SRC (a git checkout, a directory or an sdist archive) -> a clean tree, and the task repository
  mutate    the candidate bugs: one small, compilable edit of one covered line each
  probe     the pytest plugin that runs inside the task's sandbox: outcomes, messages, per-test coverage
  suite     running the suite (or some of its files) in the task's environment and sandbox
  rows      a kept bug -> its commit, gold patch, hidden tests and problem statement
  pipeline  the whole run: seeded order, --jobs workers, validation by `tasks check`, the output file
"""
