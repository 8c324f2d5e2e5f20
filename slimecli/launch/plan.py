"""The launch plan: which processes a run needs, in start order."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from slimecli.config.groups.reward import RewardConfig
from slimecli.config.groups.rollout import RolloutConfig
from slimecli.config.layout import (
    embedded_judge,
    node_engines,
    picked,
    reachable_host,
    run_dir_of,
    teacher_address,
    teacher_nodes,
)
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import GROUP_PROCESS, RunTeacher, run_teachers, teacher_view
from slimecli.launch.child_env import child_env
from slimecli.launch.ranks import MEGATRON_PRELOAD
from slimecli.launch.spec import Health, Probe, ProcessSpec
from slimecli.launch.torchrun import rank_command

CONFIG_FILE = "config.yaml"


def engine_specs(cfg: SlimeConfig, config_path: str, training: bool = False) -> list[ProcessSpec]:
    """The engines this node starts (cluster.node_rank; see config/layout.py), each on its own GPUs. ``training``:
    the trainer pushes weights to them, so a restarted one waits for the current weights before it generates."""
    r = cfg.rollout
    specs = []
    # trainer.weight_sync=nccl: the weight-update group cannot take a new member mid-run, so an engine that dies
    # stops the run (docs/reliability.md)
    restarts = 0 if training and cfg.trainer.weight_sync == "nccl" else r.max_restarts
    gpus = engine_gpus(cfg)
    for slot in node_engines(cfg):
        env = _overlap_env(cfg, share_cores=r.name == "local")
        if r.name == "local":
            argv = [sys.executable, "-m", "slimecli.engine", "--config", config_path, "--index", str(slot.index)]
            if slot.index in gpus:
                env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus[slot.index]))}
        else:
            args = sglang_engine_args(cfg, slot.index)
            placed = [] if _flag(args, "--base-gpu-id") is not None else ["--base-gpu-id", str(gpus[slot.index][0])]
            argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(cfg.model.path or "<model=tiny>"),
                    "--host", slot.host, "--port", str(slot.port), "--dtype", r.dtype,
                    *(["--trust-remote-code"] if cfg.model.trust_remote_code else []),
                    "--skip-server-warmup", *_api_key_args(r), *placed, *_grammar_args(cfg, args),
                    *_lora_args(cfg, args), *args]
        health = Health(f"{slot.url}/health_generate", r.health_interval_s, r.health_timeout_s,
                        r.health_start_grace_s, restarts, await_weights=training, setting="rollout.max_restarts")
        specs.append(ProcessSpec(name=f"engine-{slot.index}", argv=argv, kind="server", ports=[slot.port],
                                 probe=Probe(f"{slot.url}/health_generate"), start_timeout_s=r.start_timeout_s,
                                 env=env, health=health, awaited_by_workers=True))
    return specs


def sglang_engine_args(cfg: SlimeConfig, index: int) -> list[str]:
    """rollout.sglang_args, then engine ``index``'s own rollout.sglang_engine_args (later flags win in SGLang's
    parser)."""
    r = cfg.rollout
    own = r.sglang_engine_args[index] if index < len(r.sglang_engine_args) else ""
    return [*shlex.split(r.sglang_args), *shlex.split(own)]


def _flag(args: list[str], *names: str) -> str | None:
    """The value of the last of these flags in an argv (``--flag V`` or ``--flag=V``); "" for a bare flag."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "")
    return value


def _count(args: list[str], *names: str) -> int:
    value = _flag(args, *names)
    return int(value) if value and value.isdigit() and int(value) > 0 else 1


def sglang_gpus(args: list[str]) -> int:
    """GPUs one SGLang server takes: tensor x pipeline parallel, x data parallel unless DP attention shares them."""
    dp = 1 if _flag(args, "--enable-dp-attention") is not None else _count(args, "--dp-size", "--dp")
    return _count(args, "--tp-size", "--tp") * _count(args, "--pp-size", "--pp") * dp


