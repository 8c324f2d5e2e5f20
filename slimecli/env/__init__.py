"""RL environments: the native multi-turn protocol, adapters for the hubs' libraries (verifiers, OpenEnv,
skyrl-gym, reasoning-gym) and the environment rollout (rollout.generate=env).

Not to be confused with a SWE task's environment (task.environment, slimecli/swe/env/): the interpreter and
packages an agent's task runs with.
"""
