"""The controller behind `slimecli train`: resolve, write the run dir, launch the plan, supervise."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.schema import SlimeConfig
from slimecli.launch.plan import build_plan
from slimecli.launch.rundir import prepare, write_plan
from slimecli.launch.supervisor import Supervisor


def materialize(cfg: SlimeConfig) -> SlimeConfig:
    """Make model paths concrete (model=tiny is created on first use) so workers never re-resolve."""
    if cfg.model.path is None:
        from slimecli.model.loading import resolve_model_path

        cfg = replace(cfg, model=replace(cfg.model, path=str(resolve_model_path(cfg.model))))
    return cfg


def preflight(cfg: SlimeConfig) -> None:
    """Checks of a training run that need this machine or the model files; raises ConfigErrors."""
    errors = machine_errors(cfg)
    if errors:
        raise ConfigErrors(errors)
    if cfg.teacher.name == "server" and cfg.teacher.model_path and not cfg.teacher.url:
        from slimecli.teacher.client import check_tokenizers_compatible

        problem = check_tokenizers_compatible(cfg.model.tokenizer_path or cfg.model.path, cfg.teacher.model_path)
        if problem:
            raise ConfigErrors([ConfigError("teacher.model_path", cfg.teacher.model_path, problem)])


def machine_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Checks that need this machine rather than the config alone (back-ends that need GPUs)."""
    import importlib.util

    errors = []
    t = cfg.trainer
    if t.name == "megatron":
        if importlib.util.find_spec("megatron") is None:
            errors.append(ConfigError("trainer", "megatron", "megatron-core is not installed",
                                      "pip install 'slimecli[megatron]' on a GPU machine, or use trainer=torch"))
        errors.append(ConfigError("trainer", "megatron", "the megatron-core training loop is not in this release "
                                  "(only its stateless Adam patch is: slimecli.train.optim.megatron_patch)",
                                  "use trainer=torch"))
    if cfg.task.name == "swe" or cfg.agent.name != "none":
        errors.append(ConfigError("agent", cfg.agent.name, "training with coding agents (the SWE rollout loop) is not "
                                  "in this release; the agent back-ends run on their own",
                                  "try: slimecli agent serve / slimecli agent run"))
    if cfg.rollout.name == "sglang" and importlib.util.find_spec("sglang") is None:
        errors.append(ConfigError("rollout", "sglang", "sglang is not installed",
                                  "pip install 'slimecli[sglang]' on a GPU machine, or use rollout=local"))
    return errors


def run(cfg: SlimeConfig, argv: list[str], overrides: list[str], console: Console | None = None) -> int:
    console = console or Console(highlight=False, soft_wrap=True)
    cfg = materialize(cfg)
    preflight(cfg)
    run_dir = prepare(cfg, argv, overrides)
    if run_dir.resumed:
        console.print(f"[bold]resuming[/] the run in {run_dir.path}")
        for line in run_dir.changed:
            console.print(f"  [yellow]config changed[/] {line}")
    else:
        console.print(f"[bold]run directory[/] {run_dir.path}")
    specs = build_plan(cfg, run_dir.path)
    write_plan(run_dir, specs)
    return Supervisor(specs, run_dir.log_dir, console=console).run()
