"""The simulated plugin: GPUs and RDMA NICs of a real machine's shape, on any Linux host.

The inventory and topology come from a topology file (``devices/topologies/*.json``; format in
docs/devices.md): ``gpus`` (index, model, memoryMiB, numa), ``nvlink`` (count matrix), ``pcie``
(relation matrix, ``X`` on the diagonal) and optionally ``nics`` (name, numa, pcieNearGpu,
rateGbps, vfs). A NIC with ``vfs: N`` is a PF (``function: pf``) with N SR-IOV VFs named
``<name>-vf<k>`` (``function: vf``, ``parentDevice``, the PF's rate and NUMA node): what the
scheduler gives pods as RDMA interfaces. GPU ids are ``GPU-<uuid5(node name, index)>``: stable
across restarts, distinct per node, shaped like NVIDIA UUIDs. NIC ids are the NIC names
(``mlx5_0``), as the RDMA plugin's.

Each device gets a stand-in character device node ``<state>/dev/kubegpu-sim/<gpuN | nic name>``
with major 1, minor 3, the numbers of ``/dev/null``: a container really receives a char device
through the CRI path, and it is harmless (reads EOF, writes vanish; the cgroup rule it adds,
``c 1:3 rwm``, every container already has). Without CAP_MKNOD the node falls back to a symlink
to ``/dev/null`` (containerd resolves symlinked host device paths).

Health: ``<state>/unhealthy`` lists device ids (whitespace or comma separated, ``#`` comments);
those are unhealthy, all others healthy. Tests and demos flip health by writing that file.

Telemetry: ``<state>/metrics.json`` holds what the GPUs are doing (format in
``devices.telemetry``); without it every GPU is idle. Tests and demos make a GPU hot by writing it.

Edits: the device nodes at ``/dev/kubegpu-sim/<name>`` in the container,
``KUBEGPU_VISIBLE_DEVICES=<all ids>``, ``NVIDIA_VISIBLE_DEVICES=<GPU ids>`` (when GPUs),
``KUBEGPU_RDMA_DEVICES=<NIC ids>`` (when NICs) and ``KUBEGPU_GPU_SHARES`` for fractional GPUs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from devices.model import Device, DeviceKind, NodeInventory, PCIeRelation, Topology, pair
from devices.plugin import ContainerEdits, DeviceNode, GpuShare, PluginConfigError, PluginError, shares_env
from devices.telemetry import MAX_METRICS_BYTES, GpuTelemetry, TelemetryError, parse_metrics_file
from kubegpu.inputfiles import read_text

log = logging.getLogger(__name__)

TOPOLOGY_DIR = Path(__file__).parent / "topologies"
SIM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "sim.kubegpu.io")
SIM_MAJOR, SIM_MINOR = 1, 3  # /dev/null's numbers: a real, harmless char device
DEV_SUBDIR = "dev/kubegpu-sim"  # under the state dir on the host
CONTAINER_DEV_DIR = "/dev/kubegpu-sim"
DEFAULT_STATE_DIR = "/var/lib/kubegpu/sim"
UNHEALTHY_FILE = "unhealthy"
METRICS_FILE = "metrics.json"
MAX_SIM_VFS = 64  # per NIC
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:\-]{0,127}$")


class TopologyFileError(PluginConfigError):
    """The topology file is malformed; the message names the file and the problem."""


# --- pure helpers -----------------------------------------------------------------------------


def sim_gpu_id(node_name: str, index: int) -> str:
    """A stable, node-specific, NVIDIA-shaped UUID for simulated GPU ``index`` of ``node_name``."""
    return f"GPU-{uuid.uuid5(SIM_NAMESPACE, f'{node_name}/gpu/{index}')}"


def device_file_name(device: Device) -> str:
    return f"gpu{device.index}" if device.kind is DeviceKind.GPU else device.id


def resolve_topology(name_or_path: str | os.PathLike[str]) -> Path:
    """A path as given, or a shipped topology by name (``dgx1-v100`` -> devices/topologies/...)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = TOPOLOGY_DIR / f"{path.name.removesuffix('.json')}.json"
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.json")))
    raise TopologyFileError(f"topology file {name_or_path} not found (shipped: {known})")


