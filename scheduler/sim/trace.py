"""Reading the openb trace format (Alibaba cluster-trace-gpu-v2023) into the core's types.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model`` and optionally ``gpu_util``: how busy the node's GPUs are
(percent, 0..100; empty: unknown), fed to the scheduling core as the node's live readings
(``NodeSpec.live``, docs/simulator.md "Live utilisation").
Pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and optionally ``gpu_spec`` (allowed models
separated by ``|``; empty = any) and the gang columns ``gang`` (the pod's group; empty = none) and
``gang_min`` (the group's minimum; without the column, all its members); other columns (qos, phase,
timestamps) are ignored. A pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` shares one GPU; other
GPU pods take ``num_gpu`` whole GPUs.

RDMA (docs/simulator.md "RDMA interfaces"): the node list's optional ``rdma_nics`` column gives the
node's NICs as ``PFSxRATE/VFS`` (``2x100Gbps/8``: two PFs of 100 Gbit/s with 8 VFs each; empty: none),
built into ``NodeState.nics`` (``NicSpec.state``); the pod list's optional ``rdma_interfaces`` and
``rdma_bandwidth`` columns give ``PodRequest.rdma`` in the grammar of the live scheduler's annotations
``kubegpu.io/rdma-interfaces`` and ``kubegpu.io/rdma-bandwidth``.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kubegpu.bandwidth import format_mbps, parse_bandwidth
from kubegpu.inputfiles import MAX_TRACE_BYTES, check_input
from scheduler.core.rdma import MAX_INTERFACES, NO_RDMA, NicState, PfState, RdmaRequest
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.state import ClusterState, GpuState, LiveGpu, NodeState
from scheduler.sim.machines import MachineError, MachineShape

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_NODES = DATA_DIR / "default_nodes.csv"
DEFAULT_PODS = DATA_DIR / "default_pods.csv"

GANG = "gang"  # the pod list's column naming a pod's group
GANG_MIN = "gang_min"  # the column with the group's minimum number of members that must run together
MAX_GANG_MIN = 100_000  # as the live scheduler's bound on a PodGroup's minMember
CLONE_NAME = re.compile(r"-clone-[0-9]+$")  # the names the protocol gives its clones
UTILIZATION = "gpu_util"  # the node list's optional column: the node's GPU utilisation, percent
RDMA_NICS = "rdma_nics"  # the node list's optional column: the node's RDMA NICs, PFSxRATE/VFS
RDMA_INTERFACES = "rdma_interfaces"  # the pod list's optional column: RDMA interfaces (VFs) for the pod
RDMA_BANDWIDTH = "rdma_bandwidth"  # the pod list's optional column: bandwidth per interface
MAX_PFS = 64  # per node
MAX_VFS = 256  # per PF (SR-IOV's usual ceiling on one port)
_NICS = re.compile(r"([0-9]{1,3})x([^/]*)/([0-9]{1,4})")
_COUNT = re.compile(r"[ \t]*([0-9]+)[ \t]*")  # ASCII digits, spaces or tabs around, as podspec reads it


class TraceError(ValueError):
    """A trace file is missing a column or has a malformed value (the message names the row)."""


@dataclass(frozen=True)
class NicSpec:
    """A node's RDMA NICs: ``pfs`` identical PFs of ``rate_mbps`` line rate with ``vfs`` VFs each."""

    pfs: int
    rate_mbps: int
    vfs: int

    def __str__(self) -> str:
        return f"{self.pfs}x{format_mbps(self.rate_mbps)}/{self.vfs}"

    def state(self, node: str, gpu_ids: Sequence[str], numa: Sequence[int]) -> NicState:
        """The PFs ``NODE-nicJ`` with VFs ``NODE-nicJ-vfK``. The node's GPUs are split evenly over the
        PFs in index order: PF J sits beside (on the PCIe switch of) GPUs ``J*n//pfs`` up to
        ``(J+1)*n//pfs - 1`` and on the NUMA node of the first of them (-1 when it has none)."""
        n = len(gpu_ids)
        pfs = []
        for j in range(self.pfs):
            near = gpu_ids[j * n // self.pfs : (j + 1) * n // self.pfs]
            first = numa[j * n // self.pfs] if near else -1
            pf = f"{node}-nic{j}"
            vfs = tuple(f"{pf}-vf{k}" for k in range(self.vfs))
            pfs.append(PfState(pf, self.rate_mbps, first, frozenset(near), vfs))
        return NicState(pfs)


def parse_nics(text: str) -> NicSpec | None:
    """``"2x100Gbps/8"`` -> ``NicSpec(2, 100000, 8)``; ``""`` -> None. ValueError saying what is wrong:
    not of the form, PFs outside 1..``MAX_PFS``, VFs outside 1..``MAX_VFS``, a rate that is not one
    bandwidth figure above 0 (``kubegpu.bandwidth.parse_bandwidth``: ``Gbps`` or ``Mbps``; no range)."""
    text = text.strip()
    if not text:
        return None
    match = _NICS.fullmatch(text) if text.isascii() else None
    if match is None:
        raise ValueError(f"{text[:64]!r} is not PFSxRATE/VFS such as 2x100Gbps/8")
    pfs, rate, vfs = int(match.group(1)), match.group(2), int(match.group(3))
    if not 1 <= pfs <= MAX_PFS:
        raise ValueError(f"{text!r}: {pfs} PFs, not 1 to {MAX_PFS}")
    if not 1 <= vfs <= MAX_VFS:
        raise ValueError(f"{text!r}: {vfs} VFs per PF, not 1 to {MAX_VFS}")
    if "-" in rate:
        raise ValueError(f"{text!r}: a PF's line rate is one figure, not a range")
    low, _ = parse_bandwidth(rate)
    if not low:
        raise ValueError(f"{text!r}: a PF's line rate must be above 0")
    return NicSpec(pfs, low, vfs)


def parse_rdma(interfaces: str, bandwidth: str) -> RdmaRequest:
    """A pod's RDMA request from its ``rdma_interfaces`` and ``rdma_bandwidth`` cells, as the live
    scheduler reads its annotations: a count 0..``MAX_INTERFACES`` in ASCII digits (empty: none) and an
    optional bandwidth per interface (``25Gbps``, ``500Mbps``, ``25Gbps-50Gbps``). A bandwidth without
    interfaces is an error; ``0`` interfaces asks for none. ValueError saying what is wrong."""
    bandwidth = bandwidth.strip()
    if not interfaces.strip():
        if bandwidth:
            raise ValueError(f"column {RDMA_BANDWIDTH} is {bandwidth!r} but {RDMA_INTERFACES} is empty")
        return NO_RDMA
    match = _COUNT.fullmatch(interfaces)  # the live scheduler's rule for the annotation
    digits = (match.group(1).lstrip("0") or "0") if match else ""
    if not digits or len(digits) > 2 or int(digits) > MAX_INTERFACES:
        raise ValueError(
            f"column {RDMA_INTERFACES}: not a whole number from 0 to {MAX_INTERFACES}: {interfaces!r}"
        )
    low = high = 0
    if bandwidth:
        try:
            low, high = parse_bandwidth(bandwidth)
        except ValueError as error:
            raise ValueError(f"column {RDMA_BANDWIDTH}: {error}") from None
    count = int(digits)
    return RdmaRequest(count, low, high) if count else NO_RDMA


@dataclass(frozen=True)
class NodeSpec:
    """One node of a trace: CPU, memory and identical GPUs of one model, and optionally the links of a
    machine shape (``scheduler.sim.machines``) among them."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    shape: MachineShape | None = None
    utilization: float | None = None  # percent busy, every GPU of the node (None: unknown)
    nics: NicSpec | None = None  # RDMA NICs (None: none)

    def gpu_ids(self) -> list[str]:
        return [f"{self.name}-gpu{j}" for j in range(self.gpus)]

    def live(self) -> dict[str, LiveGpu]:
        """The node's GPUs' readings as the live scheduler would take them (none when unknown)."""
        if self.utilization is None:
            return {}
        return {gpu: LiveGpu(utilization=self.utilization) for gpu in self.gpu_ids()}

    def state(self) -> NodeState:
        ids = self.gpu_ids()
        topology, numa = self.shape.topology(ids) if self.shape is not None else (None, [-1] * self.gpus)
        gpus = [GpuState(j, ids[j], self.model, numa=numa[j]) for j in range(self.gpus)]
        labels = {"kubernetes.io/hostname": self.name}
        if self.gpus:
            labels["kubegpu.io/gpu-model"] = self.model
        nics = self.nics.state(self.name, ids, numa) if self.nics is not None else None
        return NodeState(
            self.name, self.cpu_milli, self.memory_mib, gpus, labels=labels, topology=topology, nics=nics
        )


def with_shapes(nodes: Sequence[NodeSpec], shapes: Mapping[str, MachineShape | None]) -> list[NodeSpec]:
    """The nodes with the machine shape of their GPU model (none where the model has no entry).

    Raises ``MachineError`` naming the node if a node has more GPUs than its shape.
    """
    out = []
    for node in nodes:
        shape = shapes.get(node.model) if node.gpus > 1 else None
        if shape is not None and node.gpus > shape.gpus:
            raise MachineError(
                f"node {node.name}: {node.gpus} {node.model} GPUs, "
                f"but machine shape {shape.name} has {shape.gpus}"
            )
        out.append(replace(node, shape=shape))
    return out


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    check_input(path, MAX_TRACE_BYTES)  # a FIFO, a device or a runaway file is refused unread
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        try:
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            yield from enumerate(reader, start=2)
        except (csv.Error, UnicodeDecodeError) as error:  # a field beyond csv's limit, a NUL, not UTF-8
            raise TraceError(f"{path}:{reader.line_num}: not a CSV trace: {error}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, negative: bool = False) -> int:
    """The column as a whole number (empty: 0); below 0 only with ``negative`` (a negative CPU, memory
    or GPU count would add capacity to the node a pod runs on). Raises ``TraceError`` naming the row."""
    text = (row.get(column) or "").strip()
    try:
        value = int(float(text)) if text else 0
    except (ValueError, OverflowError):  # "lots", "nan", "inf"
        raise TraceError(f"{path}:{line}: column {column}: not a number: {text!r}") from None
    if value < 0 and not negative:
        raise TraceError(f"{path}:{line}: column {column}: below 0: {text!r}")
    return value


def _utilization(path: Path, line: int, row: dict[str, str]) -> float | None:
    """The row's ``gpu_util``: a percent 0..100, None when empty or absent."""
    text = (row.get(UTILIZATION) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # NaN and infinities fail too
        raise TraceError(f"{path}:{line}: column {UTILIZATION}: not a percent from 0 to 100: {text!r}")
    return value


def _nics(path: Path, line: int, row: dict[str, str]) -> NicSpec | None:
    """The row's ``rdma_nics`` (None when empty or absent); ``TraceError`` naming the row."""
    try:
        return parse_nics(row.get(RDMA_NICS) or "")
    except ValueError as error:
        raise TraceError(f"{path}:{line}: column {RDMA_NICS}: {error}") from None


def _rdma(path: Path, line: int, row: dict[str, str]) -> RdmaRequest:
    """The row's RDMA request (none without the columns); ``TraceError`` naming the row."""
    try:
        return parse_rdma(row.get(RDMA_INTERFACES) or "", row.get(RDMA_BANDWIDTH) or "")
    except ValueError as error:
        raise TraceError(f"{path}:{line}: pod {(row.get('name') or '').strip()!r}: {error}") from None


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """The nodes of a node list; ``TraceError`` naming the row for a malformed value."""
    path = Path(path)
    out = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        out.append(
            NodeSpec(
                name=row["sn"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=_int(path, line, row, "gpu"),
                model=(row.get("model") or "").strip(),
                utilization=_utilization(path, line, row),
                nics=_nics(path, line, row),
            )
        )
    if not out:
        raise TraceError(f"{path}: no nodes")
    return out


@dataclass(frozen=True)
class Gang:
    """A pod group: its members (pod uids, in trace order) of which ``min_member`` must run together."""

    name: str
    min_member: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Workload:
    """A pod list: the pods in trace order and the groups (gangs) some of them form."""

    pods: tuple[PodRequest, ...]
    gangs: tuple[Gang, ...] = ()


@dataclass
class _GangRows:
    first_line: int
    min_member: int | None  # None: no gang_min column (all members)
    members: list[str]


def _gang_min(path: Path, line: int, gang: str, text: str) -> int:
    if not text:
        raise TraceError(
            f"{path}:{line}: gang {gang!r}: column {GANG_MIN} is empty "
            "(give the group's minimum on every member)"
        )
    whole = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_GANG_MIN))
    if not whole or not 1 <= int(text) <= MAX_GANG_MIN:
        raise TraceError(
            f"{path}:{line}: column {GANG_MIN}: not a whole number from 1 to {MAX_GANG_MIN}: {text!r}"
        )
    return int(text)


def _gang_of(
    path: Path, line: int, row: dict[str, str], name: str, has_min: bool, gangs: dict[str, _GangRows]
) -> None:
    """Record the row's group membership in ``gangs`` (raises ``TraceError`` naming the row)."""
    gang = (row.get(GANG) or "").strip()
    min_text = (row.get(GANG_MIN) or "").strip()
    if not gang:
        if min_text:
            raise TraceError(f"{path}:{line}: column {GANG_MIN} is {min_text!r} but the pod is in no gang")
        return
    minimum = _gang_min(path, line, gang, min_text) if has_min else None
    known = gangs.get(gang)
    if known is None:
        gangs[gang] = _GangRows(line, minimum, [name])
        return
    if minimum != known.min_member:
        raise TraceError(
            f"{path}:{line}: gang {gang!r}: {GANG_MIN} {minimum} differs from the {known.min_member} "
            f"of its member on line {known.first_line}"
        )
    known.members.append(name)


def _check_gangs(path: Path, names: dict[str, list[int]], gangs: dict[str, _GangRows]) -> tuple[Gang, ...]:
    """The groups, once every row is read: each has its minimum of members, members have names of their
    own, and no name can be mistaken for a clone's (raises ``TraceError`` naming the row)."""
    for name, lines in names.items():
        if CLONE_NAME.search(name):
            raise TraceError(
                f"{path}:{lines[0]}: pod name {name!r} ends like a simulator clone's (-clone-N); "
                "a trace with gangs may not use such names"
            )
    out = []
    for gang, rows in gangs.items():
        for member in rows.members:
            if len(names[member]) > 1:
                raise TraceError(
                    f"{path}:{names[member][1]}: pod name {member!r} of gang {gang!r} is also on line "
                    f"{names[member][0]} (a gang's members need names of their own)"
                )
        minimum = len(rows.members) if rows.min_member is None else rows.min_member
        if minimum > len(rows.members):
            raise TraceError(
                f"{path}:{rows.first_line}: gang {gang!r}: {GANG_MIN} {minimum} but the trace has "
                f"{len(rows.members)} member(s)"
            )
        out.append(Gang(gang, minimum, tuple(rows.members)))
    return tuple(out)


def load_pods(path: str | Path) -> list[PodRequest]:
    """The pods of a pod list, in trace order (its gang columns are checked, see ``load_workload``)."""
    return list(load_workload(path).pods)


def load_workload(path: str | Path) -> Workload:
    """A pod list with its gangs. Raises ``TraceError`` naming the row for a malformed value, a
    ``gang_min`` that is not a whole number from 1 to ``MAX_GANG_MIN``, is empty on a member, is given
    on a pod in no gang or differs among a group's members, a group with fewer members than its
    minimum, a member whose name another row also has, and (with gangs) a name like a clone's."""
    path = Path(path)
    out = []
    names: dict[str, list[int]] = {}
    gangs: dict[str, _GangRows] = {}
    rows = _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    fields: Sequence[str] = ()
    for line, row in rows:
        if not fields:
            fields = list(row)
            if GANG_MIN in fields and GANG not in fields:
                raise TraceError(f"{path}: column {GANG_MIN} without a {GANG} column")
        name = row["name"].strip()
        names.setdefault(name, []).append(line)
        _gang_of(path, line, row, name, GANG_MIN in fields, gangs)
        count = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli", negative=True) if count else 0  # out of range: whole
        if count and not 0 < milli < MILLI:
            milli = MILLI  # as the FGD simulator's converter: out-of-range milli means whole GPUs
        if count > 1 and milli < MILLI:
            raise TraceError(
                f"{path}:{line}: a share of {milli} milli on {count} GPUs (shares are of one GPU)"
            )
        models = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        out.append(
            PodRequest(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=count,
                gpu_milli=milli,
                gpu_models=models,
                rdma=_rdma(path, line, row),
            )
        )
    if not out:
        raise TraceError(f"{path}: no pods")
    return Workload(tuple(out), _check_gangs(path, names, gangs) if gangs else ())


def build_cluster(nodes: Sequence[NodeSpec]) -> ClusterState:
    """A fresh, empty cluster of these nodes."""
    return ClusterState(spec.state() for spec in nodes)
