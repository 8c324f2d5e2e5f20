"""The rollout kind and the reward this package provides, declared lazily (slimecli.config.registry): nothing is
imported here."""

from slimecli.config.registry import GENERATE_KINDS, REWARDS

# rollout.generate=single_turn: a factory fn(cfg, tokenizer, engines, source) -> an object with async collect()
GENERATE_KINDS.builtin("single_turn", "slimecli.rollout.driver:RolloutDriver")
REWARDS.builtin("quickstart", "slimecli.rollout.quickstart:quickstart_reward", inline=True)
