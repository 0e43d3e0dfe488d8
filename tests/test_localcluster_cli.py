"""``kubegpu up`` / ``kubegpu down`` as a user runs them (``make demo``), in separate processes.

``up`` must leave a working cluster behind when it exits (kubectl reaches it through the printed
kubeconfig, the demo workload ran and every waiting pod got its GPUs), and ``down``, a new process
that knows only the state dir, must leave nothing: no process, no mount, no changed sysctl, no
file outside the state dir, and only ``logs/`` inside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.localcluster.namespace import read_tunables
from kubegpu.localcluster.processes import mounts_under, processes_of
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]
# fixed host paths kubelet would create (the last one is its default FlexVolume directory)
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/usr/libexec/kubernetes",
)


def kubegpu(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kubegpu", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_up_runs_the_demo_and_down_leaves_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    from kubegpu.devenv.controlplane import BinariesMissing
    from kubegpu.localcluster.cluster import find_cluster_binaries

    try:
        binaries = find_cluster_binaries()  # `up` would build them: the suite's build step did
    except BinariesMissing as exc:
        missing_component(str(exc))
        raise
    _require_node_tools()
    state = tmp_path_factory.mktemp("up")  # short: unix socket paths live under it
    tunables = read_tunables()
    present = {path: os.path.exists(path) for path in HOST_PATHS}
    up = kubegpu("up", "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"kubeconfig: {state}/control-plane/admin.kubeconfig" in up.stdout
        final = up.stdout.rsplit("POD", 1)[1]
        assert "train-4-next  Running    gpu" in final and "(waiting for GPUs)" not in final, up.stdout
        # `up` has exited; the cluster runs on, reachable as printed
        nodes = subprocess.run([str(binaries.kubectl), "--kubeconfig", str(state / "control-plane" /
                                "admin.kubeconfig"), "get", "nodes", "-o", "name"],
                               capture_output=True, text=True, timeout=60)
        assert nodes.stdout.strip() == "node/kubegpu-node", nodes.stderr
        assert processes_of(state)
        assert read_tunables() == tunables  # kubelet wrote its tunables inside the node only
        again = kubegpu("up", "--state-dir", str(state), "--no-workload")
        assert again.returncode == 2 and "already recorded" in again.stderr
        assert subprocess.run([str(binaries.kubectl), "--kubeconfig", str(state / "control-plane" /
                               "admin.kubeconfig"), "get", "nodes"], capture_output=True,
                              timeout=60).returncode == 0  # the refused second `up` touched nothing
    finally:
        down = kubegpu("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nothing left" in down.stdout
    assert processes_of(state) == set()
    assert mounts_under(state) == []
    assert read_tunables() == tunables
    assert {path: os.path.exists(path) for path in HOST_PATHS} == present
    assert sorted(p.name for p in state.iterdir()) == [".kubegpu-cluster", "logs"]
    assert {"kube-apiserver", "kubelet", "crishim"} <= {
        name for log in (state / "logs").iterdir() for name in ("kube-apiserver", "kubelet", "crishim")
        if name in log.name
    }
    assert kubegpu("down", "--state-dir", str(state)).returncode == 2  # nothing recorded any more


def test_down_without_a_cluster_says_so(tmp_path: Path) -> None:
    result = kubegpu("down", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    message = f"kubegpu down: no local cluster recorded in {tmp_path} (cluster.json missing)"
    assert result.stderr.strip() == message


def test_up_never_takes_over_a_directory_with_other_files(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("own")
    (tmp_path / "precious").write_text("mine")
    result = kubegpu("up", "--state-dir", str(tmp_path), "--no-workload")
    assert result.returncode == 2 and "not a kubegpu state dir" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["precious"]


def test_up_refuses_a_state_dir_a_node_would_hide(tmp_path: Path) -> None:
    result = kubegpu("up", "--state-dir", "/var/lib/kubegpu-demo")
    assert result.returncode == 2
    assert "is under /var/lib" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists("/var/lib/kubegpu-demo")


def container_ids(state: Path) -> set[str]:
    """The ids of every container and sandbox the nodes' containerds have bundles for."""
    tasks = "nodes/*/containerd/state/io.containerd.runtime.v2.task"
    return {bundle.name for bundle in state.glob(f"{tasks}/*/*")}


def host_remains(ids: set[str]) -> list[str]:
    """What containerd's shims keep on the host for these containers: runc state, cgroups."""
    places = [Path("/run/containerd/runc/k8s.io")] + sorted(Path("/sys/fs/cgroup").glob("*/k8s.io"))
    places.append(Path("/sys/fs/cgroup/k8s.io"))
    return sorted(str(place / cid) for place in places for cid in ids if (place / cid).exists())


@pytest.mark.parametrize("nodes", ["0", "9", "two", "1_0", "-1"])
def test_up_takes_one_to_eight_nodes(nodes: str, tmp_path: Path) -> None:
    result = kubegpu("up", "--state-dir", str(tmp_path), "--nodes", nodes)
    assert result.returncode == 2
    assert "--nodes" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_down_after_kubelet_and_containerd_were_killed_leaves_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A crash (kill -9 of every kubelet and containerd while a pod runs) on a two-node cluster
    (`up --nodes 2`): `down` still stops and removes everything, including what containerd would
    have cleaned up on the host."""
    from kubegpu.devenv.controlplane import BinariesMissing
    from kubegpu.localcluster.cluster import find_cluster_binaries

    try:
        binaries = find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
        raise
    _require_node_tools()
    state = tmp_path_factory.mktemp("crash")
    tunables = read_tunables()
    up = kubegpu("up", "--state-dir", str(state), "--no-workload", "--nodes", "2")
    ids: set[str] = set()
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubectl = [str(binaries.kubectl), "--kubeconfig", str(state / "control-plane" / "admin.kubeconfig")]
        nodes = subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True,
                               timeout=60)
        gpus = {n["metadata"]["name"]: n["status"]["capacity"].get("nvidia.com/gpu")
                for n in json.loads(nodes.stdout)["items"]}
        assert gpus == {"kubegpu-node": "8", "kubegpu-node-2": "8"}, nodes.stderr
        for node in ("kubegpu-node", "kubegpu-node-2"):  # one pod on each node
            pod = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"sleeper-{node}"},
                              "spec": {
                "nodeName": node, "hostNetwork": True,  # no kube-scheduler in the demo cluster
                "containers": [{"name": "app", "image": "registry.kubegpu.test/busybox:1.0",
                                "imagePullPolicy": "Never", "command": ["/bin/sleep", "100000"]}]}})
            made = subprocess.run([*kubectl, "apply", "-f", "-"], input=pod, capture_output=True, text=True,
                                  timeout=60)
            assert made.returncode == 0, made.stderr
        ready = subprocess.run([*kubectl, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=120s"],
                               capture_output=True, text=True, timeout=150)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        ids = container_ids(state)
        assert len(ids) >= 4 and host_remains(ids)  # the pods' sandboxes and containers, on the host
        records = json.loads((state / "cluster.json").read_text())["processes"]
        killed = [r for r in records if r["name"].endswith(("/kubelet", "/containerd"))]
        assert len(killed) == 4  # a kubelet and a containerd per node
        for record in killed:
            os.kill(record["pid"], signal.SIGKILL)
    finally:
        down = kubegpu("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes_of(state) == set()
    assert mounts_under(state) == []
    assert read_tunables() == tunables
    assert host_remains(ids) == []
    assert sorted(p.name for p in state.iterdir()) == [".kubegpu-cluster", "logs"]
