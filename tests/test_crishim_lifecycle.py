"""The rewriter over time, with stand-in plugins and runtime: discovery retried until it works,
rediscovery on health changes, creates of unknown outcome reconciled with the runtime, static
pods never sent to the API server. (Real containerd: test_crishim_rewrite.py.)"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.hostpaths import CHAR, DeviceNumber
from crishim.intercept import Rejected
from crishim.ledger import MARK_ANNOTATION, Holding, mark_value, parse_mark
from crishim.rewrite import CONFIG_SOURCE_ANNOTATION, AllocationRewriter, DevicesNotDiscovered, NodeDevices
from devices.model import Device, DeviceKind, NodeInventory
from devices.plugin import ContainerEdits, DeviceNode, GpuShare, PluginError
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, Share, sign
from tests.fixtures.keys import SIGNING

NODE, UID = "life-node", "11111111-0000-4000-8000-000000000001"


class Flaky:
    """A GPU plugin whose discovery fails ``failures`` times (NVML not up yet), then works."""

    name = "flaky"
    kinds = frozenset({DeviceKind.GPU})
    device_patterns = ("/dev/flaky-gpu*",)

    def __init__(self, failures: int, gpus: int = 2, memory_mib: int = 0) -> None:
        self.failures = failures
        self.gpus = gpus
        self.memory_mib = memory_mib
        self.calls = 0
        self.healthy = True

    def discover(self) -> NodeInventory:
        self.calls += 1
        if self.calls <= self.failures:
            raise PluginError("flaky: NVML not available: driver not loaded")
        return NodeInventory(
            tuple(
                Device(
                    id=f"GPU-{i}",
                    kind=DeviceKind.GPU,
                    index=i,
                    model="x",
                    healthy=self.healthy,
                    device_nodes=(f"/dev/flaky-gpu{i}",),
                    memory_mib=self.memory_mib,
                )
                for i in range(self.gpus)
            )
        )

    def health(self) -> dict[str, bool]:
        if self.calls <= self.failures:
            return {}  # knows no device yet, and says so without failing
        return {f"GPU-{i}": self.healthy for i in range(self.gpus)}

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits:
        return ContainerEdits(
            device_nodes=tuple(DeviceNode(d.device_nodes[0], d.device_nodes[0]) for d in devices),
            env={"NVIDIA_VISIBLE_DEVICES": ",".join(d.id for d in devices)},
        )


def request(
    container: str = "app",
    grant: dict[str, list[str]] | None = None,
    shares: dict[str, dict[str, Share]] | None = None,
    uid: str = UID,
    sandbox: str = "sb",
    attempt: int = 0,
    annotations: dict[str, str] | None = None,
) -> api_pb2.CreateContainerRequest:
    req = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox)
    req.sandbox_config.metadata.name, req.sandbox_config.metadata.namespace = "p", "default"
    req.sandbox_config.metadata.uid = uid
    req.sandbox_config.annotations.update(annotations or {})
    if grant is not None:
        allocation = Allocation(
            NODE,
            uid,
            {n: ContainerAllocation(tuple(d), (shares or {}).get(n, {})) for n, d in grant.items()},
        )
        req.sandbox_config.annotations[ANNOTATION] = sign(allocation, "k1", SIGNING["k1"])
    req.config.metadata.name = container
    req.config.metadata.attempt = attempt
    return req


def rewriter_for(node: NodeDevices, lookup: object = None) -> AllocationRewriter:
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING), lookup)  # type: ignore[arg-type]
    rewriter.rebuilt.set()
    return rewriter


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, dict[str, object]]]:
    """The structured log events called ``name``: (level, fields)."""
    return [(r.levelno, getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == name]


def test_discovery_is_retried_and_creates_wait_for_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    plugin = Flaky(failures=3)
    node = NodeDevices([plugin], sysfs_root=None)
    with pytest.raises(PluginError):
        node.discover()
    rewriter = rewriter_for(node)
    with pytest.raises(DevicesNotDiscovered, match="has not succeeded yet: flaky: NVML not available"):
        node.current_inventory()  # the advertiser publishes nothing rather than an empty node

    async def run() -> None:
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        assert caught.value.code is grpc.StatusCode.UNAVAILABLE
        assert (
            "device discovery has not succeeded" in caught.value.message
            and "driver not loaded" in caught.value.message
        )
        # A container without devices is served meanwhile, and still scrubbed of the known paths.
        plain = request()
        plain.config.devices.add(host_path="/dev/flaky-gpu0", container_path="/dev/x")
        created, _ = await rewriter.create_container(plain)
        assert not created.config.devices
        # Discovery is retried on its own schedule, not only by the (rare) full rediscovery.
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01, rediscover_every=10**6))
        for _ in range(500):
            if events(caplog, "devices.discovered"):  # logged just after discovery succeeded
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()
        assert node.discovered and sorted(node.devices) == ["GPU-0", "GPU-1"]
        assert plugin.calls == 4
        granted, completion = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        assert [d.host_path for d in granted.config.devices] == ["/dev/flaky-gpu0"]
        assert completion is not None

    asyncio.run(run())
    assert [d.id for d in node.current_inventory().devices] == ["GPU-0", "GPU-1"]
    assert (
        events(caplog, "devices.discovery_failed")
        == [(logging.WARNING, {"node": NODE, "error": "flaky: NVML not available: driver not loaded"})] * 2
    )
    assert events(caplog, "devices.discovered") == [
        (logging.INFO, {"node": NODE, "devices": ["GPU-0", "GPU-1"]})
    ]


def test_a_health_change_triggers_rediscovery(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    plugin = Flaky(failures=0, gpus=1)
    node = NodeDevices([plugin], sysfs_root=None)
    node.discover()
    rewriter = rewriter_for(node)

    async def run() -> None:
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01, rediscover_every=10**6))
        await asyncio.sleep(0.1)
        plugin.gpus, plugin.healthy = 3, False  # a GPU fell off and two more came up
        for _ in range(500):
            if events(caplog, "devices.rediscovered"):  # logged just after the devices changed
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()

    asyncio.run(run())
    assert sorted(node.devices) == ["GPU-0", "GPU-1", "GPU-2"]
    changed = {"GPU-0": False, "GPU-1": False, "GPU-2": False}  # GPU-0 went bad, two came (bad)
    assert events(caplog, "health.changed")[0] == (logging.INFO, {"node": NODE, "devices": changed})
    assert events(caplog, "devices.rediscovered")[0] == (
        logging.INFO,
        {"node": NODE, "devices": ["GPU-0", "GPU-1", "GPU-2"]},
    )
    inventory = node.current_inventory()  # what the advertiser publishes: today's health folded in
    assert [(d.id, d.healthy) for d in inventory.devices] == [
        ("GPU-0", False),
        ("GPU-1", False),
        ("GPU-2", False),
    ]
    assert inventory.topology == node.inventory.topology


class FakeRuntime:
    """Answers ListContainers, ListPodSandbox and ContainerStatus from a list of containers. Like
    containerd's gRPC stub it takes only requests of the method's own type; it records each call's
    deadline (``calls``)."""

    def __init__(self) -> None:
        self.containers: list[api_pb2.Container] = []
        self.lists = 0
        self.asked: list[tuple[str, float | None]] = []  # (sandbox filter, timeout) of each list
        self.calls: list[tuple[str, float | None]] = []  # (method, timeout) of every call
        self.sandbox_uids: dict[str, str] = {}  # sandbox id -> pod UID where it is not UID

    def _called(self, method: str, req: object, timeout: float | None) -> None:
        wanted = getattr(api_pb2, f"{method}Request")
        if not isinstance(req, wanted):  # the stub could not even serialize it
            raise TypeError(f"{method}: {type(req).__name__} is not a {wanted.__name__}")
        self.calls.append((method, timeout))

    def add(self, container_id: str, sandbox: str, name: str, attempt: int, devices: dict[str, int]) -> None:
        self.containers.append(
            api_pb2.Container(
                id=container_id,
                pod_sandbox_id=sandbox,
                metadata=api_pb2.ContainerMetadata(name=name, attempt=attempt),
                state=api_pb2.CONTAINER_CREATED,
                annotations={MARK_ANNOTATION: mark_value(UID, name, devices)},
            )
        )

    async def ListContainers(
        self, req: api_pb2.ListContainersRequest, timeout: float | None = None
    ) -> object:
        self._called("ListContainers", req, timeout)
        self.lists += 1
        self.asked.append((req.filter.pod_sandbox_id, timeout))
        wanted = req.filter.pod_sandbox_id
        return api_pb2.ListContainersResponse(
            containers=[c for c in self.containers if not wanted or c.pod_sandbox_id == wanted]
        )

    async def ListPodSandbox(
        self, req: api_pb2.ListPodSandboxRequest, timeout: float | None = None
    ) -> object:
        """Every sandbox of a listed container, as pod UID's (or as ``sandbox_uids`` says)."""
        self._called("ListPodSandbox", req, timeout)
        ids = dict.fromkeys(c.pod_sandbox_id for c in self.containers)
        return api_pb2.ListPodSandboxResponse(
            items=[
                api_pb2.PodSandbox(
                    id=i, metadata=api_pb2.PodSandboxMetadata(uid=self.sandbox_uids.get(i, UID))
                )
                for i in ids
            ]
        )

    async def ContainerStatus(
        self, req: api_pb2.ContainerStatusRequest, timeout: float | None = None
    ) -> object:
        self._called("ContainerStatus", req, timeout)
        for c in self.containers:
            if c.id == req.container_id:
                return api_pb2.ContainerStatusResponse(status=api_pb2.ContainerStatus(id=c.id, state=c.state))
        raise _NotFound()


