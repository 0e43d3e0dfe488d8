"""Hostile review of the NRI transport (crishim/nri): defects found by attacking the multiplexer,
ttrpc and the plugin session, each against the real containerd 2.x where containerd's behaviour is
what makes it a defect."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from crishim.cri import api_pb2 as cri
from crishim.hostpaths import CHAR, DeviceNumber, ManagedDevices
from crishim.nri import api_pb2
from crishim.nri.mux import HEADER, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux, chunks
from crishim.nri.plugin import PluginSession
from crishim.nri.ttrpc import RESOURCE_EXHAUSTED, Endpoint, RpcError
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from tests.support.crisandboxes import remove_sandbox
from tests.test_nri_transport import (
    PLUGIN,
    PluginThread,
    Recorder,
    create_in_new_sandbox,
    mux_on_socketpair,
    nri_containerd,
    started_output,
    wait_until,
)

__all__ = ["nri_containerd"]  # the module fixture, shared with tests/test_nri_transport.py


class SlowRecorder(Recorder):
    """A CreateContainer handler stuck past containerd's request timeout (2 s) while ``delay`` is."""

    delay = 3.5

    async def create_container(  # type: ignore[override]
        self, request: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        await asyncio.sleep(self.delay)
        return super().create_container(request)


def try_create(client: CriClient, logs: Path, name: str) -> tuple[str, str | grpc.RpcError, str]:
    """(sandbox id, container id or the create's error, the container's log path)."""
    config = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(logs))
    sandbox = client.runtime.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    request = cri.CreateContainerRequest(
        pod_sandbox_id=sandbox,
        sandbox_config=config,
        config=shell_container("app", BUSYBOX_IMAGE, "env; echo END", log_path=f"{name}.log"),
    )
    try:
        return sandbox, client.runtime.CreateContainer(request, timeout=60).container_id, f"{name}.log"
    except grpc.RpcError as error:
        return sandbox, error, f"{name}.log"


