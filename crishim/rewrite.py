"""CreateContainer rewrite from the scheduler's allocation: the shim's one real decision.

For each CreateContainer the rewriter
1. finds the pod's ``kubegpu.io/allocation`` annotation in the sandbox config (kubelet copied it
   there), falling back to the API server only when it is absent, a lookup is configured and
   the pod is not a static pod (kubelet's ``kubernetes.io/config.source`` is not ``api``);
2. scrubs every way the request could make a managed device visible (``crishim.edits``);
3. verifies signature, node name and pod UID, and that every device is known and healthy here;
4. reserves the devices in the node ledger (refusing devices other containers hold);
5. applies the plugins' edits for exactly the granted devices, and marks the container so a
   restarted shim can rebuild the ledger from ListContainers.
A refusal raises ``Rejected`` with INVALID_ARGUMENT (the request or annotation itself is bad),
FAILED_PRECONDITION (it does not fit this node now) or UNAVAILABLE (retry: the ledger is being
rebuilt, or device discovery has not succeeded yet), naming the pod; nothing is created.

Restoring from a checkpoint is refused on a device node: RestorePod as a whole method
(``refused_methods``), and a CreateContainer whose image names a file (containerd 2.x restores
it as a checkpoint archive, with the checkpoint's annotations). Before every reservation, live
marked containers the ledger does not account for (a create containerd finished after its
caller gave up, or after a restart's rebuild) are adopted; a mark counts only on the container
it was written for (its sandbox's pod UID, its own name).

In the background it keeps the node's devices current (``maintain_devices``: discovery retried
until it succeeds, health re-read, rediscovery on health changes and on a slow schedule) and
reconciles creates whose outcome was unknown against containerd.
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import grpc.aio

from crishim import edits
from crishim.capabilities import sys_admin_grant
from crishim.container import ContainerSpec, from_cri, to_cri
from crishim.cri import api_pb2, api_pb2_grpc
from crishim.hostpaths import Ambiguous, ManagedDevices, numbers_of
from crishim.intercept import Completion, Refusal, Rejected
from crishim.ledger import (
    MARK_ANNOTATION,
    WHOLE,
    Holding,
    Ledger,
    Mark,
    OverBooked,
    mark_value,
    parse_mark,
)
from crishim.mps import DaemonError, MpsSharing, share_devices
from devices.model import Device, DeviceKind, NodeInventory
from devices.nics import PfIndex, is_vf
from devices.plugin import (
    DevicePlugin,
    PluginError,
    device_char_majors,
    device_dirs,
    device_patterns,
    discover_all,
    edits_for,
    health_all,
    merge_edits,
)
from kubegpu.allocation import (
    ANNOTATION,
    RDMA_INTERFACES_ANNOTATION,
    RDMA_RESOURCE,
    Allocation,
    AllocationError,
    KeyRing,
    Share,
    asks_rdma,
    verify,
)
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.rewrite")

# Pod-annotation lookup for a sandbox without the annotation: (namespace, name, uid) -> value or None.
PodAnnotationLookup = Callable[[str, str, str], Awaitable[str | None]]
# The pod's request of the extended resource kubegpu.io/rdma, from its API object:
# (namespace, name, uid) -> count, or None when it cannot be known (no answer from the API).
RdmaResourceLookup = Callable[[str, str, str], Awaitable[int | None]]
# Container state lookups go to the runtime; these count as not holding devices any more.
GONE_STATES = (api_pb2.CONTAINER_EXITED,)


# kubelet's annotation naming where a pod came from: "api", or "file"/"http" for static pods.
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
RESTORE_POD = "/runtime.v1.RuntimeService/RestorePod"
# Methods refused on a node with device allocation (see AllocationRewriter.refused_methods).
REFUSED_ON_DEVICE_NODES = {
    RESTORE_POD: Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        "on a kubegpu node a pod is not restored from a checkpoint: RestorePod recreates the sandbox "
        "and its containers without CreateContainer, so the shim could neither scrub them to their "
        "signed allocation nor hold their devices in its ledger; create the pod anew instead",
    )
}
# containerd 2.x reads a CreateContainer image that names an existing file (as an absolute path,
# or relative to containerd's working directory, / under systemd) as a checkpoint archive.
CONTAINERD_WORKDIR = "/"

# Creates that failed ambiguously are reconciled this long after the failure (containerd may
# still be finishing them), and again whenever their holdings are in another create's way.
RECONCILE_DELAY_SECONDS = 2.0
RECONCILE_TRIES = 5


def _real_dir(pattern: str) -> str:
    """A path pattern with its directory resolved through symlinks (containerd resolves them)."""
    return os.path.join(os.path.realpath(os.path.dirname(pattern)), os.path.basename(pattern))


def _managed(plugins: Sequence[DevicePlugin], devices: Sequence[Device]) -> ManagedDevices:
    """The device nodes ``plugins`` own: their patterns and majors, and the nodes of ``devices``
    and of the plugins' edits for them, as they exist now on the host."""
    paths: set[str] = {p for d in devices for p in d.device_nodes}
    if devices:
        try:
            every = edits_for(plugins, devices)
            paths |= {n.host_path for n in every.device_nodes}
        except PluginError as error:  # a plugin that cannot say today: its patterns still hold
            log_event(log, "devices.managed_partial", logging.WARNING, error=str(error)[:300])
    patterns = set(device_patterns(plugins))
    patterns |= {_real_dir(p) for p in set(patterns)}
    patterns |= {glob.escape(p) for p in paths} | {glob.escape(os.path.realpath(p)) for p in paths}
    existing = {hit for pattern in patterns for hit in glob.glob(pattern)}
    return ManagedDevices(
        numbers=numbers_of(paths | existing),
        char_majors=frozenset(device_char_majors(plugins)),
        patterns=tuple(sorted(patterns)),
    )


