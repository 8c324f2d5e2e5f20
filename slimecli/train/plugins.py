"""The advantage estimators and policy losses this package provides, declared lazily (slimecli.config.registry):
nothing is imported here, so validating a config never imports torch."""

from slimecli.config.registry import ADVANTAGE_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES

# whiten: the trainer whitens the advantages over the batch's valid tokens after the OPD term
ADVANTAGE_ESTIMATORS.builtin("grpo", "slimecli.train.advantages:grpo", whiten=False)
ADVANTAGE_ESTIMATORS.builtin("reinforce_plus_plus", "slimecli.train.advantages:reinforce_plus_plus", whiten=True)
ADVANTAGE_ESTIMATORS.builtin("reinforce_plus_plus_baseline", "slimecli.train.advantages:reinforce_plus_plus_baseline",
                             whiten=True)
# critic: the trainer builds trainer.critic and hands the estimator its values
ADVANTAGE_ESTIMATORS.builtin("gae", "slimecli.train.advantages:gae", whiten=True, critic=True)
POLICY_LOSSES.builtin("ppo_clip", "slimecli.train.losses:ppo_clip")
POLICY_LOSSES.builtin("cispo", "slimecli.train.losses:cispo")
OFF_POLICY_CORRECTIONS.builtin("tis", "slimecli.train.off_policy:tis")
OFF_POLICY_CORRECTIONS.builtin("mis", "slimecli.train.off_policy:mis")
OFF_POLICY_CORRECTIONS.builtin("icepop", "slimecli.train.off_policy:icepop")
OFF_POLICY_CORRECTIONS.builtin("decoupled_ppo", "slimecli.train.off_policy:decoupled_ppo")
