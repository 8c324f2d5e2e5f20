"""Pre-flight: the checks that need this machine or the model files (packages, CLIs, sandboxes, GPUs, ports,
checkpoints), shared by every command that starts something, so that what one refuses the others refuse with
the same message. The checks that need only the config are the rules in slimecli.config.rules; every command
runs those first (while composing), then its pre-flight here:

  train, plan, config validate   train_errors (check raises them): the run directory, then the rest
  teacher serve                  teacher_serve_errors
  rollout serve                  rollout_serve_errors
  agent serve / agent run        agent_serve_errors / agent_run_errors
  (SWE tasks, with any of those)   task_env_errors: every task's environment gives the test runner

Each is assembled from per-component checks (engine, teacher, agent CLI, sandbox, task, ports, devices);
the agent's (CLI, sandbox, context, task environments) are in agent_checks, the run directory's in
rundir_checks.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import socket
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from slimecli.config.errors import ConfigError, ConfigErrors
from slimecli.config.groups.teacher import TeacherConfig
from slimecli.config.groups.trainer import MEGATRON_ARCHITECTURES
from slimecli.config.layout import layout_port, node_engines, teacher_address, teacher_nodes
from slimecli.config.port import AUTO, Port
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import RunTeacher, run_teachers, scoped, teacher_view
from slimecli.launch.agent_checks import agent_cli_errors, agent_errors, context_errors, sandbox_errors, task_env_errors
from slimecli.launch.replay_checks import replay_errors
from slimecli.launch.rundir_checks import run_dir_errors
from slimecli.launch.sglang_checks import sglang_args_errors
from slimecli.model.loading import TOKENIZER_FILES


def materialize(cfg: SlimeConfig) -> SlimeConfig:
    """Make model paths concrete (model=tiny is created on first use) so workers never re-resolve."""
    if cfg.model.path is None:
        from slimecli.model.loading import resolve_model_path

        cfg = replace(cfg, model=replace(cfg.model, path=str(resolve_model_path(cfg.model))))
    return cfg


def check(cfg: SlimeConfig) -> None:
    """`train`, `plan`, `config validate`: raise ConfigErrors with every problem found."""
    errors = train_errors(cfg)
    if errors:
        raise ConfigErrors(errors)


def train_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Back-ends, agent, and the servers this node starts; then (only if those pass) the model files."""
    errors = run_dir_errors(cfg) + machine_errors(cfg) + server_errors(cfg)
    if not errors:
        errors = model_errors(cfg)
    return errors


def machine_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Back-ends this machine cannot run, and agent runs it cannot host."""
    errors = []
    if cfg.trainer.name == "megatron":
        if importlib.util.find_spec("megatron") is None:
            errors.append(ConfigError("trainer", "megatron", "megatron-core is not installed",
                                      "pip install 'slimecli[megatron]' on a GPU machine, or use trainer=torch"))
    if cfg.rollout.name == "sglang" and importlib.util.find_spec("sglang") is None:
        errors.append(ConfigError("rollout", "sglang", "sglang is not installed",
                                  "pip install 'slimecli[sglang]' on a GPU machine, or use rollout=local"))
    if cfg.observe.wandb and importlib.util.find_spec("wandb") is None:
        errors.append(ConfigError("observe.wandb", True, "wandb is not installed",
                                  "pip install 'slimecli[wandb]', or observe.wandb=false"))
    return errors + sglang_args_errors(cfg) + agent_errors(cfg) + weight_sync_errors(cfg)


def weight_sync_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer.weight_sync=shared_memory holds a copy of the weights in the host's tmpfs: it must fit there
    (a container's /dev/shm is often 64 MiB)."""
    if cfg.trainer.weight_sync != "shared_memory" or cfg.model.path is None:
        return []  # the embedded tiny model is a few MiB
    import shutil

    from slimecli.engine.shm import segment_dir

    model = Path(cfg.model.path).expanduser()
    need = sum(f.stat().st_size for g in WEIGHT_GLOBS for f in model.glob(g) if f.is_file())
    where = segment_dir()
    free = shutil.disk_usage(where).free
    if need <= free:
        return []
    return [ConfigError("trainer.weight_sync", "shared_memory",
                        f"the weights take {need / 2**20:.0f} MiB but {where} has {free / 2**20:.0f} MiB free",
                        "use trainer.weight_sync=disk, or give the host more shared memory (docker: --shm-size)")]


