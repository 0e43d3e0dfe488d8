"""kubegpu-cni under a real containerd with CNI enabled (issue #25, "Tests without SR-IOV hardware").

containerd (Debian's 1.6, and 2.2.9 from the testbin cache) runs inside the lab's "host" network
namespace (tests/support/cnilab.py; ``nsenter --net``), so every CNI plugin it runs works there:
Debian's ``bridge`` + ``host-local`` make the pods' primary network on a private subnet, on a
bridge in that namespace with no way out; ``kubegpu-cni`` (the installed executable) is chained
after them as docs/cni.md shows and moves the stand-in VF netdevs, dummy interfaces named by the
lab's fake sysfs tree, into the pods. The shim (``kubegpu crishim --device-plugin rdma``) sits in
front of containerd over the same fake tree, whose verbs nodes are real character devices, so a
pod's container gets the same VFs' ``/dev/infiniband`` nodes. No interface of the machine is
touched and no packet can leave it.

The pods are not on the host network; their containers print ``ip -o link`` and
``ls /dev/infiniband``: that is the proof of what they were given.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from kubegpu.allocation import ANNOTATION, RDMA_INTERFACES_ANNOTATION
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, Containerd, ContainerdError, containerd2_bin_dir
from kubegpu.devenv.cri import CriClient, host_network_sandbox, shell_container
from kubegpu.devenv.shimproc import ShimProcess
from tests.fixtures.common import missing_component, require_executable
from tests.support.cnilab import NODE, PF_NETDEVS, UVERBS, VFS, NetLab
from tests.support.crisandboxes import remove_sandbox, remove_sandboxes_since, sandbox_ids
from tests.support.rdmanode import rdma_shim_args
from tests.test_nri_transport import started_output

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(300)]

DEBIAN_CNI = Path("/usr/lib/cni")
PRIMARY = ("bridge", "host-local", "loopback")
SUBNET = "10.231.7.0/24"  # the pods' primary network, on a bridge inside the lab namespace only
SCRIPT = "busybox ip -o link; echo ---; ls /dev/infiniband 2>&1; echo END; exec sleep 100000"
# What kubelet adds to every pod's annotations (and so to its sandbox's): containerd passes the
# annotations to CNI only when there are some (docs/cni.md, "Where the allocation comes from").
KUBELET_ANNOTATIONS = {
    "kubernetes.io/config.source": "api",
    "kubernetes.io/config.seen": "2026-11-27T08:00:00.000000000Z",
}
LINK = re.compile(r"^\d+: ([^:@]+)(?:@\S+)?: .*link/\S+ ([0-9a-f:]{17})")


def network_config(lab: NetLab, ipam: Path) -> dict[str, object]:
    """The conflist: the primary network, then kubegpu-cni chained after it (docs/cni.md)."""
    kubegpu = {
        key: value for key, value in lab.config().items() if key not in ("cniVersion", "name", "prevResult")
    }
    return {
        "cniVersion": "1.0.0",
        "name": "kgpods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "kgbr0",
                "ipam": {"type": "host-local", "dataDir": str(ipam), "ranges": [[{"subnet": SUBNET}]]},
            },
            kubegpu,
        ],
    }


def cni_bin_dir(directory: Path, plugin: str) -> Path:
    """A private CNI bin directory: Debian's primary plugins and the installed kubegpu-cni."""
    directory.mkdir()
    for name in PRIMARY:
        if not (DEBIAN_CNI / name).exists():
            missing_component(f"{DEBIAN_CNI / name} is missing (apt-get install containernetworking-plugins)")
        (directory / name).symlink_to(DEBIAN_CNI / name)
    (directory / "kubegpu-cni").symlink_to(plugin)
    return directory


@dataclass
class Pod:
    """What one pod's container saw: its links (name -> MAC) and its /dev/infiniband entries (None:
    no such directory)."""

    sandbox: str
    links: dict[str, str]
    verbs: list[str] | None


