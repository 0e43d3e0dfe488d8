"""The shim against a real containerd, called the way kubelet calls it.

Every test here drives containerd through ``kubegpu crishim`` (a real subprocess) and, where the
answer could differ, compares with the same call made directly to containerd.
"""

from __future__ import annotations

import os
import signal
import stat
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, PULL_IMAGE, Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.containerd

SandboxFactory = Callable[..., str]


def sandbox_config(client: CriClient, sandbox_id: str) -> api_pb2.PodSandboxConfig:
    """Rebuild the config of a sandbox the way kubelet keeps it (for CreateContainer)."""
    status = client.runtime.PodSandboxStatus(
        api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=False)
    ).status
    return host_network_sandbox(
        status.metadata.name,
        status.metadata.uid,
        namespace=status.metadata.namespace,
        log_directory=status.log_directory if hasattr(status, "log_directory") else "",
    )


def create_container(
    client: CriClient,
    sandbox_id: str,
    log_dir: Path,
    name: str,
    script: str,
    envs: dict[str, str] | None = None,
) -> str:
    config = host_network_sandbox(name + "-pod", str(uuid.uuid4()), log_directory=str(log_dir))
    container = shell_container(name, BUSYBOX_IMAGE, script, log_path=f"{name}.log", envs=envs)
    return client.runtime.CreateContainer(
        api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container, sandbox_config=config),
        timeout=60,
    ).container_id


def container_state(client: CriClient, container_id: str) -> int:
    return client.runtime.ContainerStatus(
        api_pb2.ContainerStatusRequest(container_id=container_id), timeout=10
    ).status.state


def sandbox_log_dir(client: CriClient, sandbox_id: str) -> Path:
    listing = client.runtime.ListPodSandbox(
        api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(id=sandbox_id))
    )
    name = listing.items[0].metadata.name
    return Path(os.environ.get("KUBEGPU_TEST_TMP", "/tmp")) / name


def test_version_and_status_match_direct(proxied: CriClient, direct: CriClient) -> None:
    request = api_pb2.VersionRequest(version="v1")
    assert proxied.runtime.Version(request) == direct.runtime.Version(request)
    status = proxied.runtime.Status(api_pb2.StatusRequest(verbose=False))
    conditions = {c.type: c.status for c in status.status.conditions}
    assert conditions["RuntimeReady"] is True
    direct_conditions = {
        c.type: c.status for c in direct.runtime.Status(api_pb2.StatusRequest()).status.conditions
    }
    assert conditions == direct_conditions


def test_image_pull_list_status_remove(proxied: CriClient, direct: CriClient) -> None:
    spec = api_pb2.ImageSpec(image=PULL_IMAGE)
    pulled = proxied.images.PullImage(api_pb2.PullImageRequest(image=spec), timeout=120)
    assert pulled.image_ref.startswith("sha256:")
    # containerd 1.6 ignores ListImages filters; what matters is that the shim returns what it does.
    listing = api_pb2.ListImagesRequest(filter=api_pb2.ImageFilter(image=spec))
    listed = proxied.images.ListImages(listing)
    assert {PULL_IMAGE, BUSYBOX_IMAGE} <= {tag for image in listed.images for tag in image.repo_tags}
    assert sorted(i.id for i in listed.images) == sorted(
        i.id for i in direct.images.ListImages(listing).images
    )
    status = proxied.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec))
    assert status.image.id == pulled.image_ref
    assert status == direct.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec))
    fs_info = proxied.images.ImageFsInfo(api_pb2.ImageFsInfoRequest())
    assert fs_info.image_filesystems
    proxied.images.RemoveImage(api_pb2.RemoveImageRequest(image=spec), timeout=60)
    gone = proxied.images.ImageStatus(api_pb2.ImageStatusRequest(image=spec))
    assert not gone.HasField("image")