class _NotFound(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "not found")


def sim_node(tmp_path: Path) -> NodeDevices:
    node = NodeDevices([Flaky(failures=0, gpus=2)], sysfs_root=None)
    node.discover()
    return node


def rewriter_on_fake_runtime(tmp_path: Path) -> tuple[AllocationRewriter, FakeRuntime]:
    """A sim node's rewriter whose runtime is a ``FakeRuntime`` (returned with it)."""
    rewriter = rewriter_for(sim_node(tmp_path))
    runtime = FakeRuntime()
    rewriter._runtime = runtime  # type: ignore[assignment]
    return rewriter, runtime


@pytest.mark.parametrize("created", [False, True])
def test_an_unknown_outcome_is_settled_by_asking_the_runtime(tmp_path: Path, created: bool) -> None:
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    share = {"app": {"GPU-1": Share(600)}}

    async def run() -> None:
        _, completion = await rewriter.create_container(request(grant={"app": ["GPU-1"]}, shares=share))
        assert completion is not None
        completion(None, True)  # DEADLINE_EXCEEDED: containerd may or may not have made it
        [held] = rewriter.ledger.holdings()
        assert held.unknown and not held.container_id
        if created:
            runtime.add("c-ghost", "sb", "app", 0, {"GPU-1": 600})
        other = request(
            container="c", grant={"c": ["GPU-1"]}, shares={"c": {"GPU-1": Share(500)}}, uid="Q", sandbox="sq"
        )
        # Either way 500 more do not fit: the ghost exists and may be started, or (no container
        # yet) containerd may still finish it, so its 600 stay held.
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(other)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert ("c-ghost" if created else "outcome unknown") in caught.value.message
        # The ghost, if made, is adopted before the reservation; otherwise the unknown holding in
        # the way is reconciled by listing its one sandbox. Every list is bounded.
        reconciled = [asked for asked in runtime.asked if asked[0]]
        assert reconciled == ([] if created else [("sb", reconciled[0][1])])
        assert all(t is not None and 0 < t <= 30 for _, t in runtime.asked)
        mine = [h for h in rewriter.ledger.holdings() if h.pod_uid == UID]
        assert [(h.container_id, h.unknown) for h in mine] == (
            [("c-ghost", False)] if created else [("", True)]
        )
        rewriter.removed_sandbox("sb")  # P's sandbox is gone: nothing of it can be created any more
        runtime.containers.clear()  # (containerd removed its containers with it)
        await rewriter.create_container(other)

    asyncio.run(run())


def test_the_retry_of_an_unknown_create_does_not_count_twice(tmp_path: Path) -> None:
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    share = {"app": {"GPU-0": Share(600)}}

    async def run() -> None:
        _, first = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share))
        first(None, True)  # type: ignore[misc]
        _, retry = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share))
        runtime.add("c-retry", "sb", "app", 0, {"GPU-0": 600})
        retry("c-retry", False)  # type: ignore[misc]
        assert await rewriter.reconcile_unknown("sb")
        assert [(h.container_id, h.milli) for h in rewriter.ledger.holdings()] == [("c-retry", 600)]

    asyncio.run(run())


def test_reconciliation_keeps_the_holding_while_the_runtime_is_unreachable(tmp_path: Path) -> None:
    rewriter = rewriter_for(sim_node(tmp_path))

    class Down(FakeRuntime):
        async def ListContainers(self, req: object, timeout: float = 0) -> object:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )

    rewriter._runtime = Down()  # type: ignore[assignment]
    rewriter.ledger.try_reserve([Holding("", "sb", UID, "app", "GPU-0", 1000)])
    rewriter.ledger.mark_unknown([Holding("", "sb", UID, "app", "GPU-0", 1000)])
    assert not asyncio.run(rewriter.reconcile_unknown())
    assert [h.unknown for h in rewriter.ledger.holdings()] == [True]  # still counts: the safe side


def test_static_pods_never_need_the_api_server(tmp_path: Path) -> None:
    asked: list[str] = []

    async def lookup(namespace: str, name: str, uid: str) -> str | None:
        asked.append(name)
        raise AssertionError("a static pod must not be looked up")

    rewriter = rewriter_for(sim_node(tmp_path), lookup)
    static = request(annotations={CONFIG_SOURCE_ANNOTATION: "file"})
    static.config.envs.add(key="NVIDIA_VISIBLE_DEVICES", value=b"all")
    created, completion = asyncio.run(rewriter.create_container(static))
    assert completion is None and not asked
    assert {kv.key: kv.value for kv in created.config.envs}["NVIDIA_VISIBLE_DEVICES"] == b"void"

    async def found(namespace: str, name: str, uid: str) -> str | None:
        asked.append(f"{namespace}/{name}/{uid}")
        return None

    api_pod = request(annotations={CONFIG_SOURCE_ANNOTATION: "api"})
    asyncio.run(rewriter_for(sim_node(tmp_path), found).create_container(api_pod))
    assert asked == [f"default/p/{UID}"]


def test_a_privileged_container_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    privileged = request()
    privileged.config.linux.security_context.privileged = True
    asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(privileged))
    asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(request(container="plain")))
    assert events(caplog, "create_container.privileged") == [
        (
            logging.WARNING,
            {
                "pod": "default/p",
                "container": "app",
                "node": NODE,
                "note": "a privileged container sees every device node; Pod Security must forbid it",
            },
        )
    ]


SYS_ADMIN_NOTE = (
    "CAP_SYS_ADMIN lets a container lift its device cgroup and open every device node; "
    "Pod Security must forbid it"
)


@pytest.mark.parametrize(
    ("added", "dropped", "granted"),
    [
        (["SYS_ADMIN"], [], "SYS_ADMIN"),
        (["NET_ADMIN", "sys_admin"], [], "sys_admin"),
        (["Sys_Admin"], ["ALL"], "Sys_Admin"),  # ALL is dropped before the names are added
        (["CAP_SYS_ADMIN"], [], "CAP_SYS_ADMIN"),  # another runtime strips CAP_; counted
        (["ſys_admin"], [], "ſys_admin"),  # Go's ToUpper makes it SYS_ADMIN
        (["ALL"], [], "ALL"),
        (["all"], ["NET_RAW"], "all"),
        (["ALL"], ["CAP_SYS_ADMIN"], "ALL"),  # containerd drops CAP_CAP_SYS_ADMIN: nothing
    ],
)
def test_a_container_given_sys_admin_is_logged_and_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, added: list[str], dropped: list[str], granted: str
) -> None:
    """CAP_SYS_ADMIN without privileged lifts the device cgroup: refused on a device node, with
    a log line like the privileged one, unless the namespace is allowed (then only logged)."""
    caplog.set_level(logging.DEBUG)
    create = request(grant={"app": ["GPU-0"]})
    create.config.linux.security_context.capabilities.add_capabilities.extend(added)
    create.config.linux.security_context.capabilities.drop_capabilities.extend(dropped)
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(create))
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.message == (
        f"pod default/p container app: capability SYS_ADMIN (added as {granted!r}) is refused on this "
        "node: it lets a container lift its device cgroup and open every device node, past the shim; "
        "the shim allows it only in the namespaces named by --allow-sys-admin-namespace"
    )
    fields = {"pod": "default/p", "container": "app", "node": NODE, "capability": granted}
    assert events(caplog, "create_container.sys_admin") == [
        (logging.WARNING, {**fields, "allowed": False, "note": SYS_ADMIN_NOTE})
    ]
    caplog.clear()
    allowing = rewriter_for(sim_node(tmp_path))
    allowing.sys_admin_namespaces = frozenset({"default"})
    created, _ = asyncio.run(allowing.create_container(create))
    assert list(created.config.linux.security_context.capabilities.add_capabilities) == added
    assert events(caplog, "create_container.sys_admin") == [
        (logging.WARNING, {**fields, "allowed": True, "note": SYS_ADMIN_NOTE})
    ]


@pytest.mark.parametrize(
    ("added", "dropped"),
    [
        ([], []),
        (["NET_ADMIN", "SYS_PTRACE", "SYS_ADMINX"], []),
        (["SYS_ADMIN"], ["sys_admin"]),  # dropped last
        (["ALL"], ["SYS_ADMIN"]),
        (["ALL"], ["all"]),
    ],
)
def test_a_container_without_sys_admin_is_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, added: list[str], dropped: list[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    create = request(grant={"app": ["GPU-0"]})
    create.config.linux.security_context.capabilities.add_capabilities.extend(added)
    create.config.linux.security_context.capabilities.drop_capabilities.extend(dropped)
    asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(create))
    assert events(caplog, "create_container.sys_admin") == []


