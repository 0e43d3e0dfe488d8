"""CreateContainer rewrite from the scheduler's allocation: the shim's one real decision.

For each CreateContainer the rewriter
1. finds the pod's ``kubegpu.io/allocation`` annotation in the sandbox config (kubelet copied it
   there), falling back to the API server only when it is absent and a lookup is configured;
2. verifies signature, node name and pod UID, and that every device is known and healthy here;
3. reserves the devices in the node ledger (refusing devices live containers of other pods hold);
4. scrubs every way the request could make a managed device visible, applies the plugins' edits
   for exactly the granted devices, and marks the container so a restarted shim can rebuild the
   ledger from ListContainers.
A refusal raises ``Rejected`` with INVALID_ARGUMENT (the annotation itself is bad) or
FAILED_PRECONDITION (it does not fit this node now), naming the pod; nothing is created.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import grpc.aio

from crishim import edits
from crishim.cri import api_pb2, api_pb2_grpc
from crishim.intercept import Completion, Rejected
from crishim.ledger import MARK_ANNOTATION, WHOLE, Holding, Ledger, mark_value, parse_mark
from crishim.mps import DaemonError, MpsSharing, share_devices
from devices.model import Device, NodeInventory
from devices.plugin import DevicePlugin, PluginError, discover_all, edits_for, health_all, merge_edits
from kubegpu.allocation import ANNOTATION, Allocation, AllocationError, Share, load_keys, verify
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.rewrite")

# Pod-annotation lookup for a sandbox without the annotation: (namespace, name, uid) -> value or None.
PodAnnotationLookup = Callable[[str, str, str], Awaitable[str | None]]
# Container state lookups go to the runtime; these count as not holding devices any more.
GONE_STATES = (api_pb2.CONTAINER_EXITED,)


class KeyRing:
    """The cluster's allocation keys from a mounted Secret directory, re-read when it changes."""

    def __init__(
        self, directory: Path | None, static: Mapping[str, bytes] | None = None, recheck_seconds: float = 5.0
    ) -> None:
        self._directory = directory
        self._keys: dict[str, bytes] = dict(static or {})
        self._recheck = recheck_seconds
        self._checked = 0.0
        self._stamp: float | None = None

    def keys(self) -> Mapping[str, bytes]:
        if self._directory is None:
            return self._keys
        now = time.monotonic()
        if now - self._checked >= self._recheck:
            self._checked = now
            try:
                stamp = max((p.stat().st_mtime for p in self._directory.iterdir()), default=0.0)
            except OSError:
                stamp = -1.0
            if stamp != self._stamp:
                self._stamp = stamp
                self._keys = load_keys(self._directory)
                log_event(log, "keys.loaded", directory=str(self._directory), key_ids=sorted(self._keys))
        return self._keys


@dataclass
class NodeDevices:
    """The node's plugins with their last inventory and health (refreshed off the CRI path)."""

    plugins: Sequence[DevicePlugin]
    sysfs_root: str | None = "/"
    devices: dict[str, Device] = field(default_factory=dict)
    healthy: dict[str, bool] = field(default_factory=dict)
    managed_host_paths: frozenset[str] = frozenset()
    inventory: NodeInventory = field(default_factory=lambda: NodeInventory(()))
    sharing: MpsSharing | None = None  # how GPU shares are enforced (crishim.mps); None: advisory

    def discover(self) -> None:
        inventory = discover_all(self.plugins, self.sysfs_root)
        self.inventory = inventory
        self.devices = inventory.by_id()
        self.healthy = {d.id: d.healthy for d in inventory.devices}
        every = edits_for(self.plugins, list(self.devices.values())) if self.devices else None
        self.managed_host_paths = frozenset(
            {p for d in self.devices.values() for p in d.device_nodes}
            | ({n.host_path for n in every.device_nodes} if every else set())
        )

    def refresh_health(self) -> None:
        self.healthy.update(health_all(self.plugins))

    def current_inventory(self) -> NodeInventory:
        """The discovered inventory with today's health folded in (what the advertiser publishes)."""
        devices = tuple(replace(d, healthy=self.healthy.get(d.id, d.healthy)) for d in self.inventory.devices)
        inventory = NodeInventory(devices, self.inventory.topology)
        return self.sharing.annotate(inventory) if self.sharing else inventory


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_of(request: api_pb2.CreateContainerRequest) -> PodRef:
    meta = request.sandbox_config.metadata
    return PodRef(meta.namespace, meta.name, meta.uid)


