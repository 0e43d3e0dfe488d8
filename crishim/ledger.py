"""The node ledger: which container holds which device, and how much of it.

Filled when the shim creates a container from an allocation, freed on RemoveContainer and
RemovePodSandbox, rebuilt after a restart from containerd's own list of containers (the shim
marks every container it rewrote with ``MARK_ANNOTATION``). A whole device counts 1000 milli; a
fractional share counts its milli. A new container may take a device only if the live holders
of *other* pods leave room; containers of the same pod never conflict with each other (kubelet
restarts a container by creating a new one while the exited one still exists).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

MARK_ANNOTATION = "kubegpu.io/devices"
WHOLE = 1000


@dataclass(frozen=True)
class Holding:
    """One container's claim on one device."""

    container_id: str  # "" while the create is in flight
    sandbox_id: str
    pod_uid: str
    container: str
    device: str
    milli: int


@dataclass(frozen=True)
class Conflict:
    device: str
    holders: tuple[Holding, ...]

    def describe(self) -> str:
        who = ", ".join(
            f"{h.container} of pod {h.pod_uid} ({h.container_id[:12] or 'creating'})" for h in self.holders
        )
        return f"device {self.device} is held by {who}"


def mark_value(pod_uid: str, container: str, shares: Mapping[str, int]) -> str:
    """The annotation the shim puts on a container it rewrote (device id -> milli)."""
    return json.dumps(
        {"pod": pod_uid, "container": container, "devices": dict(sorted(shares.items()))},
        sort_keys=True,
        separators=(",", ":"),
    )


def parse_mark(value: str) -> tuple[str, str, dict[str, int]] | None:
    """Inverse of mark_value; None for anything the shim did not write."""
    try:
        doc = json.loads(value)
        pod, container, devices = doc["pod"], doc["container"], doc["devices"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(pod, str) and isinstance(container, str) and isinstance(devices, dict)):
        return None
    if not all(isinstance(k, str) and type(v) is int and 0 < v <= WHOLE for k, v in devices.items()):
        return None
    return pod, container, devices


class Ledger:
    """Thread-safe device holdings of one node."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_device: dict[str, list[Holding]] = {}

    def _conflicts_locked(self, pod_uid: str, wanted: Mapping[str, int]) -> list[Conflict]:
        found = []
        for device, milli in wanted.items():
            others = tuple(h for h in self._by_device.get(device, ()) if h.pod_uid != pod_uid)
            if others and sum(h.milli for h in others) + milli > WHOLE:
                found.append(Conflict(device, others))
        return found

    def try_reserve(self, holdings: Iterable[Holding]) -> list[Conflict]:
        """Atomically check the holdings against other pods' and record them if all fit.

        The holdings (all of one pod; container id may still be empty) are later given their
        container id by ``commit`` or dropped by ``release``.
        """
        kept = list(holdings)
        if not kept:
            return []
        wanted: dict[str, int] = {}
        for h in kept:
            wanted[h.device] = wanted.get(h.device, 0) + h.milli
        with self._lock:
            conflicts = self._conflicts_locked(kept[0].pod_uid, wanted)
            if not conflicts:
                for h in kept:
                    self._by_device.setdefault(h.device, []).append(h)
            return conflicts

    def commit(self, reserved: Iterable[Holding], container_id: str) -> None:
        """Give in-flight holdings their container id once containerd created the container."""
        with self._lock:
            for h in reserved:
                entries = self._by_device.get(h.device, [])
                if h in entries:
                    entries[entries.index(h)] = Holding(
                        container_id, h.sandbox_id, h.pod_uid, h.container, h.device, h.milli
                    )

    def release(self, reserved: Iterable[Holding]) -> None:
        """Drop in-flight holdings of a create that failed."""
        with self._lock:
            for h in reserved:
                entries = self._by_device.get(h.device, [])
                if h in entries:
                    entries.remove(h)
                if not entries:
                    self._by_device.pop(h.device, None)

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