def test_ambient_sys_admin_and_a_privileged_container_follow_their_own_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An ambient SYS_ADMIN (containerd ignores it, another runtime may not) is refused; a
    privileged container has every capability anyway: it is logged as privileged, not refused."""
    caplog.set_level(logging.DEBUG)
    ambient = request()
    ambient.config.linux.security_context.capabilities.add_ambient_capabilities.append("SYS_ADMIN")
    with pytest.raises(Rejected):
        asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(ambient))
    caplog.clear()
    privileged = request()
    privileged.config.linux.security_context.privileged = True
    privileged.config.linux.security_context.capabilities.add_capabilities.append("SYS_ADMIN")
    asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(privileged))
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("create_container.")]
    assert logged == ["create_container.privileged"]


def test_the_ledger_is_rebuilt_from_the_runtimes_marked_live_containers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node = sim_node(tmp_path)

    class Sharing:  # stands in for crishim.mps.MpsSharing: told how to read the ledger's shares
        def __init__(self) -> None:
            self.shared: object = None

        def start(self, shared: object) -> None:
            self.shared = shared

        def poke(self) -> None:
            pass

    sharing = Sharing()
    node.sharing = sharing  # type: ignore[assignment]
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.containers.append(api_pb2.Container(id="c-plain", pod_sandbox_id="sb"))  # not ours, listed first
    runtime.add("c-done", "sb", "old", 0, {"GPU-1": 700})
    runtime.containers[-1].state = api_pb2.CONTAINER_EXITED
    runtime.add("c-live", "sb", "app", 2, {"GPU-0": 1000, "GPU-1": 300})
    rewriter._runtime = runtime  # type: ignore[assignment]
    assert not rewriter.rebuilt.is_set()
    asyncio.run(rewriter.rebuild())
    assert rewriter.rebuilt.is_set()
    held = sorted(
        (h.container_id, h.pod_uid, h.container, h.device, h.milli, h.attempt, h.sandbox_id)
        for h in rewriter.ledger.holdings()
    )
    assert held == [
        ("c-live", UID, "app", "GPU-0", 1000, 2, "sb"),
        ("c-live", UID, "app", "GPU-1", 300, 2, "sb"),
    ]
    assert callable(sharing.shared) and sharing.shared() == {"GPU-1"}  # type: ignore[operator]
    assert events(caplog, "ledger.rebuilt") == [
        (logging.INFO, {"containers": 1, "devices": ["GPU-0", "GPU-1"]})
    ]
    # What was rebuilt counts: another pod cannot take GPU-0.
    assert rewriter.ledger.try_reserve([Holding("", "sq", "Q", "c", "GPU-0", 1)])
    rewriter.removed_container("c-live")
    assert not rewriter.ledger.holdings()
    assert events(caplog, "ledger.freed") == [
        (logging.INFO, {"container": "c-live", "devices": ["GPU-0", "GPU-1"]})
    ]


def test_the_rebuild_waits_for_the_runtime(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))

    class Late(FakeRuntime):
        """Lists containers at the third call, sandboxes at the second (one failure each way)."""

        sandbox_lists = 0

        async def ListContainers(self, req: object, timeout: float | None = None) -> object:
            self.lists += 1
            if self.lists < 3:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
                )
            return await super().ListContainers(req, timeout)  # type: ignore[arg-type]  (counts again)

        async def ListPodSandbox(self, req: object, timeout: float | None = None) -> object:
            self.sandbox_lists += 1
            if self.sandbox_lists < 2:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "slow"
                )
            return await super().ListPodSandbox(req, timeout)  # type: ignore[arg-type]

    late = Late()
    late.add("c1", "sb", "app", 0, {"GPU-0": 1000})
    rewriter._runtime = late  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild(retry_seconds=0.01))
    assert late.lists == 4 and late.sandbox_lists == 2
    assert [h.container_id for h in rewriter.ledger.holdings()] == ["c1"]
    assert [t for _, t in late.asked if t is None] == []  # every list is bounded
    assert events(caplog, "ledger.rebuild_retry") == [
        (logging.WARNING, {"code": "UNAVAILABLE"}),
        (logging.WARNING, {"code": "UNAVAILABLE"}),
        (logging.WARNING, {"code": "DEADLINE_EXCEEDED"}),
    ]


def test_an_exited_or_vanished_holder_of_another_pod_is_dropped_on_conflict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rewriter = rewriter_for(sim_node(tmp_path))
    runtime = FakeRuntime()
    runtime.add("c-exited", "s-old", "app", 0, {"GPU-0": 1000})
    runtime.containers[-1].state = api_pb2.CONTAINER_EXITED
    runtime.add("c-running", "s-run", "app", 0, {"GPU-1": 1000})
    runtime.containers[-1].state = api_pb2.CONTAINER_RUNNING
    rewriter._runtime = runtime  # type: ignore[assignment]
    assert not rewriter.ledger.try_reserve([Holding("c-gone", "s-gone", "other2", "app", "GPU-0", 1)])
    assert not rewriter.ledger.try_reserve([Holding("c-exited", "s-old", "other", "app", "GPU-0", 999)])
    rewriter.ledger.try_reserve([Holding("c-running", "s-run", "other3", "app", "GPU-1", 1000)])

    async def run() -> None:
        _, done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        assert done is not None
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(request(container="b", grant={"b": ["GPU-1"]}))
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU-1 is held by app of pod other3 (c-running)" in caught.value.message

    asyncio.run(run())
    owners = sorted((h.pod_uid, h.device) for h in rewriter.ledger.holdings())
    assert owners == [(UID, "GPU-0"), ("other3", "GPU-1")]
    rewriter.removed_sandbox("s-run")
    assert sorted(h.pod_uid for h in rewriter.ledger.holdings()) == [UID]
    assert events(caplog, "ledger.freed") == [(logging.INFO, {"sandbox": "s-run", "devices": ["GPU-1"]})]
    [(level, conflict)] = events(caplog, "create_container.conflict")
    assert level == logging.WARNING
    assert conflict == {
        "pod": "default/p",
        "container": "b",
        "node": NODE,
        "reason": "device GPU-1 is held by app of pod other3 (c-running)",
    }


def test_health_refresh_reports_only_changes_and_rediscovery_when_health_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    plugin = Flaky(failures=0, gpus=2)
    node = NodeDevices([plugin], sysfs_root=None)
    node.discover()
    assert node.refresh_health() == {}
    plugin.healthy = False
    assert node.refresh_health() == {"GPU-0": False, "GPU-1": False}
    assert node.healthy == {"GPU-0": False, "GPU-1": False}
    assert [d.healthy for d in node.inventory.devices] == [True, True]  # as discovered
    assert [d.healthy for d in node.current_inventory().devices] == [False, False]  # as published

    class Broken(Flaky):
        def health(self) -> dict[str, bool]:
            raise PluginError("broken: NVML went away")

    broken = Broken(failures=0, gpus=1)
    node = NodeDevices([broken], sysfs_root=None)
    node.discover()
    rewriter = rewriter_for(node)

    async def run() -> None:
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01, rediscover_every=10**6))
        for _ in range(500):
            if broken.calls >= 3:
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()

    asyncio.run(run())
    assert broken.calls >= 3  # health failing: discovery again, every round
    assert events(caplog, "devices.health_refresh_failed")[0] == (
        logging.WARNING,
        {"node": NODE, "error": "broken: NVML went away"},
    )


def test_reconciliation_settles_only_the_sandbox_asked_about_and_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    here = Holding("", "sb", UID, "app", "GPU-0", 500, attempt=1, ticket=1)
    there = Holding("", "sc", "other", "app", "GPU-1", 500, ticket=2)
    for h in (here, there):
        rewriter.ledger.try_reserve([h])
        rewriter.ledger.mark_unknown([h])
    runtime.containers.append(api_pb2.Container(id="c-plain", pod_sandbox_id="sb"))  # unmarked
    runtime.add("c-exited", "sb", "app", 1, {"GPU-0": 500})  # same create, but it has exited
    runtime.containers[-1].state = api_pb2.CONTAINER_EXITED
    runtime.add("c-claimed", "sb", "app", 1, {"GPU-0": 500})  # same create, already accounted for
    rewriter.ledger.try_reserve([Holding("c-claimed", "sb", UID, "app", "GPU-2", 1)])
    runtime.add("c-made", "sb", "app", 1, {"GPU-0": 500})
    runtime.add("c-other-attempt", "sb", "app", 0, {"GPU-0": 500})
    assert asyncio.run(rewriter.reconcile_unknown("sb"))
    held = sorted((h.sandbox_id, h.container_id, h.unknown) for h in rewriter.ledger.holdings())
    assert held == [("sb", "c-claimed", False), ("sb", "c-made", False), ("sc", "", True)]
    assert events(caplog, "ledger.reconciled") == [
        (
            logging.INFO,
            {
                "pod_uid": UID,
                "container": "app",
                "attempt": 1,
                "created": "c-made",
                "devices": ["GPU-0"],
                "held": "by its container",
            },
        )
    ]


def test_an_unknown_outcome_is_settled_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import crishim.rewrite

    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(crishim.rewrite, "RECONCILE_DELAY_SECONDS", 0.01)
    rewriter = rewriter_for(sim_node(tmp_path))

    class Flapping(FakeRuntime):
        async def ListContainers(
            self, req: api_pb2.ListContainersRequest, timeout: float | None = None
        ) -> object:
            self.lists += 1
            self.reconciles += bool(req.filter.pod_sandbox_id)
            if req.filter.pod_sandbox_id and self.reconciles < 3:  # the reconciliation's lists
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), ""
                )
            return await super().ListContainers(req, timeout)

    runtime = Flapping()
    runtime.reconciles = 0  # type: ignore[attr-defined]
    rewriter._runtime = runtime  # type: ignore[assignment]
    other = Holding("", "sc", "other", "app", "GPU-1", 500, ticket=99)
    rewriter.ledger.try_reserve([other])
    rewriter.ledger.mark_unknown([other])

    async def run() -> None:
        _, done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        assert done is not None
        done(None, True)
        for _ in range(300):
            if events(caplog, "ledger.reconciled"):
                break
            await asyncio.sleep(0.01)
        assert runtime.reconciles >= 3  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)
        assert not rewriter._background  # finished tasks are not kept

    asyncio.run(run())
    # No container yet: the holding stays (containerd may still finish the create); the other
    # sandbox's was not asked about.
    held = sorted((h.ticket, h.sandbox_id, h.unknown) for h in rewriter.ledger.holdings())
    assert held == [(1, "sb", True), (99, "sc", True)]
    assert [f["held"] for _, f in events(caplog, "ledger.reconciled")] == [
        "quarantined: the create may still complete"
    ]
    assert events(caplog, "ledger.outcome_unknown") == [
        (logging.WARNING, {"pod_uid": UID, "container": "app", "attempt": 0, "devices": ["GPU-0"]})
    ]
    assert (
        events(caplog, "ledger.reconcile_failed")
        == [(logging.WARNING, {"sandbox": "sb", "code": "UNAVAILABLE"})] * 2
    )


def test_an_unknown_outcome_outside_an_event_loop_leaves_nothing_dangling(tmp_path: Path) -> None:
    rewriter = rewriter_for(sim_node(tmp_path))
    _, done = asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-0"]})))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done(None, True)  # type: ignore[misc]
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert [h.unknown for h in rewriter.ledger.holdings()] == [True]  # settled at the next conflict


def test_rediscovery_follows_its_schedule_and_the_managed_set_follows_the_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every fourth health check rediscovers (rediscover_every=4); every health check refreshes
    the managed set, so a device node that appears on the host is scrubbed from then on."""
    caplog.set_level(logging.DEBUG)
    calls: list[str] = []
    dev = tmp_path / "dev"
    dev.mkdir()

    class Steady(Flaky):
        device_patterns = (f"{dev}/late*",)

        def discover(self) -> NodeInventory:
            calls.append("d")
            return super().discover()

        def health(self) -> dict[str, bool]:
            calls.append("h")
            return super().health()

    plugin = Steady(failures=0, gpus=1)
    node = NodeDevices([plugin], sysfs_root=None)
    node.discover()
    rewriter = rewriter_for(node)
    (dev / "late0").symlink_to("/dev/zero")  # a node that appears after discovery
    assert DeviceNumber(CHAR, 1, 5) not in node.managed.numbers

    async def until(health_checks: int, every: int) -> None:
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01, rediscover_every=every))
        for _ in range(500):
            if calls.count("h") >= health_checks:
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()

    asyncio.run(until(2, 10**6))  # health checks only, no rediscovery
    assert "d" not in calls[1:] and DeviceNumber(CHAR, 1, 5) in node.managed.numbers
    calls.clear()
    asyncio.run(until(9, 4))
    assert "".join(calls).startswith("hhhhdhhhhd"), calls
    assert events(caplog, "devices.rediscovered") == []  # the devices did not change
    assert events(caplog, "devices.managed_refresh_failed") == []


