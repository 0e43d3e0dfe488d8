"""What a pod asks for: CPU, memory, whole or fractional GPUs, GPU models, topology, placement rules.

A ``PodRequest`` is the scheduler's view of a pod, built by the live scheduler from a Pod object and
by the simulator from a trace row. GPU requests come in two forms:

- whole GPUs: ``gpu_count = k`` and ``gpu_milli = 1000`` (the default when only a count is given);
- a share of ONE GPU: ``gpu_count = 1`` and ``gpu_milli < 1000`` (the openb trace's milli-GPU), and/or
  ``gpu_memory_mib`` (a share by GPU memory; the milli charged is then derived from the GPU's memory).
  ``enforced_share`` asks for a GPU whose node enforces shares (MPS; the GPU's ``sharing`` attribute).

Beyond CPU, memory and GPUs a pod may ask for any other resource kube-scheduler's NodeResourcesFit
checks (``resources``: ``ephemeral-storage``, ``hugepages-*``, extended resources such as
``example.com/foo`` or ``kubegpu.io/rdma``, and ``memory`` in bytes when the caller knows it exactly)
and for host ports (``host_ports``, kube-scheduler's NodePorts). The simulator's pods ask for none,
which costs nothing. ``rdma`` asks for RDMA interfaces (SR-IOV VFs) for the whole pod, a count and a
bandwidth per interface (``scheduler.core.rdma``).

``shape()`` is a hashable key of everything that affects scheduling (not the pod's name), so scores
can be memoised per request shape.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubegpu.podrequests import effective_request as effective_request
from scheduler.core.rdma import NO_RDMA, RdmaRequest

if TYPE_CHECKING:
    from scheduler.core.placement import PodPlacement

MILLI = 1000  # one whole GPU in milli-GPU


class Wish(enum.IntEnum):
    """How strongly a pod wants a topology property of its GPU set."""

    NONE = 0
    PREFER = 1
    REQUIRE = 2


@dataclass(frozen=True)
class TopologyWish:
    """Topology wishes for a multi-GPU set (ignored for requests of fewer than two GPUs)."""

    nvlink: Wish = Wish.NONE  # every pair of the set NVLink-connected
    same_numa: Wish = Wish.NONE  # every GPU of the set on one NUMA node
    same_pcie_switch: Wish = Wish.NONE  # every pair of the set behind one PCIe switch (PIX)

    def required(self) -> bool:
        return Wish.REQUIRE in (self.nvlink, self.same_numa, self.same_pcie_switch)

    def any(self) -> bool:
        return (self.nvlink, self.same_numa, self.same_pcie_switch) != (Wish.NONE,) * 3


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE

    def __str__(self) -> str:
        return f"{{{self.key}: {self.value}}}" if self.value else f"{{{self.key}}}"


# The taint a cordoned node (``spec.unschedulable``) stands for: a pod tolerating it may go there
# (kube-scheduler's NodeUnschedulable), although the node need not carry it.
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", TaintEffect.NO_SCHEDULE)


@dataclass(frozen=True)
class Toleration:
    """A Kubernetes toleration: ``operator`` is ``Equal`` or ``Exists``; empty key+Exists tolerates all."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # "" matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerates_unschedulable(tolerations: Iterable[Toleration]) -> bool:
    """Whether a pod with these tolerations may go to a cordoned node (kube-scheduler's rule)."""
    return any(t.tolerates(UNSCHEDULABLE_TAINT) for t in tolerations)


class ContainerKind(enum.StrEnum):
    """Where a container runs in the pod's life: Kubernetes' three kinds."""

    APP = "app"  # spec.containers
    INIT = "init"  # spec.initContainers, run one at a time before the app containers
    SIDECAR = "sidecar"  # spec.initContainers with restartPolicy Always: start in order, then stay


@dataclass(frozen=True)
class ContainerRequest:
    """How many of the pod's whole GPUs one container gets (``gpu_count``), in pod order
    (init containers first, as declared, then the app containers).

    A sharing pod's one GPU share goes to every container listed (or to the whole pod).
    """

    name: str
    gpu_count: int = 0
    kind: ContainerKind = ContainerKind.APP


def container_gpus(containers: Iterable[ContainerRequest]) -> int:
    """The pod's whole GPUs by Kubernetes' rule over its containers' counts."""
    app, init = [], []
    for c in containers:
        if c.kind == ContainerKind.APP:
            app.append(c.gpu_count)
        else:
            init.append((c.gpu_count, c.kind == ContainerKind.SIDECAR))
    return effective_request(app, init)


BIND_ALL = "0.0.0.0"  # a host port on every IP of the node


@dataclass(frozen=True, order=True)
class HostPort:
    """A host port a pod binds on its node (kube-scheduler's ``HostPortInfo`` entry): ``protocol``
    (TCP when empty), ``ip`` (``0.0.0.0``, every IP, when empty) and ``port`` (> 0)."""

    protocol: str
    ip: str
    port: int

    @classmethod
    def of(cls, port: int, protocol: str = "", ip: str = "") -> HostPort:
        """The entry as kube-scheduler sanitises it (empty protocol TCP, empty IP 0.0.0.0)."""
        return cls(protocol or "TCP", ip or BIND_ALL, port)

    def conflicts(self, used: HostPort) -> bool:
        """Whether binding this port collides with ``used``: same protocol and port, and the same IP
        or either of them on every IP (``0.0.0.0``)."""
        if self.port != used.port or self.protocol != used.protocol:
            return False
        return self.ip == used.ip or self.ip == BIND_ALL or used.ip == BIND_ALL