def test_pod_and_container_lifecycle(
    proxied: CriClient, direct: CriClient, sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    """Everything kubelet does for one pod, through the shim (events: test_crishim_events.py)."""
    sandbox_id = sandbox_factory(proxied, name="lifecycle")
    sandbox = proxied.runtime.PodSandboxStatus(api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))
    assert sandbox.status.state == api_pb2.SANDBOX_READY
    assert sandbox.status.linux.namespaces.options.network == api_pb2.NODE

    log_dir = tmp_path / "pods" / "lifecycle"
    container_id = create_container(
        proxied,
        sandbox_id,
        log_dir,
        "app",
        "env; ls -l /dev; exec sleep 100000",
        envs={"KUBEGPU_PROBE": "through-the-shim"},
    )
    assert container_state(proxied, container_id) == api_pb2.CONTAINER_CREATED
    proxied.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
    wait_for(lambda: container_state(proxied, container_id) == api_pb2.CONTAINER_RUNNING)

    log = log_dir / "app.log"
    wait_for(lambda: log.exists() and "null" in log.read_text())
    text = log.read_text()
    assert "KUBEGPU_PROBE=through-the-shim" in text
    assert " stdout F " in text  # CRI log format written by containerd

    executed = proxied.runtime.ExecSync(
        api_pb2.ExecSyncRequest(
            container_id=container_id, cmd=["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=20
        )
    )
    assert (executed.stdout, executed.stderr, executed.exit_code) == (b"out\n", b"err\n", 3)

    by_label = proxied.runtime.ListContainers(
        api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(
                pod_sandbox_id=sandbox_id, label_selector={"io.kubernetes.container.name": "app"}
            )
        )
    )
    assert [c.id for c in by_label.containers] == [container_id]
    running = proxied.runtime.ListContainers(
        api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(
                id=container_id, state=api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)
            )
        )
    )
    assert len(running.containers) == 1
    nobody = proxied.runtime.ListContainers(
        api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(
                pod_sandbox_id=sandbox_id, label_selector={"io.kubernetes.container.name": "nope"}
            )
        )
    )
    assert not nobody.containers
    pods = proxied.runtime.ListPodSandbox(
        api_pb2.ListPodSandboxRequest(
            filter=api_pb2.PodSandboxFilter(
                state=api_pb2.PodSandboxStateValue(state=api_pb2.SANDBOX_READY),
                label_selector={"io.kubernetes.pod.name": "lifecycle"},
            )
        )
    )
    assert [p.id for p in pods.items] == [sandbox_id]

    stats = proxied.runtime.ContainerStats(api_pb2.ContainerStatsRequest(container_id=container_id))
    assert stats.stats.attributes.id == container_id
    assert stats.stats.memory.working_set_bytes.value > 0

    proxied.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
    assert container_state(proxied, container_id) == api_pb2.CONTAINER_EXITED
    proxied.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id))
    with pytest.raises(grpc.RpcError) as missing:
        container_state(proxied, container_id)
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND

    proxied.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))
    proxied.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))
    assert not proxied.runtime.ListPodSandbox(
        api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(id=sandbox_id))
    ).items


def test_errors_pass_through_unchanged(proxied: CriClient, direct: CriClient) -> None:
    request = api_pb2.ContainerStatusRequest(container_id="does-not-exist")
    errors = []
    for client in (proxied, direct):
        with pytest.raises(grpc.RpcError) as caught:
            client.runtime.ContainerStatus(request)
        errors.append((caught.value.code(), caught.value.details()))
    assert errors[0] == errors[1]
    assert errors[0][0] is grpc.StatusCode.NOT_FOUND


def test_unknown_method_passes_through(proxied: CriClient, direct: CriClient) -> None:
    """A method our proto does not know reaches containerd (which answers UNIMPLEMENTED)."""
    answers = []
    for client in (proxied, direct):
        call = client.channel.unary_unary("/runtime.v1.RuntimeService/FutureMethod")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\x0a\x03abc", timeout=10)
        answers.append((caught.value.code(), caught.value.details()))
    assert answers[0] == answers[1]
    assert answers[0][0] is grpc.StatusCode.UNIMPLEMENTED


