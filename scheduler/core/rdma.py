"""RDMA virtual functions as schedulable devices: what a pod asks, what a node has, which VFs it gets.

A pod asks for RDMA interfaces per pod (``RdmaRequest``): how many, and the bandwidth of each in
Mbit/s, a minimum the node reserves and optionally a maximum (0: none; the node applies it, the
scheduler only carries it). Each interface is one SR-IOV virtual function (VF) of a physical
function (PF, one NIC port) of the node.

A node's NICs (``NicState``, built from its published inventory by ``nic_state``): its PFs with
their line rate, their usable VFs, which GPUs sit beside each PF (on its PCIe switch,
``Topology.nic_gpus``) and its NUMA node. Bookings hold VFs (a VF goes to one pod at a time) and
reserve bandwidth per PF: the minimums of the interfaces on one PF add up and never exceed its
line rate.

Choice (``choose_vfs``): the PFs beside the pod's GPUs first (on their PCIe switch, then on their
NUMA node, then the others); within a tier the PF that can take every interface still wanted and
has the least bandwidth left (best fit, keeping roomier PFs for bigger pods), else the PF that
takes the most, so a pod's interfaces spread over PFs only when one PF's VFs or bandwidth are not
enough. Whether a node can take a pod at all (``NicState.shortage``) depends on the PFs alone, not on
which GPUs the pod gets: the filter and the choice always agree.

Everything here is pure and in memory; the bandwidth notation both fronts use is
``kubegpu.bandwidth`` (docs/scheduler.md, "RDMA interfaces"); how the inventory reads as PFs and
VFs is ``devices.nics``, shared with the advertiser.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devices.model import NodeInventory
from devices.nics import nic_ports
from devices.nics import rate_mbps as rate_mbps
from kubegpu.bandwidth import MAX_MBPS as MAX_MBPS
from kubegpu.bandwidth import MBPS_PER_GBPS as MBPS_PER_GBPS
from kubegpu.bandwidth import format_mbps as format_mbps
from kubegpu.bandwidth import parse_bandwidth as parse_bandwidth

MAX_INTERFACES = 32  # per pod

NO_FREE_VFS = "node(s) had too few free RDMA virtual functions"
NO_BANDWIDTH = "node(s) had insufficient RDMA bandwidth"


@dataclass(frozen=True)
class RdmaRequest:
    """A pod's RDMA interfaces: ``count`` VFs of ``min_mbps`` reserved each (``max_mbps``: cap, 0 none)."""

    count: int = 0
    min_mbps: int = 0
    max_mbps: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.count <= MAX_INTERFACES:
            raise ValueError(f"RDMA interfaces {self.count} outside 0..{MAX_INTERFACES}")
        if not 0 <= self.min_mbps <= MAX_MBPS or not 0 <= self.max_mbps <= MAX_MBPS:
            raise ValueError(f"RDMA bandwidth outside 0..{MAX_MBPS} Mbit/s")
        if self.max_mbps and self.min_mbps > self.max_mbps:
            raise ValueError(
                f"RDMA bandwidth minimum {self.min_mbps} above its maximum {self.max_mbps} Mbit/s"
            )

    def __bool__(self) -> bool:
        return self.count > 0


NO_RDMA = RdmaRequest()


@dataclass(frozen=True, order=True)
class VfGrant:
    """One VF given to a pod: its PF and the interface's bandwidth (Mbit/s; ``max_mbps`` 0: no cap)."""

    id: str
    pf: str
    min_mbps: int = 0
    max_mbps: int = 0

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "pf": self.pf, "minMbps": self.min_mbps}
        if self.max_mbps:
            doc["maxMbps"] = self.max_mbps
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> VfGrant:
        return cls(str(doc["id"]), str(doc["pf"]), int(doc.get("minMbps", 0)), int(doc.get("maxMbps", 0)))


