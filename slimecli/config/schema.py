"""The whole run config: one field per group, each a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimecli.config.decode import spec
from slimecli.config.groups.agent import AgentConfig
from slimecli.config.groups.cluster import ClusterConfig
from slimecli.config.groups.env import EnvConfig
from slimecli.config.groups.eval import EvalConfig
from slimecli.config.groups.model import ModelConfig
from slimecli.config.groups.observe import ObserveConfig
from slimecli.config.groups.optimizer import OptimizerConfig
from slimecli.config.groups.reward import RewardConfig
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.config.groups.run import RunConfig
from slimecli.config.groups.sandbox import SandboxConfig
from slimecli.config.groups.task import TaskConfig
from slimecli.config.groups.teacher import TeacherConfig, TeacherEntry
from slimecli.config.groups.trainer import TrainerConfig


@dataclass(frozen=True)
class SlimeConfig:
    """A field's spec says what a resume may change (run.resume=auto): how long the run is, how often it saves,
    how it logs, where its servers listen, how long it waits, how the same maths is laid out over the ranks
    (checkpoints hold full weights and optimizer state, or megatron-core's re-shardable format), and whole
    groups (observe, eval, cluster). Anything else (model, task, optimizer, batch shape, algorithm, seed)
    would make the checkpoints belong to another run."""

    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = spec(default_factory=ClusterConfig, resumable=True)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    # several teachers, each scoring the samples routed to it (config/teachers.py); `teacher` is a list of one
    teachers: tuple[TeacherEntry, ...] = ()
    teacher_routes: dict[str, str] = field(default_factory=dict)  # a source's label -> the name of its teacher
    teacher_default: str | None = spec(None, nonempty=True)  # the teacher of unrouted samples; null: the first
    agent: AgentConfig = field(default_factory=AgentConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    observe: ObserveConfig = spec(default_factory=ObserveConfig, resumable=True)
    eval: EvalConfig = spec(default_factory=EvalConfig, resumable=True)
    recipe: str = "quickstart"  # the recipe this run was composed from


# Groups whose member is chosen with `group=member` (a YAML file in conf/<group>/).
GROUPS: tuple[str, ...] = ("optimizer", "agent", "teacher", "reward", "rollout", "trainer", "model", "task", "env",
                           "cluster", "sandbox")