def test_failures_of_rediscovery_and_of_the_managed_refresh_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    class Failing(Flaky):
        def __init__(self) -> None:
            super().__init__(failures=0, gpus=1)
            self.broken = False

        def discover(self) -> NodeInventory:
            if self.broken:
                raise PluginError("failing: rediscovery broke")
            return super().discover()

        @property
        def device_patterns(self) -> tuple[str, ...]:
            if self.broken:
                raise RuntimeError("cannot list patterns")
            return ()

    plugin = Failing()
    node = NodeDevices([plugin], sysfs_root=None)
    node.discover()
    plugin.broken = True
    rewriter = rewriter_for(node)

    async def run() -> None:
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01, rediscover_every=2))
        for _ in range(500):
            if events(caplog, "devices.rediscovery_failed") and events(
                caplog, "devices.managed_refresh_failed"
            ):
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()

    asyncio.run(run())
    assert events(caplog, "devices.rediscovery_failed")[0] == (
        logging.WARNING,
        {"node": NODE, "error": "failing: rediscovery broke"},
    )
    assert events(caplog, "devices.managed_refresh_failed")[0] == (
        logging.WARNING,
        {"node": NODE, "error": "cannot list patterns"},
    )
    assert node.discovered and sorted(node.devices) == ["GPU-0"]  # the last good state stays


def test_a_device_that_turned_unhealthy_after_discovery_is_refused(tmp_path: Path) -> None:
    plugin = Flaky(failures=0, gpus=2)
    node = NodeDevices([plugin], sysfs_root=None)
    node.discover()
    plugin.healthy = False
    node.refresh_health()  # the inventory still says healthy; today's health says not
    rewriter = rewriter_for(node)
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-1"]})))
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.message == "pod default/p container app: device GPU-1 is unhealthy"


def test_the_published_inventory_keeps_the_topology(tmp_path: Path) -> None:
    from devices.registry import load_plugins

    plugins = load_plugins(["sim"], {"node_name": NODE, "topology": "dgx1-v100", "state_dir": str(tmp_path)})
    node = NodeDevices(plugins, sysfs_root=None)
    node.discover()
    published = node.current_inventory()
    assert published.topology == node.inventory.topology and published.topology.nvlinks


def test_unavailable_before_discovery_says_why(tmp_path: Path) -> None:
    node = NodeDevices([Flaky(failures=10)], sysfs_root=None)  # never tried yet
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter_for(node).create_container(request(grant={"app": ["GPU-0"]})))
    assert "has not succeeded on this node yet (not run), retry" in caught.value.message


def test_a_rewritten_create_reserves_marks_and_logs_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rewriter = rewriter_for(sim_node(tmp_path))
    shares = {"app": {"GPU-1": Share(250)}}
    rewritten, _ = asyncio.run(
        rewriter.create_container(request(grant={"app": ["GPU-0", "GPU-1"]}, shares=shares, attempt=3))
    )
    held = sorted(
        (h.container_id, h.sandbox_id, h.pod_uid, h.container, h.device, h.milli, h.attempt)
        for h in rewriter.ledger.holdings()
    )
    assert held == [("", "sb", UID, "app", "GPU-0", 1000, 3), ("", "sb", UID, "app", "GPU-1", 250, 3)]
    assert len({h.ticket for h in rewriter.ledger.holdings()}) == 1
    assert rewritten.config.annotations[MARK_ANNOTATION] == mark_value(
        UID, "app", {"GPU-0": 1000, "GPU-1": 250}
    )
    assert events(caplog, "create_container.rewritten") == [
        (
            logging.INFO,
            {
                "pod": "default/p",
                "pod_uid": UID,
                "node": NODE,
                "container": "app",
                "devices": ["GPU-0", "GPU-1"],
            },
        )
    ]


def test_a_plugin_that_cannot_edit_releases_the_reservation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    class Refusing(Flaky):
        def container_edits(self, devices: Sequence[Device], shares: object = None) -> ContainerEdits:
            raise PluginError("refusing: no minor number")

    node = NodeDevices([Refusing(failures=0)], sysfs_root=None)
    try:
        node.discover()
    except PluginError:
        pass
    rewriter = rewriter_for(node)
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-0"]})))
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.message == "pod default/p: refusing: no minor number"
    assert not rewriter.ledger.holdings()
    # Its well-known paths and its devices' own nodes are still managed; the failure is logged.
    assert events(caplog, "devices.managed_partial")[0] == (
        logging.WARNING,
        {"error": "refusing: no minor number"},
    )
    assert node.managed.has_path("/dev/flaky-gpu0")


def test_creates_wait_for_the_ledger_rebuild_with_a_reason(tmp_path: Path) -> None:
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-0"]})))
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    assert caught.value.message == "pod default/p: the device ledger is still being rebuilt, retry"


@pytest.mark.parametrize("where", ["env value", "mount"])
def test_a_nul_in_an_env_value_or_mount_path_is_refused(tmp_path: Path, where: str) -> None:
    odd = request()
    if where == "env value":
        odd.config.envs.add(key="A", value=b"x\x00y")
    else:
        odd.config.mounts.add(host_path="/tmp", container_path="/data\x00x")
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter_for(sim_node(tmp_path)).create_container(odd))
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    expected = (
        "environment variable 'A' has '=' or NUL in its name or value"
        if where == "env value"
        else "mount path '/data\\x00x' has a NUL"
    )
    assert caught.value.message == f"pod default/p container app: refused: {expected}"


def test_start_attaches_to_the_runtime_and_runs_the_background_work(tmp_path: Path) -> None:
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))

    async def run() -> None:
        channel = grpc.aio.insecure_channel(f"unix:{tmp_path}/no-runtime.sock")
        tasks = rewriter.start(channel, 0.01)
        assert rewriter._runtime is not None and len(tasks) == 2
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in tasks)  # the rebuild keeps retrying, the upkeep keeps going
        assert not rewriter.rebuilt.is_set()
        for task in tasks:
            task.cancel()
        await channel.close()

    asyncio.run(run())


def test_an_unexpected_plugin_failure_releases_the_reservation_too(tmp_path: Path) -> None:
    class Buggy(Flaky):
        calls_to_edit = 0

        def container_edits(self, devices: Sequence[Device], shares: object = None) -> ContainerEdits:
            Buggy.calls_to_edit += 1
            if Buggy.calls_to_edit > 1:  # the first call is the managed-set refresh at discovery
                raise ValueError("a bug in a plugin")
            return super().container_edits(devices)

    node = NodeDevices([Buggy(failures=0)], sysfs_root=None)
    node.discover()
    rewriter = rewriter_for(node)
    with pytest.raises(ValueError, match="a bug in a plugin"):
        asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-0"]})))
    assert not rewriter.ledger.holdings()  # the proxy answers INTERNAL; nothing stays reserved


