"""SGLang's own argument parser and request schemas on a machine without a GPU, for the contract tests.

`make sglang-contract` installs the sglang wheel and the few pure-Python packages its ``server_args`` and
``io_struct`` modules import into .cache/sglang-contract (no dependencies: sglang pins another torch and
transformers, and the venv keeps its own). What only exists on GPU machines (triton, torchvision, IPython,
tvm_ffi) is stubbed here while sglang imports, and only then: any attribute of a stub is a do-nothing callable, or
a class where the name is capitalised. ``load()`` returns the sglang modules, or the reason they cannot be had.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("SLIMECLI_SGLANG_CONTRACT", ROOT / ".cache" / "sglang-contract"))
STUBBED = ("triton", "torchvision", "IPython", "tvm_ffi")


class _Anything:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything(self._name + "()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __getitem__(self, key: Any) -> Any:
        return _Anything(self._name + "[]")

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {}) if name[:1].isupper() else _Anything(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Stub(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_loaded: Any = None


def load() -> Any:
    """A namespace with sglang's ServerArgs, io_struct and api_contract, or a string saying why not."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if not (TARGET / ".installed").is_file():
        _loaded = f"sglang is not installed in {TARGET} (make sglang-contract)"
        return _loaded
    # transformers decides once whether torchvision exists: let it see that it does not, before the stubs
    import transformers.image_utils
    import transformers.models.auto.image_processing_auto
    import transformers.models.auto.processing_auto  # noqa: F401

    sys.path.insert(0, str(TARGET))
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        from sglang.srt.entrypoints import api_contract
        from sglang.srt.managers import io_struct
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.utils.common import init_custom_process_group
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        _loaded = f"sglang from {TARGET} does not import here: {type(exc).__name__}: {exc}"
        return _loaded
    finally:
        _unstub(finder)
    _loaded = types.SimpleNamespace(ServerArgs=ServerArgs, io_struct=io_struct, api_contract=api_contract,
                                    init_custom_process_group=init_custom_process_group,
                                    version=_version(TARGET))
    return _loaded


def _unstub(finder: _StubFinder) -> None:
    """The stubs and sglang's directory only while sglang imports: the later tests of the same worker see no fake
    IPython or torchvision (matplotlib, asked for a figure, reads IPython's version from sys.modules when it is
    there), and import the venv's packages, not the older ones installed beside sglang."""
    sys.meta_path.remove(finder)
    sys.path.remove(str(TARGET))
    for name, module in list(sys.modules.items()):
        if isinstance(module, _Stub):
            del sys.modules[name]


def _version(target: Path) -> str:
    """The installed sglang's version, from its wheel's metadata in `target` (not the venv's packages)."""
    found = sorted(target.glob("sglang-*.dist-info"))
    return found[0].name.removeprefix("sglang-").removesuffix(".dist-info") if found else "unknown"
