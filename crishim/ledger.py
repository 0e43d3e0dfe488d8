"""The node ledger: which container holds which device, and how much of it.

Filled when the shim creates a container from an allocation, freed on RemoveContainer and
RemovePodSandbox, rebuilt after a restart from containerd's own list of containers (the shim
marks every container it rewrote with ``MARK_ANNOTATION``). A whole device counts 1000 milli; a
fractional share counts its milli. A new container may take a device only if the holders that
are not the same container leave room: only a restart of the same container (same pod, same
container name; kubelet creates the new one while the exited one still exists) is exempt, never
another container of the same pod. A pod-wide holding (``Holding.pod_wide``: an RDMA VF, which the
allocation gives the whole pod) may be held by every container of its pod at once, and by no
container of another pod: one VF is never granted to two pods.

A holding is in flight (no container id yet) from its reservation until the create's outcome is
known; a create that failed ambiguously (deadline, cancellation, UNKNOWN) leaves it ``unknown``:
it becomes the container containerd did create when one is found (by pod, container name and
attempt), and otherwise stays, quarantined, until containerd can no longer make it (a later
create of the same container succeeded, or its sandbox is gone). A marked live container found
later that the ledger does not account for (containerd finished a create after a restart) is
adopted, unless that would book a device past its capacity (``OverBooked``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

MARK_ANNOTATION = "kubegpu.io/devices"
WHOLE = 1000


@dataclass(frozen=True)
class Holding:
    """One container's claim on one device."""

    container_id: str  # "" while the create is in flight or its outcome is unknown
    sandbox_id: str
    pod_uid: str
    container: str
    device: str
    milli: int
    attempt: int = 0
    unknown: bool = False  # the create failed ambiguously: containerd may have made the container
    ticket: int = 0  # tells apart the reservations of two creates of the same container and attempt
    memory_mib: int = 0  # the share's GPU memory; 0: its milli's fraction of the GPU's memory
    pod_wide: bool = False  # a device of the whole pod (an RDMA VF): its pod's containers share it

    @property
    def state(self) -> str:
        return self.container_id[:12] or ("outcome unknown" if self.unknown else "creating")

    @property
    def owner(self) -> tuple[str, str]:
        """The container (pod UID, container name) across its restarts."""
        return (self.pod_uid, self.container)

    @property
    def create_key(self) -> tuple[str, str, int]:
        """What identifies the create in containerd: pod, container name, attempt."""
        return (self.pod_uid, self.container, self.attempt)


def one_per_create(holdings: Iterable[Holding]) -> tuple[Holding, ...]:
    """The holdings with each create (pod, container, attempt) counted once, its largest kept:
    containerd makes at most one container per name, so a create and its retry (both quarantined
    while their outcome is unknown) are one container at most."""
    kept: dict[tuple[str, str, int], Holding] = {}
    for h in holdings:
        current = kept.get(h.create_key)
        if current is None or (h.milli, h.memory_mib) > (current.milli, current.memory_mib):
            kept[h.create_key] = h
    return tuple(kept.values())


def memory_held(holding: Holding, gpu_memory_mib: int) -> int:
    """The GPU memory (MiB) a holding takes of a GPU with ``gpu_memory_mib``: its share's memory,
    or its milli's fraction of the GPU's (all of it for a whole GPU), as the scheduler books it."""
    return holding.memory_mib or gpu_memory_mib * holding.milli // WHOLE


@dataclass(frozen=True)
class Conflict:
    device: str
    holders: tuple[Holding, ...]
    reason: str = ""  # empty: their milli leave no room

    def describe(self) -> str:
        who = ", ".join(f"{h.container} of pod {h.pod_uid} ({h.state})" for h in self.holders)
        return f"device {self.device} is held by {who}" + (f": {self.reason}" if self.reason else "")


class OverBooked(Exception):
    """A container found in containerd does not fit beside the holdings the ledger has: adopting
    it would book its devices past their capacity (``conflicts`` say where and beside whom)."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        super().__init__("; ".join(c.describe() for c in conflicts))
        self.conflicts = conflicts


class Mark(NamedTuple):
    """What the shim's mark on a container says (``mark_value``)."""

    pod: str
    container: str
    devices: dict[str, int]  # device id -> milli
    memory: dict[str, int]  # device id -> the share's memory MiB, where the allocation set one
    pod_wide: frozenset[str] = frozenset()  # the devices held pod-wide (RDMA VFs)


