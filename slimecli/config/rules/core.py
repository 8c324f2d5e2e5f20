"""Rules that span the trainer, rollout, model and cluster groups."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.layout import engine_count
from slimecli.config.schema import SlimeConfig
from slimecli.config.teachers import run_teachers


def sampling(cfg: SlimeConfig) -> list[ConfigError]:
    """Sampling settings across fields (each field's own bounds are in its spec)."""
    r = cfg.rollout
    errors = []
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < r.batch_size:
        errors.append(ConfigError("rollout.over_sampling_batch_size", r.over_sampling_batch_size,
                                  f"must be >= rollout.batch_size ({r.batch_size})"))
    return errors


def engine(cfg: SlimeConfig) -> list[ConfigError]:
    """The embedded engine's device and prefix cache (SGLang engines take theirs from rollout.sglang_args)."""
    r = cfg.rollout
    errors = []
    kind, _, index = r.device.partition(":")
    if not (r.device in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit())):
        errors.append(ConfigError("rollout.device", r.device, "not an allowed value", "auto, cpu, cuda or cuda:N"))
    elif r.name == "sglang" and r.device != "auto":
        errors.append(ConfigError("rollout.device", r.device, "applies to the embedded engine (rollout=local)",
                                  "SGLang picks its GPUs itself: leave rollout.device=auto, or use rollout.sglang_args"))
    return errors + _engine_args(cfg)


def _engine_args(cfg: SlimeConfig) -> list[ConfigError]:
    """rollout.sglang_args and rollout.sglang_engine_args split as a shell would; one entry per engine at most."""
    import shlex

    from slimecli.config.layout import engine_count

    r = cfg.rollout
    errors = []
    for path, text in [("rollout.sglang_args", r.sglang_args),
                       *((f"rollout.sglang_engine_args[{i}]", t) for i, t in enumerate(r.sglang_engine_args))]:
        try:
            shlex.split(text)
        except ValueError as exc:
            errors.append(ConfigError(path, text, f"cannot be split into flags: {exc}", "close the quote"))
    if r.sglang_engine_args and r.name != "sglang":
        errors.append(ConfigError("rollout.sglang_engine_args", list(r.sglang_engine_args),
                                  "applies to SGLang engines (rollout=sglang)"))
    elif len(r.sglang_engine_args) > engine_count(cfg):
        errors.append(ConfigError("rollout.sglang_engine_args", list(r.sglang_engine_args),
                                  f"one entry per engine: {len(r.sglang_engine_args)} entries for "
                                  f"{engine_count(cfg)} engine(s)"))
    return errors


def generate(cfg: SlimeConfig) -> list[ConfigError]:
    """rollout.generate: a registered kind or an import path; agent rollouts need SWE tasks, an agent and the
    per-rollout loss (a run forked into several samples must weigh as much as one that did not)."""
    from slimecli.config.registry import GENERATE_KINDS

    g = cfg.rollout.generate
    error = GENERATE_KINDS.config_error(g)
    if error is not None:
        return [error]
    if g != "agent":
        return []
    errors = []
    if cfg.task.name != "swe":
        errors.append(ConfigError("task.name", cfg.task.name, "rollout.generate=agent works SWE tasks", "add task=swe"))
    if cfg.agent.name == "none" and not cfg.agent.harness:
        errors.append(ConfigError("agent.name", "none", "rollout.generate=agent needs an agent",
                                  "add agent=claude_code or agent=codex (or use +recipe=swe_agent)"))
    if cfg.trainer.loss_reduction != "per_rollout":
        errors.append(ConfigError("trainer.loss_reduction", cfg.trainer.loss_reduction,
                                  "agent runs fork into several samples; each run must weigh the same",
                                  "use trainer.loss_reduction=per_rollout"))
    engines = engine_count(cfg)
    slots = cfg.rollout.max_running_requests * engines
    if cfg.agent.concurrency > slots:
        errors.append(ConfigError("agent.concurrency", cfg.agent.concurrency,
                                  f"more agent runs than the engines serve at once ({engines} x "
                                  f"rollout.max_running_requests={cfg.rollout.max_running_requests})",
                                  f"at most {slots}, or more engines (rollout.num_engines)"))
    return errors


def batches(cfg: SlimeConfig) -> list[ConfigError]:
    t, r = cfg.trainer, cfg.rollout
    errors = []
    samples = r.batch_size * r.n_samples_per_prompt
    if samples % t.global_batch_size:
        errors.append(ConfigError("trainer.global_batch_size", t.global_batch_size,
                                  f"must divide rollout.batch_size x rollout.n_samples_per_prompt = {samples}",
                                  "change rollout.batch_size, rollout.n_samples_per_prompt or trainer.global_batch_size"))
    world = t.nproc * cfg.cluster.nnodes
    model_parallel = t.tensor_parallel_size * t.pipeline_parallel_size if t.name == "megatron" else 1
    replicas = world // model_parallel if model_parallel > 0 and world % model_parallel == 0 else world
    if t.global_batch_size % replicas:
        what = ("data-parallel replicas (trainer.nproc x cluster.nnodes / tensor x pipeline parallel"
                if model_parallel > 1 else "trainer ranks (trainer.nproc x cluster.nnodes")
        errors.append(ConfigError("trainer.global_batch_size", t.global_batch_size,
                                  f"must be divisible by the number of {what} = {replicas})"))
    return errors