def engine_gpus(cfg: SlimeConfig) -> dict[int, list[int]]:
    """The GPUs (node-local ids) of each engine this node starts, after the trainer's: its ranks take GPUs
    0..trainer.nproc-1 (one per local rank), the engines the next ones in turn.

    SGLang engines are always placed (an engine on a GPU is what rollout=sglang means; ``--base-gpu-id`` in
    rollout.sglang_args wins). An embedded engine (rollout.device=auto) only where cluster.gpus_per_node says
    that the node has a GPU for it beside the trainer's: otherwise it shares the first one, as before."""
    r = cfg.rollout
    slots = node_engines(cfg)
    sizes = [sglang_gpus(sglang_engine_args(cfg, s.index)) if r.name == "sglang" else 1 for s in slots]
    if r.name == "local" and (r.device != "auto" or cfg.cluster.gpus_per_node < cfg.trainer.nproc + len(slots)):
        return {}
    out, first = {}, cfg.trainer.nproc
    for slot, size in zip(slots, sizes, strict=True):
        out[slot.index] = list(range(first, first + size))
        first += size
    return out


def _lora_args(cfg: SlimeConfig, args: list[str]) -> list[str]:
    """trainer.lora: SGLang loads the trainer's adapters at run time (/load_lora_adapter), so it must reserve LoRA
    memory up front for their rank and modules; two adapters at once, as the new version loads before the old one
    is dropped. LoRA flags in rollout.sglang_args win."""
    lo = cfg.trainer.lora
    if not lo.enabled or _flag(args, "--enable-lora") is not None:
        return []
    return ["--enable-lora", "--max-lora-rank", str(lo.rank), "--lora-target-modules", *lo.targets(cfg.model.name),
            "--max-loras-per-batch", "2"]


def _grammar_args(cfg: SlimeConfig, args: list[str]) -> list[str]:
    """Constrained agent turns send llguidance's Lark grammars as ``ebnf``: SGLang must compile them with
    llguidance (its default back-end, xgrammar, answers them 400). A back-end in rollout.sglang_args wins."""
    constrained = cfg.agent.name != "none" and cfg.agent.constrain != "none"
    if not constrained or _flag(args, "--grammar-backend") is not None:
        return []
    return ["--grammar-backend", "llguidance"]


def _overlap_env(cfg: SlimeConfig, *, share_cores: bool) -> dict[str, str]:
    """With trainer.async_rollout an engine generates while the trainer computes on the same cores.

    OpenMP's default of spinning between parallel regions then takes the cores from the other side (on 2 CPU
    cores the update ran 5-8x slower): idle OpenMP threads of engines and trainer sleep instead. The trainer's
    ranks and the local engines also keep to their share of the node's cores (node_threads): a parallel region
    with more threads than free cores waits for whichever of its threads was descheduled. What the environment
    sets wins. ``share_cores``: a trainer or an engine slimecli runs itself (SGLang's own threads are left
    alone)."""
    if not cfg.trainer.async_rollout:
        return {}
    env = {} if "OMP_WAIT_POLICY" in os.environ else {"OMP_WAIT_POLICY": "PASSIVE"}
    if share_cores and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(node_threads(cfg))
    return env


def node_threads(cfg: SlimeConfig) -> int:
    """The threads of a local engine or a trainer rank when rollout and training overlap: the node's cores
    shared out among its local engines and trainer ranks. On 2 cores, 1 engine and 1 rank, giving either one
    both cores made the overlapped step 10-15% slower; a synchronous step, which has the cores to itself in
    turn, keeps OpenMP's default (all of them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local_engines = len(node_engines(cfg)) if cfg.rollout.name == "local" else 0
    return max(1, cores // (local_engines + cfg.trainer.nproc))


def _api_key_args(r: RolloutConfig) -> list[str]:
    """SGLang's --api-key: rollout.api_key, else $SLIMECLI_ENGINE_API_KEY (the embedded engine reads the same)."""
    from slimecli.net.auth import engine_api_key

    key = engine_api_key(r.api_key)
    return ["--api-key", key] if key else []


def teacher_spec(cfg: SlimeConfig, config_path: str, teacher: RunTeacher | None = None) -> ProcessSpec | None:
    """This node's server of one teacher (the `teacher` group's unless named), if it starts one
    (config/layout.py: teacher_nodes). A listed teacher's ranks are told its name (--teacher)."""
    if teacher is not None:
        cfg = teacher_view(cfg, teacher)
    t = cfg.teacher
    if cfg.cluster.node_rank not in teacher_nodes(cfg):
        return None
    host, port = teacher_address(cfg, cfg.cluster.node_rank)
    named = ["--teacher", teacher.name] if teacher is not None and teacher.key != "teacher" else []
    argv, env = rank_command("slimecli.teacher", ["--config", config_path, *named], t.tp * t.dp,
                             preload=MEGATRON_PRELOAD if t.backend == "megatron" else ())
    url = f"http://{host}:{port}/healthz"
    key = teacher.key if teacher is not None else "teacher"
    health = Health(url, t.health_interval_s, t.health_timeout_s, t.health_start_grace_s, t.max_restarts,
                    setting=f"{key}.max_restarts")
    return ProcessSpec(name=teacher.process if teacher is not None else GROUP_PROCESS, kind="server", ports=[port],
                       argv=argv, env=env, probe=Probe(url), health=health,
                       start_timeout_s=t.start_timeout_s + (t.warmup_timeout_s if t.warmup else 0.0))