def _matrix(doc: Mapping[str, Any], key: str, n: int, where: str) -> list[list[Any]]:
    rows = doc.get(key)
    square = isinstance(rows, list) and len(rows) == n
    if not square or any(not isinstance(r, list) or len(r) != n for r in rows):
        raise TopologyFileError(f"{where}: {key!r} must be a {n}x{n} matrix")
    for i in range(n):
        for j in range(n):
            if rows[i][j] != rows[j][i]:
                raise TopologyFileError(f"{where}: {key}[{i}][{j}] != {key}[{j}][{i}]")
    return rows


def _nvlinks(doc: Mapping[str, Any], ids: Sequence[str], where: str) -> dict[tuple[str, str], int]:
    rows = _matrix(doc, "nvlink", len(ids), where)
    links: dict[tuple[str, str], int] = {}
    for i, a in enumerate(ids):
        if rows[i][i] not in (0, None):
            raise TopologyFileError(f"{where}: nvlink[{i}][{i}] must be 0")
        for j in range(i + 1, len(ids)):
            n = rows[i][j]
            if not isinstance(n, int) or n < 0:
                raise TopologyFileError(f"{where}: nvlink[{i}][{j}] must be a count >= 0, not {n!r}")
            if n:
                links[pair(a, ids[j])] = n
    return links


def _pcie(doc: Mapping[str, Any], ids: Sequence[str], where: str) -> dict[tuple[str, str], PCIeRelation]:
    rows = _matrix(doc, "pcie", len(ids), where)
    relations: dict[tuple[str, str], PCIeRelation] = {}
    for i, a in enumerate(ids):
        if str(rows[i][i]).upper() != "X":
            raise TopologyFileError(f"{where}: pcie[{i}][{i}] must be 'X'")
        for j in range(i + 1, len(ids)):
            try:
                relations[pair(a, ids[j])] = PCIeRelation.parse(str(rows[i][j]))
            except ValueError as exc:
                raise TopologyFileError(f"{where}: pcie[{i}][{j}]: {exc}") from None
    return relations


def _near_gpus(value: Any, n: int, where: str) -> list[int]:
    near = value if isinstance(value, list) else [] if value is None else [value]
    for g in near:
        if not isinstance(g, int) or not 0 <= g < n:
            raise TopologyFileError(f"{where}: pcieNearGpu {g!r} is not a GPU index")
    return near