@pytest.mark.containerd
def test_a_handler_slower_than_containerds_timeout_fails_the_create_instead_of_skipping_the_plugin(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """containerd treats a plugin's DEADLINE_EXCEEDED as fatal: it drops the plugin and creates the
    container WITHOUT its adjustment (the required-plugin check already counted it present). The
    plugin must answer with an error of its own before containerd's deadline, so the create fails
    closed."""
    assert nri_containerd.nri_socket is not None
    client = CriClient(nri_containerd.endpoint)
    handlers = SlowRecorder()
    plugin = PluginThread(PluginSession(handlers, socket=nri_containerd.nri_socket, name=PLUGIN))
    sandboxes = []
    try:
        plugin.synchronize()
        sandbox, made, _ = try_create(client, tmp_path, "slow")
        sandboxes.append(sandbox)
        assert isinstance(made, grpc.RpcError), "container created without the plugin's adjustment"
        assert "not done in" in (made.details() or ""), made.details()
        handlers.delay = 0  # the same session, still connected, adjusts the next create
        sandbox, made, log = try_create(client, tmp_path, "fast")
        sandboxes.append(sandbox)
        assert isinstance(made, str), made
        assert [name for _, name, _ in handlers.created] == ["app"]
    finally:
        for sandbox in sandboxes:
            remove_sandbox(client, sandbox)
        client.close()
        plugin.stop()


class SyncOnly:
    """Handlers for no event at all: the plugin only wants Synchronize's snapshot."""

    def __init__(self) -> None:
        self.synced: list[tuple[int, int]] = []

    def synchronize(self, pods: list, containers: list) -> None:
        self.synced.append((len(pods), len(containers)))


@pytest.mark.containerd
def test_a_plugin_with_no_event_handlers_does_not_break_container_creation(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """NRI reads an event mask of 0 as "every event": containerd then sends CreateContainer (and
    the rest) to a plugin that serves none of them, and every create fails UNIMPLEMENTED."""
    assert nri_containerd.nri_socket is not None
    client = CriClient(nri_containerd.endpoint)
    handlers = SyncOnly()
    plugin = PluginThread(PluginSession(handlers, socket=nri_containerd.nri_socket, name=PLUGIN))
    sandbox = ""
    try:
        plugin.synchronize()
        assert handlers.synced
        sandbox, made, _ = try_create(client, tmp_path, "no-events")
        assert isinstance(made, str), made
    finally:
        if sandbox:
            remove_sandbox(client, sandbox)
        client.close()
        plugin.stop()


def test_bytes_for_a_connection_nobody_opened_are_dropped_not_kept() -> None:
    """NRI's multiplexer drops chunks for a connection id not opened on its side. Ours kept them in
    a new channel's buffer that nobody reads: a peer could grow the plugin's memory without bound."""

    async def scenario() -> None:
        left, right = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=left)
        mux = Mux(reader, writer)
        opened = mux.channel(PLUGIN_SERVICE_CONN)
        mux.start()
        right.setblocking(False)
        loop = asyncio.get_running_loop()
        for conn_id in range(3, 40):
            for piece in chunks(conn_id, b"z" * 65536):
                await loop.sock_sendall(right, piece)
        await loop.sock_sendall(right, HEADER.pack(PLUGIN_SERVICE_CONN, 2) + b"ok")
        assert await asyncio.wait_for(opened.reader.readexactly(2), 2) == b"ok"
        late = mux.channel(3)  # opened after its bytes came: they are not there
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(late.reader.read(1), 0.2)
        right.close()
        await mux.close()

    asyncio.run(scenario())


def test_a_call_too_big_for_ttrpc_fails_as_an_rpc_error() -> None:
    """``Endpoint.call`` promises its result or RpcError; a payload over ttrpc's 4 MiB escaped as a
    bare ValueError (ttrpc's Go client answers RESOURCE_EXHAUSTED)."""

    async def scenario() -> None:
        mux, right = await mux_on_socketpair()
        endpoint = Endpoint(mux.channel(RUNTIME_SERVICE_CONN), None, name="runtime")
        endpoint.start()
        try:
            with pytest.raises(RpcError) as error:
                await endpoint.call("s", "m", b"x" * (5 << 20), 1)
            assert error.value.code == RESOURCE_EXHAUSTED
        finally:
            await endpoint.close()
            await mux.close()
            right.close()

    asyncio.run(scenario())


# --- the agent's validation against other NRI plugins (crishim/nri/agent.py, front.foreign_grant) ---


def _other_plugins_grant(kind: str) -> api_pb2.ContainerAdjustment:
    """What another NRI plugin (after kubegpu's) answers to reach a managed device, by ``kind``."""
    adjust = api_pb2.ContainerAdjustment()
    if kind == "cdi-device":
        adjust.CDI_devices.add(name="nvidia.com/gpu=all")
    elif kind == "toolkit-mount":
        adjust.mounts.add(
            destination="/var/run/nvidia-container-devices/all",
            type="bind",
            source="/tmp",
            options=["rbind", "ro"],
        )
    elif kind == "cgroup-rule":
        rule = adjust.linux.resources.devices.add(allow=True, type="c", access="rw")
        rule.major.value, rule.minor.value = 10, 229
    elif kind == "env-removal":
        adjust.env.add(key="-NVIDIA_VISIBLE_DEVICES")
    elif kind == "cdi-annotation":
        adjust.annotations["cdi.k8s.io/sneak"] = "nvidia.com/gpu=all"
    return adjust


class OtherPlugin:
    """An NRI plugin after kubegpu's (index 20) that adds ``kind`` to every container."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def create_container(self, request: api_pb2.CreateContainerRequest) -> api_pb2.CreateContainerResponse:
        return api_pb2.CreateContainerResponse(adjust=_other_plugins_grant(self.kind))


def _runtime_spec(client: CriClient, container: str) -> dict[str, object]:
    status = client.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=container, verbose=True))
    return dict(json.loads(status.info["info"])["runtimeSpec"])


@pytest.mark.containerd
@pytest.mark.parametrize(
    "kind",
    ["cdi-device", "toolkit-mount", "cgroup-rule", "env-removal", "cdi-annotation"],
)
def test_another_plugins_adjustment_cannot_bring_back_what_kubegpu_scrubbed(
    nri_containerd: Containerd, tmp_path: Path, kind: str
) -> None:
    """The agent's validation judged only the device nodes of the final adjustment. Another NRI
    plugin could still give the container what the scrub takes away, and containerd 2.2.9 made it:
    a managed CDI name (containerd resolves CDI names after every plugin answered: its device
    nodes never pass the validator), a toolkit device-list mount, a device cgroup allow rule after
    kubegpu's deny (the scrubbed node opened), the removal of kubegpu's NVIDIA_VISIBLE_DEVICES=void
    (NRI lets any plugin remove another's variable: the pod's own "all" came back), or a CDI
    annotation naming a GPU (read by the NVIDIA runtime). Each create must fail, naming why."""
    from tests.test_nri_agent import Pods, agent_for

    assert nri_containerd.nri_socket is not None
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "all", "containerEdits": {"env": ["CDI_GRANTED=all"]}}],
    }
    (nri_containerd.cdi_spec_dir / "review-nvidia.json").write_text(json.dumps(spec))
    agent = agent_for(tmp_path)
    node = agent.rewriter.node_devices
    fuse = DeviceNumber(CHAR, 10, 229)  # made managed here: the sim's own nodes are /dev/null's numbers
    node.managed = ManagedDevices(numbers=node.managed.numbers | {fuse}, patterns=node.managed.patterns)
    ours = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    other = PluginThread(
        PluginSession(OtherPlugin(kind), socket=nri_containerd.nri_socket, name="other", index="20")
    )
    pods = Pods(nri_containerd, tmp_path / "logs")
    try:
        ours.synchronize()
        other.synchronize()
        script = (
            "(exec 3<>/dev/grab) 2>/dev/null && echo opened; env; ls /var/run/nvidia-container-devices 2>&1; "
            "echo END; exec sleep 100000"
        )
        made = pods.create(
            "grab",
            None,
            envs={"NVIDIA_VISIBLE_DEVICES": "all"},
            devices=[("/dev/fuse", "/dev/grab")],
            script=script,
        )
        if isinstance(made, str):
            annotations = _runtime_spec(pods.client, made).get("annotations")
            out = pods.output(made, "grab")
            pytest.fail(f"created past kubegpu's validation ({kind}): annotations {annotations}\n{out}")
        details = made.details() or ""
        assert "an NRI plugin" in details and "kubegpu" in details, details
        assert not agent.rewriter.ledger.holdings(), "a refused create still holds its devices"
    finally:
        pods.close()
        other.stop()
        ours.stop()


def test_foreign_grant_judges_cgroup_rules_by_what_they_open() -> None:
    """The pure half of the validation fix: kubegpu's own answer passes; another plugin's rule for
    the granted GPU or an unmanaged device passes; a wildcard over the managed major does not,
    even when one of its minors is granted (it opens the others)."""
    from crishim.nri.front import foreign_grant

    managed = ManagedDevices(numbers=frozenset({DeviceNumber(CHAR, 195, 255)}), char_majors=frozenset({195}))
    ours = api_pb2.ContainerAdjustment()
    ours.env.add(key="NVIDIA_VISIBLE_DEVICES", value="GPU-1")
    ours.linux.devices.add(path="/dev/nvidia1", type="c", major=195, minor=1)

    def with_rule(major: int | None, minor: int | None) -> api_pb2.ContainerAdjustment:
        final = api_pb2.ContainerAdjustment()
        final.CopyFrom(ours)
        rule = final.linux.resources.devices.add(allow=True, type="c", access="rwm")
        if major is not None:
            rule.major.value = major
        if minor is not None:
            rule.minor.value = minor
        return final

    assert foreign_grant(ours, ours, managed) is None
    assert foreign_grant(with_rule(195, 1), ours, managed) is None
    assert foreign_grant(with_rule(10, 229), ours, managed) is None
    assert "c 195:*" in (foreign_grant(with_rule(195, None), ours, managed) or "")
    assert "c 195:0" in (foreign_grant(with_rule(195, 0), ours, managed) or "")
    assert foreign_grant(with_rule(None, None), ours, managed) is not None
    changed = api_pb2.ContainerAdjustment()
    changed.CopyFrom(ours)
    changed.env[0].value = "GPU-1,GPU-2"
    assert "NVIDIA_VISIBLE_DEVICES" in (foreign_grant(changed, ours, managed) or "")


@pytest.mark.apiserver
def test_a_container_the_pod_cache_has_not_seen_yet_is_read_from_the_api_not_waved_through(
    admin_api: Any, kube_namespace: str, tmp_path: Path
) -> None:
    """NRI shows no security context: the agent reads it from the Pod, from the node's pod cache
    when the cache has the pod. A container the cached copy does not have (an ephemeral container
    added by ``kubectl debug`` while the cache's watch is behind) was taken as neither privileged
    nor given CAP_SYS_ADMIN, so a debug container adding SYS_ADMIN was created where the CRI proxy,
    which reads the request itself, refuses it. Here the cache is stopped after it saw the pod
    (its watch as far behind as it can be) and the debug container is then added."""
    from kubernetes import client as k8s

    from crishim.nri.agent import NriAgent, pod_security
    from crishim.podlookup import ApiPodLookup, NodePodCache
    from crishim.rewrite import AllocationRewriter, NodeDevices
    from devices.registry import load_plugins
    from kubegpu.allocation import KeyRing
    from kubegpu.devenv.controlplane import create_fake_node
    from tests.fixtures.keys import SIGNING

    core = k8s.CoreV1Api(admin_api)
    node = f"nri-sec-{uuid.uuid4().hex[:6]}"
    create_fake_node(core, node)
    cache = NodePodCache(core, node).start()
    try:
        assert cache.synced.wait(30)
        body = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name="debugged", namespace=kube_namespace),
            spec=k8s.V1PodSpec(
                node_name=node,
                scheduler_name="nobody",
                containers=[k8s.V1Container(name="app", image="busybox")],
            ),
        )
        made = core.create_namespaced_pod(kube_namespace, body)
        wait_until(lambda: made.metadata.uid in cache._pods, 30, "the cache to see the pod")
    finally:
        cache.stop()
    sys_admin = {"capabilities": {"add": ["SYS_ADMIN"]}}
    debugger = {"name": "debugger", "image": "busybox", "securityContext": sys_admin}
    core.patch_namespaced_pod_ephemeralcontainers(
        "debugged", kube_namespace, {"spec": {"ephemeralContainers": [debugger]}}
    )

    plugins = load_plugins(["sim"], {"node_name": node, "topology": "dgx1-v100", "state_dir": str(tmp_path)})
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    lookup = ApiPodLookup(core, cache=cache)
    agent = NriAgent(AllocationRewriter(node, devices, KeyRing(None, SIGNING), lookup), pod_security(lookup))
    agent.rewriter.rebuilt.set()
    request = api_pb2.CreateContainerRequest(
        pod=api_pb2.PodSandbox(
            id="sandbox-1",
            name="debugged",
            uid=made.metadata.uid,
            namespace=kube_namespace,
            annotations={"kubernetes.io/config.source": "api"},
        ),
        container=api_pb2.Container(id="c-debugger", name="debugger", pod_sandbox_id="sandbox-1"),
    )
    with pytest.raises(RpcError) as refused:
        asyncio.run(agent.create_container(request))
    assert "SYS_ADMIN" in refused.value.message, refused.value.message


def _image_with_env(containerd: Containerd, ref: str, env: list[str]) -> None:
    """Import a busybox image whose config carries ``env`` (duplicates kept, as an image may)."""
    from kubegpu.devenv.images import (
        MEDIA_CONFIG,
        MEDIA_MANIFEST,
        Blob,
        Image,
        build_busybox_image,
        write_oci_tar,
    )

    base = build_busybox_image(ref, ["/bin/sh"])
    config_doc = json.loads(base.config.data)
    config_doc["config"]["Env"] = env
    config = Blob(MEDIA_CONFIG, json.dumps(config_doc, sort_keys=True).encode())
    manifest_doc = json.loads(base.manifest.data)
    manifest_doc["config"] = config.descriptor()
    manifest = Blob(MEDIA_MANIFEST, json.dumps(manifest_doc, sort_keys=True).encode())
    tar = write_oci_tar(Image(ref, manifest, config, base.layer), containerd.base / "dup-env.tar")
    containerd.run_ctr("images", "import", "--no-unpack", str(tar))


@pytest.mark.containerd
def test_an_image_naming_a_selector_twice_cannot_outlast_the_scrub(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """An image's config may list a variable twice (containerd keeps the image's duplicates). NRI's
    generator sets an adjusted variable at its first occurrence and then re-adds the later one over
    it, so kubegpu's NVIDIA_VISIBLE_DEVICES=void was replaced by the image's second "all" and the
    container was created selecting every GPU. A create whose environment names a variable the
    agent sets more than once is refused, naming it."""
    from tests.test_nri_agent import agent_for

    assert nri_containerd.nri_socket is not None
    image = "registry.kubegpu.test/dup-env:1.0"
    twice = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all"]
    _image_with_env(nri_containerd, image, ["PATH=/bin", *twice])
    agent = agent_for(tmp_path)
    ours = PluginThread(PluginSession(agent, socket=nri_containerd.nri_socket, name=PLUGIN))
    client = CriClient(nri_containerd.endpoint)
    logs = tmp_path / "logs"
    logs.mkdir()
    sandbox = ""
    try:
        ours.synchronize()
        sandbox, made = create_in_new_sandbox(client, logs, "dup", image, "env; echo END; exec sleep 100000")
        if isinstance(made, grpc.RpcError):
            assert "NVIDIA_VISIBLE_DEVICES" in (made.details() or ""), made.details()
            return
        output = "\n".join(started_output(client, made, logs / "app.log", "the container's output"))
        pytest.fail(f"created with the image's duplicate selector:\n{output}")
    finally:
        if sandbox:
            remove_sandbox(client, sandbox)
        client.close()
        ours.stop()


@pytest.mark.containerd
def test_an_nri_agent_without_api_access_says_it_cannot_check_capabilities(
    nri_containerd: Containerd, tmp_path: Path
) -> None:
    """Known limit (docs/nri.md): without API access the NRI front cannot see a container's
    capabilities, so CAP_SYS_ADMIN is not refused as the CRI proxy refuses it. It started silently;
    it now says so at start (``nri.security_unchecked``)."""
    from tests.fixtures.keys import write_node_keys
    from tests.test_nri_agent import start_agent

    keys = tmp_path / "keys"
    write_node_keys(keys)
    agent = start_agent(nri_containerd, tmp_path, keys)
    log = tmp_path / "agent.log"
    try:
        wait_until(lambda: "nri.registered" in log.read_text(), 60, "the agent to register")
        assert "nri.security_unchecked" in log.read_text(), log.read_text()[-2000:]
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(10)
