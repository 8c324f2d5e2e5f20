"""Teacher rules: where the teacher comes from and where it runs (its limits are in its schema's field specs)."""

from __future__ import annotations

from slimecli.config.errors import ConfigError
from slimecli.config.schema import SlimeConfig


def source(cfg: SlimeConfig) -> list[ConfigError]:
    t = cfg.teacher
    if t.name == "server" and not (t.url or t.model_path):
        return [ConfigError("teacher.model_path", None, "teacher=server needs teacher.model_path (launched by slimecli) "
                            "or teacher.url (an existing server)")]
    if t.name == "sglang" and not t.url:
        return [ConfigError("teacher.url", None, "teacher=sglang needs the URL of a running SGLang server")]
    if t.url and not t.url.startswith(("http://", "https://")):
        return [ConfigError("teacher.url", t.url, "must start with http:// or https://")]
    return []


def sglang_temperature(cfg: SlimeConfig) -> list[ConfigError]:
    """SGLang applies the temperature to sampled tokens only: its input-token log-probs, which teacher=sglang
    scores with, are always at temperature 1, and no reply holds the full distribution to rescale them."""
    temperature = cfg.rollout.temperature
    if cfg.teacher.name != "sglang" or temperature == 1.0:
        return []
    return [ConfigError("rollout.temperature", temperature,
                        "teacher=sglang scores at temperature 1 only (SGLang applies the temperature to sampled "
                        "tokens, not to the input-token log-probs the teacher's scores are), so it cannot score "
                        "the student's tokens at this rollout temperature",
                        "use teacher=server (it scores at the rollout temperature), or rollout.temperature=1.0")]


def placement(cfg: SlimeConfig) -> list[ConfigError]:
    t = cfg.teacher
    if t.every_node and (t.name != "server" or t.url):
        return [ConfigError("teacher.every_node", True, "starts a teacher server on every node: it needs teacher=server "
                            "with teacher.model_path, not a teacher that runs already (teacher.url)",
                            "drop teacher.url (and use teacher=server), or drop teacher.every_node")]
    return []


RULES = [source, sglang_temperature, placement]
