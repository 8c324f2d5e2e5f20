"""Run megatron-core on a machine without a GPU (CPU tensors, gloo), for tests and laptops.

megatron-core 0.16 assumes CUDA in a few places: the RNG tracker reads and writes CUDA generator states,
buffers are allocated on ``torch.cuda.current_device()`` or ``device="cuda"``, and gradient clipping and the distributed optimizer
accept only ``torch.cuda.*`` tensor types. ``apply()`` redirects exactly those, and only inside megatron-core's own modules:
each listed module's global ``torch`` is replaced by a view of torch whose ``cuda`` namespace is the CPU and
whose tensor factories put ``"cuda"`` tensors on the CPU. Nothing outside megatron-core sees a change.
It refuses to run where a GPU exists, so a GPU run never goes through it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("slimecli.megatron")

# the megatron-core modules whose CUDA calls are redirected (found by running a training step on CPU)
MODULES = (
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.utils",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",  # trainer=megatron with DP > 1
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.transformer.utils",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.language_module.language_module",
    "megatron.core.dist_checkpointing.strategies.async_utils",  # distributed checkpoints (sync saves)
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.dist_checkpointing.exchange_utils",
)
# megatron-core methods that call Tensor.cuda(): while one runs (and only then), Tensor.cuda() is the identity
TENSOR_CUDA_CALLERS = (
    ("megatron.core.models.common.language_module.language_module", "LanguageModule",
     "setup_embeddings_and_output_layer"),  # the tied embedding's copy on the last pipeline stage
    # the distributed optimizer's checkpoint gathers and scatters its shards over the replicas (DP > 1)
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "sharded_state_dict"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "load_state_dict"),
)
# megatron-core methods that accept only parameters whose Tensor.type() is torch.cuda.*: while one runs, a CPU
# tensor's type() names the CUDA type of its dtype
TENSOR_TYPE_CALLERS = (
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "__init__"),
)
FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like",
             "full_like", "rand", "randn")
_applied = False


def _cpu_device(device: Any) -> Any:
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def make(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return make


class _CpuCuda(types.SimpleNamespace):
    """What megatron-core calls on ``torch.cuda``, answered by the CPU."""


def _cpu_cuda() -> _CpuCuda:
    real = torch.cuda
    rng = types.SimpleNamespace(get_rng_state=lambda device=None: torch.get_rng_state(),
                                set_rng_state=lambda state, device=None: torch.set_rng_state(state))
    return _CpuCuda(
        random=rng,
        is_available=lambda: False,
        current_device=lambda: torch.device("cpu"),
        device_count=lambda: 0,
        get_rng_state=lambda device=None: torch.get_rng_state(),
        set_rng_state=lambda state, device=None: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        synchronize=lambda device=None: None,
        empty_cache=lambda: None,
        current_stream=lambda device=None: None,
        nvtx=types.SimpleNamespace(range_push=lambda *a, **k: None, range_pop=lambda *a, **k: None),
        # types, events and graphs are only named, never used on the paths a CPU run takes
        Event=real.Event, Stream=real.Stream, CUDAGraph=getattr(real, "CUDAGraph", None),
        FloatTensor=torch.FloatTensor, memory=real.memory, amp=real.amp,
        default_generators=(torch.default_generator,), _lazy_call=lambda fn: fn(),
    )


def _device(*args: Any, **kwargs: Any) -> torch.device:
    device = torch.device(*args, **kwargs)
    return torch.device("cpu") if device.type == "cuda" else device


class _CpuTorch(types.ModuleType):
    """torch, except that ``cuda`` is the CPU and factories place "cuda" tensors on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cpu_cuda()
        for name in FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))
        self.device = _device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _clip_by_total_norm(parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False) -> None:
    """megatron-core's clip_grad_by_total_norm_fp32 without its CUDA type assertion and fused kernel."""
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff >= 1.0:
        return
    for p in parameters:
        grad = getattr(p, "decoupled_grad", None) if use_decoupled_grad else p.grad
        if grad is not None:
            grad.detach().mul_(coeff)


def _tensor_cuda_is_identity(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        original = torch.Tensor.cuda
        torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
        try:
            return method(*args, **kwargs)
        finally:
            torch.Tensor.cuda = original  # type: ignore[method-assign]

    return call


def _tensor_type_is_cuda(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        original = torch.Tensor.type

        def cuda_type(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            name = original(self, *a, **k)
            if a or k or self.device.type != "cpu":
                return name
            return str(name).replace("torch.", "torch.cuda.", 1)

        torch.Tensor.type = cuda_type  # type: ignore[method-assign,assignment]
        try:
            return method(*args, **kwargs)
        finally:
            torch.Tensor.type = original  # type: ignore[method-assign]

    return call


class _PlainJitFuser(importlib.abc.MetaPathFinder):
    """Loads megatron.core.jit, then switches its fuser off before any module decorates a function with it."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "megatron.core.jit":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            load(module)
            module.disable_jit_fuser()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def plain_jit_fuser() -> None:
    """Before megatron-core is imported where no GPU exists: its fusable functions stay plain Python functions.
    megatron-core wraps them in torch.compile as it imports them (its jit_fuser), which imports torch's dynamo and
    inductor: 1.5 of the 4.5 CPU-seconds its import costs every trainer rank and teacher, for GPU kernels. A CPU
    run computes the same functions eagerly."""
    if "megatron.core.jit" in sys.modules or any(isinstance(f, _PlainJitFuser) for f in sys.meta_path):
        return
    if not torch.cuda.is_available():
        sys.meta_path.insert(0, _PlainJitFuser())


def apply() -> None:
    """Redirect megatron-core's CUDA calls to the CPU (idempotent); refuses when a GPU is present."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the megatron-core CPU shim is for machines without a GPU; this one has one")
    cpu_torch = _CpuTorch()
    for name in MODULES:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = cpu_torch  # type: ignore[attr-defined]
    for module_name, owner, method in TENSOR_CUDA_CALLERS:
        cls = getattr(importlib.import_module(module_name), owner)
        setattr(cls, method, _tensor_cuda_is_identity(getattr(cls, method)))
    for module_name, owner, method in TENSOR_TYPE_CALLERS:
        cls = getattr(importlib.import_module(module_name), owner)
        setattr(cls, method, _tensor_type_is_cuda(getattr(cls, method)))
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random._get_cuda_rng_state = lambda device=None, clone=False, graph_safe=False: (  # type: ignore[attr-defined]
        torch.get_rng_state().clone() if clone else torch.get_rng_state())
    random._set_cuda_rng_state = lambda state, device=-1, graph_safe=False: torch.set_rng_state(state)  # type: ignore[attr-defined]
    clip = importlib.import_module("megatron.core.optimizer.clip_grads")
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    for module in (clip, optimizer):
        if hasattr(module, "clip_grad_by_total_norm_fp32"):
            module.clip_grad_by_total_norm_fp32 = _clip_by_total_norm  # type: ignore[attr-defined]
    _applied = True
    log.warning("no GPU: megatron-core runs on the CPU (its CUDA calls redirected by slimecli.model.megatron.cpu)")
