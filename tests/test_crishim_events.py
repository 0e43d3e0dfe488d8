"""The shim in front of containerd 2.x: the GetContainerEvents stream and a pod's lifecycle.

Debian's containerd 1.6 answers UNIMPLEMENTED to GetContainerEvents (the server-streaming call
kubelet's Evented PLEG keeps open; the last test shows it), so the other tests run against
containerd 2.x built by ``tests/containerd/build.sh`` (fixtures ``containerd2``, ``proxied2``,
``direct2``, ...; see docs/test-containerd.md).
Every call goes through ``kubegpu crishim`` (a real subprocess); the event stream seen through
the shim is compared with the one containerd sends to a direct subscriber.

containerd fans each event out to the subscribers of that moment (it keeps events for a
future subscriber only while nobody listens), so each test waits until its streams are open
at containerd before it makes the events it looks for.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, PULL_IMAGE
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess
from tests.support.crisandboxes import remove_sandbox
from tests.support.waiting import wait_for

pytestmark = pytest.mark.containerd

SandboxFactory = Callable[..., str]
Event = api_pb2.ContainerEventResponse

LIFECYCLE = [
    api_pb2.CONTAINER_CREATED_EVENT,
    api_pb2.CONTAINER_STARTED_EVENT,
    api_pb2.CONTAINER_STOPPED_EVENT,
    api_pb2.CONTAINER_DELETED_EVENT,
]
# Time for a stream, once the shim has it in flight, to be subscribed at containerd.
SUBSCRIBE_SETTLE = 0.5


class EventStream:
    """A GetContainerEvents call read on a thread; its events kept in arrival order."""

    def __init__(self, client: CriClient) -> None:
        self.call = client.runtime.GetContainerEvents(api_pb2.GetEventsRequest())
        self.events: list[Event] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="container-events", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        except grpc.RpcError:
            pass  # the call's code() tells how it ended

    def about(self, *ids: str) -> list[Event]:
        """The events received so far for these container or sandbox ids."""
        with self._changed:
            return [event for event in self.events if event.container_id in ids]

    def types(self, object_id: str) -> list[int]:
        return [event.container_event_type for event in self.about(object_id)]

    def wait_types(self, object_id: str, expected: list[int], timeout: float = 30.0) -> list[int]:
        """Wait until ``object_id`` has at least as many events as ``expected``; return them."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.types(object_id)) >= len(expected), timeout)
        return self.types(object_id)

    def cancel(self, timeout: float = 10.0) -> grpc.StatusCode:
        """Cancel the call from the client side; return the code the call ended with."""
        self.call.cancel()
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "the event stream did not end after cancel()"
        return self.call.code()


def inflight_calls(shim: ShimProcess) -> float:
    """The shim's kubegpu_crishim_inflight_calls gauge (open streams count)."""
    body = urllib.request.urlopen(shim.metrics_url + "/metrics", timeout=5).read().decode()
    match = re.search(r"^kubegpu_crishim_inflight_calls (\S+)$", body, re.MULTILINE)
    assert match is not None, "no kubegpu_crishim_inflight_calls in the shim's metrics"
    return float(match.group(1))


def open_through_shim(client: CriClient, shim: ShimProcess) -> EventStream:
    """Open GetContainerEvents through the shim; return once containerd has the stream."""
    before = inflight_calls(shim)
    stream = EventStream(client)
    wait_for(lambda: inflight_calls(shim) == before + 1)
    time.sleep(SUBSCRIBE_SETTLE)
    return stream


def run_sandbox(sandboxes: SandboxFactory, client: CriClient, tmp_path: Path, name: str,
                ) -> tuple[str, api_pb2.PodSandboxConfig]:
    """Run a host-network sandbox; return its id and a config to create containers with."""
    sandbox_id = sandboxes(client, name=name)
    config = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(tmp_path / "pods" / name))
    return sandbox_id, config


def create_container(client: CriClient, sandbox_id: str, sandbox: api_pb2.PodSandboxConfig,
                     name: str, script: str) -> str:
    container = shell_container(name, BUSYBOX_IMAGE, script, log_path=f"{name}.log")
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox_id, config=container, sandbox_config=sandbox
    )
    return client.runtime.CreateContainer(request, timeout=60).container_id


def container_state(client: CriClient, container_id: str) -> int:
    request = api_pb2.ContainerStatusRequest(container_id=container_id)
    return client.runtime.ContainerStatus(request, timeout=10).status.state


def test_version_reports_containerd_2(proxied2: CriClient, direct2: CriClient) -> None:
    request = api_pb2.VersionRequest(version="v1")
    version = proxied2.runtime.Version(request)
    assert version == direct2.runtime.Version(request)
    assert version.runtime_name == "containerd"
    assert version.runtime_version.startswith("v2.")


def test_image_pull_through_registry_hosts_on_containerd2(proxied2: CriClient, direct2: CriClient) -> None:
    """PullImage reaches the loopback registry through containerd 2's certs.d hosts.toml."""
    spec = api_pb2.ImageSpec(image=PULL_IMAGE)
    pulled = proxied2.images.PullImage(api_pb2.PullImageRequest(image=spec), timeout=120)
    assert pulled.image_ref.startswith("sha256:")
    status = proxied2.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec))
    assert status.image.id == pulled.image_ref
    assert status == direct2.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec))
    proxied2.images.RemoveImage(api_pb2.RemoveImageRequest(image=spec), timeout=60)
    assert not proxied2.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec)).HasField("image")