def test_plugin_paths_are_managed_through_symlinked_directories(tmp_path: Path) -> None:
    from devices.registry import load_plugins

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    plugins = load_plugins(
        ["sim"], {"node_name": NODE, "topology": "pcie-4gpu", "state_dir": str(tmp_path / "link")}
    )
    node = NodeDevices(plugins, sysfs_root=None)
    for spelled in (f"{tmp_path}/link/dev/kubegpu-sim/gpu9", f"{real}/dev/kubegpu-sim/gpu9"):
        assert node.managed.has_path(spelled), spelled


def test_the_rebuild_counts_only_marks_written_for_the_container_that_carries_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A container restored from another pod's checkpoint (containerd 2.x restores the
    checkpoint's annotations), or given a forged mark, carries a mark naming another pod or
    another container: counting it would hold devices nobody was given."""
    caplog.set_level(logging.DEBUG)
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.add("c-ours", "sb", "app", 0, {"GPU-0": 400})
    runtime.add("c-other-pod", "sb-q", "app", 0, {"GPU-0": 600})  # the mark says UID, sb-q is Q's
    runtime.sandbox_uids["sb-q"] = "Q"
    runtime.add("c-renamed", "sb", "web", 0, {"GPU-1": 1000})
    runtime.containers[-1].metadata.name = "sidecar"  # the mark says "web"
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    assert [(h.container_id, h.device, h.milli) for h in rewriter.ledger.holdings()] == [
        ("c-ours", "GPU-0", 400)
    ]
    foreign = events(caplog, "ledger.foreign_mark")
    assert [(level, f["container"], f["mark_pod_uid"], f["sandbox_pod_uid"]) for level, f in foreign] == [
        (logging.WARNING, "c-other-pod", UID, "Q"),
        (logging.WARNING, "c-renamed", UID, UID),
    ]
    assert rewriter.ledger.try_reserve([Holding("", "sq", "Q", "c", "GPU-1", 1000)]) == []


def test_reconciliation_matches_only_a_container_of_the_marked_name(tmp_path: Path) -> None:
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)

    async def run() -> None:
        _, completion = await rewriter.create_container(request(grant={"app": ["GPU-1"]}))
        completion(None, True)  # type: ignore[misc]
        runtime.add("c-imposter", "sb", "app", 0, {"GPU-1": 1000})
        runtime.containers[-1].metadata.name = "other"
        assert await rewriter.reconcile_unknown("sb")
        assert [(h.container_id, h.unknown) for h in rewriter.ledger.holdings()] == [("", True)]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("image", "restored"),
    [
        ("/var/lib/kubelet/checkpoints/checkpoint-p_default-app.tar", True),
        ("/nonexistent.tar", True),  # containerd's stat decides; an absolute path is never an image
        ("sha256:" + "0" * 64, False),
        ("docker.io/library/busybox:1.36", False),
        ("", False),
    ],
)
def test_a_create_from_a_checkpoint_archive_is_refused_before_anything_is_held(
    tmp_path: Path, image: str, restored: bool
) -> None:
    rewriter = rewriter_for(sim_node(tmp_path))
    req = request(grant={"app": ["GPU-0"]})
    req.config.image.image = image

    async def run() -> None:
        if not restored:
            await rewriter.create_container(req)
            return
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(req)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.message == (
            f"pod default/p container app: image {image!r} is a file, which containerd restores as a "
            "container checkpoint with the checkpoint's own annotations, past the device scrub and the "
            "ledger; checkpoint restore is refused on this node"
        )
        assert rewriter.ledger.holdings() == []

    asyncio.run(run())


def test_an_image_naming_a_file_relative_to_containerds_directory_is_a_checkpoint(tmp_path: Path) -> None:
    from crishim.rewrite import restored_from

    (tmp_path / "ckpt.tar").write_bytes(b"")
    assert restored_from("ckpt.tar", workdir=str(tmp_path)) == "ckpt.tar"
    assert restored_from("busybox:latest", workdir=str(tmp_path)) is None
    assert restored_from("/abs/ckpt.tar", workdir=str(tmp_path)) == "/abs/ckpt.tar"


def test_restore_pod_is_what_a_device_node_refuses() -> None:
    from crishim.rewrite import RESTORE_POD

    rewriter = rewriter_for(NodeDevices([Flaky(failures=0, gpus=1)], sysfs_root=None))
    refusal = rewriter.refused_methods()[RESTORE_POD]
    assert refusal.code is grpc.StatusCode.FAILED_PRECONDITION and "ledger" in refusal.reason
    assert set(rewriter.refused_methods()) == {RESTORE_POD}


def test_a_container_containerd_makes_after_its_create_was_settled_is_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kubelet gave up on P's create (cancelled); asked, containerd had no container yet, so the
    600 stay held (quarantined); then containerd finishes the create. Q's 500 must not be handed the same GPU:
    the late container is adopted before Q's reservation, and freed with it."""
    caplog.set_level(logging.DEBUG)
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    q = request(
        container="c", grant={"c": ["GPU-0"]}, shares={"c": {"GPU-0": Share(500)}}, uid="Q", sandbox="sq"
    )
    runtime.sandbox_uids["sq"] = "Q"

    async def run() -> None:
        _, done = await rewriter.create_container(
            request(grant={"app": ["GPU-0"]}, shares={"app": {"GPU-0": Share(600)}})
        )
        done(None, True)  # type: ignore[misc]
        assert await rewriter.reconcile_unknown("sb")  # no container yet: the 600 stay held
        assert [(h.container_id, h.unknown) for h in rewriter.ledger.holdings()] == [("", True)]
        runtime.add("c-late", "sb", "app", 0, {"GPU-0": 600})
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(q)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "held by app of pod" in caught.value.message and "c-late" in caught.value.message
        assert [(h.container_id, h.milli) for h in rewriter.ledger.holdings()] == [("c-late", 600)]
        rewriter.removed_container("c-late")
        runtime.containers.clear()
        await rewriter.create_container(q)

    asyncio.run(run())
    assert events(caplog, "ledger.adopted") == [
        (
            logging.WARNING,
            {"container": "c-late", "pod_uid": UID, "name": "app", "attempt": 0, "devices": ["GPU-0"]},
        )
    ]


def test_a_late_container_takes_the_place_of_its_unknown_holding_and_counts_once(tmp_path: Path) -> None:
    """The outcome is still unknown when containerd's container shows up: adopting it replaces
    the unknown 600 rather than adding 600 more, so Q's 400 fits."""
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    runtime.sandbox_uids["sq"] = "Q"

    async def run() -> None:
        _, done = await rewriter.create_container(
            request(grant={"app": ["GPU-1"]}, shares={"app": {"GPU-1": Share(600)}})
        )
        done(None, True)  # type: ignore[misc]
        runtime.add("c-late", "sb", "app", 0, {"GPU-1": 600})
        q = request(
            container="c", grant={"c": ["GPU-1"]}, shares={"c": {"GPU-1": Share(400)}}, uid="Q", sandbox="sq"
        )
        _, q_done = await rewriter.create_container(q)
        q_done("c-q", False)  # type: ignore[misc]
        assert sorted((h.container_id, h.milli, h.unknown) for h in rewriter.ledger.holdings()) == [
            ("c-late", 600, False),
            ("c-q", 400, False),
        ]

    asyncio.run(run())


def test_an_in_flight_create_is_not_adopted_twice(tmp_path: Path) -> None:
    """containerd has made P's container and the answer is on its way: another create's adoption
    pass must leave it to P's own commit, or P would count twice until then."""
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    runtime.sandbox_uids["sq"] = "Q"

    async def run() -> None:
        _, done = await rewriter.create_container(
            request(grant={"app": ["GPU-1"]}, shares={"app": {"GPU-1": Share(600)}})
        )
        runtime.add("c-p", "sb", "app", 0, {"GPU-1": 600})  # made; P's completion not run yet
        q = request(
            container="c", grant={"c": ["GPU-1"]}, shares={"c": {"GPU-1": Share(400)}}, uid="Q", sandbox="sq"
        )
        await rewriter.create_container(q)
        done("c-p", False)  # type: ignore[misc]
        assert sorted((h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.pod_uid == UID) == [
            ("c-p", 600)
        ]

    asyncio.run(run())


def test_a_container_made_after_a_restarts_rebuild_is_adopted(tmp_path: Path) -> None:
    """The shim restarted while containerd was still making P's container: the rebuild did not
    list it. It is adopted before the next reservation."""
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.sandbox_uids["sq"] = "Q"
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        await rewriter.rebuild()
        runtime.add("c-late", "sb", "app", 0, {"GPU-0": 1000})
        q = request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(q)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION and "c-late" in caught.value.message

    asyncio.run(run())


def test_adoption_skips_foreign_marks_and_goes_on_when_the_runtime_cannot_be_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rewriter = rewriter_for(sim_node(tmp_path))

    class Down(FakeRuntime):
        async def ListContainers(self, req: object, timeout: float | None = None) -> object:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), ""
            )

    runtime = FakeRuntime()
    runtime.add("c-forged", "sx", "app", 0, {"GPU-0": 1000})
    runtime.sandbox_uids["sx"] = "X"  # the mark names pod UID, the sandbox is X's
    rewriter._runtime = runtime  # type: ignore[assignment]
    q = request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")
    asyncio.run(rewriter.create_container(q))
    assert [h.container_id for h in rewriter.ledger.holdings()] == [""]
    assert events(caplog, "ledger.foreign_mark") == [
        (
            logging.WARNING,
            {
                "container": "c-forged",
                "sandbox": "sx",
                "sandbox_pod_uid": "X",
                "name": "app",
                "mark_pod_uid": UID,
                "mark_container": "app",
                "devices": ["GPU-0"],
            },
        )
    ]
    rewriter._runtime = Down()  # type: ignore[assignment]
    asyncio.run(
        rewriter.create_container(request(container="d", grant={"d": ["GPU-1"]}, uid="Q", sandbox="sq"))
    )
    assert events(caplog, "ledger.adopt_failed") == [(logging.WARNING, {"code": "UNAVAILABLE"})]


