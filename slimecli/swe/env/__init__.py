"""Task environments: the interpreter and packages a task's agent and its grader share.

A repository's tests need its dependencies, and a sandbox has no network to install them. So an environment
is made outside the sandbox, before the task runs, and shown to the sandbox read-only:

  spec      what goes into a task's environment (its kind, the dependency files, the row's `install`), and
            the cache key of all of it
  build     making one venv with pip or uv, logged to a file
  store     the cache: one directory per key, built at most once at a time, listed and pruned
  resolve   the environment of one task (building it when missing), and the sandboxes that use it
"""