def model_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """Checks that read the model files (the teacher must share the student's tokenizer; trainer=megatron must
    be able to convert and split the model; trainer.lora's target modules must be linear layers of it)."""
    from slimecli.launch.lora_checks import lora_module_errors

    if errors := lora_module_errors(cfg):
        return errors
    if cfg.trainer.name == "megatron":
        errors = megatron_model_errors(cfg)
        if errors:
            return errors
    return [e for t in run_teachers(cfg) for e in teacher_tokenizer_errors(teacher_view(cfg, t), t)]


def teacher_tokenizer_errors(cfg: SlimeConfig, teacher: RunTeacher) -> list[ConfigError]:
    """A launched teacher (``cfg``: its view) must share the student's tokenizer; a teacher that runs already
    (teacher.url) is asked for its vocabulary when the trainer starts (train/coordinator/teacher.py)."""
    t = cfg.teacher
    if t.name != "server" or not t.model_path or t.url:
        return []
    from slimecli.model.loading import check_tokenizers_compatible

    problem = check_tokenizers_compatible(materialize(cfg).model.resolved_tokenizer_path, t.model_path)
    return scoped([ConfigError("teacher.model_path", t.model_path, problem)], teacher) if problem else []


def megatron_model_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """trainer=megatron: the model's family converts to megatron-core, its heads and layers split over TP and PP."""
    t = cfg.trainer
    errors = megatron_split_errors(Path(materialize(cfg).model.resolved_path), "model.path", "trainer",
                                   ("trainer.tensor_parallel_size", t.tensor_parallel_size),
                                   ("trainer.pipeline_parallel_size", t.pipeline_parallel_size))
    if cfg.model.dtype != "float32" and cuda_devices() == 0:
        errors.append(ConfigError("model.dtype", cfg.model.dtype, "megatron-core's mixed-precision optimizer needs a "
                                  "GPU; on the CPU trainer=megatron trains in float32", "set model.dtype=float32"))
    return errors


def megatron_split_errors(model_dir: Path, path_key: str, user: str, tp: tuple[str, int],
                          pp: tuple[str, int] | None = None) -> list[ConfigError]:
    """The checkpoint at model_dir converts to megatron-core and splits over the TP (and PP) sizes."""
    path = model_dir / "config.json"
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [ConfigError(path_key, str(model_dir), f"cannot read its config.json ({exc})")]
    names = hf.get("architectures") or []
    backend = "trainer=megatron" if user == "trainer" else "teacher.backend=megatron"
    if not any(n in MEGATRON_ARCHITECTURES for n in names):
        fix = "use trainer=torch for this model" if user == "trainer" else "use teacher.backend=torch for this model"
        return [ConfigError(user if user == "trainer" else "teacher.backend", "megatron",
                            f"the model is {names or hf.get('model_type')}; {backend} converts "
                            f"{', '.join(MEGATRON_ARCHITECTURES)}", fix)]
    heads = hf.get("num_attention_heads", 0)
    splits = [(tp[0], tp[1], "num_attention_heads", heads),
              (tp[0], tp[1], "num_key_value_heads", hf.get("num_key_value_heads") or heads)]
    if pp is not None:
        splits.append((pp[0], pp[1], "num_hidden_layers", hf.get("num_hidden_layers", 0)))
    return [ConfigError(key, size, f"the model's {field}={count} does not split into {size} equal parts",
                        f"use a divisor of {count}")
            for key, size, field, count in splits if size > 1 and count % size]


# ---- the machine: ports, GPUs, model files -------------------------------------------------------------------
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.pt", "*.pth")