@dataclass
class CniNode:
    """The lab, containerd in its host namespace with the chain above, and the shim before it."""

    lab: NetLab
    containerd: Containerd
    client: CriClient  # through the shim, as kubelet talks to it
    direct: CriClient
    logs: Path

    def sandbox(
        self, name: str, annotations: dict[str, str], uid: str | None = None, kubelet: bool = True
    ) -> str:
        """RunPodSandbox for a pod on the pod network (not the host's), as kubelet sends it (with
        ``KUBELET_ANNOTATIONS`` unless ``kubelet`` is false)."""
        log_dir = self.logs / name
        log_dir.mkdir(parents=True, exist_ok=True)
        config = self._config(name, annotations, uid, log_dir, kubelet)
        request = api_pb2.RunPodSandboxRequest(config=config)
        return self.client.runtime.RunPodSandbox(request, timeout=120).pod_sandbox_id

    @staticmethod
    def _config(
        name: str, annotations: dict[str, str], uid: str | None, log_dir: Path, kubelet: bool = True
    ) -> api_pb2.PodSandboxConfig:
        passed = {**KUBELET_ANNOTATIONS, **annotations} if kubelet else annotations
        config = host_network_sandbox(
            name, uid or str(uuid.uuid4()), log_directory=str(log_dir), annotations=passed
        )
        config.linux.security_context.namespace_options.network = api_pb2.POD
        return config

    def pod(self, name: str, annotations: dict[str, str], uid: str | None = None) -> Pod:
        """A pod whose container ``app`` printed its links and verbs nodes."""
        uid = uid or str(uuid.uuid4())
        sandbox = self.sandbox(name, annotations, uid)
        config = self._config(name, annotations, uid, self.logs / name)
        created = self.client.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(
                pod_sandbox_id=sandbox,
                sandbox_config=config,
                config=shell_container("app", BUSYBOX_IMAGE, SCRIPT, log_path="app.log"),
            ),
            timeout=60,
        ).container_id
        lines = started_output(self.client, created, self.logs / name / "app.log", f"pod {name}'s output")
        links_part, _, verbs_part = "\n".join(lines).partition("---")
        links = {}
        for line in links_part.splitlines():
            match = LINK.match(line.strip())
            if match:
                links[match.group(1)] = match.group(2)
        listed = verbs_part.replace("END", "").strip()
        return Pod(sandbox, links, None if "No such file" in listed else sorted(listed.split()))

    def records(self) -> list[str]:
        return sorted(p.name for p in self.lab.state.glob("*.json"))


def _containerd(kind: str) -> Containerd:
    if kind == "containerd-1.6":
        for tool in ("containerd", "ctr", "runc"):
            require_executable(tool)
        return Containerd()
    bin_dir = containerd2_bin_dir()
    if bin_dir is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    require_executable("runc")
    return Containerd(bin_dir=bin_dir)


@pytest.fixture(params=["containerd-1.6", "containerd-2"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CniNode]:
    require_executable("nsenter")
    lab = NetLab(tmp_path / "lab", verbs=True)
    try:
        runtime = _containerd(request.param)
        runtime.command_prefix = ["nsenter", f"--net=/run/netns/{lab.host}"]
        runtime.cni_bin_dir = cni_bin_dir(tmp_path / "cni-bin", lab.exe)
        runtime.cni_conflist = json.dumps(network_config(lab, tmp_path / "ipam"))
        try:
            runtime.start()
        except (ContainerdError, FileNotFoundError) as exc:
            runtime.stop()
            missing_component(f"containerd could not start: {exc}")
        shim = ShimProcess(
            socket=Path(f"/tmp/kgshim-cni-{uuid.uuid4().hex[:8]}.sock"),
            runtime_endpoint=runtime.endpoint,
            log_path=tmp_path / "crishim.log",
            extra_args=rdma_shim_args(lab.root, NODE, lab.keys),
        )
        direct = CriClient(runtime.endpoint)
        before = sandbox_ids(direct)
        try:
            shim.start()
            client = CriClient(shim.endpoint)
            try:
                yield CniNode(lab, runtime, client, direct, tmp_path / "logs")
            finally:
                client.close()
        finally:
            remove_sandboxes_since(direct, before)
            direct.close()
            shim.stop()
            runtime.stop()
    finally:
        lab.close()


def allocation(node: CniNode, uid: str, vfs: list[str]) -> dict[str, str]:
    """A pod's annotations: its signed version-2 allocation of ``vfs`` and the ask for them."""
    value = node.lab.annotation(uid, [(vf, 1000, 2000) for vf in vfs])
    return {ANNOTATION: value, RDMA_INTERFACES_ANNOTATION: str(len(vfs))}


def verbs_of(vfs: list[str]) -> list[str]:
    return sorted(["rdma_cm", *(f"uverbs{UVERBS[vf]}" for vf in vfs)])


def test_pods_get_exactly_their_vfs_beside_eth0_and_give_them_back(node: CniNode) -> None:
    lab = node.lab
    host = lab.links()
    mac = {vf: host[netdev] for vf, (_, netdev) in VFS.items()}
    # two VFs on two PFs for one pod, one for another, mlx5_4 for nobody, a pod without RDMA
    a_uid, b_uid = str(uuid.uuid4()), str(uuid.uuid4())
    a = node.pod("pod-a", allocation(node, a_uid, ["mlx5_2", "mlx5_5"]), a_uid)
    b = node.pod("pod-b", allocation(node, b_uid, ["mlx5_3"]), b_uid)
    plain = node.pod("plain", {})

    assert set(a.links) == {"lo", "eth0", "rdma0", "rdma1"}, a.links
    assert (a.links["rdma0"], a.links["rdma1"]) == (mac["mlx5_2"], mac["mlx5_5"])
    assert a.verbs == verbs_of(["mlx5_2", "mlx5_5"])
    assert set(b.links) == {"lo", "eth0", "rdma0"} and b.links["rdma0"] == mac["mlx5_3"], b.links
    assert b.verbs == verbs_of(["mlx5_3"])
    assert set(plain.links) == {"lo", "eth0"}, plain.links
    assert plain.verbs is None, plain.verbs
    # no pod holds another's VF or the unallocated one, under any name
    for pod, own in ((a, ["mlx5_2", "mlx5_5"]), (b, ["mlx5_3"]), (plain, [])):
        others = {mac[vf] for vf in VFS if vf not in own}
        assert not others & set(pod.links.values()), (pod.links, own)
    # the host namespace keeps the unallocated VF and the PFs; the allocated ones are in the pods
    now = lab.links()
    assert {"vfnet2", *PF_NETDEVS.values(), "kgbr0"} <= set(now)
    assert not {"vfnet0", "vfnet1", "vfnet3"} & set(now)
    assert node.records() == sorted(f"{s}.json" for s in (a.sandbox, b.sandbox))

    # StopPodSandbox runs DEL: pod-a's VFs come home under their names, pod-b keeps its own
    node.client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=a.sandbox), timeout=60)
    now = lab.links()
    assert now["vfnet0"] == mac["mlx5_2"] and now["vfnet3"] == mac["mlx5_5"]
    assert "vfnet1" not in now and node.records() == [f"{b.sandbox}.json"]
    remove_sandbox(node.client, a.sandbox)  # its DEL again: nothing left to do
    # a VF given back can go to the next pod it is allocated to
    c_uid = str(uuid.uuid4())
    c = node.pod("pod-c", allocation(node, c_uid, ["mlx5_5"]), c_uid)
    assert set(c.links) == {"lo", "eth0", "rdma0"} and c.links["rdma0"] == mac["mlx5_5"]
    for sandbox in (b.sandbox, c.sandbox, plain.sandbox):
        remove_sandbox(node.client, sandbox)
    assert {"vfnet0", "vfnet1", "vfnet2", "vfnet3"} <= set(lab.links()) and node.records() == []