def parse_topology(
    doc: Mapping[str, Any], node_name: str, dev_dir: str, where: str = "topology"
) -> NodeInventory:
    """The inventory a topology document describes, for node ``node_name``.

    ``dev_dir`` is the host directory of the stand-in device nodes (``<state>/dev/kubegpu-sim``).
    """
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise TopologyFileError(f"{where}: 'gpus' must be a non-empty list")
    indices = [g.get("index") if isinstance(g, dict) else None for g in gpus]
    if indices != list(range(len(gpus))):
        raise TopologyFileError(f"{where}: gpus must be listed by index 0..{len(gpus) - 1}, got {indices}")
    ids = [sim_gpu_id(node_name, i) for i in range(len(gpus))]
    devices = [
        Device(
            id=ids[i],
            kind=DeviceKind.GPU,
            index=i,
            model=str(g.get("model", "simulated GPU")),
            memory_mib=int(g.get("memoryMiB", 0)),
            numa_node=int(g.get("numa", -1)),
            device_nodes=(f"{dev_dir}/gpu{i}",),
            attributes={"simulated": "true"},
        )
        for i, g in enumerate(gpus)
    ]
    negative = [d.index for d in devices if d.memory_mib < 0]
    if negative:
        raise TopologyFileError(f"{where}: gpus[{negative[0]}].memoryMiB must not be negative")
    nic_gpus: dict[str, tuple[str, ...]] = {}
    index = 0
    for k, nic in enumerate(doc.get("nics") or []):
        name = str(nic.get("name", "")) if isinstance(nic, dict) else ""
        if not _NAME.match(name) or len(name) > 100:
            raise TopologyFileError(f"{where}: nics[{k}] needs a name like mlx5_0, not {name!r}")
        vfs = nic.get("vfs", 0)
        if type(vfs) is not int or not 0 <= vfs <= MAX_SIM_VFS:
            raise TopologyFileError(f"{where}: nics[{k}].vfs must be a count 0..{MAX_SIM_VFS}, not {vfs!r}")
        rate = f"{float(nic.get('rateGbps', 0)):g}"
        model = str(nic.get("model", "simulated RDMA NIC"))
        numa = int(nic.get("numa", -1))
        common = {"simulated": "true", "rateGbps": rate, "state": "ACTIVE"}
        devices.append(
            Device(
                id=name,
                kind=DeviceKind.RDMA,
                index=index,
                model=model,
                numa_node=numa,
                device_nodes=(f"{dev_dir}/{name}",),
                attributes={**common, "function": "pf", "sriovNumVfs": str(vfs)} if vfs else common,
            )
        )
        index += 1
        for v in range(vfs):
            vf = f"{name}-vf{v}"
            devices.append(
                Device(
                    id=vf,
                    kind=DeviceKind.RDMA,
                    index=index,
                    model=f"{model} VF",
                    numa_node=numa,
                    device_nodes=(f"{dev_dir}/{vf}",),
                    attributes={**common, "function": "vf", "parentDevice": name},
                )
            )
            index += 1
        near = _near_gpus(nic.get("pcieNearGpu"), len(ids), f"{where}: nics[{k}]")
        if near:
            nic_gpus[name] = tuple(ids[g] for g in near)
    if len({d.id for d in devices}) != len(devices):
        raise TopologyFileError(f"{where}: duplicate NIC names (a VF is named <nic>-vf<k>)")
    topology = Topology(nvlinks=_nvlinks(doc, ids, where), pcie=_pcie(doc, ids, where), nic_gpus=nic_gpus)
    return NodeInventory(tuple(devices), topology)


def parse_unhealthy(text: str) -> set[str]:
    """Device ids from the ``unhealthy`` file: whitespace or comma separated, ``#`` comments."""
    ids: set[str] = set()
    for line in text.splitlines():
        ids.update(t for t in re.split(r"[\s,]+", line.split("#", 1)[0]) if t)
    return ids


def with_health(inventory: NodeInventory, unhealthy: set[str]) -> NodeInventory:
    """The inventory with exactly the ``unhealthy`` ids marked unhealthy."""
    devices = tuple(replace(d, healthy=d.id not in unhealthy) for d in inventory.devices)
    return NodeInventory(devices, inventory.topology)


def sim_edits(
    devices: Sequence[Device], dev_dir: str, shares: Mapping[str, GpuShare] | None = None
) -> ContainerEdits:
    """Edits for simulated devices (already checked to belong to this node)."""
    if not devices:
        return ContainerEdits()
    nodes = tuple(
        DeviceNode(f"{dev_dir}/{device_file_name(d)}", f"{CONTAINER_DEV_DIR}/{device_file_name(d)}")
        for d in devices
    )
    gpus = [d.id for d in devices if d.kind is DeviceKind.GPU]
    nics = [d.id for d in devices if d.kind is DeviceKind.RDMA]
    env = {"KUBEGPU_VISIBLE_DEVICES": ",".join(d.id for d in devices)}
    if gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
    if nics:
        env["KUBEGPU_RDMA_DEVICES"] = ",".join(nics)
    env.update(shares_env(shares, gpus))
    return ContainerEdits(device_nodes=nodes, env=env)


# --- host side effects ------------------------------------------------------------------------


def ensure_device_node(path: str) -> None:
    """Make ``path`` a char device 1:3 (or, without CAP_MKNOD, a symlink to /dev/null)."""
    want = os.makedev(SIM_MAJOR, SIM_MINOR)
    try:
        st = os.stat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, want)
        os.chmod(path, 0o666)  # mknod's mode passes through the umask; containers copy the mode
    except PermissionError:
        log.info("sim: no CAP_MKNOD, %s becomes a symlink to /dev/null", path)
        os.symlink("/dev/null", path)


