from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimecli.config.decode import spec
from slimecli.config.port import Port, port_field


@dataclass(frozen=True)
class RolloutConfig:
    """Rollout engines (embedded or SGLang) and the sampling of responses."""

    name: Literal["local", "sglang"] = "local"
    batch_size: int = spec(8, gt=0)  # prompts per step
    n_samples_per_prompt: int = spec(4, gt=0)
    temperature: float = spec(1.0, gt=0, note="log-probs are taken at this temperature")
    top_p: float = spec(1.0, gt=0, le=1)
    top_k: int = spec(-1, ge=1, also=(-1,), note="-1: all")
    max_new_tokens: int = spec(64, gt=0)
    max_prompt_len: int = spec(1024, gt=0)
    num_engines: int = spec(1, gt=0)  # all on node 0 (with rollout.engines_per_node = 0)
    # N > 0: N engines on every node of a multi-node run (cluster.node_hosts)
    engines_per_node: int = spec(0, ge=0, note="0: rollout.num_engines engines on node 0", resumable=True)
    host: str = spec("127.0.0.1", resumable=True)
    # auto: a free port for every engine when the run starts (recorded in RUN/plan.json); N: engine i on N + i
    port: Port = port_field()
    start_timeout_s: float = spec(300.0, gt=0, resumable=True)
    request_timeout_s: float = spec(600.0, gt=0, resumable=True)
    # an engine that dies, or answers no /health_generate for health_timeout_s (hung), is killed and restarted (its
    # Python stacks dumped first), at most max_restarts times in a run; then the run stops, naming it
    max_restarts: int = spec(2, ge=0, note="0: a dead engine stops the run", resumable=True)
    health_interval_s: float = spec(10.0, gt=0, resumable=True)
    health_timeout_s: float = spec(120.0, gt=0, resumable=True)
    health_start_grace_s: float = spec(60.0, ge=0, note="after a (re)start, before a failing probe counts",
                                       resumable=True)
    max_running_requests: int = spec(128, gt=0)  # embedded engine batch limit (and the rollouts in flight an engine)
    device: str = "auto"  # embedded engine: auto (the first GPU when there is one, else the CPU) | cpu | cuda | cuda:N
    # the engines' weights: auto = SGLang's own choice from the checkpoint (--dtype auto); the embedded engine
    # bfloat16 on a GPU, model.dtype on the CPU. fp32 serving on a GPU costs twice the memory for nothing.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    prefix_cache_mb: int = spec(1024, ge=0, note="0 turns it off")  # embedded engine: memory for cached prompt prefixes (KV), in MiB; 0 turns it off
    dynamic_filter: Literal["none", "zero_std"] = "none"
    over_sampling_batch_size: int | None = spec(None, gt=0, note="or unset")  # prompts pulled per round when filtering
    sglang_args: str = ""  # extra flags for sglang.launch_server
    # one more string of flags per engine (item i: engine i), after sglang_args: () = none
    sglang_engine_args: tuple[str, ...] = ()
    # Engine control and generation endpoints need `Authorization: Bearer <api_key>` (SGLang's --api-key);
    # None: the SLIMECLI_ENGINE_API_KEY environment variable if set, else open. /health* stays open.
    api_key: str | None = None
    # update_weights_from_disk loads only directories under these (symlinks resolved), for every client.
    # () = clients on this host load any directory (as from SGLang); others the run directory or model.path's
    weight_roots: tuple[str, ...] = ()
    # embedded engine: a request head or body that stalls longer is dropped / 408
    read_timeout_s: float = spec(60.0, gt=0, resumable=True)
    max_connections: int = spec(1024, gt=0)  # embedded engine: open connections at most; more are answered 503
    # single_turn: one engine completion per sample; agent: an agent CLI works each SWE task (task=swe);
    # or package.module:function, a factory fn(cfg, tokenizer, engines, source) of an object with async collect()
    generate: str = "single_turn"
    # write each step's samples to RUN/rollouts/step_<k>.jsonl (docs/runs.md#rollout-dumps): tokens, masks,
    # log-probs, weight versions, rewards, the decoded response (an agent's or environment's turns included)
    dump: bool = spec(False, resumable=True)
    # train on the samples a run dumped (its run directory or its rollouts/ folder), with no engine or teacher
    replay: str | None = None
    # with rollout.replay: only these steps, each from the dumped run's checkpoint of the step before
    replay_steps: tuple[int, ...] = spec((), ge=1)


def engine_dtype(r: RolloutConfig, model_dtype: str, on_gpu: bool) -> str:
    """The embedded engine's dtype (rollout.dtype resolved for its device)."""
    if r.dtype != "auto":
        return r.dtype
    return "bfloat16" if on_gpu else model_dtype