def mark_value(
    pod_uid: str,
    container: str,
    shares: Mapping[str, int],
    memory: Mapping[str, int] | None = None,
    pod_wide: Iterable[str] = (),
) -> str:
    """The annotation the shim puts on a container it rewrote (device id -> milli, the shares'
    memory in MiB where the allocation set it, and the devices it holds pod-wide; a mark without
    memory or pod-wide devices is what earlier shims wrote)."""
    doc: dict[str, object] = {"pod": pod_uid, "container": container, "devices": dict(sorted(shares.items()))}
    set_memory = {device: mib for device, mib in sorted((memory or {}).items()) if mib}
    if set_memory:
        doc["memoryMiB"] = set_memory
    wide = sorted(set(pod_wide))
    if wide:
        doc["podWide"] = wide
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def parse_mark(value: str) -> Mark | None:
    """Inverse of mark_value; None for anything the shim did not write."""
    try:
        doc = json.loads(value)
        pod, container, devices = doc["pod"], doc["container"], doc["devices"]
        memory = doc.get("memoryMiB", {})
        wide = doc.get("podWide", [])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (isinstance(pod, str) and isinstance(container, str) and isinstance(devices, dict)):
        return None
    if not all(isinstance(k, str) and type(v) is int and 0 < v <= WHOLE for k, v in devices.items()):
        return None
    if not (
        isinstance(memory, dict) and all(k in devices and type(v) is int and v > 0 for k, v in memory.items())
    ):
        return None
    if not (isinstance(wide, list) and all(isinstance(d, str) and devices.get(d) == WHOLE for d in wide)):
        return None
    return Mark(pod, container, devices, memory, frozenset(wide))