GIB = 1024


def test_shares_whose_memory_adds_up_past_the_gpus_are_refused(tmp_path: Path) -> None:
    """Shares of a 23 GiB GPU: milli are checked against 1000 and memory against the GPU's 23 GiB.
    A share given by milli alone takes its fraction of the memory (as the scheduler books it); a
    share asking for more than the whole GPU is refused by itself; up to exactly the GPU's memory
    fits; a GPU whose memory is unknown is checked by milli only."""
    node = NodeDevices([Flaky(failures=0, gpus=1, memory_mib=23 * GIB)], sysfs_root=None)
    node.discover()
    rewriter = rewriter_for(node)
    runtime = FakeRuntime()  # the holders in the way are live containers
    rewriter._runtime = runtime  # type: ignore[assignment]
    runtime.containers.extend(api_pb2.Container(id=holder) for holder in ("c-p", "c-h1", "c-h2"))

    def share(pod: str, milli: int, memory: int) -> api_pb2.CreateContainerRequest:
        return request(
            grant={"app": ["GPU-0"]},
            shares={"app": {"GPU-0": Share(milli, memory)}},
            uid=pod,
            sandbox=f"s-{pod}",
        )

    async def refused(req: api_pb2.CreateContainerRequest) -> str:
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(req)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        return caught.value.message

    async def run() -> None:
        too_big = await refused(share("big", 100, 92 * GIB))
        assert "GPU-0 asks for 94208 MiB of memory, the device has 23552 MiB" in too_big
        assert rewriter.ledger.holdings() == []
        _, p_done = await rewriter.create_container(share("P", 500, 23 * GIB))
        p_done("c-p", False)  # type: ignore[misc]
        by_milli = await refused(share("Q", 300, 0))  # 300 milli of 23 GiB: 7065 MiB more
        assert "GPU-0 is held by app of pod P (c-p)" in by_milli
        assert "GPU memory would add up to 30617 MiB, more than its 23552 MiB" in by_milli
        assert "add up to 24576 MiB" in await refused(share("R", 100, 1 * GIB))
        rewriter.removed_container("c-p")
        _, half = await rewriter.create_container(share("H1", 400, 11776))
        half("c-h1", False)  # type: ignore[misc]
        _, other_half = await rewriter.create_container(share("H2", 400, 11776))  # exactly 23 GiB
        other_half("c-h2", False)  # type: ignore[misc]
        assert "add up to 23553 MiB" in await refused(share("one-more", 100, 1))
        node.devices["GPU-0"] = replace(node.devices["GPU-0"], memory_mib=0)  # memory not known
        await rewriter.create_container(share("unknown", 100, 1))

    asyncio.run(run())


def test_the_shares_memory_is_marked_and_counts_after_a_rebuild(tmp_path: Path) -> None:
    """The mark carries a share's memory where the allocation set one, so a restarted shim counts
    it; a mark without memory (a share by milli, or an earlier shim's) reads as before."""
    node = NodeDevices([Flaky(failures=0, gpus=1, memory_mib=23 * GIB)], sysfs_root=None)
    node.discover()
    created, _ = asyncio.run(
        rewriter_for(node).create_container(
            request(grant={"app": ["GPU-0"]}, shares={"app": {"GPU-0": Share(200, 20 * GIB)}})
        )
    )
    mark = created.config.annotations[MARK_ANNOTATION]
    assert mark == mark_value(UID, "app", {"GPU-0": 200}, {"GPU-0": 20 * GIB})
    assert parse_mark(mark) == (UID, "app", {"GPU-0": 200}, {"GPU-0": 20480}, frozenset())
    assert parse_mark(mark_value(UID, "app", {"GPU-0": 200}, {"GPU-0": 0})) == (
        UID,
        "app",
        {"GPU-0": 200},
        {},
        frozenset(),
    )
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.add("c-p", "sb", "app", 0, {"GPU-0": 200})
    runtime.containers[-1].annotations[MARK_ANNOTATION] = mark
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    assert [(h.container_id, h.milli, h.memory_mib) for h in rewriter.ledger.holdings()] == [
        ("c-p", 200, 20480)
    ]
    q = request(
        container="c",
        grant={"c": ["GPU-0"]},
        shares={"c": {"GPU-0": Share(200, 4 * GIB)}},
        uid="Q",
        sandbox="sq",
    )
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(q))
    assert "add up to 24576 MiB, more than its 23552 MiB" in caught.value.message


@pytest.mark.parametrize(
    "memory",
    [{"GPU-9": 5}, {"GPU-0": 0}, {"GPU-0": -1}, {"GPU-0": "5"}, {"GPU-0": True}, ["GPU-0"]],
)
def test_a_mark_with_bad_memory_is_not_ours(memory: object) -> None:
    value = json.dumps({"pod": UID, "container": "app", "devices": {"GPU-0": 200}, "memoryMiB": memory})
    assert parse_mark(value) is None


def test_a_gpu_whose_create_may_still_complete_is_not_granted_again(tmp_path: Path) -> None:
    """Issue #20: P's create of a whole GPU fails ambiguously; about 2 s later the shim finds no
    container; then containerd finishes P's create after all. Q must not have been handed the
    GPU meanwhile: P's holding stays quarantined until its container shows up (then adopted in
    its place, counted once) or P's sandbox goes."""
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    runtime.sandbox_uids["sq"] = "Q"
    q = request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")

    async def run() -> None:
        _, done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        done(None, True)  # type: ignore[misc]
        assert await rewriter.reconcile_unknown("sb")  # no container (yet)
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(q)
        assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert (
            "GPU-0 is held by app of pod" in caught.value.message
            and "outcome unknown" in caught.value.message
        )
        runtime.add("c-late", "sb", "app", 0, {"GPU-0": 1000})  # containerd finishes P's create
        await rewriter.create_container(request(container="r", grant={"r": ["GPU-1"]}, uid="R", sandbox="sr"))
        on_gpu0 = [(h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.device == "GPU-0"]
        assert on_gpu0 == [("c-late", 1000)]
        with pytest.raises(Rejected):
            await rewriter.create_container(q)
        rewriter.removed_sandbox("sb")
        runtime.containers.clear()
        _, q_done = await rewriter.create_container(q)
        q_done("c-q", False)  # type: ignore[misc]

    asyncio.run(run())


def test_a_quarantined_create_is_settled_by_its_retry_or_its_sandbox_only(tmp_path: Path) -> None:
    """Once a retry of the same create (same sandbox, container name and attempt) has made its
    container, containerd can no longer finish the earlier one (it reserves the name): the
    quarantined holding goes, and P counts once. A create of another attempt or another sandbox
    settles nothing; removing the sandbox settles everything of it."""
    rewriter, _ = rewriter_on_fake_runtime(tmp_path)
    share = {"app": {"GPU-0": Share(600)}}

    async def run() -> None:
        _, first = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share))
        first(None, True)  # type: ignore[misc]
        _, other_attempt = await rewriter.create_container(
            request(grant={"app": ["GPU-0"]}, shares=share, attempt=1)
        )
        other_attempt("c-1", False)  # type: ignore[misc]
        _, other_sandbox = await rewriter.create_container(
            request(grant={"app": ["GPU-0"]}, shares=share, sandbox="sb2")
        )
        other_sandbox("c-sb2", False)  # type: ignore[misc]
        held = sorted(
            (h.sandbox_id, h.container_id, h.attempt, h.unknown) for h in rewriter.ledger.holdings()
        )
        assert held == [("sb", "", 0, True), ("sb", "c-1", 1, False), ("sb2", "c-sb2", 0, False)]
        _, retry = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share))
        _, concurrent = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share))
        retry("c-0", False)  # type: ignore[misc]
        held = sorted((h.sandbox_id, h.container_id, h.unknown) for h in rewriter.ledger.holdings())
        # A create still in flight is left to its own answer (containerd refuses it the name).
        assert held == [
            ("sb", "", False),
            ("sb", "c-0", False),
            ("sb", "c-1", False),
            ("sb2", "c-sb2", False),
        ]
        concurrent(None, False)  # type: ignore[misc]
        _, again = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, shares=share, attempt=2))
        again(None, True)  # type: ignore[misc]
        rewriter.removed_sandbox("sb")
        assert [h.container_id for h in rewriter.ledger.holdings()] == ["c-sb2"]

    asyncio.run(run())


