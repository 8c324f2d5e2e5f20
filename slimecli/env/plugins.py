"""The rollout kind, the reward and the built-in environments this package provides, declared lazily
(slimecli.config.registry): nothing is imported here."""

from slimecli.config.registry import ENVIRONMENTS, GENERATE_KINDS, REWARDS

# rollout.generate=env: episodes of the run's environment(s), tokens in and tokens out (implied by env=...)
GENERATE_KINDS.builtin("env", "slimecli.env.rollout:env_collector")
# reward=env: the environment's own reward, which the episode carries (implied by env=...)
REWARDS.builtin("env", "slimecli.env.reward:env_reward", inline=True)
# env=native env.id=NAME
ENVIRONMENTS.builtin("lookup", "slimecli.env.builtin.lookup:LookupEnv")
