"""Load any HF checkpoint directory, and find (or make once) the tiny model a config asks for."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimecli.config.groups.model import ModelConfig

log = logging.getLogger(__name__)
TINY_PARAMS = ("seed", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
               "max_position_embeddings")


def torch_dtype(name: str) -> Any:
    import torch

    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (float32, bfloat16, float16)") from None


# model.trust_remote_code of the run this process serves. A server's entry point (engine, teacher) sets it once,
# so that every load below honours it, the weight updates of the running server included.
_trust_remote_code = False


def set_trust_remote_code(value: bool) -> None:
    """Let checkpoints whose config names custom code (auto_map) run it: model.trust_remote_code."""
    global _trust_remote_code
    _trust_remote_code = value


def remote_code_trusted() -> bool:
    return _trust_remote_code


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu",
               trust_remote_code: bool | None = None) -> Any:
    """AutoModelForCausalLM with SDPA attention (long prompts never materialise the full score matrix).

    `trust_remote_code`: None -> this process's setting (set_trust_remote_code)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    trust = _trust_remote_code if trust_remote_code is None else trust_remote_code
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype), attn_implementation="sdpa",
                                                      trust_remote_code=trust)
    return model.to(device).eval()


def load_serving_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> Any:
    """The model a server runs: the engine's own implementation where it reproduces the checkpoint exactly
    (model/plain_decoder.py: Llama, Mistral, Qwen2, Qwen3 without custom code), else load_model's. Without
    transformers' model code the server starts 1.4 CPU-seconds sooner."""
    from slimecli.model.plain_decoder import plain_decoder_or_why

    model, why = plain_decoder_or_why(path, torch_dtype(dtype), device)
    if model is not None:
        return model
    log.info("loading %s with transformers: %s", path, why)
    return load_model(path, dtype, device)


def load_tokenizer(path: str | Path, trust_remote_code: bool | None = None) -> Any:
    from transformers import AutoTokenizer

    trust = _trust_remote_code if trust_remote_code is None else trust_remote_code
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)


def tiny_params(model_cfg: ModelConfig) -> dict[str, int]:
    return {k: getattr(model_cfg, k) for k in TINY_PARAMS}


def tiny_dir_name(params: dict[str, int]) -> str:
    from slimecli.model.tiny import TINY_FORMAT_VERSION

    blob = json.dumps({"v": TINY_FORMAT_VERSION, **params}, sort_keys=True).encode()
    return "tiny-" + hashlib.sha256(blob).hexdigest()[:12]


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "slimecli"


def ensure_tiny_model(params: dict[str, int], cache_dir: str | Path | None = None) -> Path:
    """Create the tiny model once per parameter set: a file lock serialises makers, temp dir + rename publishes."""
    from slimecli.model.tiny import create_tiny_model

    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / tiny_dir_name(params)
    if (final / "config.json").exists():
        return final
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            create_tiny_model(tmp, **params)
            tmp.chmod(0o755)
            if final.exists():  # a half-made directory without config.json: never published, so remove it
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_model_path(model_cfg: ModelConfig) -> Path:
    """model.path if set; for model=tiny without a path, the cached tiny model (made on first use)."""
    if model_cfg.path:
        return Path(model_cfg.path)
    if model_cfg.name == "tiny":
        return ensure_tiny_model(tiny_params(model_cfg), model_cfg.cache_dir)
    raise ValueError(f"model={model_cfg.name} needs model.path (a Hugging Face checkpoint directory)")


def resolve_tokenizer_path(model_cfg: ModelConfig) -> Path:
    return Path(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else resolve_model_path(model_cfg)


# The text both tokenizers must encode alike (ASCII, digits, accents, tool-call markup).
PROBE_TEXT = "Teacher and student must agree: 12 + 30 = 42, naïve café, <tool_call>{\"x\": 1}</tool_call>\n"


# A saved Hugging Face tokenizer: a directory holding any of TOKENIZER_FILES is one; TOKENIZER_PARTS is everything
# save_pretrained writes for one (the parts its kind needs)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOKENIZER_PARTS = (*TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "merges.txt", "chat_template.jinja")


def same_tokenizer_files(a: str | Path, b: str | Path) -> bool:
    """Both directories hold the same tokenizer files, byte for byte (tokenizer_config.json, which names the
    tokenizer's class, among them): the same tokenizer, known without loading either."""
    a, b = Path(a).expanduser(), Path(b).expanduser()
    if not (a / "tokenizer_config.json").is_file():
        return False
    for name in TOKENIZER_PARTS:
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file() or (fa.is_file() and fa.read_bytes() != fb.read_bytes()):
            return False
    return True


def check_tokenizers_compatible(student_path: str | Path, teacher_path: str | Path) -> str | None:
    """None if both tokenizers have the same vocabulary size and encode a probe text to the same ids (or are the
    same files: the controller's pre-flight then imports no transformers)."""
    if same_tokenizer_files(student_path, teacher_path):
        return None
    try:
        student, teacher = load_tokenizer(student_path), load_tokenizer(teacher_path)
    except Exception as exc:  # noqa: BLE001 - any failure to load one is the answer, with its message
        return f"cannot compare the tokenizers of student {student_path} and teacher {teacher_path}: {exc}"
    if len(student) != len(teacher):
        return (f"teacher and student tokenizers differ: student {student_path} has {len(student)} tokens, "
                f"teacher {teacher_path} has {len(teacher)}")
    a, b = student.encode(PROBE_TEXT, add_special_tokens=False), teacher.encode(PROBE_TEXT, add_special_tokens=False)
    if a != b:
        return (f"teacher and student tokenizers differ: the probe text encodes to different ids with student "
                f"{student_path} and teacher {teacher_path}")
    return None