def test_adoption_never_books_a_device_past_its_capacity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shim restarted while containerd was making P's container (whole GPU-0): the rebuild did
    not see it and Q got GPU-0. When P's container turns up it is not booked beside Q's (that
    would be 2000 milli): the adoption is refused and reported once, naming pod, container and
    device; once Q's container has exited, P's fits and is adopted."""
    caplog.set_level(logging.DEBUG)
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.sandbox_uids["sq"] = "Q"
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        await rewriter.rebuild()
        _, q_done = await rewriter.create_container(
            request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")
        )
        q_done("c-q", False)  # type: ignore[misc]
        runtime.containers.append(
            api_pb2.Container(id="c-q", pod_sandbox_id="sq", state=api_pb2.CONTAINER_RUNNING)
        )
        runtime.add("c-late", "sb", "app", 0, {"GPU-0": 1000})
        for name in ("r", "s"):  # two reservations, two adoption passes
            _, done = await rewriter.create_container(
                request(container=name, grant={name: ["GPU-1"]}, uid=name, sandbox=f"s{name}")
            )
            done(None, False)  # type: ignore[misc]
        on_gpu0 = [(h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.device == "GPU-0"]
        assert on_gpu0 == [("c-q", 1000)]
        assert (
            list(rewriter.overbooked) == ["c-late"]
            and "held by c of pod Q (c-q)" in rewriter.overbooked["c-late"]
        )
        with pytest.raises(Rejected) as start:  # it must not start with a GPU that is Q's
            rewriter.start_container("c-late")
        assert start.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert "container c-late was created for devices that are not its own now" in start.value.message
        rewriter.start_container("c-q")
        runtime.containers[0].state = api_pb2.CONTAINER_EXITED  # Q's container is done
        _, done = await rewriter.create_container(
            request(container="t", grant={"t": ["GPU-1"]}, uid="T", sandbox="st")
        )
        on_gpu0 = [(h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.device == "GPU-0"]
        assert on_gpu0 == [("c-late", 1000)] and rewriter.overbooked == {}
        rewriter.start_container("c-late")  # its own now
        rewriter.overbooked["c-gone"] = "refused earlier"
        rewriter.removed_container("c-gone")  # removed: nothing left to refuse
        assert rewriter.overbooked == {}

    asyncio.run(run())
    [(level, refused)] = events(caplog, "ledger.adopt_refused")
    assert level == logging.ERROR
    assert (refused["container"], refused["pod_uid"], refused["name"], refused["devices"]) == (
        "c-late",
        UID,
        "app",
        ["GPU-0"],
    )
    assert "GPU-0 is held by c of pod Q (c-q)" in str(refused["reason"])
    assert [f["container"] for _, f in events(caplog, "ledger.adopted")] == ["c-late"]


# --- found containers that do not fit, the runtime's deadlines (mutation survivors of make mutate-node)

ADOPT_REFUSED_NOTE = "not booked past capacity; StartContainer is refused for it until it fits"


def marked(
    container_id: str,
    sandbox: str,
    pod_uid: str,
    devices: dict[str, int],
    state: int = api_pb2.CONTAINER_RUNNING,
    created_at: int = 0,
    memory: dict[str, int] | None = None,
    attempt: int = 0,
) -> api_pb2.Container:
    """A live container the shim rewrote for ``pod_uid``'s container "app" (its mark says so)."""
    return api_pb2.Container(
        id=container_id,
        pod_sandbox_id=sandbox,
        metadata=api_pb2.ContainerMetadata(name="app", attempt=attempt),
        state=state,  # type: ignore[arg-type]
        created_at=created_at,
        annotations={MARK_ANNOTATION: mark_value(pod_uid, "app", devices, memory)},
    )


def refused_event(
    container_id: str, pod_uid: str, devices: list[str], reason: str, attempt: int = 0
) -> object:
    return (
        logging.ERROR,
        {
            "container": container_id,
            "pod_uid": pod_uid,
            "name": "app",
            "attempt": attempt,
            "devices": devices,
            "reason": reason,
            "note": ADOPT_REFUSED_NOTE,
        },
    )


def test_a_rebuild_books_running_containers_first_then_the_oldest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart the shim books what containerd lists as adoptions are booked: a running
    container uses its devices now and comes first, then the oldest. One that does not fit is
    not booked, is reported once, and its start is refused with what to do."""
    caplog.set_level(logging.DEBUG)
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.containers.extend(
        [
            marked("c-created", "sp", "P", {"GPU-0": 1000}, api_pb2.CONTAINER_CREATED, 1, attempt=2),
            marked("c-running", "sq", "Q", {"GPU-0": 1000}, api_pb2.CONTAINER_RUNNING, 2),
            marked("c-newer", "sr", "R", {"GPU-1": 1000}, api_pb2.CONTAINER_CREATED, 4),
            marked("c-older", "ss", "S", {"GPU-1": 1000}, api_pb2.CONTAINER_CREATED, 3),
        ]
    )
    runtime.sandbox_uids.update(sp="P", sq="Q", sr="R", ss="S")
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    held = sorted((h.device, h.container_id) for h in rewriter.ledger.holdings())
    assert held == [("GPU-0", "c-running"), ("GPU-1", "c-older")]
    on_gpu0, on_gpu1 = (
        "device GPU-0 is held by app of pod Q (c-running)",
        "device GPU-1 is held by app of pod S (c-older)",
    )
    assert rewriter.overbooked == {"c-created": on_gpu0, "c-newer": on_gpu1}
    assert events(caplog, "ledger.adopt_refused") == [
        refused_event("c-created", "P", ["GPU-0"], on_gpu0, attempt=2),
        refused_event("c-newer", "R", ["GPU-1"], on_gpu1),
    ]
    with pytest.raises(Rejected) as start:
        rewriter.start_container("c-created")
    assert start.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert start.value.message == (
        f"container c-created was created for devices that are not its own now ({on_gpu0}); "
        "remove it, kubelet creates the container anew"
    )
    rewriter.start_container("c-running")


def test_a_rebuild_checks_the_shares_memory_and_counts_a_share_by_milli_at_its_fraction(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node = NodeDevices([Flaky(failures=0, gpus=2, memory_mib=23 * GIB)], sysfs_root=None)
    node.discover()
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.containers.extend(
        [
            marked("c-p", "sp", "P", {"GPU-0": 400}, created_at=1, memory={"GPU-0": 20 * GIB}),
            marked("c-q", "sq", "Q", {"GPU-0": 400}, created_at=2, memory={"GPU-0": 20 * GIB}),
            marked("c-m", "sm", "M", {"GPU-1": 500}, created_at=3),  # a share by milli: half of 23 GiB
        ]
    )
    runtime.sandbox_uids.update(sp="P", sq="Q", sm="M")
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    assert sorted(h.container_id for h in rewriter.ledger.holdings()) == ["c-m", "c-p"]
    assert rewriter.overbooked == {
        "c-q": "device GPU-0 is held by app of pod P (c-p): their GPU memory would add up to 40960 MiB, "
        "more than its 23552 MiB"
    }
    twelve = request(
        container="c",
        grant={"c": ["GPU-1"]},
        shares={"c": {"GPU-1": Share(400, 12 * GIB)}},
        uid="T",
        sandbox="st",
    )
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(twelve))
    assert caught.value.message.endswith("would add up to 24064 MiB, more than its 23552 MiB")


def test_a_rebuild_before_discovery_books_shares_by_milli_alone(tmp_path: Path) -> None:
    """The shim restarted and the driver is not up yet: the GPUs' memory is not known, so the
    shares found are booked by milli (as any share on a GPU of unknown memory), none refused."""
    node = NodeDevices([Flaky(failures=10**6, gpus=1, memory_mib=23 * GIB)], sysfs_root=None)
    rewriter = AllocationRewriter(NODE, node, KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.containers.extend(
        marked(f"c-{pod}", f"s{pod}", pod, {"GPU-0": 400}, memory={"GPU-0": 20 * GIB}) for pod in "PQ"
    )
    runtime.sandbox_uids.update(sP="P", sQ="Q")
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    assert sorted(h.container_id for h in rewriter.ledger.holdings()) == ["c-P", "c-Q"]
    assert rewriter.overbooked == {}


def test_a_create_answering_after_its_sandbox_went_is_not_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """P's create of GPU-0 is in flight when P's sandbox is removed and Q gets GPU-0; then
    containerd answers with P's container. It is not booked beside Q's, it is reported, and its
    start is refused."""
    caplog.set_level(logging.DEBUG)
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)

    async def run() -> None:
        _, p_done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}, attempt=1))
        rewriter.removed_sandbox("sb")
        _, q_done = await rewriter.create_container(
            request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")
        )
        q_done("c-q", False)  # type: ignore[misc]
        p_done("c-p", False)  # type: ignore[misc]

    asyncio.run(run())
    assert [h.container_id for h in rewriter.ledger.holdings()] == ["c-q"]
    reason = "device GPU-0 is held by c of pod Q (c-q)"
    assert events(caplog, "ledger.adopt_refused") == [refused_event("c-p", UID, ["GPU-0"], reason, attempt=1)]
    with pytest.raises(Rejected) as start:
        rewriter.start_container("c-p")
    assert reason in start.value.message
    rewriter.start_container("c-q")


def test_a_container_found_for_a_quarantined_create_whose_sandbox_went_meanwhile_is_not_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reconciliation asks containerd for P's container; while it answers, P's sandbox is removed
    and Q's container takes GPU-0. The container found is not booked beside Q's, nor started."""
    caplog.set_level(logging.DEBUG)
    rewriter = rewriter_for(sim_node(tmp_path))

    class Answering(FakeRuntime):
        async def ListContainers(self, req: object, timeout: float | None = None) -> object:
            listing = await super().ListContainers(req, timeout)  # type: ignore[arg-type]
            if req.filter.pod_sandbox_id == "sb":  # type: ignore[attr-defined]
                rewriter.removed_sandbox("sb")
                assert not rewriter.ledger.try_reserve([Holding("c-q", "sq", "Q", "c", "GPU-0", 1000)])
            return listing

    runtime = Answering()
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        _, done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        done(None, True)  # type: ignore[misc]
        runtime.add("c-p", "sb", "app", 0, {"GPU-0": 1000})
        assert await rewriter.reconcile_unknown("sb")

    asyncio.run(run())
    assert [h.container_id for h in rewriter.ledger.holdings()] == ["c-q"]
    reason = "device GPU-0 is held by c of pod Q (c-q)"
    assert events(caplog, "ledger.adopt_refused") == [refused_event("c-p", UID, ["GPU-0"], reason)]
    with pytest.raises(Rejected):
        rewriter.start_container("c-p")