class DevicesNotDiscovered(PluginError):
    """Device discovery has not succeeded yet on this node."""


@dataclass
class NodeDevices:
    """The node's plugins with their last inventory and health (refreshed off the CRI path).

    ``managed`` covers the device nodes the plugins own whether or not discovery has succeeded:
    the plugins' well-known paths and majors always, plus every discovered device's nodes.
    ``rdma`` is the part of it that belongs to the RDMA plugins (those whose only kind is RDMA):
    their paths, majors and nodes, with ``rdma_dirs``, the directories wholly of their nodes
    (``/dev/infiniband``): what a container asking for RDMA devices reaches.
    """

    plugins: Sequence[DevicePlugin]
    sysfs_root: str | None = "/"
    devices: dict[str, Device] = field(default_factory=dict)
    healthy: dict[str, bool] = field(default_factory=dict)
    inventory: NodeInventory = field(default_factory=lambda: NodeInventory(()))
    sharing: MpsSharing | None = None  # how GPU shares are enforced (crishim.mps); None: advisory
    discovered: bool = False
    last_error: str = ""
    managed: ManagedDevices = field(default_factory=ManagedDevices)
    rdma: ManagedDevices = field(default_factory=ManagedDevices)
    rdma_dirs: tuple[str, ...] = ()
    pfs: PfIndex = field(default_factory=lambda: PfIndex(()))  # the discovered RDMA PFs (devices.nics)

    def __post_init__(self) -> None:
        self.refresh_managed()

    def discover(self) -> None:
        """Discover with every plugin; on failure the previous state stays and PluginError rises."""
        try:
            inventory = discover_all(self.plugins, self.sysfs_root)
        except PluginError as error:
            self.last_error = str(error)
            raise
        self.inventory = inventory
        self.devices = inventory.by_id()
        self.healthy = {d.id: d.healthy for d in inventory.devices}
        self.pfs = PfIndex(inventory.devices)
        self.discovered = True
        self.last_error = ""
        self.refresh_managed()

    def refresh_managed(self) -> None:
        """Recompute the managed device sets (the plugins' paths as they exist now on the host)."""
        self.managed = _managed(self.plugins, list(self.devices.values()))
        rdma_plugins = [p for p in self.plugins if p.kinds == {DeviceKind.RDMA}]
        nics = [d for d in self.devices.values() if d.kind is DeviceKind.RDMA] if rdma_plugins else []
        self.rdma = _managed(rdma_plugins, nics)
        dirs = device_dirs(rdma_plugins)
        self.rdma_dirs = tuple(dict.fromkeys([*dirs, *(os.path.realpath(d) for d in dirs)]))

    def refresh_health(self) -> dict[str, bool]:
        """Re-read health; returns the devices whose health changed."""
        fresh = health_all(self.plugins)
        changed = {k: v for k, v in fresh.items() if self.healthy.get(k) != v}
        self.healthy.update(fresh)
        return changed

    def current_inventory(self) -> NodeInventory:
        """The discovered inventory with today's health folded in (what the advertiser publishes)."""
        if not self.discovered:
            raise DevicesNotDiscovered(f"device discovery has not succeeded yet: {self.last_error}")
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


@dataclass(frozen=True)
class Security:
    """What of a container's security context the rewrite core checks: privileged, and the added
    capability name that gives it CAP_SYS_ADMIN (as the request spells it; None: not given)."""

    privileged: bool = False
    sys_admin: str | None = None


def security_of(context: api_pb2.LinuxContainerSecurityContext) -> Security:
    """The CRI front's reading of a container's security context."""
    return Security(context.privileged, sys_admin_grant(context.capabilities))


