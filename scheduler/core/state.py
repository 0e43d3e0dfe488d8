"""Cluster state: nodes, their GPUs and what is allocated on them, with a vectorised mirror.

``NodeState`` is the truth for one node (capacity, used CPU/memory, per-GPU free milli and memory,
topology, the allocations on it). ``ClusterState`` holds all nodes and mirrors the numbers every
filter and score needs into numpy arrays (one row per node), so one scheduling decision costs a few
vector operations over the nodes instead of a Python loop. ``assume`` and ``forget`` change one node
and refresh its row; ``version[i]`` counts the changes of node ``i`` so scores can be memoised per
node state.

Live readings (``LiveGpu``: utilisation, memory in use, a GPU the node reports unfit) come from
the live layer through ``ClusterState.set_live``; the core keeps them as data and never reads a
clock: what is stale is decided by the caller (docs/utilisation.md).

``Allocation`` is the decision for one pod: the node, CPU and memory, the GPUs (whole, or a
share of one GPU with its milli and memory) and its RDMA VFs with their bandwidth (``NodeState.nics``
books them: a VF held once, a PF's reservations within its line rate; ``scheduler.core.rdma``). It
is a plain frozen dataclass with ``to_dict`` / ``from_dict`` so the allocation-annotation code
(``kubegpu.allocation``) can serialise it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.model import DeviceKind, NodeInventory, Topology
from scheduler.core.affinity import PodFacts
from scheduler.core.placement import PlacementView
from scheduler.core.rdma import NicState, VfGrant, nic_state
from scheduler.core.request import MILLI, HostPort, PodRequest, Taint, TaintEffect, ports_conflict
from scheduler.core.topology import LinkMatrix

UNLIMITED = 1 << 40  # the pods / GPU-count headroom of a node that sets no limit
MIB = 1 << 20  # bytes
STATIC_SCORE_LABEL = "kubegpu.io/static-score"  # a node's static score, 0..100 (docs/utilisation.md)
DEFAULT_STATIC_SCORE = 100.0
UNKNOWN_UTILIZATION = 100.0  # how busy a GPU whose utilisation is unknown (or stale) is taken to be


@dataclass(frozen=True)
class LiveGpu:
    """What a node last reported of one GPU, as far as it is trusted (None: unknown).

    ``utilization``: percent (the node's moving average); ``memory_used_mib``: memory in use,
    whoever uses it; ``unfit``: why the node says the GPU must take no new pods (lost, an XID, an
    uncorrectable ECC error), '' when it says nothing against it.
    """

    utilization: float | None = None
    memory_used_mib: int | None = None
    unfit: str = ""


UNKNOWN_LIVE = LiveGpu()


@dataclass
class GpuState:
    """One GPU of a node and how much of it is free."""

    index: int
    id: str
    model: str = ""
    memory_mib: int = 0  # 0: unknown (shares are then by milli only)
    numa: int = -1
    healthy: bool = True
    free_milli: int = MILLI
    free_memory_mib: int = -1  # -1: initialise to memory_mib
    share_enforced: bool = False  # the node enforces shares of this GPU (MPS)
    # live readings (``NodeState.set_live``); None: unknown
    live_utilization: float | None = None
    live_memory_used_mib: int | None = None
    unfit: str = ""  # why the node's live report takes it out of placement ('' none)
    listed_healthy: bool | None = None  # the inventory's word (None: ``healthy`` as given)

    def __post_init__(self) -> None:
        if self.free_memory_mib < 0:
            self.free_memory_mib = self.memory_mib
        if self.listed_healthy is None:
            self.listed_healthy = self.healthy
        self.healthy = bool(self.listed_healthy) and not self.unfit

    @property
    def live_free_memory_mib(self) -> int | None:
        """Memory not in use by anyone, as the node last reported (None: unknown)."""
        if self.live_memory_used_mib is None or not self.memory_mib:
            return None
        return self.memory_mib - self.live_memory_used_mib

    @property
    def fully_free(self) -> bool:
        return self.healthy and self.free_milli == MILLI

    def share_for(self, pod: PodRequest) -> tuple[int, int]:
        """(milli, memory MiB) a sharing pod would take of this GPU.

        A share asked by milli takes the same fraction of the GPU's memory (when the memory is known);
        a share asked by memory takes the same fraction of its compute, rounded up.
        """
        milli, memory = pod.gpu_milli, pod.gpu_memory_mib
        if not milli:
            milli = -(-memory * MILLI // self.memory_mib) if self.memory_mib else MILLI
        if not memory and self.memory_mib:
            memory = self.memory_mib * milli // MILLI
        return min(milli, MILLI), memory

    def fits_share(self, pod: PodRequest) -> bool:
        if not self.healthy or not pod.allows_model(self.model):
            return False
        if pod.enforced_share and not self.share_enforced:
            return False
        milli, memory = self.share_for(pod)
        if not self.fits_live_memory(memory):
            return False
        return milli <= self.free_milli and (not self.memory_mib or memory <= self.free_memory_mib)

    def fits_live_memory(self, memory_mib: int) -> bool:
        """The memory guard: the memory in use leaves ``memory_mib`` (True when unknown)."""
        live_free = self.live_free_memory_mib
        return live_free is None or memory_mib <= live_free


@dataclass(frozen=True)
class GpuGrant:
    """One GPU given to a pod: whole (``milli == 1000``) or a share."""

    index: int
    id: str
    milli: int = MILLI
    memory_mib: int = 0  # a share's GPU memory (0: unspecified); whole GPUs: the GPU's memory

    @property
    def is_share(self) -> bool:
        return self.milli < MILLI


@dataclass(frozen=True)
class Allocation:
    """Where one pod runs and exactly which devices it gets."""

    node: str
    pod_uid: str
    pod_name: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: tuple[GpuGrant, ...] = ()
    # container name -> ids of its devices; empty: every container gets all of ``gpus``
    containers: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    gpu_tag: str = "no-gpu"  # the pod's GPU shape (PodRequest.gpu_tag)
    # GPUs the kubelet charges against the node's ``nvidia.com/gpu`` allocatable (the pod's
    # extended-resource request); None: one per whole GPU granted (none for a share)
    gpu_resource: int | None = None
    # regular init containers: they run alone before the others and may reuse their devices
    init_containers: frozenset[str] = field(default=frozenset(), hash=False)
    # the other resources it holds (PodRequest.resources: name, amount) and its host ports
    resources: tuple[tuple[str, int], ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    rdma: tuple[VfGrant, ...] = ()  # the pod's RDMA interfaces (VFs, with their bandwidth)

    @property
    def exact_memory(self) -> bool:
        """Its memory is held in bytes among ``resources`` (``memory_mib`` then only feeds scores)."""
        return any(name == "memory" for name, _ in self.resources)

    def memory_bytes(self) -> int:
        """The memory it holds in bytes: exact when given, else ``memory_mib`` MiB."""
        for name, amount in self.resources:
            if name == "memory":
                return amount
        return self.memory_mib * MIB

    @property
    def charged_gpus(self) -> int:
        """What this pod counts against the node's ``nvidia.com/gpu`` allocatable."""
        if self.gpu_resource is not None:
            return self.gpu_resource
        return sum(1 for g in self.gpus if not g.is_share)

    @property
    def gpu_milli(self) -> int:
        """GPU milli allocated in all (whole GPUs count 1000 each)."""
        return sum(g.milli for g in self.gpus)

    def device_ids(self) -> tuple[str, ...]:
        return tuple(g.id for g in self.gpus)

    def shares(self) -> dict[str, tuple[int, int]]:
        """device id -> (milli, memory MiB) for the fractional grants."""
        return {g.id: (g.milli, g.memory_mib) for g in self.gpus if g.is_share}

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "node": self.node,
            "podUID": self.pod_uid,
            "podName": self.pod_name,
            "cpuMilli": self.cpu_milli,
            "memoryMiB": self.memory_mib,
            "gpus": [
                {"index": g.index, "id": g.id, "milli": g.milli, "memoryMiB": g.memory_mib} for g in self.gpus
            ],
            "containers": {name: list(ids) for name, ids in sorted(self.containers.items())},
            "gpuTag": self.gpu_tag,
            "gpuResource": self.gpu_resource,
            "initContainers": sorted(self.init_containers),
        }
        if self.resources:
            doc["resources"] = dict(self.resources)
        if self.host_ports:
            doc["hostPorts"] = [{"protocol": p.protocol, "ip": p.ip, "port": p.port} for p in self.host_ports]
        if self.rdma:
            doc["rdma"] = [g.to_dict() for g in self.rdma]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Allocation:
        return cls(
            node=str(doc["node"]),
            pod_uid=str(doc["podUID"]),
            pod_name=str(doc.get("podName", "")),
            cpu_milli=int(doc.get("cpuMilli", 0)),
            memory_mib=int(doc.get("memoryMiB", 0)),
            gpus=tuple(
                GpuGrant(
                    int(g["index"]), str(g["id"]), int(g.get("milli", MILLI)), int(g.get("memoryMiB", 0))
                )
                for g in doc.get("gpus", [])
            ),
            containers={str(k): tuple(str(d) for d in v) for k, v in dict(doc.get("containers", {})).items()},
            gpu_tag=str(doc.get("gpuTag", "no-gpu")),
            gpu_resource=None if doc.get("gpuResource") is None else int(doc["gpuResource"]),
            init_containers=frozenset(str(c) for c in doc.get("initContainers", ())),
            resources=tuple(sorted((str(k), int(v)) for k, v in dict(doc.get("resources", {})).items())),
            host_ports=tuple(
                HostPort(str(p["protocol"]), str(p["ip"]), int(p["port"])) for p in doc.get("hostPorts", ())
            ),
            rdma=tuple(VfGrant.from_dict(g) for g in doc.get("rdma", ())),
        )


