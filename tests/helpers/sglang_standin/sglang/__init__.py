"""A stand-in for the sglang package where SGLang cannot run (no GPU): only ``python -m sglang.launch_server``."""