@dataclass
class ContainerCreate:
    """One container create as the rewrite core decides it, whichever front brought it: the pod,
    its sandbox's annotations (the signed allocation; scrubbed in place), the container's name,
    attempt, image and security facts, and its ``ContainerSpec`` (changed in place)."""

    pod: PodRef
    sandbox_id: str
    sandbox_annotations: dict[str, str]
    container: str
    attempt: int
    image: str
    security: Security
    spec: ContainerSpec
    # how long the create may wait for a GPU's MPS daemon to start (None: as long as the start
    # takes); the NRI front's caller gives a create only its request timeout
    daemon_wait: float | None = None


def pod_of(request: api_pb2.CreateContainerRequest) -> PodRef:
    meta = request.sandbox_config.metadata
    return PodRef(meta.namespace, meta.name, meta.uid)


def require_discovered(node_devices: NodeDevices, pod: PodRef, container: str) -> None:
    """Raise Rejected (UNAVAILABLE: retry) while device discovery has not succeeded on this node:
    a container granted devices cannot be checked against them yet."""
    if not node_devices.discovered:
        raise Rejected(
            grpc.StatusCode.UNAVAILABLE,
            f"pod {pod} container {container}: device discovery has not succeeded on this node yet "
            f"({node_devices.last_error or 'not run'}), retry",
        )


def check_allocation(
    allocation: Allocation,
    pod: PodRef,
    container: str,
    node_name: str,
    node_devices: NodeDevices,
) -> tuple[list[Device], dict[str, Share]]:
    """The devices (and shares) this container gets; raise Rejected if the node cannot honour it."""
    misplaced = allocation.misplaced(node_name, pod.uid)
    if misplaced is not None:
        raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, f"pod {pod}: {misplaced}")
    entry = allocation.containers.get(container)
    if entry is None:
        return [], {}
    require_discovered(node_devices, pod, container)
    devices, healthy = node_devices.devices, node_devices.healthy
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
        share = entry.shares.get(device_id)
        if share is not None and 0 < device.memory_mib < share.memory_mib:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod} container {container}: the share of device {device_id} asks for "
                f"{share.memory_mib} MiB of memory, the device has {device.memory_mib} MiB",
            )
        granted.append(device)
    return granted, dict(entry.shares)


def check_rdma(
    allocation: Allocation, pod: PodRef, container: str, node_devices: NodeDevices
) -> list[Device]:
    """The pod's RDMA interfaces (VFs) as this node's devices; raise Rejected unless each is an
    RDMA VF on this node, of the PF the allocation names, and healthy."""
    if not allocation.rdma:
        return []
    require_discovered(node_devices, pod, container)
    vfs = []
    for interface in allocation.rdma:
        where = f"pod {pod} container {container}: RDMA interface {interface.device}"
        device = node_devices.devices.get(interface.device)
        if device is None:
            raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, f"{where} is not on this node")
        if not is_vf(device):
            raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, f"{where} is not an RDMA VF on this node")
        pf = node_devices.pfs.parent(device)  # as the scheduler and the advertiser read it (devices.nics)
        parent = pf.id if pf is not None else None
        if parent != interface.pf:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where} is a VF of {parent or 'an unnamed PF'} on this node, not of {interface.pf}",
            )
        if not node_devices.healthy.get(device.id, device.healthy):
            raise Rejected(grpc.StatusCode.FAILED_PRECONDITION, f"{where} is unhealthy")
        vfs.append(device)
    return vfs


def refuse_rdma_requests(
    asked: edits.RdmaRequests,
    pod: PodRef,
    container: str,
    pod_asks: bool,
    allocation: Allocation | None,
    resource: int = 0,
) -> None:
    """Refuse a container that asks for RDMA devices itself (INVALID_ARGUMENT): a mount showing
    RDMA device nodes always (only the pod's VFs' nodes reach a container, one by one), a device
    entry of one when its pod holds no RDMA interfaces; and a pod whose annotations ask for RDMA
    interfaces that its allocation does not hold, or whose request of ``kubegpu.io/rdma``
    (``resource``, as the API says) is more interfaces than its allocation holds (FAILED_PRECONDITION).
    The VFs granted are always the allocation's, never more: a request is only ever refused."""
    who = f"pod {pod} container {container}"
    holds = allocation is not None and bool(allocation.rdma)
    if asked.mounts:
        raise Rejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{who}: mount {asked.mounts[0][:200]!r} reaches the node's RDMA devices "
            "(/dev/infiniband): a container gets only its pod's allocated RDMA VFs, added by the node",
        )
    if asked.devices and not holds:
        raise Rejected(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{who}: asks for RDMA device {asked.devices[0][:200]!r} but its pod holds no RDMA "
            "interfaces: they come only from kubegpu's signed allocation (kubegpu.io/rdma-interfaces)",
        )
    if pod_asks and not holds:
        raise Rejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{who}: the pod asks for RDMA interfaces ({RDMA_INTERFACES_ANNOTATION}) but "
            + ("carries no kubegpu allocation" if allocation is None else "its allocation holds none")
            + " (was it scheduled by kubegpu?)",
        )
    if allocation is not None and resource > len(allocation.rdma):
        raise Rejected(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{who}: the pod requests {RDMA_RESOURCE}: {resource} (RDMA interfaces) but its allocation "
            f"holds {len(allocation.rdma)} (was it scheduled by kubegpu?)",
        )


