"""Pre-flight for env=...: every source's environment loads (its library imported, its id found, its arguments
taken, its tasks read) before anything starts. What fails is a config error naming the key, with a did-you-mean
over the ids the adapter knows; the environments loaded are closed again (an OpenEnv server is stopped)."""

from __future__ import annotations

import asyncio

from slimecli.config.errors import ConfigError, allowed_hint, did_you_mean
from slimecli.config.schema import SlimeConfig
from slimecli.env.provider import EnvLoadError, EnvNotFound
from slimecli.env.sources import load_provider, read_rows, source_specs


def source_errors(cfg: SlimeConfig) -> list[ConfigError]:
    errors: list[ConfigError] = []
    for i, spec in enumerate(source_specs(cfg.env)):
        key = f"env.mix[{i}].id" if cfg.env.mix else "env.id"
        try:
            provider = load_provider(spec, cfg.env)
        except EnvNotFound as exc:
            close = did_you_mean(spec.env_id, exc.known)
            hint = allowed_hint(spec.env_id, exc.known) if 0 < len(exc.known) <= 12 else \
                ", ".join(filter(None, [close, "slimecli env list shows what is installed"]))
            detail = exc.detail if exc.detail and "did you mean" not in exc.detail else ""
            errors.append(ConfigError(key, spec.env_id, f"no {spec.kind} environment of that name"
                                      + (f" ({detail})" if detail else ""), hint))
            continue
        except (EnvLoadError, ImportError, TypeError, ValueError) as exc:
            errors.append(ConfigError(key, spec.env_id, f"cannot load the environment: {exc}"))
            continue
        try:
            own = provider.tasks(cfg.env.split)
            if not own:
                read_rows(cfg.task)
        except (EnvLoadError, OSError, ValueError) as exc:
            where = "task.path" if not isinstance(exc, EnvLoadError) or "task" in str(exc) else key
            errors.append(ConfigError(where, spec.env_id if where == key else cfg.task.path, str(exc)))
        finally:
            asyncio.run(provider.aclose())
    return errors