def _refused(node: CniNode, name: str, annotations: dict[str, str], uid: str, kubelet: bool = True) -> str:
    """RunPodSandbox must fail; its error's details, once containerd kept no sandbox of it."""
    before = sandbox_ids(node.direct)
    with pytest.raises(grpc.RpcError) as caught:
        node.sandbox(name, annotations, uid, kubelet)
    ready = [
        s.id
        for s in node.direct.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items
        if s.id not in before and s.state == api_pb2.SANDBOX_READY
    ]
    assert ready == []
    return caught.value.details() or ""


def test_a_pod_asking_for_interfaces_without_an_allocation_fails_its_sandbox(node: CniNode) -> None:
    uid = str(uuid.uuid4())
    details = _refused(node, "asks", {RDMA_INTERFACES_ANNOTATION: "2"}, uid)
    assert "kubegpu-cni" in details, details
    assert "asks for RDMA interfaces" in details and "carries no kubegpu allocation" in details, details
    assert {"vfnet0", "vfnet1", "vfnet2", "vfnet3"} <= set(node.lab.links()) and node.records() == []
    # asking for none is an ordinary pod
    plain = node.pod("asks-none", {RDMA_INTERFACES_ANNOTATION: "0"})
    assert set(plain.links) == {"lo", "eth0"}, plain.links
    # a sandbox with no annotations at all (kubelet never sends one): containerd passes nothing,
    # so the plugin cannot tell it from a pod with VFs and refuses it, saying why
    details = _refused(node, "bare", {}, str(uuid.uuid4()), kubelet=False)
    assert "passed no pod annotations" in details and "without annotations" in details, details


def _cni_namespaces() -> set[str]:
    """The host's network namespaces named as containerd names a sandbox's (``cni-<uuid>``)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"^(cni-\S+)", listed, re.MULTILINE))


def test_a_vf_gone_from_sysfs_fails_the_sandbox_with_nothing_attached(node: CniNode) -> None:
    lab = node.lab
    uid = str(uuid.uuid4())
    annotations = allocation(node, uid, ["mlx5_3", "mlx5_4"])
    (lab.root / "sys/class/infiniband/mlx5_4").unlink()  # gone since scheduling
    before = _cni_namespaces()
    details = _refused(node, "vanished", annotations, uid)
    assert "kubegpu-cni" in details and "mlx5_4" in details, details
    # mlx5_3, checked first and present, was not moved either; no record, no namespace holds them
    assert {"vfnet0", "vfnet1", "vfnet2", "vfnet3"} <= set(lab.links()) and node.records() == []
    # only namespaces made since: another run's leftovers on this host are not this sandbox's
    for netns in sorted(_cni_namespaces() - before):
        inside = subprocess.run(
            ["ip", "-n", netns, "-o", "link"], capture_output=True, text=True, timeout=30
        ).stdout
        assert not {"rdma0", "vfnet1"} & set(re.findall(r"^\d+: ([^:@]+)", inside, re.MULTILINE))
