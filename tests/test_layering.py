"""Dependencies point one way: the scheduling core is pure and imports only the ground floor; the
node agent, the CNI plugin and the device plugins never import the scheduler; the scheduler never
imports the node agent. Checked on the source (every import, module level or inside a function).

The ground floor the layers share: ``devices.model`` and ``devices.nics`` (the inventory and how it
reads as NIC ports), and the lower modules of ``kubegpu/`` (``KUBEGPU_GROUND``: the contract, the
API and command-line helpers, logs), which import nothing above them. ``kubegpu/`` also holds the
top (the CLI, the local cluster, the node installer, the GPU proof), which no layer imports.
Within ``devices/``, the plugin interface (``devices.plugin``) imports no plugin; the registry
(``devices.registry``) above them builds them by name."""

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
    """The Python files of a folder, or the one file named."""
    path = REPO / folder
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


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


# kubegpu/'s ground floor: what crishim, devices, scheduler and kubegpu-cni may import from kubegpu/.
KUBEGPU_GROUND = {
    "kubegpu",  # the package itself: __version__
    "kubegpu.allocation",
    "kubegpu.bandwidth",
    "kubegpu.cliargs",
    "kubegpu.containerdconfig",
    "kubegpu.httphead",
    "kubegpu.httpserve",
    "kubegpu.inputfiles",
    "kubegpu.kube",
    "kubegpu.leanpost",
    "kubegpu.livemetrics",
    "kubegpu.logs",
    "kubegpu.nodeannotations",
    "kubegpu.podrequests",
}
# kubegpu/ modules a layer may import besides the ground floor: the node's NodeResourceTopology
# object (it reads the inventory, devices.model) and the CNI plugin's own package.
KUBEGPU_NODE_SIDE = {"kubegpu.nrt"}
PLUGIN_MODULES = ("devices.nvidia", "devices.sim", "devices.rdma")


def kubegpu_imports(path: Path) -> set[str]:
    """The kubegpu modules ``path`` imports (``from kubegpu import x`` counts as ``kubegpu.x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "kubegpu")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "kubegpu":
                names.update(f"kubegpu.{a.name}".removesuffix(".__version__") for a in node.names)
            elif node.module.split(".")[0] == "kubegpu":
                names.add(node.module)
    return names


@pytest.mark.parametrize("folder", ["crishim", "devices", "scheduler", "kubegpu/cni"])
def test_the_layers_import_only_kubegpus_ground_floor(folder: str) -> None:
    allowed = KUBEGPU_GROUND | KUBEGPU_NODE_SIDE
    wrong = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources(folder)
        for name in sorted(kubegpu_imports(path))
        if name not in allowed and not name.startswith("kubegpu.cni")
    ]
    assert wrong == []


def test_kubegpus_ground_floor_imports_nothing_above_it() -> None:
    wrong = []
    for module in sorted(KUBEGPU_GROUND - {"kubegpu"}):
        path = REPO / (module.replace(".", "/") + ".py")
        above = {n for n in imported(path) if n.split(".")[0] in ("crishim", "scheduler", "devices")}
        above |= kubegpu_imports(path) - KUBEGPU_GROUND
        wrong += [f"{module} imports {name}" for name in sorted(above)]
    assert wrong == []


def test_the_plugin_interface_imports_no_plugin() -> None:
    assert offending("devices/plugin.py", PLUGIN_MODULES + ("devices.registry",)) == []
    for plugin in PLUGIN_MODULES:
        path = plugin.replace(".", "/") + ".py"
        assert offending(path, ("devices.registry",)) == [], plugin


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from scheduler.core.rdma import nic_state\n    import crishim.shim\n")
    assert imported(module) == {"scheduler.core.rdma", "crishim.shim"}