def test_deadline_and_cancellation_reach_containerd(
    proxied: CriClient, sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    sandbox_id = sandbox_factory(proxied, name="deadline")
    container_id = create_container(proxied, sandbox_id, tmp_path, "sleeper", "exec sleep 100000")
    proxied.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))

    def exec_processes() -> str:
        return proxied.runtime.ExecSync(
            api_pb2.ExecSyncRequest(container_id=container_id, cmd=["ps"], timeout=10)
        ).stdout.decode()

    with pytest.raises(grpc.RpcError) as caught:
        proxied.runtime.ExecSync(
            api_pb2.ExecSyncRequest(container_id=container_id, cmd=["sleep", "4242"], timeout=0),
            timeout=1.0,
        )
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # containerd saw the deadline: it killed the exec'd process.
    wait_for(lambda: "sleep 4242" not in exec_processes(), timeout=10)

    future = proxied.runtime.ExecSync.future(
        api_pb2.ExecSyncRequest(container_id=container_id, cmd=["sleep", "4343"], timeout=0), timeout=60
    )
    wait_for(lambda: "sleep 4343" in exec_processes(), timeout=10)
    future.cancel()
    wait_for(lambda: "sleep 4343" not in exec_processes(), timeout=10)


def test_socket_mode_and_stale_socket(shim_factory: Callable[..., ShimProcess]) -> None:
    path = Path(f"/tmp/kgshim-stale-{uuid.uuid4().hex[:6]}.sock")
    first = shim_factory(socket=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    # A second shim must not steal a live socket.
    second = ShimProcess(path, first.runtime_endpoint, path.with_suffix(".log"))
    try:
        with pytest.raises(RuntimeError, match="served by another process"):
            second.start(timeout=10)
    finally:
        second.stop()  # never leave a process behind, whatever happened
        path.with_suffix(".log").unlink(missing_ok=True)  # nor its log in /tmp
    first.kill()
    assert path.exists()  # SIGKILL leaves the socket file behind
    third = shim_factory(socket=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    client = CriClient(third.endpoint)
    assert client.runtime.Version(api_pb2.VersionRequest()).runtime_name == "containerd"
    client.close()


def test_metrics_and_health(shim: ShimProcess, proxied: CriClient) -> None:
    for _ in range(3):
        proxied.runtime.Version(api_pb2.VersionRequest())
    with pytest.raises(grpc.RpcError):
        proxied.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id="nope"))
    wanted = (
        'kubegpu_crishim_calls_total{code="OK",method="Version"} 3.0',
        'kubegpu_crishim_calls_total{code="NOT_FOUND",method="ContainerStatus"} 1.0',
        'kubegpu_crishim_call_duration_seconds_count{method="Version"} 3.0',
    )

    def scrape() -> str:
        return urllib.request.urlopen(shim.metrics_url + "/metrics", timeout=5).read().decode()

    # A failed call is counted once its status has gone out, so the client may see the error
    # first: wait for the counters to settle rather than read them once.
    wait_for(lambda: all(line in scrape() for line in wanted), timeout=10)
    body = scrape()
    assert "process_cpu_seconds_total" in body
    assert urllib.request.urlopen(shim.metrics_url + "/healthz", timeout=5).status == 200
    ready = urllib.request.urlopen(shim.metrics_url + "/readyz", timeout=5)
    assert ready.status == 200 and b"ready" in ready.read()