def losses(cfg: SlimeConfig) -> list[ConfigError]:
    from slimecli.config.registry import ADVANTAGE_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES

    t = cfg.trainer
    # deprecated spellings (advantage_estimator=gspo, use_tis=true) were rewritten when the config was composed
    # (config/canonical.py); use_tis is still true here only when another correction is named
    checked = [ADVANTAGE_ESTIMATORS.config_error(t.advantage_estimator), POLICY_LOSSES.config_error(t.policy_loss)]
    errors = [error for error in checked if error is not None]
    if t.eps_clip_high is not None and t.eps_clip_high < t.eps_clip:
        errors.append(ConfigError("trainer.eps_clip_high", t.eps_clip_high, f"must be >= trainer.eps_clip ({t.eps_clip})"))
    if t.kl_coef != 0 and t.kl_loss_coef != 0:
        errors.append(ConfigError("trainer.kl_loss_coef", t.kl_loss_coef,
                                  f"cannot be non-zero together with trainer.kl_coef ({t.kl_coef})",
                                  "use either KL reward shaping (kl_coef) or the KL loss (kl_loss_coef)"))
    if t.kl_coef != 0 and t.advantage_estimator == "grpo":
        errors.append(ConfigError("trainer.kl_coef", t.kl_coef,
                                  f"KL reward shaping is not part of {t.advantage_estimator}'s advantages",
                                  "use trainer.kl_loss_coef, or a reinforce_plus_plus estimator"))
    correction = t.off_policy_correction
    if t.use_tis and correction not in ("none", "tis"):
        errors.append(ConfigError("trainer.use_tis", True, "is the deprecated spelling of "
                                  f"trainer.off_policy_correction=tis, which names {t.off_policy_correction!r}",
                                  "drop trainer.use_tis"))
    unknown = OFF_POLICY_CORRECTIONS.config_error(t.off_policy_correction)
    if unknown is not None:
        errors.append(unknown)
    if correction != "none" and t.use_rollout_logprobs:
        errors.append(ConfigError("trainer.off_policy_correction", correction,
                                  "an off-policy correction weighs recomputed old log-probs against the engine's; "
                                  "with trainer.use_rollout_logprobs=true the weight is always 1",
                                  "set trainer.off_policy_correction back or trainer.use_rollout_logprobs=false"))
    if correction == "tis" and not t.tis_clip_high > t.tis_clip_low >= 0:
        errors.append(ConfigError("trainer.tis_clip_high", t.tis_clip_high, f"must be > trainer.tis_clip_low ({t.tis_clip_low}) >= 0"))
    if correction in ("mis", "icepop") and not t.is_mask_high > t.is_mask_low:
        errors.append(ConfigError("trainer.is_mask_high", t.is_mask_high, f"must be > trainer.is_mask_low ({t.is_mask_low})"))
    if (t.opd_kl_coef > 0 or cfg.recipe == "opd") and not run_teachers(cfg):
        errors.append(ConfigError("teacher", "none", "distillation needs a teacher",
                                  "add teacher=server teacher.url=... (or teacher.model_path=...), or teacher=sglang teacher.url=..."))
    return errors


def parallel(cfg: SlimeConfig) -> list[ConfigError]:
    t, c = cfg.trainer, cfg.cluster
    errors = []
    world = t.nproc * c.nnodes
    model_parallel = t.tensor_parallel_size * t.pipeline_parallel_size
    if t.name == "torch":  # the sizes belong to trainer=megatron; set on the torch trainer they would do nothing
        for key, size in (("tensor_parallel_size", t.tensor_parallel_size),
                          ("pipeline_parallel_size", t.pipeline_parallel_size)):
            if size != 1:
                errors.append(ConfigError(f"trainer.{key}", size, "the torch trainer is data-parallel only; "
                                          "tensor/pipeline parallel sizes must be 1",
                                          "use trainer=megatron for model parallelism"))
    elif world % model_parallel:
        errors.append(ConfigError("trainer.nproc", t.nproc,
                                  f"world size {world} is not divisible by tensor x pipeline parallel = {model_parallel}"))
    if t.sequence_parallel and (t.name != "megatron" or t.tensor_parallel_size < 2):
        errors.append(ConfigError("trainer.sequence_parallel", True, "sequence parallelism splits what tensor "
                                  "parallelism replicates: it needs trainer=megatron and tensor_parallel_size > 1",
                                  "set trainer=megatron trainer.tensor_parallel_size=2 (or more), or drop it"))
    if t.max_tokens_per_micro_batch is not None and t.name == "megatron" and t.pipeline_parallel_size > 1:
        errors.append(ConfigError("trainer.max_tokens_per_micro_batch", t.max_tokens_per_micro_batch,
                                  "pipeline stages exchange activations of one shape, so every micro-batch is padded "
                                  "to the most rows and the longest sample of any: a token budget would pad more, "
                                  "not less", "unset it (trainer.micro_batch_size sets the rows), or use "
                                  "trainer.pipeline_parallel_size=1"))
    if c.nnodes > 1 and not cfg.run.dir and c.name != "slurm":  # slurm: the submitting command makes one
        errors.append(ConfigError("run.dir", None, "a multi-node run needs run.dir: one directory shared by every node",
                                  "set run.dir to a path on a shared file system"))
    if not 0 <= c.node_rank < c.nnodes:
        errors.append(ConfigError("cluster.node_rank", c.node_rank, f"must be in [0, cluster.nnodes={c.nnodes})"))
    if c.node_hosts and len(c.node_hosts) != c.nnodes:
        errors.append(ConfigError("cluster.node_hosts", list(c.node_hosts),
                                  f"one address per node: {len(c.node_hosts)} given for cluster.nnodes={c.nnodes}"))
    return errors


def model(cfg: SlimeConfig) -> list[ConfigError]:
    """A preset other than tiny names its checkpoint (the directory is read in launch/source_checks.py)."""
    m = cfg.model
    if m.path is None and m.name != "tiny":
        return [ConfigError("model.path", None, f"model={m.name} needs model.path (a Hugging Face checkpoint directory)")]
    return []


RULES = [sampling, engine, generate, batches, losses, parallel, model]
