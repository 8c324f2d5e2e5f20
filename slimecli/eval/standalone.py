"""`slimecli eval`: engines serving a checkpoint, the evaluator worker next to them, a table of the results.

Two ways to name what is evaluated:
- `model.path=DIR` (any composed config, `+recipe=NAME` included): DIR on the config's eval.datasets, as
  step 0, in a new run directory `<run.root>/<run.name>-<time>` (run.name defaults to `eval`);
- `run.dir=RUN`: that run's final policy (RUN/final) with the run's own frozen config and eval settings (a
  later key=value changes them; its ports are picked free again unless given), as its last step, in `RUN/evals/final-<time>`.
With an environment (env=KIND env.id=ID, or env.mix) and no eval dataset naming one, each of its sources is
evaluated too, as a dataset named by its label (its eval split; eval.datasets=[] leaves only those).
Either directory holds what a training run's evaluation writes: eval/step_<N>/<name>.jsonl, the summary,
metrics.jsonl, plus the config, plan and logs.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.layout import engine_slots
from slimecli.config.schema import GROUPS, SlimeConfig

FINAL_DIR = "final"
MERGED_DIR = "final-merged"  # a LoRA run: final/ holds the adapter, final-merged/ the model it makes
EVALS_DIR = "evals"
SCHEDULE = {"eval.interval": 0, "eval.at_start": "false", "eval.at_end": "false"}
ORDER = ("reward_mean", "resolved_rate", "pass@", "response_len_mean", "invalid", "prompts", "samples")


def _override_key(text: str) -> str:
    return text.split("=", 1)[0].lstrip("+~")


def resolve(overrides: list[str], recipe_dirs: tuple[str, ...] = ()) -> tuple[SlimeConfig, int]:
    """The evaluation's config and the step its weights stand for; ConfigErrors for anything wrong."""
    from slimecli.launch.source_checks import load

    source = next((o.split("=", 1)[1] for o in overrides if _override_key(o) == "run.dir"), None)
    if source is None:  # evaluated once, now: training's schedule does not apply (an env alone is something to evaluate)
        given = {_override_key(o) for o in overrides}
        cfg = load([f"{k}={v}" for k, v in SCHEDULE.items() if k not in given] + overrides, recipe_dirs)
        if not any(_override_key(o) == "run.name" for o in overrides):
            cfg = replace(cfg, run=replace(cfg.run, name="eval"))
        return with_env_datasets(cfg), 0
    cfg, step = from_run(Path(source).expanduser(), [o for o in overrides if _override_key(o) != "run.dir"])
    return with_env_datasets(cfg), step


def with_env_datasets(cfg: SlimeConfig) -> SlimeConfig:
    """The run's environments as eval datasets (each source one, named by its label, before eval.datasets' own),
    unless a dataset already names an environment: `slimecli eval env=native env.id=lookup` evaluates lookup."""
    from slimecli.config.groups.eval import EvalDatasetConfig
    from slimecli.config.rules import check_all
    from slimecli.env.sources import source_specs

    if any(ds.env is not None for ds in cfg.eval.datasets):
        return cfg
    rows = cfg.task.path if cfg.task.name == "jsonl" else None  # for environments without eval tasks of their own
    added = tuple(EvalDatasetConfig(name=spec.label, env=spec.kind, id=spec.env_id, args=dict(spec.args),  # type: ignore[arg-type]
                                    path=rows) for spec in source_specs(cfg.env))
    if not added:
        return cfg
    cfg = replace(cfg, eval=replace(cfg.eval, datasets=added + cfg.eval.datasets))
    errors = check_all(cfg)
    if errors:
        raise ConfigErrors(errors)
    return cfg