def test_pod_and_container_lifecycle_on_containerd2(
    proxied2: CriClient, sandbox2_factory: SandboxFactory, tmp_path: Path
) -> None:
    """The basic kubelet sequence through the shim, on containerd 2.x (1.6: test_crishim_containerd)."""
    sandbox_id, sandbox = run_sandbox(sandbox2_factory, proxied2, tmp_path, "lifecycle2")
    status = proxied2.runtime.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))
    assert status.status.state == api_pb2.SANDBOX_READY

    container_id = create_container(proxied2, sandbox_id, sandbox, "app", "exec sleep 100000")
    assert container_state(proxied2, container_id) == api_pb2.CONTAINER_CREATED
    proxied2.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id), timeout=60)
    wait_for(lambda: container_state(proxied2, container_id) == api_pb2.CONTAINER_RUNNING)

    executed = proxied2.runtime.ExecSync(api_pb2.ExecSyncRequest(
        container_id=container_id, cmd=["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=20))
    assert (executed.stdout, executed.stderr, executed.exit_code) == (b"out\n", b"err\n", 3)

    proxied2.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
    assert container_state(proxied2, container_id) == api_pb2.CONTAINER_EXITED
    proxied2.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id))
    with pytest.raises(grpc.RpcError) as missing:
        container_state(proxied2, container_id)
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND

    remove_sandbox(proxied2, sandbox_id)
    listing = proxied2.runtime.ListPodSandbox(
        api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(id=sandbox_id)))
    assert not listing.items


def test_container_events_stream_through_shim(
    shim2: ShimProcess, proxied2: CriClient, direct2: CriClient,
    sandbox2_factory: SandboxFactory, tmp_path: Path,
) -> None:
    """A container's CREATED, STARTED, STOPPED, DELETED events arrive, as containerd sent them.

    containerd sends STOPPED from its exit handler, after StopContainer may have returned; like
    kubelet's evented PLEG, the test waits for STOPPED before it removes (else DELETED can
    overtake it). The sandbox has events of its own, under its id.
    """
    upstream = EventStream(direct2)
    events = open_through_shim(proxied2, shim2)
    try:
        sandbox_id, sandbox = run_sandbox(sandbox2_factory, proxied2, tmp_path, "events")
        container_id = create_container(proxied2, sandbox_id, sandbox, "evented", "exec sleep 100000")
        proxied2.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id), timeout=60)
        proxied2.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
        assert events.wait_types(container_id, LIFECYCLE[:3]) == LIFECYCLE[:3]
        proxied2.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id))
        assert events.wait_types(container_id, LIFECYCLE) == LIFECYCLE

        proxied2.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
        assert events.wait_types(sandbox_id, LIFECYCLE[:3]) == LIFECYCLE[:3]
        proxied2.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))
        assert events.wait_types(sandbox_id, LIFECYCLE) == LIFECYCLE

        assert_container_events(events.about(container_id), container_id, sandbox_id)
        upstream.wait_types(sandbox_id, LIFECYCLE)
        assert events.about(container_id, sandbox_id) == upstream.about(container_id, sandbox_id)
    finally:
        upstream.cancel()
        events.cancel()


def assert_container_events(events: list[Event], container_id: str, sandbox_id: str) -> None:
    """Each event carries its sandbox's status and, while the container exists, the container's."""
    created, started, stopped, deleted = events
    assert all(event.pod_sandbox_status.id == sandbox_id for event in events)
    assert [event.created_at for event in events] == sorted(event.created_at for event in events)

    def state(event: Event) -> int | None:
        states = [s.state for s in event.containers_statuses if s.id == container_id]
        return states[0] if states else None

    assert state(created) == api_pb2.CONTAINER_CREATED
    assert state(started) == api_pb2.CONTAINER_RUNNING
    assert state(stopped) == api_pb2.CONTAINER_EXITED
    assert state(deleted) is None


def test_cancelled_event_stream_ends_cancelled_upstream_too(
    shim2: ShimProcess, proxied2: CriClient
) -> None:
    """A client cancelling GetContainerEvents gets CANCELLED; the shim closes its upstream stream."""
    before = inflight_calls(shim2)
    events = open_through_shim(proxied2, shim2)
    assert events.cancel() is grpc.StatusCode.CANCELLED
    wait_for(lambda: inflight_calls(shim2) == before)
    # The shim still serves a new stream and unary calls after the cancellation.
    again = open_through_shim(proxied2, shim2)
    assert proxied2.runtime.Version(api_pb2.VersionRequest(), timeout=10).runtime_name == "containerd"
    assert again.cancel() is grpc.StatusCode.CANCELLED


def test_containerd_1_6_has_no_container_events(proxied: CriClient, direct: CriClient) -> None:
    """Why these tests need containerd 2: 1.6 answers UNIMPLEMENTED, through the shim as directly."""
    answers = []
    for client in (proxied, direct):
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(client.runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=10)))
        answers.append((caught.value.code(), caught.value.details()))
    assert answers[0] == answers[1]
    assert answers[0][0] is grpc.StatusCode.UNIMPLEMENTED