def port_problem(host: str, port: int) -> str | None:
    """None when a server can listen on host:port here (as aiohttp does: SO_REUSEADDR), else why not."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r} ({exc.strerror})"
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is in use"
            return f"cannot listen on {host}:{port} ({exc.strerror})"
    return None


def port_errors(key: str, host: str, ports: Iterable[Port]) -> list[ConfigError]:
    """Each port a server started here will listen on must be free (auto or 0: a free one is picked, nothing to
    check)."""
    errors = []
    for port in ports:
        problem = port_problem(host, port) if isinstance(port, int) and port else None
        if problem:
            errors.append(ConfigError(key, port, problem, f"stop what listens there, or choose another {key}"))
    return errors


def cuda_devices() -> int:
    """GPUs a process started here sees (0: it runs on the CPU). Imports torch: call it only when it matters."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """rollout.device names a GPU this machine has (auto and cpu always do)."""
    device = cfg.rollout.device
    if not device.startswith("cuda"):
        return []
    index = int(device.partition(":")[2] or 0)
    gpus = cuda_devices()
    if index < gpus:
        return []
    have = "no CUDA device is visible here" if not gpus else f"this machine has {gpus} GPU(s): cuda:0..cuda:{gpus - 1}"
    return [ConfigError("rollout.device", device, have, "use rollout.device=auto (a GPU when there is one) or cpu")]


def weights_errors(key: str, path: str | None) -> list[ConfigError]:
    """A checkpoint directory (the rules checked it has a config.json) must hold weights too."""
    if path is None:
        return []
    p = Path(path).expanduser()
    if not (p / "config.json").is_file() or any(next(p.glob(g), None) is not None for g in WEIGHT_GLOBS):
        return []
    return [ConfigError(key, path, "no weights in the checkpoint directory (no *.safetensors or *.bin)",
                        "point it at a complete Hugging Face checkpoint")]


def tokenizer_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The tokenizer of the policy (model.tokenizer_path, else model.path) is there."""
    key, path = ("model.tokenizer_path", cfg.model.tokenizer_path) if cfg.model.tokenizer_path else \
        ("model.path", cfg.model.path)
    if path is None or not Path(path).expanduser().is_dir():
        return []  # model=tiny (made with its tokenizer), or the rules report the directory
    if any((Path(path).expanduser() / f).is_file() for f in TOKENIZER_FILES):
        return []
    return [ConfigError(key, path, f"no tokenizer in the directory (none of {', '.join(TOKENIZER_FILES)})",
                        "set model.tokenizer_path to the directory of the tokenizer")]


# ---- components: what each kind of process needs here ------------------------------------------------------
def engine_errors(cfg: SlimeConfig, ports: Iterable[Port]) -> list[ConfigError]:
    """Rollout engines started here: their model files and ports, and for the embedded one its device."""
    errors = device_errors(cfg) if cfg.rollout.name == "local" else []
    errors += weights_errors("model.path", cfg.model.path) + tokenizer_errors(cfg)
    return errors + port_errors("rollout.port", cfg.rollout.host, ports)


def teacher_errors(t: TeacherConfig, path_key: str = "teacher.model_path",
                   address: tuple[str, Port] | None = None) -> list[ConfigError]:
    """A teacher server started here: its weights, its port (``address``: where it listens, when not
    teacher.host:teacher.port), one GPU per rank where ranks run on GPUs."""
    host, port = address or (t.host, t.port)
    errors = weights_errors(path_key, t.model_path) + port_errors("teacher.port", host, [port])
    if t.backend == "megatron":
        if importlib.util.find_spec("megatron") is None:
            errors.append(ConfigError("teacher.backend", "megatron", "megatron-core is not installed",
                                      "pip install 'slimecli[megatron]', or use teacher.backend=torch"))
        elif t.model_path and not errors:
            errors += megatron_split_errors(Path(t.model_path), path_key, "teacher", ("teacher.tp", t.tp))
    ranks = t.tp * t.dp
    if ranks > 1:
        gpus = cuda_devices()
        if gpus and ranks > gpus:
            errors.append(ConfigError("teacher.tp", t.tp, f"teacher.tp x teacher.dp = {ranks} ranks take one GPU "
                                      f"each, and this machine has {gpus}",
                                      f"lower teacher.tp or teacher.dp so that tp x dp <= {gpus}"))
    return errors


