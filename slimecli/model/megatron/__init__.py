"""megatron-core models from HF checkpoints (trainer=megatron, teacher.backend=megatron): the converter, the
builder and the CPU shim."""

from slimecli.model.megatron.cpu import plain_jit_fuser

plain_jit_fuser()