def check_allocation(
    allocation: Allocation,
    pod: PodRef,
    container: str,
    node_name: str,
    devices: Mapping[str, Device],
    healthy: Mapping[str, bool],
) -> tuple[list[Device], dict[str, Share]]:
    """The devices (and shares) this container gets; raise Rejected if the node cannot honour it."""
    if allocation.node != node_name:
        raise Rejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"pod {pod}: allocation is for node {allocation.node!r}, this is {node_name!r}",
        )
    if allocation.pod_uid != pod.uid:
        raise Rejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"pod {pod}: allocation is for pod UID {allocation.pod_uid}, sandbox has {pod.uid}",
        )
    entry = allocation.containers.get(container)
    if entry is None:
        return [], {}
    granted = []
    for device_id in entry.devices:
        device = devices.get(device_id)
        if device is None:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod} container {container}: device {device_id} is not on this node",
            )
        if not healthy.get(device_id, device.healthy):
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod} container {container}: device {device_id} is unhealthy",
            )
        granted.append(device)
    return granted, dict(entry.shares)


class AllocationRewriter:
    """The shim's CreateContainer interceptor (see module docstring)."""

    def __init__(
        self,
        node_name: str,
        node_devices: NodeDevices,
        keys: KeyRing,
        lookup: PodAnnotationLookup | None = None,
    ) -> None:
        self.node_name = node_name
        self.node_devices = node_devices
        self.keys = keys
        self.ledger = Ledger()
        self._lookup = lookup
        self._runtime: api_pb2_grpc.RuntimeServiceStub | None = None
        self.rebuilt = asyncio.Event()

    def attach(self, channel: grpc.aio.Channel) -> None:
        """Give the rewriter the runtime connection (for rebuild and liveness checks)."""
        self._runtime = api_pb2_grpc.RuntimeServiceStub(channel)

    def start(self, channel: grpc.aio.Channel, health_interval: float) -> list[asyncio.Task[None]]:
        """Attach to the runtime and start the background work: ledger rebuild, health refresh."""
        self.attach(channel)
        return [asyncio.create_task(self.rebuild()), asyncio.create_task(self._watch_health(health_interval))]

    async def ready(self) -> None:
        """Creates with devices can be decided once the ledger is rebuilt."""
        await self.rebuilt.wait()

    async def _watch_health(self, interval: float) -> None:
        """Re-read device health off the CRI path (plugin calls may block)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            before = dict(self.node_devices.healthy)
            try:
                await loop.run_in_executor(None, self.node_devices.refresh_health)
            except Exception as error:  # a plugin failing must not stop the loop
                log_event(
                    log, "health.refresh_failed", logging.WARNING, node=self.node_name, error=str(error)
                )
                continue
            changed = {k: v for k, v in self.node_devices.healthy.items() if before.get(k) != v}
            if changed:
                log_event(log, "health.changed", node=self.node_name, devices=changed)

    # --- ledger lifecycle ---------------------------------------------------------------------

    async def rebuild(self, retry_seconds: float = 1.0) -> None:
        """Rebuild the ledger from containerd's containers that carry our mark; retry until it works."""
        assert self._runtime is not None
        while True:
            try:
                listing = await self._runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=30)
                break
            except grpc.aio.AioRpcError as error:
                log_event(log, "ledger.rebuild_retry", logging.WARNING, code=error.code().name)
                await asyncio.sleep(retry_seconds)
        holdings = []
        for container in listing.containers:
            mark = parse_mark(container.annotations.get(MARK_ANNOTATION, ""))
            if mark is None or container.state in GONE_STATES:
                continue
            pod_uid, name, devices = mark
            holdings.extend(
                Holding(container.id, container.pod_sandbox_id, pod_uid, name, device, milli)
                for device, milli in devices.items()
            )
        self.ledger.replace_all(holdings)
        self.rebuilt.set()
        if self.node_devices.sharing is not None:  # from now on the MPS daemons follow the ledger's shares
            self.node_devices.sharing.start(self._shared_devices)
        log_event(
            log,
            "ledger.rebuilt",
            containers=len({h.container_id for h in holdings}),
            devices=sorted({h.device for h in holdings}),
        )

    def removed_container(self, container_id: str) -> None:
        freed = self.ledger.remove_container(container_id)
        if freed:
            log_event(log, "ledger.freed", container=container_id, devices=[h.device for h in freed])
            self._shares_changed()

    def removed_sandbox(self, sandbox_id: str) -> None:
        freed = self.ledger.remove_sandbox(sandbox_id)
        if freed:
            log_event(log, "ledger.freed", sandbox=sandbox_id, devices=[h.device for h in freed])
            self._shares_changed()

    def _shared_devices(self) -> set[str]:
        return share_devices((h.device, h.milli) for h in self.ledger.holdings())

    def _shares_changed(self) -> None:
        if self.node_devices.sharing is not None:
            self.node_devices.sharing.poke()

    # --- the rewrite ----------------------------------------------------------------------------

    async def create_container(
        self, request: api_pb2.CreateContainerRequest
    ) -> tuple[api_pb2.CreateContainerRequest, Completion | None]:
        pod = pod_of(request)
        container = request.config.metadata.name
        value = request.sandbox_config.annotations.get(ANNOTATION)
        if value is None and self._lookup is not None:
            value = await self._lookup(pod.namespace, pod.name, pod.uid)
        edits.scrub(request.config, self.node_devices.managed_host_paths)
        if value is None:
            return request, None
        try:
            allocation = verify(value, self.keys.keys())
        except AllocationError as error:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"pod {pod}: {error}") from None
        granted, shares = check_allocation(
            allocation, pod, container, self.node_name, self.node_devices.devices, self.node_devices.healthy
        )
        if not granted:
            return request, None
        if not self.rebuilt.is_set():
            raise Rejected(
                grpc.StatusCode.UNAVAILABLE, f"pod {pod}: the device ledger is still being rebuilt, retry"
            )
        milli = {d.id: (shares[d.id].milli if d.id in shares else WHOLE) for d in granted}
        holdings = [Holding("", request.pod_sandbox_id, pod.uid, container, d, m) for d, m in milli.items()]
        await self._reserve(pod, container, holdings)
        sharing = self.node_devices.sharing
        try:
            applied = edits_for(self.node_devices.plugins, granted, shares)
            if sharing is not None:  # a share on a node that enforces shares: the container is an MPS client
                applied = merge_edits([applied, await sharing.container_edits(granted, shares)])
            edits.apply(request.config, applied)
        except (PluginError, DaemonError) as error:
            self.ledger.release(holdings)
            self._shares_changed()
            retry = isinstance(error, DaemonError)  # the GPU's MPS daemon did not start: kubelet retries
            code = grpc.StatusCode.UNAVAILABLE if retry else grpc.StatusCode.FAILED_PRECONDITION
            raise Rejected(code, f"pod {pod}: {error}") from None
        request.config.annotations[MARK_ANNOTATION] = mark_value(pod.uid, container, milli)
        log_event(
            log,
            "create_container.rewritten",
            pod=str(pod),
            pod_uid=pod.uid,
            node=self.node_name,
            container=container,
            devices=sorted(milli),
        )
        return request, self._completion(holdings)

    async def _reserve(self, pod: PodRef, container: str, holdings: list[Holding]) -> None:
        """Reserve, after dropping holders that are no longer live if they are in the way."""
        conflicts = self.ledger.try_reserve(holdings)
        if not conflicts:
            return
        for conflict in conflicts:
            for holder in conflict.holders:
                if holder.container_id and not await self._is_live(holder.container_id):
                    self.ledger.remove_container(holder.container_id)
        conflicts = self.ledger.try_reserve(holdings)
        if conflicts:
            reason = "; ".join(c.describe() for c in conflicts)
            log_event(
                log,
                "create_container.conflict",
                logging.WARNING,
                pod=str(pod),
                container=container,
                node=self.node_name,
                reason=reason,
            )
            raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, f"pod {pod} container {container}: {reason}")

    async def _is_live(self, container_id: str) -> bool:
        assert self._runtime is not None
        try:
            status = await self._runtime.ContainerStatus(
                api_pb2.ContainerStatusRequest(container_id=container_id), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            return error.code() is not grpc.StatusCode.NOT_FOUND
        return status.status.state not in GONE_STATES

    def _completion(self, holdings: list[Holding]) -> Completion:
        def done(container_id: str | None) -> None:
            if container_id:
                self.ledger.commit(holdings, container_id)
            else:
                self.ledger.release(holdings)
                self._shares_changed()

        return done
