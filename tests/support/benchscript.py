"""A bench script (bench/*.py, not a package module) loaded as a module, so that tests can call
its parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def bench_module(file_name: str, module_name: str) -> ModuleType:
    """Execute ``bench/<file_name>`` as module ``module_name``, registered in ``sys.modules`` first
    (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH_DIR / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