@dataclass
class PfState:
    """One PF of a node: line rate, usable VFs, neighbours, and what is booked on it."""

    id: str
    rate_mbps: int
    numa: int = -1
    gpus: frozenset[str] = frozenset()  # GPU ids on its PCIe switch
    vfs: tuple[str, ...] = ()  # its usable (healthy) VFs, in order
    reserved_mbps: int = 0
    # its VFs out of use (unhealthy, or all of them while the PF is): never free, but a pod that
    # holds one keeps its booking, and the bandwidth it reserved stays reserved
    unusable: tuple[str, ...] = ()
    held: dict[str, int] = field(default_factory=dict)  # VF id -> bookings (more than 1: overbooked)

    def free_vfs(self) -> list[str]:
        return [v for v in self.vfs if not self.held.get(v)]

    @property
    def left_mbps(self) -> int:
        return self.rate_mbps - self.reserved_mbps

    def slots(self, min_mbps: int) -> int:
        """How many more interfaces of ``min_mbps`` each it can take (free VFs and bandwidth)."""
        return _slots(len(self.free_vfs()), self.left_mbps, min_mbps)


def _slots(free: int, left_mbps: int, min_mbps: int) -> int:
    """Interfaces of ``min_mbps`` each that ``free`` VFs with ``left_mbps`` left on their PF can take."""
    if not min_mbps:
        return free
    return max(0, min(free, left_mbps // min_mbps))


class NicState:
    """A node's PFs and their VFs (see module doc); ``pf_of`` maps every usable VF to its PF,
    ``booked_on`` every VF a booking counts on (the usable ones and those out of use)."""

    def __init__(self, pfs: Iterable[PfState] = ()) -> None:
        self.pfs: dict[str, PfState] = {pf.id: pf for pf in pfs}
        self.pf_of: dict[str, str] = {vf: pf.id for pf in self.pfs.values() for vf in pf.vfs}
        self.booked_on: dict[str, str] = {
            vf: pf.id for pf in self.pfs.values() for vf in (*pf.vfs, *pf.unusable)
        }

    def __bool__(self) -> bool:
        return bool(self.pf_of)

    def free_vfs(self) -> int:
        return sum(len(pf.free_vfs()) for pf in self.pfs.values())

    def shortage(self, request: RdmaRequest) -> str:
        """'' when the node can give ``request``, else why not (``NO_FREE_VFS`` or ``NO_BANDWIDTH``)."""
        return self.shortage_without(request, ())

    def shortage_without(self, request: RdmaRequest, released: Iterable[VfGrant]) -> str:
        """``shortage`` as it would be once ``released`` (grants booked here, e.g. the VFs of pods a
        preemption would evict) are given back; the books are left as they are."""
        if not request:
            return ""
        gone: dict[str, int] = {}  # VF id -> bookings released
        freed: dict[str, int] = {}  # PF id -> Mbit/s released
        for grant in released:
            pf_id = self.booked_on.get(grant.id)
            if pf_id is not None:
                gone[grant.id] = gone.get(grant.id, 0) + 1
                freed[pf_id] = freed.get(pf_id, 0) + grant.min_mbps
        free = slots = 0
        for pf in self.pfs.values():
            vfs = sum(1 for v in pf.vfs if pf.held.get(v, 0) <= gone.get(v, 0))
            free += vfs
            slots += _slots(vfs, pf.left_mbps + freed.get(pf.id, 0), request.min_mbps)
        if free < request.count:
            return NO_FREE_VFS
        if slots < request.count:
            return NO_BANDWIDTH
        return ""

    def problems(self, grants: Iterable[VfGrant]) -> list[str]:
        """Why booking ``grants`` now would be wrong: an unknown or held VF, one named twice, a PF's
        reservations past its line rate. Empty when they fit."""
        found: list[str] = []
        seen: set[str] = set()
        adding: dict[str, int] = {}
        for grant in grants:
            pf_id = self.pf_of.get(grant.id)
            if pf_id is None:
                found.append(f"no usable RDMA VF {grant.id}")
                continue
            if grant.id in seen:
                found.append(f"RDMA VF {grant.id} granted twice")
            seen.add(grant.id)
            if self.pfs[pf_id].held.get(grant.id):
                found.append(f"RDMA VF {grant.id} is held by another pod")
            adding[pf_id] = adding.get(pf_id, 0) + grant.min_mbps
        for pf_id, mbps in adding.items():
            pf = self.pfs[pf_id]
            if mbps > pf.left_mbps:
                found.append(f"PF {pf_id} has {max(pf.left_mbps, 0)} Mbit/s left, not {mbps}")
        return found

    def overbooked(self, grants: Iterable[VfGrant]) -> list[str]:
        """The ids of ``grants`` (booked here) now held twice or on a PF reserved past its rate."""
        out = []
        for grant in grants:
            pf_id = self.booked_on.get(grant.id)
            if pf_id is None:
                continue
            pf = self.pfs[pf_id]
            if pf.held.get(grant.id, 0) > 1 or pf.reserved_mbps > pf.rate_mbps:
                out.append(grant.id)
        return out

    def missing(self, grants: Iterable[VfGrant]) -> list[str]:
        """The VF ids of ``grants`` this node does not list (usable or out of use)."""
        return [g.id for g in grants if g.id not in self.booked_on]

    def apply(self, grants: Iterable[VfGrant], sign: int) -> None:
        """Book (``sign=1``) or release (``-1``) ``grants``, unconditionally, VFs out of use included
        (their pods still hold them and their bandwidth); VFs the node does not list are skipped."""
        for grant in grants:
            pf_id = self.booked_on.get(grant.id)
            if pf_id is None:
                continue
            pf = self.pfs[pf_id]
            pf.reserved_mbps += sign * grant.min_mbps
            count = pf.held.get(grant.id, 0) + sign
            if count > 0:
                pf.held[grant.id] = count
            else:
                pf.held.pop(grant.id, None)


def nic_state(inventory: NodeInventory) -> NicState:
    """The node's PFs and usable VFs from its inventory, as ``devices.nics.nic_ports`` reads them (the
    reading the advertiser's ``kubegpu.io/rdma`` count shares). A PF whose VFs are all unusable keeps
    them out of use (``PfState.unusable``) so the pods that hold them stay booked. A PF's GPUs are
    those ``Topology.nic_gpus`` lists for it or its VFs.
    """
    near = inventory.topology.nic_gpus
    states = []
    for port in nic_ports(inventory):
        mine = port.vfs
        gpus = frozenset(near.get(port.pf.id, ())).union(*(near.get(v.id, ()) for v in mine))
        unusable = tuple(v.id for v in mine if v.id not in port.usable)
        states.append(
            PfState(port.pf.id, port.rate_mbps, port.pf.numa_node, gpus, port.usable, unusable=unusable)
        )
    return NicState(states)


def _tier(pf: PfState, gpu_ids: Collection[str], gpu_numas: Collection[int]) -> int:
    """0: on the PCIe switch of one of the pod's GPUs; 1: on one of their NUMA nodes; 2: elsewhere."""
    if pf.gpus and not pf.gpus.isdisjoint(gpu_ids):
        return 0
    if pf.numa >= 0 and pf.numa in gpu_numas:
        return 1
    return 2


def vf_distance(
    vfs: Iterable[VfGrant], nics: NicState, gpu_ids: Collection[str], gpu_numas: Collection[int]
) -> int:
    """How far ``vfs`` sit from the pod's GPUs: the sum of their PFs' tiers (0 on the PCIe switch of one
    of the GPUs, 1 on one of their NUMA nodes, 2 elsewhere)."""
    return sum(_tier(nics.pfs[v.pf], gpu_ids, gpu_numas) for v in vfs)


def choose_vfs(
    request: RdmaRequest,
    nics: NicState,
    gpu_ids: Collection[str] = (),
    gpu_numas: Collection[int] = (),
) -> tuple[VfGrant, ...] | None:
    """The VFs for ``request`` beside the pod's GPUs (see module doc), or None when the node cannot
    give them. Deterministic: ties go to the PF id, VFs are taken in the PF's order."""
    if not request:
        return ()
    slots = {pf.id: pf.slots(request.min_mbps) for pf in nics.pfs.values()}
    if sum(slots.values()) < request.count:
        return None
    tiers: dict[int, list[PfState]] = {}
    for pf in nics.pfs.values():
        if slots[pf.id]:
            tiers.setdefault(_tier(pf, gpu_ids, gpu_numas), []).append(pf)
    wanted = request.count
    chosen: list[VfGrant] = []
    for tier in sorted(tiers):
        candidates = tiers[tier]
        while wanted and candidates:
            whole = [pf for pf in candidates if slots[pf.id] >= wanted]
            if whole:
                pf = min(whole, key=lambda p: (p.left_mbps, p.id))
            else:
                pf = min(candidates, key=lambda p: (-slots[p.id], p.id))
            take = min(wanted, slots[pf.id])
            chosen += [VfGrant(v, pf.id, request.min_mbps, request.max_mbps) for v in pf.free_vfs()[:take]]
            wanted -= take
            candidates = [p for p in candidates if p is not pf]
        if not wanted:
            break
    return tuple(chosen)
