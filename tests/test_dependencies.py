"""Dependencies: what is installed lies within pyproject's ranges, constraints.txt (what CI installs) agrees
with pyproject and the Makefile, megatron-core is imported only when asked for, and the transformers APIs the
code relies on behave as it expects, on the tiny model. A floor lowered below what the code needs fails here
(transformers 4.56 fails the cache test, 4.55 the dtype test)."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CORE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}
OPTIONAL = [r for name, reqs in EXTRAS.items() if name != "dev" for r in reqs]
PINNED_EXTRAS = ("dev", "megatron")  # what CI installs, so what constraints.txt must pin


def installed(name: str) -> Version | None:
    """The version installed here, SGLang's contract files (make sglang-contract) included whichever tests ran
    before: test_sglang_contract.py puts them on sys.path, and this answer must not depend on the order."""
    from tests.helpers.sglang_contract import TARGET

    for dist in md.distributions(name=name, path=[*sys.path, str(TARGET)]):
        return Version(dist.version)
    return None


def constraints() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            assert m, f"constraints.txt: not a name==version pin: {line!r}"
            pins[canonicalize_name(m[1])] = Version(m[2])
    return pins


# ---- versions --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("req", CORE + EXTRAS["dev"], ids=lambda r: r.name)
def test_installed_version_is_within_pyprojects_range(req: Requirement) -> None:
    version = installed(req.name)
    assert version is not None, f"{req.name} is not installed (pyproject requires {req})"
    assert req.specifier.contains(version, prereleases=True), (
        f"{req.name} {version} is installed, pyproject requires {req.specifier}")


@pytest.mark.parametrize("req", OPTIONAL, ids=lambda r: r.name)
def test_installed_optional_dependency_is_within_range(req: Requirement) -> None:
    version = installed(req.name)
    if version is None:
        pytest.skip(f"{req.name} is not installed (an optional extra)")
    assert req.specifier.contains(version, prereleases=True), (
        f"{req.name} {version} is installed, pyproject requires {req.specifier}")


def test_constraints_pin_every_dependency_inside_pyprojects_range() -> None:
    pins = constraints()
    reqs = CORE + [r for name in PINNED_EXTRAS for r in EXTRAS[name]]
    missing = [r.name for r in reqs if canonicalize_name(r.name) not in pins]
    assert not missing, f"constraints.txt pins none of {missing}: run make constraints"
    outside = [f"{r.name}=={pins[canonicalize_name(r.name)]} (pyproject: {r.specifier})" for r in reqs
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, f"constraints.txt pins versions pyproject excludes: {outside}"
    assert "slimecli" not in pins and not [n for n in pins if n.startswith("nvidia-")]
    assert pins["torch"].local is None, f"torch=={pins['torch']}: pin the release, which CPU and CUDA builds match"


def test_makefile_torch_pin_matches_constraints() -> None:
    m = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "Makefile: no TORCH ?= torch==VERSION"
    assert Version(m[1]) == constraints()["torch"], f"Makefile installs torch=={m[1]}, constraints.txt pins another"


def test_slimecli_imports_megatron_only_when_asked() -> None:
    """Every module (the megatron patch included: it imports megatron-core lazily) imports without megatron-core."""
    code = """if True:
        import importlib, importlib.abc, pkgutil, sys
        class NoMegatron(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "megatron":
                    raise ImportError("megatron-core imported at import time by " + name)
        sys.meta_path.insert(0, NoMegatron())
        import slimecli
        names = [m.name for m in pkgutil.walk_packages(slimecli.__path__, "slimecli.")
                 if not m.name.endswith("__main__") and ".swe.data" not in m.name]
        for name in names:
            importlib.import_module(name)
        assert "slimecli.train.optim.megatron_patch" in names
        print(len(names))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 50


# ---- the transformers APIs the code relies on -------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tiny: Path) -> Any:
    from slimecli.model.loading import load_model

    return load_model(tiny)


def test_from_pretrained_honours_dtype(tiny: Path) -> None:
    """load_model / load_policy pass `dtype=` (transformers 4.56 renamed torch_dtype)."""
    from slimecli.model.loading import load_model

    model = load_model(tiny, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "sdpa"


def test_text_config_and_logits_to_keep(model: Any) -> None:
    assert model.config.get_text_config().num_hidden_layers == 2
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[5, 6, 7, 8]]), logits_to_keep=1)
    assert out.logits.shape[:2] == (1, 1)


def test_dynamic_cache_is_per_layer(model: Any) -> None:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from slimecli.engine.runner import _cache_kwarg

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), use_cache=True, **{_cache_kwarg(model): cache})
    assert len(cache.layers) == model.config.get_text_config().num_hidden_layers
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer) and layer.is_initialized
        assert layer.keys is not None and layer.values is not None
        assert layer.keys.shape[-2] == layer.values.shape[-2] == 4 and layer.get_seq_length() == 4


def test_engine_batch_cache_serves_as_the_models_cache(model: Any) -> None:
    """The engine's BatchCache (SlotLayer per layer) in prefill and decode gives the logits of a full forward."""
    from slimecli.engine.kvcache import BatchCache
    from slimecli.engine.runner import _cache_kwarg

    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    cache = BatchCache(model.config.get_text_config().num_hidden_layers)
    kw = {_cache_kwarg(model): cache, "use_cache": True, "logits_to_keep": 1}
    with torch.inference_mode():
        full = model(input_ids=ids).logits[0]
        prefill = model(input_ids=ids[:, :4], position_ids=torch.arange(4).unsqueeze(0), **kw).logits[0, -1]
        assert cache.length == 4 and cache.slot_layers[0].valid()[0].shape[-2] == 4
        steps = [model(input_ids=ids[:, i:i + 1], position_ids=torch.tensor([[i]]), **kw).logits[0, -1]
                 for i in (4, 5)]
    assert cache.length == 6 and cache.get_seq_length() == 6
    for got, want in zip([prefill, *steps], full[3:], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_chat_template_gives_the_same_ids_both_ways(tok: Any) -> None:
    """The rollout driver's call (tokenize=True) and the agent renderer's (return_dict=False) give the ids of the text."""
    from slimecli.agent.api.render import Renderer

    messages = [{"role": "user", "content": "Say HI"}]
    tools = [{"type": "function", "function": {"name": "shout", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '"shout"' in text and text.endswith("<|im_start|>assistant\n")
    want = tok(text, add_special_tokens=False)["input_ids"]
    assert Renderer(tok, 4096).render(messages, tools) == want
    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    assert list(ids["input_ids"] if hasattr(ids, "keys") else ids) == want
