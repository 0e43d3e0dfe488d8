"""Dependencies point one way: the scheduling core is pure and imports only the ground floor; the
node agent, the CNI plugin and the device plugins never import the scheduler; the scheduler never
imports the node agent. Checked on the source (every import, module level or inside a function).

The ground floor the layers share: ``devices.model`` and ``devices.nics`` (the inventory and how it
reads as NIC ports), and the pure contract modules of ``kubegpu/`` (``allocation``, ``bandwidth``,
``podrequests``, ``nodeannotations``, ``logs``, ...)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What scheduler/core may import besides itself and the standard library.
CORE_ALLOWED = {"numpy", "devices.model", "devices.nics", "kubegpu.bandwidth", "kubegpu.podrequests"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def offending(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources(folder)
        for name in sorted(imported(path))
        if name in forbidden or name.startswith(tuple(f"{f}." for f in forbidden))
    ]


def test_the_core_imports_only_the_ground_floor() -> None:
    wrong = []
    for path in sources("scheduler/core"):
        for name in sorted(imported(path)):
            top = name.split(".")[0]
            if name.startswith("scheduler.core") or top in sys.stdlib_module_names or name in CORE_ALLOWED:
                continue
            wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("folder", ["crishim", "devices", "kubegpu/cni"])
def test_the_node_side_never_imports_the_scheduler(folder: str) -> None:
    assert offending(folder, ("scheduler",)) == []


@pytest.mark.parametrize("folder", ["scheduler", "devices"])
def test_the_scheduler_and_the_plugins_never_import_the_node_agent(folder: str) -> None:
    assert offending(folder, ("crishim",)) == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from scheduler.core.rdma import nic_state\n    import crishim.shim\n")
    assert imported(module) == {"scheduler.core.rdma", "crishim.shim"}