class SimPlugin:
    """Simulated GPUs and NICs from a topology file (see module doc)."""

    name = "sim"
    kinds = frozenset({DeviceKind.GPU, DeviceKind.RDMA})

    def __init__(
        self,
        topology: str | os.PathLike[str] | Mapping[str, Any],
        node_name: str,
        state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
        create_nodes: bool = True,
    ) -> None:
        if not node_name:
            raise PluginConfigError("sim: a node name is needed (it seeds the GPU ids)")
        if isinstance(topology, Mapping):
            self._doc, self._where = dict(topology), "topology"
        else:
            path = resolve_topology(topology)
            try:
                self._doc, self._where = json.loads(read_text(path)), str(path)
            except OSError as exc:
                raise TopologyFileError(f"{path}: {exc.strerror or exc}") from None
            except (ValueError, RecursionError) as exc:
                raise TopologyFileError(f"{path}: {exc}") from None
            if not isinstance(self._doc, dict):
                raise TopologyFileError(f"{path}: not a JSON object")
        self.node_name = node_name
        self.state_dir = os.path.abspath(state_dir)
        self.create_nodes = create_nodes
        self.dev_dir = os.path.join(self.state_dir, DEV_SUBDIR)
        self.device_patterns = (f"{self.dev_dir}/*",)
        try:
            self._inventory = parse_topology(self._doc, node_name, self.dev_dir, self._where)  # fail early
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:  # a field of the wrong type
            raise TopologyFileError(f"{self._where}: {exc}") from None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SimPlugin:
        if not options.get("topology"):
            raise PluginConfigError("sim: option 'topology' (a topology file or shipped name) is needed")
        return cls(
            topology=options["topology"],
            node_name=str(options.get("node_name") or ""),
            state_dir=options.get("state_dir") or DEFAULT_STATE_DIR,
        )

    @property
    def unhealthy_file(self) -> str:
        return os.path.join(self.state_dir, UNHEALTHY_FILE)

    def unhealthy(self) -> set[str]:
        try:
            with open(self.unhealthy_file) as f:
                return parse_unhealthy(f.read())
        except FileNotFoundError:
            return set()

    def set_unhealthy(self, ids: Iterable[str]) -> None:
        """Write the ``unhealthy`` file (tests, demos)."""
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self.unhealthy_file, "w") as f:
            f.writelines(f"{i}\n" for i in sorted(ids))

    def discover(self) -> NodeInventory:
        if self.create_nodes:
            for device in self._inventory.devices:
                for node in device.device_nodes:
                    ensure_device_node(node)
        return with_health(self._inventory, self.unhealthy())

    def health(self) -> dict[str, bool]:
        bad = self.unhealthy()
        return {d.id: d.id not in bad for d in self._inventory.devices}

    @property
    def metrics_file(self) -> str:
        return os.path.join(self.state_dir, METRICS_FILE)

    def telemetry(self) -> dict[str, GpuTelemetry]:
        """GPU id -> reading from the metrics file (every GPU idle without one); raises
        PluginError naming the file when it is unreadable or malformed."""
        gpus = [(d.id, d.index, d.memory_mib) for d in self._inventory.by_kind(DeviceKind.GPU)]
        try:
            text = read_text(self.metrics_file, MAX_METRICS_BYTES)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise PluginError(f"sim: {exc}") from None
            text = ""
        except ValueError as exc:  # not UTF-8
            raise PluginError(f"sim: {self.metrics_file}: {exc}") from None
        try:
            return parse_metrics_file(text, gpus, self.metrics_file)
        except TelemetryError as exc:
            raise PluginError(f"sim: {exc}") from None

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits:
        mine = self._inventory.by_id()
        unknown = [d.id for d in devices if d.id not in mine]
        if unknown:
            raise PluginError(f"sim: devices not on node {self.node_name}: {', '.join(unknown)}")
        return sim_edits([mine[d.id] for d in devices], self.dev_dir, shares)