def from_run(run_dir: Path, overrides: list[str]) -> tuple[SlimeConfig, int]:
    """RUN's frozen config for its final policy, with `key=value` overrides on top."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from slimecli.config.convert import build, to_plain
    from slimecli.config.groups.reward import JUDGE_EMBEDDED
    from slimecli.config.io import load_frozen
    from slimecli.config.port import AUTO
    from slimecli.config.rules import check_all
    from slimecli.launch.plan import CONFIG_FILE
    from slimecli.launch.source_checks import plugin_functions, reward_functions

    config = run_dir / CONFIG_FILE
    if not config.is_file():
        raise ConfigErrors([ConfigError("run.dir", str(run_dir), f"no run there (no {CONFIG_FILE})",
                                        "name the directory of a `slimecli train` run, or use model.path=DIR")])
    frozen = load_frozen(config)
    data: dict[str, Any] = to_plain(frozen)
    errors: list[ConfigError] = []
    parser = OverridesParser.create()
    given = set()
    for text in overrides:
        key = _override_key(text)
        if key in GROUPS or key == "recipe":
            errors.append(ConfigError(key, text, "a finished run's config is evaluated as it was frozen",
                                      "change single keys (key=value), or evaluate model.path=DIR with a composed config"))
            continue
        (ov,) = parser.parse_overrides([text])
        _set(data, key, ov.value(), errors)
        given.add(key)
    reward = data.get("reward")
    if isinstance(reward, dict):  # reward=judge: the run's embedded judge again, on a free port unless given
        if reward.get("judge_url") == JUDGE_EMBEDDED and not reward.get("judge_model") and data["model"].get("path"):
            reward["judge_model"] = data["model"]["path"]  # it served the run's starting model, not the final one
        if "reward.judge_port" not in given:
            reward["judge_port"] = AUTO
    if "model.path" not in given:
        final = run_dir / FINAL_DIR
        if (final / "adapter_config.json").is_file():
            final = run_dir / MERGED_DIR
        if not (final / "config.json").is_file():
            errors.append(ConfigError("run.dir", str(run_dir), f"the run has no final model ({final})",
                                      "let the run finish, or evaluate a checkpoint with model.path=DIR"))
        data["model"]["path"] = str(final.resolve())
    for group in ("rollout", "teacher", "agent"):  # the run's servers are gone: free ports, unless given
        if f"{group}.port" not in given:
            data[group]["port"] = AUTO
    data["run"].update(dir=None, root=str((run_dir / EVALS_DIR).resolve()), name=FINAL_DIR)
    cfg = build(SlimeConfig, data, "", errors)
    if cfg is not None:
        errors.extend(check_all(cfg) + reward_functions(cfg) + plugin_functions(cfg))
    if errors or cfg is None:
        raise ConfigErrors(errors)
    return cfg, frozen.trainer.max_steps


def _set(data: dict[str, Any], path: str, value: Any, errors: list[ConfigError]) -> None:
    from slimecli.config.errors import did_you_mean

    node: Any = data
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:i])
            keys = list(node) if isinstance(node, dict) else []
            errors.append(ConfigError(path, value, "unknown key", did_you_mean(part, keys, f"{where}." if where else "")))
            return
        if i == len(parts) - 1:
            node[part] = value
        node = node[part]


def evaluate(cfg: SlimeConfig, step: int, argv: list[str], overrides: list[str], console: Console | None = None) -> int:
    """Launch the engines and the evaluator, supervise them, print the table. 0 only when every dataset
    was evaluated."""
    from slimecli.eval.runner import read_summary
    from slimecli.launch.agent_checks import agent_cli_errors, sandbox_errors, say_sandbox_notice
    from slimecli.launch.free_ports import with_free_judge_port, with_free_rollout_port
    from slimecli.launch.plan import engine_specs, in_run, judge_spec
    from slimecli.launch.preflight import engine_errors, materialize
    from slimecli.launch.rundir import prepare, write_plan
    from slimecli.launch.spec import ProcessSpec
    from slimecli.launch.supervisor import Supervisor

    console = console or Console(highlight=False, soft_wrap=True)
    if not cfg.eval.datasets:
        raise ConfigErrors([ConfigError("eval.datasets", [], "nothing to evaluate",
                                        "eval.datasets=[{name: NAME, task: jsonl, path: FILE}], an environment "
                                        "(env=native env.id=lookup) or +recipe=NAME")])
    cfg = with_free_judge_port(with_free_rollout_port(materialize(cfg)))  # "auto" ports: free ones, in the plan
    errors = engine_errors(cfg, [slot.port for slot in engine_slots(cfg)])
    agents = any(ds.task == "swe" for ds in cfg.eval.datasets)  # SWE tasks are worked by the agent CLI in sandboxes
    if agents:
        errors += agent_cli_errors(cfg) + sandbox_errors(cfg)
    if errors:
        raise ConfigErrors(errors)
    say_sandbox_notice(cfg, console, runs_code=agents)  # where the agent's commands run (local: what is left open)
    run = prepare(cfg, argv, overrides)
    console.print(f"[bold]eval directory[/] {run.path}")
    config_path = str(run.config_path)
    evaluator = ProcessSpec(name="evaluator", kind="worker",
                            argv=[sys.executable, "-m", "slimecli.eval", "--config", config_path, "--step", str(step)])
    judge = judge_spec(cfg, config_path)  # reward.judge_url=embedded: the judge next to the engines
    specs = in_run([*engine_specs(cfg, config_path), *([judge] if judge else []), evaluator], run.path)
    write_plan(run, specs)
    code = Supervisor(specs, run.log_dir, console=console).run()
    summary = read_summary(run.path, step)
    if summary is None:
        console.print("[red]no evaluation summary was written[/]")
        return code or 1
    console.print(table(summary, f"eval of {cfg.model.path} (step {step})"))
    say_sandbox_notice(cfg, console, runs_code=agents, warnings_only=True)  # sandbox=local: again, at the end
    failed = [d["name"] for d in summary.get("datasets", []) if d.get("error")]
    if failed:
        console.print(f"[red]failed:[/] {', '.join(failed)}")
    return code or (1 if failed else 0)


def _metric_order(name: str) -> tuple[int, int, str]:
    for i, prefix in enumerate(ORDER):
        if name.startswith(prefix):
            return (i, int(name[len(prefix):]) if prefix == "pass@" and name[5:].isdigit() else 0, name)
    return (len(ORDER), 0, name)


def table(summary: dict[str, Any], title: str) -> Table:
    """One column per dataset, one row per metric (every metric any dataset has), then status and time."""
    datasets = summary.get("datasets", [])
    names = sorted({k for d in datasets for k in (d.get("metrics") or {})}, key=_metric_order)
    out = Table(title=title)
    out.add_column("metric")
    for d in datasets:
        out.add_column(str(d.get("name")), justify="right")
    for name in names:
        out.add_row(name, *[_cell(name, (d.get("metrics") or {}).get(name)) for d in datasets])
    out.add_row("status", *[f"[red]failed: {d['error']}[/]" if d.get("error") else "[green]ok[/]" for d in datasets])
    out.add_row("time (s)", *[f"{float(d.get('seconds') or 0):.1f}" for d in datasets])
    return out


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name in ("prompts", "samples") and isinstance(value, int | float):
        return str(int(value))
    return f"{value:.4f}" if isinstance(value, float) else str(value)
