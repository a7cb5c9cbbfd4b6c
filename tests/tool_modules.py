"""The repository's tools (tools/*.py, scripts rather than packages) as modules, for tests of their functions."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def tool_module(name: str) -> Iterator[ModuleType]:
    """tools/NAME.py as a module, registered in sys.modules while in use (a dataclass of it looks its module
    up there)."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