class Ledger:
    """Thread-safe device holdings of one node."""

    def __init__(self, gpu_memory_mib: Callable[[str], int] | None = None) -> None:
        """``gpu_memory_mib``: a device's memory in MiB from the node's inventory (0: unknown, and
        then memory is not checked)."""
        self._lock = threading.Lock()
        self._by_device: dict[str, list[Holding]] = {}
        self._gpu_memory_mib = gpu_memory_mib or (lambda device: 0)

    def _conflicts_locked(self, owner: tuple[str, str], wanted: Sequence[Holding]) -> list[Conflict]:
        """Where the ``wanted`` holdings (of ``owner``) do not fit beside everyone else's: their milli
        past 1000, or their memory past the GPU's."""
        found = []
        for device in dict.fromkeys(h.device for h in wanted):
            held = self._by_device.get(device, ())
            if any(h.pod_wide for h in held) or any(h.pod_wide for h in wanted if h.device == device):
                # a pod-wide device: any container of its pod, no container of another pod
                strangers = one_per_create(h for h in held if h.pod_uid != owner[0])
                if strangers:
                    found.append(
                        Conflict(device, strangers, "a pod-wide device (an RDMA VF) goes to one pod")
                    )
                continue
            others = one_per_create(h for h in held if h.owner != owner)
            if not others:
                continue
            together = [*others, *(h for h in wanted if h.device == device)]
            total = self._gpu_memory_mib(device)
            used = sum(memory_held(h, total) for h in together)
            if sum(h.milli for h in together) > WHOLE:
                found.append(Conflict(device, others))
            elif total > 0 and used > total:
                found.append(
                    Conflict(
                        device,
                        others,
                        f"their GPU memory would add up to {used} MiB, more than its {total} MiB",
                    )
                )
        return found

    def try_reserve(self, holdings: Iterable[Holding]) -> list[Conflict]:
        """Atomically check the holdings against everyone else's and record them if all fit.

        The holdings (all of one container; container id still empty) are later given their
        container id by ``commit``, dropped by ``release`` or left ``unknown`` by ``mark_unknown``.
        """
        kept = list(holdings)
        if not kept:
            return []
        with self._lock:
            conflicts = self._conflicts_locked(kept[0].owner, kept)
            if not conflicts:
                for h in kept:
                    self._by_device.setdefault(h.device, []).append(h)
            return conflicts

    def commit(self, reserved: Iterable[Holding], container_id: str) -> None:
        """containerd created the container: the holdings get its id (recorded again if they
        were dropped meanwhile, since the container exists and may use the device, unless that
        would book a device past its capacity: then ``OverBooked`` and nothing is recorded).

        Unknown holdings of earlier creates of the same container (sandbox, pod, container name,
        attempt) go: containerd reserves a container's name for its create, so none of them can
        make a container any more now that this one has the name.
        """
        kept = list(reserved)
        with self._lock:
            dropped = [
                h
                for h in kept
                if not any(e in (h, replace(h, unknown=True)) for e in self._by_device.get(h.device, ()))
                and not any(e.container_id == container_id for e in self._by_device.get(h.device, ()))
            ]
            if dropped:  # its sandbox was removed while containerd was still making it
                conflicts = self._conflicts_locked(dropped[0].owner, kept)
                if conflicts:
                    raise OverBooked(conflicts)
            for h in kept:
                entries = self._by_device.setdefault(h.device, [])
                pending = (h, replace(h, unknown=True))
                entries[:] = [
                    e
                    for e in entries
                    if e not in pending
                    and not (e.unknown and e.sandbox_id == h.sandbox_id and e.create_key == h.create_key)
                ]
                if not any(e.container_id == container_id for e in entries):  # reconciled already
                    entries.append(replace(h, container_id=container_id, unknown=False))

    def release(self, reserved: Iterable[Holding]) -> None:
        """Drop in-flight (or unknown) holdings of a create that did not make a container."""
        gone = set()
        for h in reserved:
            gone.add(h)
            gone.add(replace(h, unknown=True))
        self._remove(lambda h: not h.container_id and h in gone)

    def mark_unknown(self, reserved: Iterable[Holding]) -> None:
        """The create failed ambiguously: keep the holdings, to be reconciled with containerd."""
        with self._lock:
            for h in reserved:
                entries = self._by_device.get(h.device, [])
                if h in entries:
                    entries[entries.index(h)] = replace(h, unknown=True)

    def adopt(self, found: Iterable[Holding]) -> bool:
        """Record a live container the ledger does not account for (``found``: its holdings, all
        with its id), such as one containerd finished creating after its caller gave up, or one a
        restart's rebuild did not list yet.

        It takes the place of the unknown holdings of the same create (sandbox, pod, container,
        attempt). Nothing happens (False) if its id is recorded already, or if that create is
        still in flight here: its own commit records it. Raises ``OverBooked`` (and records
        nothing) if it does not fit beside the other containers' holdings: a device is never
        booked past its capacity.
        """
        kept = list(found)
        if not kept:
            return False
        first = kept[0]

        def same_create(h: Holding) -> bool:
            return (
                not h.container_id and h.sandbox_id == first.sandbox_id and h.create_key == first.create_key
            )

        with self._lock:
            everything = [h for entries in self._by_device.values() for h in entries]
            if any(
                h.container_id == first.container_id or (same_create(h) and not h.unknown) for h in everything
            ):
                return False
            conflicts = self._conflicts_locked(first.owner, kept)  # the unknowns it replaces are its own
            if conflicts:
                raise OverBooked(conflicts)
            for device in list(self._by_device):
                left = [h for h in self._by_device[device] if not same_create(h)]
                if left:
                    self._by_device[device] = left
                else:
                    del self._by_device[device]
            for h in kept:
                self._by_device.setdefault(h.device, []).append(h)
            return True

    def unknown(self, sandbox_id: str | None = None) -> list[Holding]:
        """Holdings whose create failed ambiguously (of one sandbox, or all)."""
        with self._lock:
            return [
                h
                for entries in self._by_device.values()
                for h in entries
                if h.unknown and (sandbox_id is None or h.sandbox_id == sandbox_id)
            ]

    def container_ids(self) -> set[str]:
        with self._lock:
            return {h.container_id for entries in self._by_device.values() for h in entries if h.container_id}

    def remove_container(self, container_id: str) -> list[Holding]:
        return self._remove(lambda h: h.container_id == container_id)

    def remove_sandbox(self, sandbox_id: str) -> list[Holding]:
        """Everything of the sandbox, creates whose outcome was never known included."""
        return self._remove(lambda h: h.sandbox_id == sandbox_id)

    def _remove(self, match: Callable[[Holding], bool]) -> list[Holding]:
        removed = []
        with self._lock:
            for device in list(self._by_device):
                keep = []
                for h in self._by_device[device]:
                    (removed if match(h) else keep).append(h)
                if keep:
                    self._by_device[device] = keep
                else:
                    del self._by_device[device]
        return removed

    def holdings(self) -> list[Holding]:
        with self._lock:
            return [h for entries in self._by_device.values() for h in entries]

    def replace_all(self, holdings: Iterable[Holding]) -> None:
        """Start over from a rebuilt list (after a restart)."""
        rebuilt: dict[str, list[Holding]] = {}
        for h in holdings:
            rebuilt.setdefault(h.device, []).append(h)
        with self._lock:
            self._by_device = rebuilt