def anonymous(alloc: Allocation) -> PodFacts:
    """What the placement view knows of a pod booked without its facts: its namespace, no labels."""
    namespace, slash, _name = alloc.pod_name.partition("/")
    return PodFacts(alloc.pod_uid, namespace if slash and namespace else "default")


class AllocationConflict(ValueError):
    """An allocation does not fit the node's current state (double booking, unknown GPU, ...)."""


class NodeState:
    """One node: static facts, what is used, and the allocations placed on it.

    GPUs are booked by id, never by index: an allocation names device ids, and the index in a
    grant is informational. A GPU an allocation names that the node does not list (it vanished
    from the inventory) is simply not booked; it is booked again when the node lists it and the
    allocation is booked on that new state.
    """

    def __init__(
        self,
        name: str,
        cpu_milli: int,
        memory_mib: int,
        gpus: Sequence[GpuState] = (),
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Taint] = (),
        topology: Topology | None = None,
        max_pods: int | None = None,
        gpu_resource: int | None = None,
        unschedulable: bool = False,
        allocatable: Mapping[str, int] | None = None,
        static_score: float = DEFAULT_STATIC_SCORE,
        nics: NicState | None = None,
    ) -> None:
        self.name = name
        self.nics = nics if nics is not None else NicState()  # RDMA PFs and VFs (scheduler.core.rdma)
        self.static_score = static_score  # 0..100, the operator's word (STATIC_SCORE_LABEL)
        # spec.unschedulable (cordoned): only pods tolerating request.UNSCHEDULABLE_TAINT go here
        self.unschedulable = unschedulable
        self.cpu_capacity = cpu_milli
        self.memory_capacity = memory_mib
        self.cpu_used = 0
        self.memory_used = 0
        self.max_pods = max_pods  # status.allocatable.pods; None: no limit
        self.gpu_resource = gpu_resource  # status.allocatable of the GPU resource; None: not checked
        self.gpu_resource_used = 0
        # other resources' allocatable (PodRequest.resources' names; a name not here is 0; memory in
        # bytes, by default memory_mib MiB) and their use (memory: every pod's, exact or in MiB)
        self.allocatable: dict[str, int] = {"memory": memory_mib * MIB, **(allocatable or {})}
        self.resources_used: Counter[str] = Counter()
        self.ports: Counter[HostPort] = Counter()  # host ports the node's pods bind
        self.gpus: list[GpuState] = list(gpus)
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError(f"node {name}: GPUs must be indexed 0..n-1 in order")
        self.gpu_by_id: dict[str, GpuState] = {g.id: g for g in self.gpus}
        if len(self.gpu_by_id) != len(self.gpus):
            raise ValueError(f"node {name}: two GPUs share an id")
        self.labels: dict[str, str] = dict(labels or {})
        self.taints: tuple[Taint, ...] = tuple(taints)
        self.topology = topology if topology is not None else Topology()
        self.allocations: dict[str, Allocation] = {}
        self.tags: Counter[str] = Counter()  # GPU shapes of the GPU pods placed here
        self._links: LinkMatrix | None = None

    def links(self) -> LinkMatrix:
        """The node's pairwise GPU link matrix (built once; shared by nodes with identical links)."""
        if self._links is None:
            self._links = LinkMatrix.shared(
                [g.id for g in self.gpus], [g.numa for g in self.gpus], self.topology
            )
        return self._links

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_inventory(
        cls,
        name: str,
        cpu_milli: int,
        memory_mib: int,
        inventory: NodeInventory,
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Taint] = (),
        max_pods: int | None = None,
        gpu_resource: int | None = None,
        unschedulable: bool = False,
        allocatable: Mapping[str, int] | None = None,
        static_score: float = DEFAULT_STATIC_SCORE,
    ) -> NodeState:
        """A node from what its advertiser published (GPUs sorted by index)."""
        gpus = sorted(inventory.by_kind(DeviceKind.GPU), key=lambda d: d.index)
        states = [
            GpuState(i, d.id, d.model, d.memory_mib, d.numa_node, d.healthy, share_enforced=d.share_enforced)
            for i, d in enumerate(gpus)
        ]
        return cls(
            name,
            cpu_milli,
            memory_mib,
            states,
            labels=labels,
            taints=taints,
            topology=inventory.topology,
            max_pods=max_pods,
            gpu_resource=gpu_resource,
            unschedulable=unschedulable,
            allocatable=allocatable,
            static_score=static_score,
            nics=nic_state(inventory),
        )

    # -- derived numbers ------------------------------------------------------------------------

    @property
    def cpu_free(self) -> int:
        return self.cpu_capacity - self.cpu_used

    @property
    def memory_free(self) -> int:
        return self.memory_capacity - self.memory_used

    def resource_free(self, name: str) -> int:
        """What is left of another resource (its allocatable, 0 if the node has none, less its use)."""
        return self.allocatable.get(name, 0) - self.resources_used.get(name, 0)

    def short_resources(self, resources: Iterable[tuple[str, int]]) -> list[str]:
        """The names among ``resources`` (name, amount) this node has not enough of left."""
        return [name for name, amount in resources if amount and amount > self.resource_free(name)]

    @property
    def pods_free(self) -> int | None:
        """How many more pods the node admits (None: no limit)."""
        return None if self.max_pods is None else self.max_pods - len(self.allocations)

    @property
    def gpu_resource_free(self) -> int | None:
        """How many more GPUs the kubelet admits by its count (None: not checked)."""
        return None if self.gpu_resource is None else self.gpu_resource - self.gpu_resource_used

    def models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)

    def free_gpu_indices(self, pod: PodRequest | None = None) -> list[int]:
        """Indices of the fully free healthy GPUs (of a model the pod allows)."""
        return [g.index for g in self.gpus if g.fully_free and (pod is None or pod.allows_model(g.model))]

    def schedulable_taints(self) -> tuple[Taint, ...]:
        """The taints a pod must tolerate to be placed here."""
        return tuple(t for t in self.taints if t.effect != TaintEffect.PREFER_NO_SCHEDULE)

    def has_live(self) -> bool:
        """Some GPU carries a live reading."""
        return any(
            g.live_utilization is not None or g.live_memory_used_mib is not None or g.unfit for g in self.gpus
        )

    def set_live(self, readings: Mapping[str, LiveGpu]) -> tuple[bool, bool]:
        """Take the node's live report (GPU id -> reading; a GPU not named is unknown).

        Returns (fit changed, relaxed): whether which pods fit may have changed (health, or memory
        in use), and whether something may now fit that did not (a GPU back in placement, memory
        freed). Bookings are untouched: pods already on a GPU the report takes out keep it.
        """
        changed = relaxed = False
        for gpu in self.gpus:
            live = readings.get(gpu.id, UNKNOWN_LIVE)
            used = None if live.memory_used_mib is None else int(live.memory_used_mib)
            healthy = bool(gpu.listed_healthy) and not live.unfit
            if healthy != gpu.healthy:
                changed = True
                relaxed = relaxed or healthy
            if used != gpu.live_memory_used_mib:
                changed = True
                before = gpu.live_memory_used_mib
                relaxed = relaxed or (before is not None and (used is None or used < before))
            gpu.healthy, gpu.unfit, gpu.live_memory_used_mib = healthy, live.unfit, used
            gpu.live_utilization = None if live.utilization is None else float(live.utilization)
        return changed, relaxed

    def missing_gpus(self, alloc: Allocation) -> list[str]:
        """The GPU ids ``alloc`` names that this node does not list."""
        return [g.id for g in alloc.gpus if g.id not in self.gpu_by_id]

    def missing_vfs(self, alloc: Allocation) -> list[str]:
        """The RDMA VF ids ``alloc`` names that this node does not list as usable."""
        return self.nics.missing(alloc.rdma)

    # -- assume / forget ------------------------------------------------------------------------

    def check(self, alloc: Allocation) -> None:
        """Raise ``AllocationConflict`` if ``alloc`` does not fit this node now."""
        if alloc.node != self.name:
            raise AllocationConflict(f"allocation for node {alloc.node} applied to {self.name}")
        if alloc.pod_uid in self.allocations:
            raise AllocationConflict(f"pod {alloc.pod_uid} already allocated on {self.name}")
        # Like the kubelet and kube-scheduler, a resource is checked only when the pod asks for it:
        # a pod asking none fits a node that bound pods over-commit.
        if (alloc.cpu_milli and alloc.cpu_milli > self.cpu_free) or (
            alloc.memory_mib and not alloc.exact_memory and alloc.memory_mib > self.memory_free
        ):
            raise AllocationConflict(f"pod {alloc.pod_uid}: not enough CPU/memory on {self.name}")
        if alloc.resources:
            short = self.short_resources(alloc.resources)
            if short:
                raise AllocationConflict(f"pod {alloc.pod_uid}: not enough {', '.join(short)} on {self.name}")
        if alloc.host_ports and ports_conflict(alloc.host_ports, self.ports):
            raise AllocationConflict(f"pod {alloc.pod_uid}: its host ports are taken on {self.name}")
        pods_free = self.pods_free
        if pods_free is not None and pods_free < 1:
            raise AllocationConflict(f"pod {alloc.pod_uid}: {self.name} runs its maximum number of pods")
        gpu_free = self.gpu_resource_free
        if gpu_free is not None and alloc.charged_gpus and alloc.charged_gpus > gpu_free:
            raise AllocationConflict(f"pod {alloc.pod_uid}: {self.name} admits only {gpu_free} more GPUs")
        seen: set[str] = set()
        for grant in alloc.gpus:
            gpu = self.gpu_by_id.get(grant.id)
            if gpu is None:
                raise AllocationConflict(f"pod {alloc.pod_uid}: no GPU {grant.id} on {self.name}")
            if grant.id in seen:
                raise AllocationConflict(f"pod {alloc.pod_uid}: GPU {grant.id} granted twice")
            seen.add(grant.id)
            if not gpu.healthy:
                raise AllocationConflict(f"pod {alloc.pod_uid}: GPU {grant.id} is unhealthy")
            memory = gpu.memory_mib if grant.milli >= MILLI else grant.memory_mib
            if grant.milli > gpu.free_milli or (gpu.memory_mib and memory > gpu.free_memory_mib):
                raise AllocationConflict(f"pod {alloc.pod_uid}: GPU {grant.id} has not enough free")
        if alloc.rdma:
            problems = self.nics.problems(alloc.rdma)
            if problems:
                raise AllocationConflict(f"pod {alloc.pod_uid}: {'; '.join(problems)} on {self.name}")

    def overbooked(self, alloc: Allocation) -> list[str]:
        """The GPU ids of ``alloc`` (booked here) that are booked beyond their capacity."""
        return [
            g.id for g in alloc.gpus if (gpu := self.gpu_by_id.get(g.id)) is not None and gpu.free_milli < 0
        ]

    def apply(self, alloc: Allocation, sign: int) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) an allocation's usage, unconditionally.

        Devices are found by id; ids this node does not list are skipped (the same ones both ways,
        as a node's GPU list never changes). CPU, memory and GPUs may go below zero free.
        """
        self.cpu_used += sign * alloc.cpu_milli
        self.memory_used += sign * alloc.memory_mib
        self.gpu_resource_used += sign * alloc.charged_gpus
        for name, amount in alloc.resources:
            self.resources_used[name] += sign * amount
            if not self.resources_used[name]:
                del self.resources_used[name]
        if alloc.memory_mib and not alloc.exact_memory:  # memory in bytes counts it too
            self.resources_used["memory"] += sign * alloc.memory_mib * MIB
        for port in alloc.host_ports:
            self.ports[port] += sign
            if self.ports[port] <= 0:
                del self.ports[port]
        for grant in alloc.gpus:
            gpu = self.gpu_by_id.get(grant.id)
            if gpu is None:
                continue
            gpu.free_milli -= sign * grant.milli
            if gpu.memory_mib:  # a whole GPU takes all its memory, a share what it names
                gpu.free_memory_mib -= sign * (gpu.memory_mib if grant.milli >= MILLI else grant.memory_mib)
        if alloc.rdma:
            self.nics.apply(alloc.rdma, sign)
        if alloc.gpu_tag != "no-gpu":
            self.tags[alloc.gpu_tag] += sign
            if self.tags[alloc.gpu_tag] <= 0:
                del self.tags[alloc.gpu_tag]
        if sign > 0:
            self.allocations[alloc.pod_uid] = alloc
        else:
            self.allocations.pop(alloc.pod_uid, None)

    def __repr__(self) -> str:
        free = ",".join(str(g.free_milli) for g in self.gpus)
        return f"NodeState({self.name}, cpu {self.cpu_free}/{self.cpu_capacity}, gpu free [{free}])"


MAX_SHARE_SHAPES = 64  # share shapes whose slots a ClusterState keeps (the oldest goes first)
CHANGE_LOG = 4096  # node changes a ClusterState remembers at least (changed_since)
SHARE_ROW_BY_ROW = 8  # share_view: up to this many changes since its last look are taken row by row


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class ShareSlots:
    """One share shape's GPU slots over every node of a ``ClusterState``, kept row by row.

    ``fits`` (``[N, G]``): which slots can take the share (``GpuState.fits_share``); ``milli``: what
    it takes of each (``GpuState.share_for``; an int for a share given in milli, else ``[N, G]``);
    ``left`` (``[N, G]``): the free milli a slot keeps after it, -1 where it does not fit;
    ``least_left`` (``[N]``): per node the least of its ``left`` (at most ``MILLI``: a GPU booked
    below zero can keep more), ``MILLI + 1`` where nothing fits (the best-fitting GPU, and whether the
    node can take the share at all). The arrays are read-only views; ``ClusterState.share_view``
    refreshes the rows of the nodes that changed since.
    """

    __slots__ = (
        "_fits", "_least", "_left", "_lists", "_mapped", "_mapped_at", "_milli", "_updates", "fits",
        "generation", "least_left", "left", "milli", "seen",
    )  # fmt: skip

    def __init__(
        self,
        fits: np.ndarray,
        milli: np.ndarray | int,
        left: np.ndarray,
        version: np.ndarray,
        generation: int,
    ) -> None:
        self._fits = fits
        self._milli = milli
        self._left = left
        self._least = _least_left(fits, left)
        self.seen = version.copy()  # version[i] of each row when it was worked out
        self.generation = generation  # the cluster's generation when every row was last checked
        self.fits = _read_only(fits)
        self.milli = milli if isinstance(milli, int) else _read_only(milli)
        self.left = _read_only(left)
        self.least_left = _read_only(self._least)
        self._mapped: dict[tuple[int, int], tuple[np.ndarray, int, np.ndarray, np.ndarray]] = {}
        self._lists: dict[int, list] = {}  # per id(table) of _mapped: the table as a list (update_row)
        self._updates = 0  # how many times rows were taken (update)
        self._mapped_at: dict[tuple[int, int], int] = {}  # per summary, _updates when last refreshed

    def update(
        self,
        rows: np.ndarray,
        fits: np.ndarray,
        milli: np.ndarray | int,
        left: np.ndarray,
        version: np.ndarray,
    ) -> None:
        """Take these rows' worked-out ``fits``, ``milli`` and ``left`` (``version``: the cluster's)."""
        self._fits[rows] = fits
        if not isinstance(self._milli, int):
            self._milli[rows] = milli
        self._left[rows] = left
        self._least[rows] = _least_left(fits, left)
        self.seen[rows] = version[rows]
        self._updates += 1

    def update_row(self, i: int, free: Sequence[int], milli: int, version: int) -> None:
        """``update`` of row ``i`` alone, for a share of ``milli`` (> 0) that fits every GPU with that
        much free (no memory, model or enforcement condition): ``free``, the node's free milli per GPU
        in index order (``ClusterState.gpu_rows``; the slots past it never fit). The summaries of
        ``least_mapped`` that were up to date are brought up to date on this row too."""
        k = len(free)
        left = [f - milli if f >= milli else -1 for f in free]
        self._fits[i, :k] = [f >= milli for f in free]
        self._left[i, :k] = left
        self._least[i] = min((min(x, MILLI) for x in left if x >= 0), default=MILLI + 1)
        self.seen[i] = version
        fresh = self._updates
        self._updates += 1
        for key, (table, none, seen, values) in self._mapped.items():
            if self._mapped_at[key] == fresh:
                by_left = self._lists.get(key[0])
                if by_left is None:
                    by_left = self._lists[key[0]] = table.tolist()
                values[i] = min((by_left[min(x, MILLI)] for x in left if x >= 0), default=none)
                seen[i] = version
                self._mapped_at[key] = self._updates

    def least_mapped(self, table: np.ndarray, none: int) -> np.ndarray:
        """Per node, the least ``table[left]`` over the slots that fit, ``none`` where none does.

        ``table`` has one value per remainder ``0..MILLI`` (a remainder above ``MILLI``, on a GPU
        booked below zero, reads ``table[MILLI]``). Read-only; kept per ``table`` object and refreshed
        with the rows, so ``table`` must not change while it is in use (a new table object starts
        afresh).
        """
        if len(table) <= MILLI:
            raise ValueError(f"least_mapped: table has {len(table)} values, not one per remainder 0..{MILLI}")
        entry = self._mapped.get((id(table), none))
        key = (id(table), none)
        if entry is None or entry[0] is not table:
            values = _least_of(table, self._fits, self._left, none)
            entry = (table, none, self.seen.copy(), values)
            self._lists.pop(key[0], None)  # a list of another table that had this id
            if len(self._mapped) >= 8:  # tables of policies bound before: let them go
                self._mapped.clear()
                self._mapped_at.clear()
                self._lists.clear()
            self._mapped[key] = entry
        elif self._mapped_at[key] != self._updates:  # rows were taken since: refresh those that moved
            _, _, seen, values = entry
            rows = np.flatnonzero(seen != self.seen)
            if rows.size:
                values[rows] = _least_of(table, self._fits[rows], self._left[rows], none)
                seen[rows] = self.seen[rows]
        self._mapped_at[key] = self._updates
        return _read_only(entry[3])


def _least_left(fits: np.ndarray, left: np.ndarray) -> np.ndarray:
    # capped at MILLI: a GPU booked below zero keeps more than MILLI, which must not read "none fits"
    return np.where(fits, np.minimum(left, MILLI), MILLI + 1).min(axis=1, initial=MILLI + 1)


def _least_of(table: np.ndarray, fits: np.ndarray, left: np.ndarray, none: int) -> np.ndarray:
    mapped = table[np.minimum(np.maximum(left, 0), MILLI)]
    top = _largest(mapped.dtype)
    least = mapped.min(axis=1, where=fits, initial=top)  # not capped at ``none``: it may be below
    return np.where(fits.any(axis=1), least, none)


@functools.cache
def _largest(dtype: np.dtype) -> int | float:
    """The largest value of an integer dtype, infinity for a float one."""
    return np.iinfo(dtype).max if np.issubdtype(dtype, np.integer) else np.inf


class NodeChanges:
    """Which nodes of one ``ClusterState`` changed since the caller last asked.

    For values a caller keeps per node and works out again only where the node changed (a row's
    numbers move only with a ``_sync`` of it): ``moved`` gives those rows once, then not again until
    they change again, from the cluster's log of changes (``ClusterState.changed_since``), so asking
    costs the changes, not the nodes. ``follows`` says whether it is this cluster's tracker (another
    cluster, even one of the same size, starts afresh: the caller works out every row).
    """

    __slots__ = ("cluster", "generation")

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.generation = cluster.generation

    def follows(self, cluster: ClusterState) -> bool:
        return self.cluster is cluster

    def moved(self) -> list[int] | None:
        """The nodes changed since the tracker was made or last asked, each once, ascending (empty:
        none); None when that is more than the cluster remembers (every node must be worked out)."""
        cluster = self.cluster
        if self.generation == cluster.generation:
            return []
        rows = cluster.changed_since(self.generation)
        self.generation = cluster.generation
        if rows is None or len(rows) == 1:
            return rows
        return sorted(set(rows))


class ClusterState:
    """All nodes, with per-node numbers mirrored into arrays for vectorised filtering and scoring.

    Arrays (row ``i`` is ``nodes[i]``): ``cpu_free``, ``mem_free``, ``cpu_capacity``, ``gpu_count``,
    ``gpu_free`` (``[N, G]`` free milli per GPU in index order, -1 where the node has fewer GPUs or
    the GPU is unhealthy), ``gpu_free_total``, ``gpu_full_free`` (fully free GPUs), ``gpu_max_free``,
    ``model_code`` (index into ``model_sets``), ``has_taints``, ``unschedulable`` (cordoned),
    ``version``, ``pods_free`` and ``gpu_resource_free`` (what the kubelet still admits;
    ``UNLIMITED`` where the node sets no limit), ``has_ports`` (nodes whose pods bind host ports),
    ``rdma_free_vfs`` (usable RDMA VFs no pod holds; bandwidth is checked on ``NodeState.nics``) and,
    once a pod asks for one, ``resource_free(name)`` per other resource (``NodeState.allocatable``
    less its pods' requests).
    Live readings (``set_live``): ``gpu_util`` (``[N, G]`` percent, NaN unknown), ``gpu_busy`` (the
    same with unknown read as ``UNKNOWN_UTILIZATION``), ``node_util`` (the mean ``gpu_busy`` of the
    node's healthy GPUs; 0 for a node without GPUs), ``gpu_live_free`` (``[N, G]`` MiB not in use,
    ``UNLIMITED`` unknown) and ``static_score`` (per node, 0..100).
    ``gpu_key[i]`` is the node's free milli per GPU sorted descending, a hashable signature of its GPU
    state. A GPU booked beyond its capacity (possible only for bound pods, which are facts) shows 0
    free.

    ``assume`` books a decision and refuses what does not fit; ``book`` records a fact (a pod the
    API shows bound): its devices are booked whatever the node's state, and free CPU, memory, pods
    may go below zero, as kube-scheduler's NodeInfo does.

    ``placement`` (``enable_placement``) is the view the placement rules need (nodes' labels and
    taints, the placed pods' labels and affinity terms, namespaces' labels); ``assume`` and
    ``book`` given a pod's ``PodFacts`` record it there, ``forget`` removes it. Without it (the
    simulator) no placement rule costs anything.
    """

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.nodes: list[NodeState] = list(nodes)
        self.index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise ValueError(f"duplicate node name {node.name}")
            self.index[node.name] = i
        n = len(self.nodes)
        g = max((len(node.gpus) for node in self.nodes), default=0)
        self.max_gpus = g
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self.cpu_capacity = np.array([node.cpu_capacity for node in self.nodes], dtype=np.int64)
        self.mem_capacity = np.array([node.memory_capacity for node in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([len(node.gpus) for node in self.nodes], dtype=np.int64)
        self.gpu_free = np.full((n, max(g, 1)), -1, dtype=np.int64)
        self.gpu_free_total = np.zeros(n, dtype=np.int64)
        self.gpu_full_free = np.zeros(n, dtype=np.int64)
        self.gpu_max_free = np.zeros(n, dtype=np.int64)
        self.gpu_key: list[tuple[int, ...]] = [()] * n
        self.gpu_rows: list[list[int]] = [[] for _ in range(n)]  # free milli per GPU, index order
        self.version = np.zeros(n, dtype=np.int64)
        self.has_taints = np.array([bool(node.schedulable_taints()) for node in self.nodes], dtype=bool)
        self.unschedulable = np.array([node.unschedulable for node in self.nodes], dtype=bool)
        self.pods_free = np.full(n, UNLIMITED, dtype=np.int64)
        self.gpu_resource_free = np.full(n, UNLIMITED, dtype=np.int64)
        self.any_pod_limit = any(node.max_pods is not None for node in self.nodes)
        self.has_ports = np.zeros(n, dtype=bool)  # nodes whose pods bind host ports
        self.rdma_free_vfs = np.zeros(n, dtype=np.int64)  # usable RDMA VFs no pod holds
        self._resource_free: dict[str, np.ndarray] = {}  # other resources' free, per name asked
        self.any_gpu_resource_limit = any(node.gpu_resource is not None for node in self.nodes)
        self.gpu_memory_known = np.array(
            [any(gpu.memory_mib for gpu in node.gpus) for node in self.nodes], dtype=bool
        )
        self.any_gpu_memory = bool(self.gpu_memory_known.any())
        self.gpu_models: list[str] = sorted({gpu.model for node in self.nodes for gpu in node.gpus})
        model_index = {m: k for k, m in enumerate(self.gpu_models)}
        self.gpu_model = np.full((n, max(g, 1)), -1, dtype=np.int64)
        self.gpu_mem_total = np.zeros((n, max(g, 1)), dtype=np.int64)
        self.gpu_mem_free = np.zeros((n, max(g, 1)), dtype=np.int64)
        self.gpu_enforced = np.zeros((n, max(g, 1)), dtype=bool)  # GPU slots whose shares are enforced
        for i, node in enumerate(self.nodes):
            for gpu in node.gpus:
                self.gpu_model[i, gpu.index] = model_index[gpu.model]
                self.gpu_mem_total[i, gpu.index] = gpu.memory_mib
                self.gpu_enforced[i, gpu.index] = gpu.share_enforced
        codes: dict[frozenset[str], int] = {}
        for node in self.nodes:
            codes.setdefault(node.models(), len(codes))
        self.model_sets: list[frozenset[str]] = list(codes)
        self.model_code = np.array([codes[node.models()] for node in self.nodes], dtype=np.int64)
        self.static_score = np.array([float(node.static_score) for node in self.nodes], dtype=np.float64)
        self.gpu_util = np.full((n, max(g, 1)), np.nan)
        self.gpu_busy = np.full((n, max(g, 1)), UNKNOWN_UTILIZATION)
        self.node_util = np.where(self.gpu_count > 0, UNKNOWN_UTILIZATION, 0.0)
        self.gpu_live_free = np.full((n, max(g, 1)), UNLIMITED, dtype=np.int64)
        self.any_live_memory = False  # some GPU of known memory has a live memory reading
        self.tag_counts: dict[str, np.ndarray] = {}
        self.tag_kinds = np.zeros(n, dtype=np.int64)  # distinct GPU shapes placed on each node
        self.where: dict[str, int] = {}  # pod uid -> node index
        self.allocated_milli = 0  # GPU milli allocated over the cluster
        self.generation = 0
        self._changed: list[int] = []  # the node of each of the last changes (changed_since)
        self._label_masks: dict[tuple, np.ndarray] = {}
        self._model_masks: dict[frozenset[str], np.ndarray] = {}
        self._gpu_model_masks: dict[frozenset[str], np.ndarray] = {}
        self._share_views: dict[tuple, ShareSlots] = {}  # share shape -> its slots (share_view)
        self.all_indices = np.arange(n, dtype=np.int64)
        # node order for equal scores (lower first); None: uniformly at random
        self.tie_rank: np.ndarray | None = None
        self.placement: PlacementView | None = None
        for i in range(n):
            self._sync(i)
            if self.nodes[i].has_live():
                self._sync_live(i)
        self.any_live_memory = bool((self.gpu_live_free < UNLIMITED).any())
        self.version[:] = 0
        self._changed.clear()  # a tracker starts from the cluster as built

    def set_tie_order(self, order: Sequence[int] | None) -> None:
        """Break equal scores by this node order (``order[k]`` is the k-th preferred node index)."""
        if order is None:
            self.tie_rank = None
            return
        rank = np.empty(len(self.nodes), dtype=np.int64)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(len(self.nodes))
        self.tie_rank = rank

    # -- lookups --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> NodeState:
        return self.nodes[self.index[name]]

    def model_mask(self, models: frozenset[str]) -> np.ndarray:
        """Nodes with at least one GPU of one of ``models`` (cached per model set)."""
        mask = self._model_masks.get(models)
        if mask is None:
            allowed = np.array([bool(s & models) for s in self.model_sets], dtype=bool)
            mask = allowed[self.model_code] if len(self.model_sets) else np.zeros(0, dtype=bool)
            self._model_masks[models] = mask
        return mask

    def gpu_model_mask(self, models: frozenset[str]) -> np.ndarray:
        """``[N, G]``: which GPU slots hold a GPU of one of ``models`` (cached per model set)."""
        mask = self._gpu_model_masks.get(models)
        if mask is None:
            codes = [k for k, m in enumerate(self.gpu_models) if m in models]
            mask = np.isin(self.gpu_model, codes)
            self._gpu_model_masks[models] = mask
        return mask

    def share_view(self, pod: PodRequest) -> ShareSlots:
        """The share's ``ShareSlots`` over every node, up to date.

        Kept per share shape (the GPU filter and the share policies ask the same question of one pod
        in turn, and the next pod of the shape asks it again): worked out for every node the first
        time, then only for the rows whose ``version`` changed since.
        """
        key = (pod.gpu_milli, pod.gpu_memory_mib, pod.gpu_models, pod.enforced_share)
        view = self._share_views.get(key)
        if view is None:
            if len(self._share_views) >= MAX_SHARE_SHAPES:
                del self._share_views[next(iter(self._share_views))]
            fits, milli, left = self._share_rows(pod, slice(None))
            view = self._share_views[key] = ShareSlots(fits, milli, left, self.version, self.generation)
        elif view.generation != self.generation:
            changed = self.changed_since(view.generation)
            if changed is None:  # further back than the log: compare every row's version
                rows = np.flatnonzero(view.seen != self.version)
            elif (
                len(changed) <= SHARE_ROW_BY_ROW
                and pod.gpu_milli
                and not (pod.gpu_models or pod.enforced_share or self.any_gpu_memory)
            ):  # a few rows of a share by milli alone: in Python
                for i in set(changed):
                    view.update_row(i, self.gpu_rows[i], pod.gpu_milli, self.version.item(i))
                rows = None
            else:
                rows = np.array(sorted(set(changed)), dtype=np.int64)
            if rows is not None and rows.size:
                view.update(rows, *self._share_rows(pod, rows), self.version)
            view.generation = self.generation
        return view

    def share_fits_by_books(self, pod: PodRequest, rows: np.ndarray) -> np.ndarray:
        """Per row: some GPU takes the share by the books alone, the live memory guard aside (what
        tells a node refused by the guard from one refused by its bookings)."""
        fits, _, _ = self._share_rows(pod, rows, live=False)
        return fits.any(axis=1)

    def _share_rows(
        self, pod: PodRequest, rows: slice | np.ndarray, live: bool = True
    ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray]:
        """(fits, milli, left) of these rows, worked out from the arrays (``live``: with the memory
        guard, the memory in use leaving the share's memory)."""
        free = self.gpu_free[rows]
        milli: np.ndarray | int
        if pod.gpu_milli:
            milli = pod.gpu_milli
        else:  # by memory: the same fraction of compute, rounded up; GPUs of unknown memory: whole
            total = self.gpu_mem_total[rows]
            milli = np.minimum(
                np.where(total > 0, -(-pod.gpu_memory_mib * MILLI // np.maximum(total, 1)), MILLI), MILLI
            )
        fits = free >= milli
        if self.any_gpu_memory:
            total = self.gpu_mem_total[rows]
            memory = pod.gpu_memory_mib if pod.gpu_memory_mib else total * milli // MILLI
            fits &= (self.gpu_mem_free[rows] >= memory) | (total == 0)
            if live and self.any_live_memory:
                fits &= (self.gpu_live_free[rows] >= memory) | (total == 0)
        if pod.gpu_models:
            fits &= self.gpu_model_mask(pod.gpu_models)[rows]
        if pod.enforced_share:
            fits &= self.gpu_enforced[rows]
        return fits, milli, np.where(fits, free - milli, -1)

    def resource_free(self, name: str) -> np.ndarray:
        """Per node, what is left of another resource (``NodeState.resource_free``; read-only).

        Kept, once asked, per resource name and refreshed with the rows; the simulator asks for none.
        """
        free = self._resource_free.get(name)
        if free is None:
            free = np.array([node.resource_free(name) for node in self.nodes], dtype=np.int64)
            self._resource_free[name] = free
        return _read_only(free)

    def label_mask(self, selector: Mapping[str, str]) -> np.ndarray:
        """Nodes whose labels contain every ``key: value`` of ``selector`` (labels are static)."""
        key = tuple(sorted(selector.items()))
        mask = self._label_masks.get(key)
        if mask is None:
            mask = np.array([all(node.labels.get(k) == v for k, v in key) for node in self.nodes], dtype=bool)
            self._label_masks[key] = mask
        return mask

    def enable_placement(
        self,
        others: Sequence[tuple[str, Mapping[str, str], Sequence[Taint]]] = (),
        namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> PlacementView:
        """Keep a placement view over these nodes plus ``others`` (name, labels, taints: nodes whose
        pods count for pod affinity and spreading but that take no pods from this scheduler)."""
        names = [node.name for node in self.nodes] + [name for name, _, _ in others]
        labels = [node.labels for node in self.nodes] + [ls for _, ls, _ in others]
        taints = [node.taints for node in self.nodes] + [tuple(t) for _, _, t in others]
        self.placement = PlacementView(names, labels, taints, len(self.nodes), namespace_labels)
        for i, node in enumerate(self.nodes):
            for uid in node.allocations:
                self.placement.index.add(anonymous(node.allocations[uid]), i)  # until booked with facts
        return self.placement

    def allocation(self, pod_uid: str) -> Allocation | None:
        i = self.where.get(pod_uid)
        return None if i is None else self.nodes[i].allocations.get(pod_uid)

    # -- assume / forget ------------------------------------------------------------------------

    def assume(self, alloc: Allocation, facts: PodFacts | None = None) -> None:
        """Book a decision ``alloc`` on its node (raises ``AllocationConflict`` if it does not fit);
        ``facts``: what the placement view records of the pod."""
        i = self.index.get(alloc.node)
        if i is None:
            raise AllocationConflict(f"unknown node {alloc.node}")
        if alloc.pod_uid in self.where:
            other = self.nodes[self.where[alloc.pod_uid]].name
            raise AllocationConflict(f"pod {alloc.pod_uid} is already allocated on node {other}")
        node = self.nodes[i]
        node.check(alloc)
        self._add(i, alloc, facts)

    def book(self, alloc: Allocation, facts: PodFacts | None = None) -> list[str]:
        """Record a fact: ``alloc`` is booked on its node unconditionally (replacing the pod's
        earlier booking, if any). Returns the problems (GPUs missing from the node, or now booked
        beyond their capacity) for the caller to report; raises only for an unknown node."""
        i = self.index.get(alloc.node)
        if i is None:
            raise AllocationConflict(f"unknown node {alloc.node}")
        if alloc.pod_uid in self.where:
            self.forget(alloc.pod_uid)
        node = self.nodes[i]
        self._add(i, alloc, facts)
        problems = [f"GPU {d} is not listed by node {node.name}" for d in node.missing_gpus(alloc)]
        problems += [f"RDMA VF {d} is not listed by node {node.name}" for d in node.missing_vfs(alloc)]
        problems += [f"GPU {d} is booked beyond its capacity" for d in node.overbooked(alloc)]
        problems += [f"RDMA VF {d} is booked beyond its capacity" for d in node.nics.overbooked(alloc.rdma)]
        return problems

    def _add(self, i: int, alloc: Allocation, facts: PodFacts | None = None) -> None:
        self.nodes[i].apply(alloc, 1)
        self.where[alloc.pod_uid] = i
        self.allocated_milli += alloc.gpu_milli
        if self.placement is not None:
            self.placement.index.add(facts if facts is not None else anonymous(alloc), i)
        self._sync(i)

    def forget(self, pod_uid: str) -> Allocation:
        """Release a pod's allocation (the pod ended, or an assumed binding failed)."""
        i = self.where.pop(pod_uid, None)
        if i is None:
            raise KeyError(f"pod {pod_uid} has no allocation")
        node = self.nodes[i]
        alloc = node.allocations[pod_uid]
        node.apply(alloc, -1)
        self.allocated_milli -= alloc.gpu_milli
        if self.placement is not None:
            self.placement.index.remove(pod_uid)
        self._sync(i)
        return alloc

    def _sync(self, i: int) -> None:
        """Refresh row ``i`` of the arrays from ``nodes[i]``."""
        node = self.nodes[i]
        self.cpu_free[i] = node.cpu_free
        self.mem_free[i] = node.memory_free
        if node.max_pods is not None:
            self.pods_free[i] = node.max_pods - len(node.allocations)
        if node.gpu_resource is not None:
            self.gpu_resource_free[i] = node.gpu_resource - node.gpu_resource_used
        for name, free in self._resource_free.items():
            free[i] = node.resource_free(name)
        self.has_ports[i] = bool(node.ports)
        self.rdma_free_vfs[i] = node.nics.free_vfs() if node.nics else 0
        free = [max(gpu.free_milli, 0) if gpu.healthy else -1 for gpu in node.gpus]
        self.gpu_rows[i] = free
        row = self.gpu_free[i]
        row[: len(free)] = free
        if self.gpu_memory_known[i]:
            self.gpu_mem_free[i, : len(free)] = [gpu.free_memory_mib for gpu in node.gpus]
        usable = [f for f in free if f >= 0]
        self.gpu_free_total[i] = sum(usable)
        self.gpu_full_free[i] = sum(1 for f in usable if f == MILLI)
        self.gpu_max_free[i] = max(usable, default=-1)
        self.gpu_key[i] = tuple(sorted(usable, reverse=True))
        for tag in set(node.tags) | {t for t, counts in self.tag_counts.items() if counts[i]}:
            counts = self.tag_counts.get(tag)
            if counts is None:
                counts = self.tag_counts[tag] = np.zeros(len(self.nodes), dtype=np.int64)
            counts[i] = node.tags.get(tag, 0)
        self.tag_kinds[i] = len(node.tags)
        self.version[i] += 1
        self.generation += 1
        self._changed.append(i)
        if len(self._changed) > 2 * CHANGE_LOG:
            del self._changed[:CHANGE_LOG]

    def set_live(self, name: str, readings: Mapping[str, LiveGpu]) -> bool:
        """Take node ``name``'s live report (``NodeState.set_live``); True when something may now fit
        that did not. A change of health or memory in use refreshes the node's row (its version
        moves: memoised scores and share slots are worked out again); utilisation alone does not.
        An unknown node is ignored (False)."""
        i = self.index.get(name)
        if i is None:
            return False
        changed, relaxed = self.nodes[i].set_live(readings)
        if changed:
            self._sync(i)
        self._sync_live(i)
        return relaxed

    def _sync_live(self, i: int) -> None:
        """Refresh row ``i`` of the live arrays from ``nodes[i]``."""
        gpus = self.nodes[i].gpus
        if not gpus:
            return
        k = len(gpus)
        util = np.array([np.nan if g.live_utilization is None else g.live_utilization for g in gpus])
        self.gpu_util[i, :k] = util
        busy = np.where(np.isnan(util), UNKNOWN_UTILIZATION, util)
        self.gpu_busy[i, :k] = busy
        healthy = np.array([g.healthy for g in gpus], dtype=bool)
        self.node_util[i] = float(busy[healthy].mean() if healthy.any() else busy.mean())
        live_free = [g.live_free_memory_mib for g in gpus]
        self.gpu_live_free[i, :k] = [UNLIMITED if f is None else f for f in live_free]
        if any(f is not None for f in live_free):
            self.any_live_memory = True

    def changed_since(self, generation: int) -> list[int] | None:
        """The node of each change (``_sync``) since ``generation`` was this cluster's, oldest first
        (a node changed twice is there twice); None when that is further back than it remembers
        (``CHANGE_LOG`` changes at least)."""
        back = self.generation - generation
        if back > len(self._changed) or back < 0:
            return None
        return self._changed[len(self._changed) - back :] if back else []

    def tag_count(self, tag: str) -> np.ndarray:
        """Per node, how many pods of GPU shape ``tag`` it runs."""
        counts = self.tag_counts.get(tag)
        if counts is None:
            counts = self.tag_counts[tag] = np.zeros(len(self.nodes), dtype=np.int64)
        return counts

    # -- summaries ------------------------------------------------------------------------------

    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    def allocated_gpu_milli(self) -> int:
        """GPU milli allocated over the cluster."""
        return self.allocated_milli