def teacher_specs(cfg: SlimeConfig, config_path: str) -> list[ProcessSpec]:
    """This node's server of every teacher it launches (config/teachers.py), in the list's order."""
    specs = [teacher_spec(cfg, config_path, t) for t in run_teachers(cfg)]
    return [s for s in specs if s is not None]


def judge_spec(cfg: SlimeConfig, config_path: str) -> ProcessSpec | None:
    """The embedded engine the run starts as its judge (reward.judge_url=embedded; layout.embedded_judge), on the
    rollout engines' device, restarted like them. It serves reward.judge_model (default: the run's model) and never
    takes a weight update: the judge stays the model it started as."""
    judge: RewardConfig | None = embedded_judge(cfg)
    if judge is None:
        return None
    port = picked(judge.judge_port, "reward.judge_port")
    argv = [sys.executable, "-m", "slimecli.engine", "--config", config_path, "--judge"]
    url = f"http://{reachable_host(judge.judge_host)}:{port}/health_generate"
    r = cfg.rollout  # an embedded engine: kept alive like the rollout engines (its verdicts wait in retries meanwhile)
    health = Health(url, r.health_interval_s, r.health_timeout_s, r.health_start_grace_s, r.max_restarts,
                    setting="rollout.max_restarts")
    return ProcessSpec(name="judge", kind="server", ports=[port], argv=argv, env=_overlap_env(cfg, share_cores=True),
                       probe=Probe(url), start_timeout_s=judge.judge_start_timeout_s, health=health)


def trainer_spec(cfg: SlimeConfig, config_path: str) -> ProcessSpec:
    argv, env = rank_command("slimecli.train", ["--config", config_path], cfg.trainer.nproc, cfg.cluster,
                             run_id=cfg.run.name, preload=MEGATRON_PRELOAD if cfg.trainer.name == "megatron" else ())
    return ProcessSpec(name="trainer", kind="worker", env={**_overlap_env(cfg, share_cores=True), **env}, argv=argv)


def build_plan(cfg: SlimeConfig, run_dir: str | Path) -> list[ProcessSpec]:
    """Servers first (engines, teacher, an embedded judge; none for rollout.replay), then the trainer. Every process
    reads RUN/config.yaml."""
    run_dir = Path(run_dir).resolve()
    config_path = str(run_dir / CONFIG_FILE)
    specs: list[ProcessSpec] = []
    if not cfg.rollout.replay:  # a replay trains on dumped samples: no engine, no teacher
        specs += engine_specs(cfg, config_path, training=True)
        specs += teacher_specs(cfg, config_path)  # on the first node, or on every node (teacher.every_node)
        judge = judge_spec(cfg, config_path)  # reward.judge_url=embedded
        if judge is not None:
            specs.append(judge)
    specs.append(trainer_spec(cfg, config_path))
    return in_run(specs, run_dir_of(config_path))  # a node's own directory is inside the shared one


def teacher_plan(cfg: SlimeConfig, run_dir: str | Path) -> list[ProcessSpec]:
    """`slimecli teacher serve`: the teacher server alone, served until it is stopped (cfg.teacher.name=server)."""
    run_dir = Path(run_dir).resolve()
    teacher = teacher_spec(cfg, str(run_dir / CONFIG_FILE))
    if teacher is None:
        raise ValueError("teacher_plan needs teacher.name=server without teacher.url")
    return in_run([teacher], run_dir)


def in_run(specs: list[ProcessSpec], run_dir: Path) -> list[ProcessSpec]:
    """What every process slimecli starts gets: its run directory and child_env (unbuffered output, malloc_env)."""
    env = {"SLIMECLI_RUN_DIR": str(run_dir), **child_env()}
    return [replace(s, env={**env, **s.env}) for s in specs]