def test_a_create_made_before_a_restart_and_retried_after_it_counts_once(tmp_path: Path) -> None:
    """containerd made P's container (a 600 share) while the shim restarted: the rebuild books it
    from its mark. kubelet, which never had the answer, retries the create (same attempt) and the
    retry runs past its deadline too ("name is reserved"). That is one container at most: Q's 400
    fits, R's 1 does not."""
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    runtime.add("c-p", "sb", "app", 0, {"GPU-0": 600})
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        await rewriter.rebuild()
        _, retry = await rewriter.create_container(
            request(grant={"app": ["GPU-0"]}, shares={"app": {"GPU-0": Share(600)}})
        )
        retry(None, True)  # type: ignore[misc]
        held = sorted((h.container_id, h.milli, h.unknown) for h in rewriter.ledger.holdings())
        assert held == [("", 600, True), ("c-p", 600, False)]
        q = request(
            container="c", grant={"c": ["GPU-0"]}, shares={"c": {"GPU-0": Share(400)}}, uid="Q", sandbox="sq"
        )
        await rewriter.create_container(q)
        r = request(
            container="d", grant={"d": ["GPU-0"]}, shares={"d": {"GPU-0": Share(1)}}, uid="R", sandbox="sr"
        )
        with pytest.raises(Rejected) as caught:
            await rewriter.create_container(r)
        assert f"device GPU-0 is held by app of pod {UID} (" in caught.value.message  # once

    asyncio.run(run())


def test_a_create_refused_on_several_devices_names_each(tmp_path: Path) -> None:
    rewriter = rewriter_for(sim_node(tmp_path))
    for gpu, pod in (("GPU-0", "Q"), ("GPU-1", "R")):
        assert not rewriter.ledger.try_reserve([Holding("", f"s{pod}", pod, "c", gpu, 1000)])
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter.create_container(request(grant={"app": ["GPU-0", "GPU-1"]})))
    assert caught.value.message == (
        "pod default/p container app: device GPU-0 is held by c of pod Q (creating); "
        "device GPU-1 is held by c of pod R (creating)"
    )


def test_any_known_gpu_memory_bounds_a_share(tmp_path: Path) -> None:
    """0 is a GPU whose memory is not known; any other figure, however small, is checked."""
    node = NodeDevices([Flaky(failures=0, gpus=1, memory_mib=1)], sysfs_root=None)
    node.discover()
    create = request(grant={"app": ["GPU-0"]}, shares={"app": {"GPU-0": Share(100, 2)}})
    with pytest.raises(Rejected) as caught:
        asyncio.run(rewriter_for(node).create_container(create))
    assert caught.value.message == (
        "pod default/p container app: the share of device GPU-0 asks for 2 MiB of memory, "
        "the device has 1 MiB"
    )


def test_every_runtime_call_is_bounded(tmp_path: Path) -> None:
    """A stuck containerd must not hang the shim: every call it makes (the rebuild's lists, an
    adoption pass, the liveness of a holder in the way, a reconciliation) has a deadline."""
    rewriter = AllocationRewriter(NODE, sim_node(tmp_path), KeyRing(None, SIGNING))
    runtime = FakeRuntime()
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        await rewriter.rebuild()
        _, done = await rewriter.create_container(request(container="u", grant={"u": ["GPU-1"]}))
        done(None, True)  # type: ignore[misc]
        runtime.containers.append(marked("c-a", "sb", UID, {"GPU-0": 1000}))  # a stray: adopted
        for name, gpu in (("w", "GPU-0"), ("v", "GPU-1")):  # in the way: a live holder, an unknown one
            with pytest.raises(Rejected):
                await rewriter.create_container(request(container=name, grant={name: [gpu]}))

    asyncio.run(run())
    assert {method for method, _ in runtime.calls} == {"ListContainers", "ListPodSandbox", "ContainerStatus"}
    assert all(t is not None and 0 < t <= 30 for _, t in runtime.calls), runtime.calls


def test_the_managed_set_follows_the_host_while_discovery_keeps_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Until discovery succeeds, every round refreshes the managed set from the plugins' patterns:
    a device node that appears meanwhile is scrubbed by its number too. A refresh that fails is
    logged."""
    caplog.set_level(logging.DEBUG)
    dev = tmp_path / "dev"
    dev.mkdir()

    class Down(Flaky):
        def __init__(self) -> None:
            super().__init__(failures=10**9, gpus=1)
            self.broken = False

        @property
        def device_patterns(self) -> tuple[str, ...]:
            if self.broken:
                raise RuntimeError("cannot list patterns")
            return (f"{dev}/late*",)

    plugin = Down()
    node = NodeDevices([plugin], sysfs_root=None)
    rewriter = rewriter_for(node)
    (dev / "late0").symlink_to("/dev/zero")  # appears after the shim started
    assert DeviceNumber(CHAR, 1, 5) not in node.managed.numbers

    async def rounds(count: int) -> None:
        upkeep = asyncio.create_task(rewriter.maintain_devices(0.01))
        start = plugin.calls
        for _ in range(500):
            if plugin.calls >= start + count:  # the rounds between these discoveries are done
                break
            await asyncio.sleep(0.01)
        upkeep.cancel()

    asyncio.run(rounds(2))
    assert not node.discovered and DeviceNumber(CHAR, 1, 5) in node.managed.numbers
    assert events(caplog, "devices.managed_refresh_failed") == []
    plugin.broken = True
    asyncio.run(rounds(2))
    assert events(caplog, "devices.managed_refresh_failed")[0] == (
        logging.WARNING,
        {"node": NODE, "error": "cannot list patterns"},
    )


def test_a_container_found_after_its_sandbox_went_is_booked_again_and_its_share_enforced(
    tmp_path: Path,
) -> None:
    """Reconciliation asks containerd for P's container (a 500 share); while it answers, P's
    sandbox is removed (its share is dropped: the MPS watchdog is told). The container found
    exists and nobody else took the GPU: it is booked again, and the watchdog is told again,
    so that the share's daemon runs for it."""
    node = sim_node(tmp_path)
    rewriter = rewriter_for(node)

    class Sharing:  # stands in for crishim.mps.MpsSharing: counts the wake-ups
        pokes = 0

        def poke(self) -> None:
            self.pokes += 1

    class Answering(FakeRuntime):
        async def ListContainers(self, req: object, timeout: float | None = None) -> object:
            listing = await super().ListContainers(req, timeout)  # type: ignore[arg-type]
            if req.filter.pod_sandbox_id == "sb":  # type: ignore[attr-defined]
                rewriter.removed_sandbox("sb")
            return listing

    runtime = Answering()
    rewriter._runtime = runtime  # type: ignore[assignment]

    async def run() -> None:
        _, done = await rewriter.create_container(
            request(grant={"app": ["GPU-0"]}, shares={"app": {"GPU-0": Share(500)}})
        )
        done(None, True)  # type: ignore[misc]
        sharing = Sharing()
        node.sharing = sharing  # type: ignore[assignment]
        runtime.add("c-p", "sb", "app", 0, {"GPU-0": 500})
        assert await rewriter.reconcile_unknown("sb")
        assert [(h.container_id, h.milli) for h in rewriter.ledger.holdings()] == [("c-p", 500)]
        assert sharing.pokes == 2

    asyncio.run(run())


def test_the_nodes_discovery_places_nics_by_the_sysfs_it_is_given(tmp_path: Path) -> None:
    """The shim's discovery reads PCI placement under its sysfs root: which NIC is near which GPU
    is part of the inventory it publishes."""
    from devices.nvidia import NvidiaPlugin
    from devices.rdma import RdmaPlugin
    from tests.test_devices_affinity import _machine_nvml
    from tests.test_devices_rdma import build_machine

    build_machine(tmp_path)
    nvml = _machine_nvml()
    node = NodeDevices(
        [NvidiaPlugin(nvml=nvml, sysfs_root=str(tmp_path)), RdmaPlugin(str(tmp_path))], str(tmp_path)
    )
    node.discover()
    g0, _, g2 = nvml.uuids
    assert dict(node.current_inventory().topology.nic_gpus) == {
        "mlx5_0": (g0,),
        "mlx5_1": (g0,),
        "mlx5_2": (g0,),
        "mlx5_10": (g2,),
    }