def ports_conflict(wanted: Iterable[HostPort], used: Iterable[HostPort]) -> bool:
    """Whether any of ``wanted`` collides with any port in ``used`` (kube-scheduler's NodePorts)."""
    used = tuple(used)
    return any(w.conflicts(u) for w in wanted for u in used)


def resource_tuple(amounts: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """``(name, amount)`` pairs sorted by name, zero amounts dropped (a zero request is ignored)."""
    items = amounts.items() if isinstance(amounts, Mapping) else amounts
    merged: dict[str, int] = {}
    for name, amount in items:
        merged[name] = merged.get(name, 0) + int(amount)
    return tuple(sorted((n, a) for n, a in merged.items() if a))


@dataclass(frozen=True)
class PodRequest:
    """The scheduling-relevant content of one pod."""

    name: str
    uid: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0  # per GPU: 1000 whole, < 1000 a share of one GPU
    gpu_memory_mib: int = 0  # a share by GPU memory (sharing pods only); 0 = none asked
    gpu_models: frozenset[str] = frozenset()  # allowed GPU models; empty = any
    enforced_share: bool = False  # a share only on a GPU whose limits the node enforces (MPS)
    topology: TopologyWish = TopologyWish()
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Toleration, ...] = ()
    containers: tuple[ContainerRequest, ...] = ()
    # other resources kube-scheduler's NodeResourcesFit checks, (name, amount in the resource's unit:
    # bytes, or a count), sorted, none zero; "memory" here (bytes) replaces the check of memory_mib,
    # which then only feeds scores. The GPU resource is never here (gpu_count).
    resources: tuple[tuple[str, int], ...] = ()
    host_ports: tuple[HostPort, ...] = ()  # kube-scheduler's NodePorts
    rdma: RdmaRequest = NO_RDMA  # RDMA interfaces (VFs) for the whole pod, with bandwidth
    # placement rules beyond resources (node and pod affinity, spread, priority): not part of the
    # shape, as they depend on other pods; None: none (the simulator's pods)
    placement: PodPlacement | None = field(default=None, compare=False, hash=False, repr=False)
    _shape: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.gpu_count < 0 or self.gpu_milli < 0 or self.gpu_memory_mib < 0:
            raise ValueError(f"pod {self.name}: negative GPU request")
        if self.gpu_count and not self.gpu_milli and not self.gpu_memory_mib:
            object.__setattr__(self, "gpu_milli", MILLI)
        if self.gpu_milli > MILLI:
            raise ValueError(f"pod {self.name}: gpu_milli {self.gpu_milli} > {MILLI} (ask for whole GPUs)")
        if self.is_share and self.gpu_count != 1:
            raise ValueError(f"pod {self.name}: a GPU share is a share of one GPU (gpu_count must be 1)")
        if self.enforced_share and not self.is_share:
            raise ValueError(f"pod {self.name}: only a share of one GPU can ask for enforcement")
        if not self.uid:
            object.__setattr__(self, "uid", self.name)
        if self.resources:
            resources = resource_tuple(self.resources)
            if any(amount < 0 for _, amount in resources):
                raise ValueError(f"pod {self.name}: negative resource request")
            object.__setattr__(self, "resources", resources)
        if self.host_ports:
            object.__setattr__(self, "host_ports", tuple(sorted(set(self.host_ports))))
        shape = (
            self.cpu_milli,
            self.memory_mib,
            self.gpu_count,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.gpu_models,
            self.enforced_share,
            self.topology if self.gpu_count > 1 else TopologyWish(),
            tuple(sorted(self.node_selector.items())),
            self.tolerations,
            self.resources,
            self.host_ports,
            self.rdma,
        )
        object.__setattr__(self, "_shape", shape)

    @property
    def exact_memory(self) -> bool:
        """Memory is asked in bytes among ``resources`` (the MiB figure then only feeds scores)."""
        return any(name == "memory" for name, _ in self.resources)

    @property
    def is_share(self) -> bool:
        """A fractional request: part of one GPU."""
        return self.gpu_count > 0 and self.gpu_milli < MILLI

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs asked for (0 for CPU-only and sharing pods)."""
        return 0 if self.is_share else self.gpu_count

    @property
    def total_gpu_milli(self) -> int:
        """GPU milli the pod asks for in all (the trace's num_gpu x gpu_milli)."""
        return self.gpu_count * self.gpu_milli

    @property
    def gpu_tag(self) -> str:
        """The pod's GPU shape: ``no-gpu``, ``share-gpu`` or ``<k>-gpu`` (GPU-clustering affinity)."""
        if self.gpu_count == 0:
            return "no-gpu"
        return "share-gpu" if self.is_share else f"{self.gpu_count}-gpu"

    def shape(self) -> tuple:
        """Hashable key of everything scheduling depends on (not name or uid)."""
        return self._shape

    def allows_model(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models