def restored_from(image: str, workdir: str = CONTAINERD_WORKDIR) -> str | None:
    """The checkpoint archive containerd would restore a CreateContainer from, if its image names a
    file (containerd stats the image string itself); None for an ordinary image reference."""
    if not image:
        return None
    path = os.path.join(workdir, image)
    return image if image.startswith("/") or os.path.lexists(path) else None


def _pod_uids(listing: api_pb2.ListPodSandboxResponse) -> dict[str, str]:
    """Each listed sandbox's pod UID, as containerd recorded it at RunPodSandbox."""
    return {sandbox.id: sandbox.metadata.uid for sandbox in listing.items}


def _booking_order(container: api_pb2.Container) -> tuple[bool, int, str]:
    """The order a rebuild books containers in: running ones first (they use their devices
    now), then the oldest."""
    return (container.state != api_pb2.CONTAINER_RUNNING, container.created_at, container.id)


def is_static_pod(sandbox_annotations: Mapping[str, str]) -> bool:
    """A pod kubelet read from a file or URL: it has no API object of its own to look up."""
    source = sandbox_annotations.get(CONFIG_SOURCE_ANNOTATION)
    return source is not None and source != "api"


class AllocationRewriter:
    """The shim's CreateContainer interceptor (see module docstring)."""

    def __init__(
        self,
        node_name: str,
        node_devices: NodeDevices,
        keys: KeyRing,
        lookup: PodAnnotationLookup | None = None,
        sys_admin_namespaces: frozenset[str] = frozenset(),
        rdma_resource: RdmaResourceLookup | None = None,
    ) -> None:
        self.node_name = node_name
        self._rdma_resource = rdma_resource  # None: no API, a pod's kubegpu.io/rdma is not checked
        self.sys_admin_namespaces = sys_admin_namespaces  # where CAP_SYS_ADMIN is allowed
        self.node_devices = node_devices
        self.keys = keys
        self.ledger = Ledger(self._gpu_memory_mib)
        self._lookup = lookup
        self._runtime: api_pb2_grpc.RuntimeServiceStub | None = None
        self.rebuilt = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._tickets = itertools.count(1)
        # Live marked containers that did not fit beside the ledger's holdings (container id ->
        # why): never booked; retried at every adoption pass, and reported once.
        self.overbooked: dict[str, str] = {}

    @property
    def pod_lookup(self) -> PodAnnotationLookup | None:
        """Where pods' facts come from when a sandbox lacks them (None: no API)."""
        return self._lookup

    def _gpu_memory_mib(self, device_id: str) -> int:
        """A device's memory in MiB as discovered (0: not known, and then not checked)."""
        device = self.node_devices.devices.get(device_id)
        return device.memory_mib if device is not None else 0

    def attach(self, channel: grpc.aio.Channel) -> None:
        """Give the rewriter the runtime connection (for rebuild and liveness checks)."""
        self._runtime = api_pb2_grpc.RuntimeServiceStub(channel)

    def start(self, channel: grpc.aio.Channel, health_interval: float) -> list[asyncio.Task[None]]:
        """Attach to the runtime and start the background work: ledger rebuild, device upkeep."""
        self.attach(channel)
        return [
            asyncio.create_task(self.rebuild()),
            asyncio.create_task(self.maintain_devices(health_interval)),
        ]

    async def ready(self) -> None:
        """Creates with devices can be decided once the ledger is rebuilt."""
        await self.rebuilt.wait()

    def refused_methods(self) -> Mapping[str, Refusal]:
        """RestorePod: its containers would carry devices the ledger never sees."""
        return REFUSED_ON_DEVICE_NODES

    # --- devices ------------------------------------------------------------------------------

    async def _run_plugins(self, what: str, call: Callable[[], Any]) -> tuple[bool, Any]:
        """Run a blocking plugin call off the event loop; (False, None) if it fails (logged)."""
        loop = asyncio.get_running_loop()
        try:
            return True, await loop.run_in_executor(None, call)
        except Exception as error:  # any plugin failure: logged, retried by the caller's schedule
            log_event(
                log, f"devices.{what}_failed", logging.WARNING, node=self.node_name, error=str(error)[:300]
            )
            return False, None

    async def maintain_devices(self, interval: float, rediscover_every: int = 30) -> None:
        """Keep devices current: discover until it works, then re-read health every ``interval``;
        rediscover when health changes or cannot be read, and every ``rediscover_every`` rounds."""
        node = self.node_devices
        rounds = 0
        while True:
            if not node.discovered:
                if (await self._run_plugins("discovery", node.discover))[0]:
                    log_event(log, "devices.discovered", node=self.node_name, devices=sorted(node.devices))
                else:
                    await self._run_plugins("managed_refresh", node.refresh_managed)
                await asyncio.sleep(interval)
                continue
            await asyncio.sleep(interval)
            rounds += 1
            healthy, changed = await self._run_plugins("health_refresh", node.refresh_health)
            if changed:
                log_event(log, "health.changed", node=self.node_name, devices=changed)
            if not healthy or changed or rounds % rediscover_every == 0:
                before = sorted(node.devices)
                ok, _ = await self._run_plugins("rediscovery", node.discover)
                if ok and sorted(node.devices) != before:
                    log_event(log, "devices.rediscovered", node=self.node_name, devices=sorted(node.devices))
            else:
                await self._run_plugins("managed_refresh", node.refresh_managed)

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
        pod_uids = await self._sandbox_uids(retry_seconds)
        # Booked as adoptions are, running containers first, then by age: a container the ledger
        # refused before the restart (over-booked, never started) stays refused after it.
        ordered = sorted(listing.containers, key=_booking_order)
        self.install_rebuilt([(c.id, self._marked_holdings(c, pod_uids)) for c in ordered])

    def install_rebuilt(self, found: Sequence[tuple[str, list[Holding]]]) -> None:
        """Replace the ledger with what the runtime's containers hold by their marks (container
        id, holdings), booked in the given order; a container that does not fit beside those
        before it is refused (``overbooked``). Any front's rebuild ends here."""
        rebuilt = Ledger(self._gpu_memory_mib)
        for container_id, holdings in found:
            try:
                rebuilt.adopt(holdings)
            except OverBooked as over:
                self._refuse_overbooked(container_id, holdings, over)
        holdings = rebuilt.holdings()
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

    @staticmethod
    def _marked(container: api_pb2.Container) -> Mark | None:
        """The shim's mark on a live container, or None (no mark, or the container exited)."""
        if container.state in GONE_STATES:
            return None
        return parse_mark(container.annotations.get(MARK_ANNOTATION, ""))

    def _marked_holdings(self, container: api_pb2.Container, pod_uids: Mapping[str, str]) -> list[Holding]:
        """What a CRI-listed container holds by its mark (``holdings_by_mark``)."""
        if container.state in GONE_STATES:
            return []
        return self.holdings_by_mark(
            container.id,
            container.pod_sandbox_id,
            container.metadata.name,
            container.metadata.attempt,
            container.annotations.get(MARK_ANNOTATION, ""),
            pod_uids.get(container.pod_sandbox_id),
        )

    def holdings_by_mark(
        self,
        container_id: str,
        sandbox_id: str,
        name: str,
        attempt: int,
        mark_text: str,
        sandbox_pod_uid: str | None,
    ) -> list[Holding]:
        """What a live container holds by its mark: nothing unless the mark is one the shim
        writes for it (its sandbox's pod UID, its own name)."""
        mark = parse_mark(mark_text)
        if mark is None:
            return []
        pod_uid, mark_name, devices, memory, pod_wide = mark
        if (pod_uid, mark_name) != (sandbox_pod_uid, name):
            # Not a mark this shim wrote for this container: one restored from a checkpoint of
            # another pod, or forged. Counting it would hold devices the container was not given.
            log_event(
                log,
                "ledger.foreign_mark",
                logging.WARNING,
                container=container_id,
                sandbox=sandbox_id,
                sandbox_pod_uid=sandbox_pod_uid,
                name=name,
                mark_pod_uid=pod_uid,
                mark_container=mark_name,
                devices=sorted(devices),
            )
            return []
        return [
            Holding(
                container_id,
                sandbox_id,
                pod_uid,
                name,
                device,
                milli,
                attempt,
                memory_mib=memory.get(device, 0),
                pod_wide=device in pod_wide,
            )
            for device, milli in devices.items()
        ]

    async def adopt_unaccounted(self) -> None:
        """Record every live marked container the ledger does not account for: creates that
        containerd finished after the caller gave up (cancelled, past its deadline, the shim
        restarted) and whose outcome was settled, or rebuilt, without them. Run before every
        reservation, so a device such a container holds is never handed out again. If containerd
        cannot be asked, the reservation goes on with what the ledger knows (the create itself
        then fails at containerd)."""
        assert self._runtime is not None
        try:
            listing = await self._runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=10)
            known = self.ledger.container_ids()
            strays = [c for c in listing.containers if c.id not in known and self._marked(c) is not None]
            if not strays:
                return
            sandboxes = await self._runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10)
        except grpc.aio.AioRpcError as error:
            log_event(log, "ledger.adopt_failed", logging.WARNING, code=error.code().name)
            return
        pod_uids = _pod_uids(sandboxes)
        for container in strays:
            holdings = self._marked_holdings(container, pod_uids)
            if await self._adopt(container.id, holdings):
                log_event(
                    log,
                    "ledger.adopted",
                    logging.WARNING,
                    container=container.id,
                    pod_uid=holdings[0].pod_uid,
                    name=holdings[0].container,
                    attempt=holdings[0].attempt,
                    devices=sorted(h.device for h in holdings),
                )
                self._shares_changed()

    async def _adopt(self, container_id: str, holdings: list[Holding]) -> bool:
        """Adopt one found container; if it does not fit, settle the holders in its way (exited
        or vanished containers, creates of unknown outcome) and try once more. A container that
        still does not fit is not booked: it is reported (``ledger.adopt_refused``, once) and kept
        in ``overbooked``, and StartContainer is refused for it."""
        try:
            try:
                adopted = self.ledger.adopt(holdings)
            except OverBooked as over:
                await self._settle_holders([h for c in over.conflicts for h in c.holders])
                adopted = self.ledger.adopt(holdings)
        except OverBooked as over:
            self._refuse_overbooked(container_id, holdings, over)
            return False
        self.overbooked.pop(container_id, None)
        return adopted

    def _refuse_overbooked(self, container_id: str, holdings: Sequence[Holding], over: OverBooked) -> None:
        """Keep a found container that does not fit out of the ledger and refuse its start
        (``ledger.adopt_refused``, logged once per container)."""
        if container_id not in self.overbooked:
            log_event(
                log,
                "ledger.adopt_refused",
                logging.ERROR,
                container=container_id,
                pod_uid=holdings[0].pod_uid,
                name=holdings[0].container,
                attempt=holdings[0].attempt,
                devices=sorted(c.device for c in over.conflicts),
                reason=str(over),
                note="not booked past capacity; StartContainer is refused for it until it fits",
            )
        self.overbooked[container_id] = str(over)

    async def _settle_holders(self, holders: Sequence[Holding]) -> None:
        """Settle holders in another container's way: creates of unknown outcome are reconciled
        with containerd, holdings of exited or vanished containers dropped. Without a CRI runtime
        (the NRI front) there is nothing to settle: the ledger follows containerd's own events,
        and every create is booked to its container id at once."""
        if self._runtime is None:
            return
        for sandbox in sorted({h.sandbox_id for h in holders if h.unknown}):
            await self.reconcile_unknown(sandbox)
        for holder in holders:
            if holder.container_id and not await self._is_live(holder.container_id):
                if self.ledger.remove_container(holder.container_id):
                    self._shares_changed()

    async def _sandbox_uids(self, retry_seconds: float) -> dict[str, str]:
        """Each sandbox's pod UID, as containerd recorded it at RunPodSandbox; retried until listed.
        Listed after the containers, so every listed container's sandbox is in it (a sandbox
        removed in between takes its containers with it)."""
        assert self._runtime is not None
        while True:
            try:
                return _pod_uids(
                    await self._runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30)
                )
            except grpc.aio.AioRpcError as error:
                log_event(log, "ledger.rebuild_retry", logging.WARNING, code=error.code().name)
                await asyncio.sleep(retry_seconds)

    def start_container(self, container_id: str) -> None:
        """A container adoption refused (it does not fit beside the devices' holders) is not
        started: it was rewritten for devices the ledger gave to others."""
        reason = self.overbooked.get(container_id)
        if reason is not None:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"container {container_id[:12]} was created for devices that are not its own now ({reason}); "
                "remove it, kubelet creates the container anew",
            )

    def removed_container(self, container_id: str) -> None:
        self.overbooked.pop(container_id, None)
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

    async def reconcile_unknown(self, sandbox_id: str | None = None) -> bool:
        """Settle holdings of creates that failed ambiguously, by asking containerd which of them
        made a container: matched by pod, container name and attempt on our mark. A create with no
        container yet stays held (quarantined): containerd may still finish it, so its devices are
        not handed to anyone else until its container shows up (adopted, or found here), a later
        create of the same container succeeds (containerd reserves the name for one create at a
        time), or its sandbox is removed. Returns False if containerd could not be asked."""
        assert self._runtime is not None
        pending = self.ledger.unknown(sandbox_id)
        for sandbox in sorted({h.sandbox_id for h in pending}):
            try:
                listing = await self._runtime.ListContainers(
                    api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox)),
                    timeout=10,
                )
            except grpc.aio.AioRpcError as error:
                log_event(
                    log, "ledger.reconcile_failed", logging.WARNING, sandbox=sandbox, code=error.code().name
                )
                return False
            claimed = self.ledger.container_ids()
            made: dict[tuple[str, str, int], str] = {}
            for c in listing.containers:
                mark = self._marked(c)
                if mark is None or c.id in claimed or mark[1] != c.metadata.name:
                    continue
                made.setdefault((mark[0], mark[1], c.metadata.attempt), c.id)
            groups: dict[tuple[str, str, int], list[Holding]] = {}
            for h in pending:
                if h.sandbox_id == sandbox:
                    groups.setdefault(h.create_key, []).append(h)
            committed = False
            for key, group in groups.items():
                container_id = made.get(key)
                if container_id:
                    try:
                        self.ledger.commit(group, container_id)
                        committed = True
                    except OverBooked as over:  # its sandbox was removed while containerd was asked
                        self._refuse_overbooked(container_id, group, over)
                log_event(
                    log,
                    "ledger.reconciled",
                    pod_uid=key[0],
                    container=key[1],
                    attempt=key[2],
                    created=container_id or None,
                    devices=[h.device for h in group],
                    held="by its container" if container_id else "quarantined: the create may still complete",
                )
            if committed:
                self._shares_changed()
        return True

    async def _reconcile_later(self, sandbox_id: str) -> None:
        for attempt in range(RECONCILE_TRIES):
            await asyncio.sleep(RECONCILE_DELAY_SECONDS * (2**attempt))
            if await self.reconcile_unknown(sandbox_id):
                return

    # --- the rewrite ----------------------------------------------------------------------------

    async def create_container(
        self, request: api_pb2.CreateContainerRequest
    ) -> tuple[api_pb2.CreateContainerRequest, Completion | None]:
        """The CRI proxy's front: a CRI CreateContainer in, the same request rewritten out."""
        create = ContainerCreate(
            pod=pod_of(request),
            sandbox_id=request.pod_sandbox_id,
            sandbox_annotations=dict(request.sandbox_config.annotations),
            container=request.config.metadata.name,
            attempt=request.config.metadata.attempt,
            image=request.config.image.image,
            security=security_of(request.config.linux.security_context),
            spec=from_cri(request.config),
        )
        completion = await self.decide(create)
        to_cri(create.spec, request.config)
        if dict(request.sandbox_config.annotations) != create.sandbox_annotations:
            request.sandbox_config.annotations.clear()
            request.sandbox_config.annotations.update(create.sandbox_annotations)
        return request, completion

    async def decide(self, create: ContainerCreate) -> Completion | None:
        """The rewrite core's decision for one container, whichever front brought it: scrub what
        could reach a managed device, verify the pod's signed allocation, book its devices in the
        ledger and apply the plugins' edits, all on ``create`` (in place). Returns the completion
        the front calls once the runtime has answered (None: nothing was booked); raises
        ``Rejected`` with the reason the front reports."""
        pod, container = create.pod, create.container
        checkpoint = restored_from(create.image)
        if checkpoint is not None:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod} container {container}: image {checkpoint[:200]!r} is a file, which containerd "
                "restores as a container checkpoint with the checkpoint's own annotations, past the "
                "device scrub and the ledger; checkpoint restore is refused on this node",
            )
        sandbox_annotations = create.sandbox_annotations
        value = sandbox_annotations.get(ANNOTATION)
        if value is None and self._lookup is not None and not is_static_pod(sandbox_annotations):
            value = await self._lookup(pod.namespace, pod.name, pod.uid)
        node = self.node_devices
        try:
            # a privileged container sees every device node anyway (logged by _check_security)
            asked = (
                edits.RdmaRequests()
                if create.security.privileged
                else edits.rdma_requests(create.spec, node.rdma, node.rdma_dirs)
            )
            edits.scrub_spec(create.spec, node.managed)
            edits.scrub_annotations(sandbox_annotations)
        except Ambiguous as error:
            raise Rejected(
                grpc.StatusCode.INVALID_ARGUMENT, f"pod {pod} container {container}: refused: {error}"
            ) from None
        self._check_security(create.security, pod, container)
        pod_asks = asks_rdma(sandbox_annotations)
        if value is None:
            refuse_rdma_requests(asked, pod, container, pod_asks, None)
            return None
        try:
            allocation = verify(value, self.keys.keys())
        except AllocationError as error:
            raise Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"pod {pod}: {error}") from None
        granted, shares = check_allocation(allocation, pod, container, self.node_name, node)
        resource = None
        if self._rdma_resource is not None and not is_static_pod(sandbox_annotations):
            resource = await self._rdma_resource(pod.namespace, pod.name, pod.uid)
        refuse_rdma_requests(asked, pod, container, pod_asks, allocation, resource or 0)
        vfs = check_rdma(allocation, pod, container, node)
        if not granted and not vfs:
            return None
        if not self.rebuilt.is_set():
            raise Rejected(
                grpc.StatusCode.UNAVAILABLE, f"pod {pod}: the device ledger is still being rebuilt, retry"
            )
        milli = {d.id: (shares[d.id].milli if d.id in shares else WHOLE) for d in granted}
        milli.update({vf.id: WHOLE for vf in vfs})
        memory = {device: share.memory_mib for device, share in shares.items() if share.memory_mib}
        pod_wide = {vf.id for vf in vfs}
        ticket = next(self._tickets)
        holdings = [
            Holding(
                "",
                create.sandbox_id,
                pod.uid,
                container,
                d,
                m,
                create.attempt,
                ticket=ticket,
                memory_mib=memory.get(d, 0),
                pod_wide=d in pod_wide,
            )
            for d, m in milli.items()
        ]
        await self._reserve(pod, container, holdings)
        sharing = node.sharing
        try:
            # the container's devices and the pod's VFs, in one call: one plugin's edits name all
            # of its devices (NCCL_IB_HCA lists exactly the RDMA devices the container can open)
            applied = edits_for(node.plugins, [*granted, *vfs], shares)
            if sharing is not None and granted:  # a share on a node that enforces shares: an MPS client
                client = await sharing.container_edits(granted, shares, create.daemon_wait)
                applied = merge_edits([applied, client])
            edits.apply_spec(create.spec, applied)
        except (PluginError, DaemonError) as error:
            self.ledger.release(holdings)
            self._shares_changed()
            retry = isinstance(error, DaemonError)  # the GPU's MPS daemon did not start: kubelet retries
            code = grpc.StatusCode.UNAVAILABLE if retry else grpc.StatusCode.FAILED_PRECONDITION
            raise Rejected(code, f"pod {pod}: {error}") from None
        except BaseException:
            self.ledger.release(holdings)
            self._shares_changed()
            raise
        create.spec.annotations[MARK_ANNOTATION] = mark_value(pod.uid, container, milli, memory, pod_wide)
        log_event(
            log,
            "create_container.rewritten",
            pod=str(pod),
            pod_uid=pod.uid,
            node=self.node_name,
            container=container,
            devices=sorted(milli),
            **({"rdma": sorted(pod_wide)} if pod_wide else {}),
        )
        return self._completion(holdings)

    def _check_security(self, security: Security, pod: PodRef, container: str) -> None:
        """Log a privileged container (Pod Security's to forbid: containerd gives it every device
        node, and node infrastructure runs so); log a container given CAP_SYS_ADMIN, and refuse it
        unless its namespace is allowed (it could lift its device cgroup, past the scrub)."""
        if security.privileged:
            log_event(
                log,
                "create_container.privileged",
                logging.WARNING,
                pod=str(pod),
                container=container,
                node=self.node_name,
                note="a privileged container sees every device node; Pod Security must forbid it",
            )
            return
        granted = security.sys_admin
        if granted is None:
            return
        allowed = pod.namespace in self.sys_admin_namespaces
        log_event(
            log,
            "create_container.sys_admin",
            logging.WARNING,
            pod=str(pod),
            container=container,
            node=self.node_name,
            capability=granted[:100],
            allowed=allowed,
            note="CAP_SYS_ADMIN lets a container lift its device cgroup and open every device node; "
            "Pod Security must forbid it",
        )
        if not allowed:
            raise Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod} container {container}: capability SYS_ADMIN (added as {granted[:100]!r}) is "
                "refused on this node: it lets a container lift its device cgroup and open every "
                "device node, past the shim; the shim allows it only in the namespaces named by "
                "--allow-sys-admin-namespace",
            )

    async def _reserve(self, pod: PodRef, container: str, holdings: list[Holding]) -> None:
        """Reserve, after adopting containers the ledger missed and settling holders that may no
        longer be real if they are in the way."""
        if self._runtime is not None:
            await self.adopt_unaccounted()
        conflicts = self.ledger.try_reserve(holdings)
        if not conflicts:
            return
        await self._settle_holders([holder for conflict in conflicts for holder in conflict.holders])
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
        def done(container_id: str | None, ambiguous: bool = False) -> None:
            if container_id:
                try:
                    self.ledger.commit(holdings, container_id)
                except OverBooked as over:  # dropped with its sandbox meanwhile, and others hold it now
                    self._refuse_overbooked(container_id, holdings, over)
            elif not ambiguous:
                self.ledger.release(holdings)
                self._shares_changed()
            else:
                self.ledger.mark_unknown(holdings)
                log_event(
                    log,
                    "ledger.outcome_unknown",
                    logging.WARNING,
                    pod_uid=holdings[0].pod_uid,
                    container=holdings[0].container,
                    attempt=holdings[0].attempt,
                    devices=[h.device for h in holdings],
                )
                self._spawn(self._reconcile_later(holdings[0].sandbox_id))

        return done

    def _spawn(self, work: Awaitable[None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        except RuntimeError:  # no loop (a direct call in a test): the next conflict reconciles
            if asyncio.iscoroutine(work):
                work.close()
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)