def test_sigterm_drains_inflight_calls(
    shim: ShimProcess, proxied: CriClient, sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    sandbox_id = sandbox_factory(proxied, name="drain")
    container_id = create_container(proxied, sandbox_id, tmp_path, "busy", "exec sleep 100000")
    proxied.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
    slow = proxied.runtime.ExecSync.future(
        api_pb2.ExecSyncRequest(
            container_id=container_id, cmd=["sh", "-c", "sleep 2; echo done"], timeout=30
        ),
        timeout=30,
    )
    time.sleep(0.5)
    shim.signal(signal.SIGTERM)
    assert slow.result(timeout=30).stdout == b"done\n"  # the in-flight call finished
    assert shim.wait(20) == 0
    assert not shim.socket.exists()
    with pytest.raises(grpc.RpcError) as refused:
        proxied.runtime.Version(api_pb2.VersionRequest(), timeout=2)
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_containerd_restart_gives_unavailable_then_recovers(
    containerd: Containerd, shim: ShimProcess, proxied: CriClient
) -> None:
    assert proxied.runtime.Version(api_pb2.VersionRequest()).runtime_name == "containerd"
    containerd.terminate()
    try:
        with pytest.raises(grpc.RpcError) as down:
            proxied.runtime.Version(api_pb2.VersionRequest(), timeout=5)
        assert down.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        containerd.restart()
    deadline = time.monotonic() + 15
    while True:
        try:
            assert proxied.runtime.Version(api_pb2.VersionRequest(), timeout=5).runtime_name == "containerd"
            break
        except grpc.RpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() < deadline, "shim did not reconnect to the restarted containerd"
            time.sleep(0.2)
    assert shim.process is not None and shim.process.poll() is None  # same shim process


def test_shim_sigkill_and_restart_keeps_containers(
    shim_factory: Callable[..., ShimProcess], sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    path = Path(f"/tmp/kgshim-kill-{uuid.uuid4().hex[:6]}.sock")
    shim = shim_factory(socket=path)
    client = CriClient(shim.endpoint)
    sandbox_id = sandbox_factory(client, name="survivor")
    container_id = create_container(client, sandbox_id, tmp_path, "keeps", "exec sleep 100000")
    client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
    wait_for(lambda: container_state(client, container_id) == api_pb2.CONTAINER_RUNNING)
    shim.kill()
    restarted = shim_factory(socket=path)
    assert restarted.process is not None and restarted.process.pid != shim.process.pid  # type: ignore[union-attr]
    # Same client, same socket path: the restarted shim serves the running container.
    wait_for(lambda: _running(client, container_id), timeout=15)
    out = client.runtime.ExecSync(
        api_pb2.ExecSyncRequest(container_id=container_id, cmd=["echo", "alive"], timeout=10)
    )
    assert out.stdout == b"alive\n"
    client.close()


def _running(client: CriClient, container_id: str) -> bool:
    try:
        return container_state(client, container_id) == api_pb2.CONTAINER_RUNNING
    except grpc.RpcError:
        return False


def test_readyz_is_503_while_containerd_is_not_ready(tmp_path: Path) -> None:
    """/healthz says the shim serves; /readyz also needs containerd's connection."""
    missing = Path(f"/tmp/kgctd-missing-{uuid.uuid4().hex[:6]}.sock")
    shim = ShimProcess(
        Path(f"/tmp/kgshim-notready-{uuid.uuid4().hex[:6]}.sock"), f"unix://{missing}", tmp_path / "shim.log"
    )
    try:
        shim.start()
        assert urllib.request.urlopen(shim.metrics_url + "/healthz", timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(shim.metrics_url + "/readyz", timeout=5)
        assert caught.value.code == 503 and b"runtime" in caught.value.read()
    finally:
        shim.stop()
        shim.socket.unlink(missing_ok=True)


def test_readyz_follows_a_containerd_restart(containerd: Containerd, shim: ShimProcess) -> None:
    def ready() -> int:
        try:
            return int(urllib.request.urlopen(shim.metrics_url + "/readyz", timeout=5).status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    wait_for(lambda: ready() == 200)
    containerd.terminate()
    try:
        wait_for(lambda: ready() == 503, timeout=15)
    finally:
        containerd.restart()
    wait_for(lambda: ready() == 200, timeout=20)


def test_messages_larger_than_grpcs_default_pass_both_ways(
    proxied: CriClient, direct: CriClient, sandbox_factory: SandboxFactory, tmp_path: Path
) -> None:
    """gRPC's default limit is 4 MiB; the shim must never be tighter than kubelet (16 MiB)."""
    huge = api_pb2.ListContainersRequest(
        filter=api_pb2.ContainerFilter(label_selector={"kubegpu.test/huge": "x" * (6 * 1024 * 1024)})
    )
    assert proxied.runtime.ListContainers(huge, timeout=30) == direct.runtime.ListContainers(huge, timeout=30)
    sandbox_id = sandbox_factory(proxied, name="bigoutput")
    container_id = create_container(proxied, sandbox_id, tmp_path, "big", "exec sleep 100000")
    proxied.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id))
    out = proxied.runtime.ExecSync(
        api_pb2.ExecSyncRequest(
            container_id=container_id, cmd=["sh", "-c", "head -c 6000000 /dev/zero"], timeout=30
        ),
        timeout=60,
    )
    assert len(out.stdout) == 6000000
