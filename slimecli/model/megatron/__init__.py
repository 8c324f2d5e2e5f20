"""megatron-core models from HF checkpoints (trainer=megatron, teacher.backend=megatron): the converter, the
builder and the CPU shim."""