def server_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The servers `train` starts on this node (config/layout.py): its engines, and its teacher server (node 0's,
    or every node's with teacher.every_node; none with teacher.url)."""
    node = cfg.cluster.node_rank
    if cfg.rollout.replay:
        return replay_errors(cfg)  # no server: the dumped samples instead
    engines_here = len(node_engines(with_port(cfg, 0)))  # how many, whatever their ports
    known = isinstance(layout_port(cfg, "rollout.port"), int)  # given, or agreed (multi-node)
    on_node: list[Port] = [slot.port for slot in node_engines(cfg)] if known else [AUTO] * engines_here
    errors = engine_errors(cfg, on_node) if on_node else []
    for teacher in run_teachers(cfg):
        view = teacher_view(cfg, teacher)
        t = view.teacher
        if node in teacher_nodes(view):
            address = teacher_address(view, node) if isinstance(layout_port(view, "teacher.port"), int) else \
                (t.host, AUTO)
            errors += scoped(teacher_errors(t, address=address), teacher)
    return errors


def with_port(cfg: SlimeConfig, port: int) -> SlimeConfig:
    """``cfg`` with rollout.port set: for counting its engines before "auto" is picked."""
    return replace(cfg, rollout=replace(cfg.rollout, port=port))


def agent_chosen_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """`agent serve|run` work with one agent: agent=NAME, SWE_AGENT, or a custom harness + adapter."""
    if cfg.agent.name != "none" or (cfg.agent.harness and cfg.agent.adapter):
        return []
    from slimecli.agent.registry import names

    return [ConfigError("agent", "none", "no agent chosen",
                        f"pass agent=NAME (valid: {', '.join(names())}) or set SWE_AGENT")]


def agent_task_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """`agent run` works one task: a SWE instance (the task rules checked the file), or a prompt in a workdir."""
    t = cfg.task
    if t.name == "swe":
        if t.instance is None:
            return [ConfigError("task.instance", None, "agent run with task=swe works one task",
                                "set task.instance=ID (`slimecli tasks list task.path=...` lists them)")]
        return []
    if not t.prompt:
        return [ConfigError("task.prompt", t.prompt, "agent run needs a task",
                            'set task.prompt="..." (and optionally task.workdir=DIR), or task=swe task.instance=ID')]
    if t.workdir is not None and not Path(t.workdir).expanduser().is_dir():
        return [ConfigError("task.workdir", t.workdir, "directory does not exist")]
    return []


def embedded_engine_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """The engine an agent command starts itself (on a free port) unless agent.engine_url names one."""
    return [] if cfg.agent.engine_url else engine_errors(cfg, [])


# ---- commands ------------------------------------------------------------------------------------------------
def teacher_source(cfg: SlimeConfig) -> tuple[str, str]:
    """The key and the directory `teacher serve` serves: teacher.model_path, else model.path, else model=tiny
    (made on first use)."""
    if cfg.teacher.model_path:
        return "teacher.model_path", cfg.teacher.model_path
    return "model.path", materialize(cfg).model.resolved_path


def teacher_serve_errors(cfg: SlimeConfig, path_key: str = "teacher.model_path") -> list[ConfigError]:
    """`teacher serve` of `cfg` (teacher=server with teacher.model_path set): the teacher group's rules, the
    server's weights, port and ranks; and, when a student (model.path) is named too, a tokenizer it shares."""
    from slimecli.config.rules import teacher as teacher_rules
    from slimecli.launch.source_checks import teacher_dir

    errors = [e for rule in teacher_rules.RULES for e in rule(cfg)] + teacher_dir(cfg)
    if errors:
        return errors
    address = teacher_address(cfg, cfg.cluster.node_rank) if isinstance(layout_port(cfg, "teacher.port"), int) else None
    errors = teacher_errors(cfg.teacher, path_key, address=address)
    student = cfg.model.path
    if not errors and student and Path(student).resolve() != Path(cfg.teacher.model_path or "").resolve():
        errors = model_errors(cfg)
    return errors


def rollout_serve_errors(cfg: SlimeConfig, index: int = 0) -> list[ConfigError]:
    """`rollout serve --index i`: the embedded engine on rollout.port + i."""
    port = cfg.rollout.port
    return engine_errors(replace(cfg, rollout=replace(cfg.rollout, name="local")),
                         [port + index] if isinstance(port, int) else [])


def agent_serve_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """`agent serve`: an agent, the adapter's port, and the engine unless agent.engine_url (its URL is a rule)."""
    errors = agent_chosen_errors(cfg)
    if errors:
        return errors
    return port_errors("agent.port", cfg.agent.host, [cfg.agent.port]) + embedded_engine_errors(cfg)


def agent_run_errors(cfg: SlimeConfig) -> list[ConfigError]:
    """`agent run`: an agent and a task, the CLI, the sandbox, a context that fits the CLI's prompt, the engine."""
    errors = agent_chosen_errors(cfg)
    if errors:
        return errors
    errors = agent_task_errors(cfg)
    return (errors + agent_cli_errors(cfg) + sandbox_errors(cfg) + context_errors(cfg) + task_env_errors(cfg)
            + embedded_engine_errors(cfg))
