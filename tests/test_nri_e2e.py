"""The NRI front end to end (issue #22): `kubegpu up --containerd 2 --front nri` runs a real
kubelet talking straight to containerd 2.2.9, with `kubegpu crishim --front nri` as containerd's
required NRI plugin (nothing on kubelet's call path).

Through it, with the proxy's verdicts: a pod the scheduler placed sees exactly its allocated GPUs
whatever it asked for itself; a pod bound past the scheduler with a forged allocation, one asking
for GPUs with no allocation, and one replaying another pod's allocation are refused, each with the
proxy's reason in the pod's events; a plain pod's device selectors are neutralised. So are, as
with the proxy, a pod's environment grabs (toolkit selectors, ``KUBEGPU_*`` in any case,
``DOCKER_RESOURCE_*``), toolkit device-list mounts in other spellings (removed), while hostPath
volumes reaching managed nodes under other spellings are kept (Pod Security's business,
docs/crishim.md); an allocation signed with a revoked key (its file removed) is refused."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.config import new_client_from_config

from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, load_keys, sign, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, containerd2_bin_dir
from kubegpu.devenv.controlplane import BinariesMissing, ensure_namespace
from kubegpu.localcluster.cluster import find_cluster_binaries, verifying_keys
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools

pytestmark = pytest.mark.node

NAMESPACE = "nri-e2e"
NODE = "kubegpu-node"
SHOW = "env; echo SEES $(ls /dev/kubegpu-sim 2>/dev/null); echo END"


def kubegpu(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, k8s.ApiClient]]:
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
        raise
    if containerd2_bin_dir() is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    _require_node_tools()
    state = tmp_path_factory.mktemp("nri-e2e")
    up = kubegpu("up", "--state-dir", str(state), "--no-workload", "--containerd", "2", "--front", "nri")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        api = new_client_from_config(str(state / "control-plane" / "admin.kubeconfig"))
        try:
            ensure_namespace(k8s.CoreV1Api(api), NAMESPACE)
            yield state, api
        finally:
            api.close()
    finally:
        down = kubegpu("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr


def pod(
    name: str,
    gpus: int = 0,
    *,
    env: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "kubegpu",
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", f"{SHOW}; sleep 1000000"],
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node  # bound past the scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}},
        "spec": spec,
    }


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def output(core: k8s.CoreV1Api, name: str) -> str:
    def read() -> str:
        try:
            text = core.read_namespaced_pod_log(name, NAMESPACE)
        except k8s.ApiException:
            return ""
        return text if text and "END" in text else ""

    return wait_for(f"{name}'s output", read)


def refusal(core: k8s.CoreV1Api, name: str, text: str) -> str:
    """The message of the pod's event (kubelet's Failed, from containerd's create error) with text."""

    def find() -> str:
        for event in core.list_namespaced_event(NAMESPACE).items:
            if event.involved_object.name == name and text in (event.message or ""):
                return event.message
        return ""

    try:
        return wait_for(f"an event on {name} containing {text!r}", find)
    except AssertionError:
        seen = [
            e.message for e in core.list_namespaced_event(NAMESPACE).items if e.involved_object.name == name
        ]
        raise AssertionError(f"no event on {name} containing {text!r}; its events: {seen}") from None


def test_the_nri_front_honours_allocations_and_refuses_what_the_proxy_refuses(
    cluster: tuple[Path, k8s.ApiClient],
) -> None:
    state, api = cluster
    core = k8s.CoreV1Api(api)
    keys = verifying_keys(state / "keys" / "node")

    core.create_namespaced_pod(NAMESPACE, pod("two", 2, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    log = output(core, "two")
    placed = core.read_namespaced_pod("two", NAMESPACE)
    allocation = verify(placed.metadata.annotations[ANNOTATION], keys)
    devices = sorted(allocation.containers["app"].devices)
    assert len(devices) == 2
    visible = next(line for line in log.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES="))
    assert sorted(visible.split("=", 1)[1].split(",")) == devices, log
    seen = next(line for line in log.splitlines() if line.startswith("SEES"))
    assert len(seen.split()) == 1 + 2, log

    forged = {ANNOTATION: placed.metadata.annotations[ANNOTATION].replace('"node"', '"nod"')}
    core.create_namespaced_pod(NAMESPACE, pod("forged", 2, annotations=forged, node=NODE))
    assert "pod nri-e2e/forged" in refusal(core, "forged", "signature does not verify")
    core.create_namespaced_pod(NAMESPACE, pod("no-allocation", 2, node=NODE))
    assert "carries no kubegpu allocation" in refusal(core, "no-allocation", "allocation")
    replay = {ANNOTATION: placed.metadata.annotations[ANNOTATION]}
    core.create_namespaced_pod(NAMESPACE, pod("replay", 2, annotations=replay, node=NODE))
    assert "allocation is for pod UID" in refusal(core, "replay", "allocation is for pod UID")
    for name in ("forged", "no-allocation", "replay"):
        assert core.read_namespaced_pod(name, NAMESPACE).status.phase == "Pending"
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    wait_for(  # kubelet counts their GPUs until they are gone
        "the refused pods to go",
        lambda: (
            not {"forged", "no-allocation", "replay"}
            & {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
        ),
    )

    # signed with the cluster's own key, so only the node's checks can refuse these
    signer = load_keys(state / "keys" / "scheduler", allow_private=True).private
    key_id, key = next(iter(signer.items()))

    def bound_with(name: str, node: str, gpus: list[str]) -> None:
        """A pod no scheduler serves, given an allocation signed for it, then bound to NODE."""
        body = pod(name, len(gpus))
        body["spec"]["schedulerName"] = "nobody"
        core.create_namespaced_pod(NAMESPACE, body)
        uid = core.read_namespaced_pod(name, NAMESPACE).metadata.uid
        allocation = Allocation(node, uid, {"app": ContainerAllocation(tuple(gpus))})
        annotations = {ANNOTATION: sign(allocation, key_id, key)}
        core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": annotations}})
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        core.create_namespaced_pod_binding(name, NAMESPACE, binding, _preload_content=False).release_conn()

    bound_with("other-node", "kubegpu-node-9", devices[:1])
    assert "kubegpu-node-9" in refusal(core, "other-node", "kubegpu-node-9")
    bound_with("double", NODE, devices[:1])
    assert devices[0] in refusal(core, "double", devices[0])

    mount = pod("toolkit-mount")
    mount["spec"]["volumes"] = [{"name": "grab", "hostPath": {"path": "/tmp"}}]
    mount["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "grab", "mountPath": "/var/run/nvidia-container-devices/all"}
    ]
    mount["spec"]["containers"][0]["command"] = [
        "/bin/sh",
        "-c",
        "ls /var/run/nvidia-container-devices 2>&1; echo END; sleep 1000000",
    ]
    core.create_namespaced_pod(NAMESPACE, mount)
    assert "No such file or directory" in output(core, "toolkit-mount")

    core.create_namespaced_pod(NAMESPACE, pod("plain", env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    log = output(core, "plain")
    assert "NVIDIA_VISIBLE_DEVICES=void" in log, log
    assert next(line for line in log.splitlines() if line.startswith("SEES")).split() == ["SEES"], log


def env_of(log: str) -> dict[str, str]:
    """The container's environment as ``env`` printed it (before the ``SEES`` line)."""
    lines = log.split("SEES", 1)[0].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def sees(log: str) -> list[str]:
    return next(line for line in log.splitlines() if line.startswith("SEES")).split()[1:]


# Variables a pod sets to grab devices: the toolkit's selectors, kubegpu's own (in any case) and
# the runtime's; CUDA_VISIBLE_DEVICES selects nothing on the node (it only renumbers what the
# container already sees), so the proxy leaves it as the pod spelled it.
GRABS = {
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_GDS": "enabled",
    "NVIDIA_MIG_CONFIG_DEVICES": "all",
    "Kubegpu_Visible_Devices": "all",
    "KUBEGPU_GPU_SHARES": "all",
    "DOCKER_RESOURCE_GPU": "all",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}
# Names the proxy removes; the NRI front empties them instead (NRI v0.11 keeps a removed variable
# in the OCI spec: crishim/nri/front.py), which selects nothing just the same.
REMOVED = (
    "NVIDIA_MIG_CONFIG_DEVICES",
    "Kubegpu_Visible_Devices",
    "KUBEGPU_GPU_SHARES",
    "DOCKER_RESOURCE_GPU",
)


def test_env_grabs_path_spellings_and_a_revoked_key_get_the_proxys_verdicts(
    cluster: tuple[Path, k8s.ApiClient],
) -> None:
    state, api = cluster
    core = k8s.CoreV1Api(api)
    keys = verifying_keys(state / "keys" / "node")

    # env grabs with an allocation: exactly the allocated GPU, the grabs neutralised
    core.create_namespaced_pod(NAMESPACE, pod("env-grab", 1, env=GRABS))
    log = output(core, "env-grab")
    placed = core.read_namespaced_pod("env-grab", NAMESPACE)
    granted = list(verify(placed.metadata.annotations[ANNOTATION], keys).containers["app"].devices)
    env = env_of(log)
    assert env["NVIDIA_VISIBLE_DEVICES"] == granted[0], log
    assert env["KUBEGPU_VISIBLE_DEVICES"] == granted[0], log  # the sim plugin's, for the grant
    assert env["NVIDIA_GDS"] == "disabled", log
    assert env["CUDA_VISIBLE_DEVICES"] == GRABS["CUDA_VISIBLE_DEVICES"], log
    for name in REMOVED:
        assert env.get(name, "") == "", log
    assert len(sees(log)) == 1, log

    # a pod without allocation: path spellings of managed nodes as hostPath volumes (kept: a
    # volume's node is outside the device cgroup, Pod Security's business as with the proxy),
    # toolkit device-list mounts in other spellings (removed), env grabs (neutralised)
    sim_dev = state / "nodes" / NODE / "sim" / "dev" / "kubegpu-sim"
    assert (sim_dev / "gpu4").exists(), sorted(p.name for p in sim_dev.parent.iterdir())
    link = state / "nodes" / NODE / "innocent-looking"
    link.symlink_to(sim_dev / "gpu4")
    empty = state / "nodes" / NODE / "empty"  # not /tmp: its many submounts would come along
    empty.mkdir()
    spelled = pod("spelled", env=GRABS)
    volumes = {
        "dot": f"{sim_dev}/./gpu3",  # the API server refuses '..' in a hostPath itself
        "slashes": f"{sim_dev}//gpu2",
        "link": str(link),
        "request-a": str(empty),
        "request-b": str(empty),
        "request-c": str(empty),
        "request-d": str(empty),
    }
    spelled["spec"]["volumes"] = [{"name": n, "hostPath": {"path": p}} for n, p in volumes.items()]
    spelled["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "dot", "mountPath": "/grab/dot"},
        {"name": "slashes", "mountPath": "/grab/slashes"},
        {"name": "link", "mountPath": "/grab/link"},
        {"name": "request-a", "mountPath": "/var/run//nvidia-container-devices/all"},
        {"name": "request-b", "mountPath": "/run/../var/run/nvidia-container-devices/1"},
        {"name": "request-c", "mountPath": "/var/run/nvidia-container-devicesall"},
        {"name": "request-d", "mountPath": "/RUN/Nvidia-Container-Devices/all"},
    ]
    spelled["spec"]["containers"][0]["command"] = [
        "/bin/sh",
        "-c",
        f"{SHOW.removesuffix('; echo END')}; echo GRABBED $(ls /grab); "
        "echo MOUNTS $(grep -i nvidia-container-devices /proc/mounts | wc -l); echo END; sleep 1000000",
    ]
    core.create_namespaced_pod(NAMESPACE, spelled)
    log = output(core, "spelled")
    env = env_of(log)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["NVIDIA_GDS"] == "disabled", log
    assert env["CUDA_VISIBLE_DEVICES"] == GRABS["CUDA_VISIBLE_DEVICES"], log
    for name in (*REMOVED, "KUBEGPU_VISIBLE_DEVICES"):
        assert env.get(name, "") == "", log
    assert sees(log) == [], log
    assert "GRABBED dot link slashes" in log, log
    assert "MOUNTS 0" in log, log

    # a revoked key (its file removed from the node's key directory): what it signed is refused
    key_file = next(p for p in (state / "keys" / "node").iterdir() if p.is_file())
    saved = key_file.read_bytes()
    key_file.unlink()
    try:
        deadline = time.monotonic() + 60  # the agent looks at the directory every few seconds
        attempt = 0
        while True:
            name = f"revoked-{attempt}"
            core.create_namespaced_pod(NAMESPACE, pod(name, 1))
            reason = f"unknown key id {key_file.name!r}"

            def settled(name: str = name, reason: str = reason) -> str:
                for event in core.list_namespaced_event(NAMESPACE).items:
                    if event.involved_object.name == name and reason in (event.message or ""):
                        return "refused"
                try:
                    text = core.read_namespaced_pod_log(name, NAMESPACE)
                except k8s.ApiException:
                    return ""
                return "admitted" if text and "END" in text else ""

            if wait_for(f"{name} to be refused or to run", settled) == "refused":
                assert f"pod {NAMESPACE}/{name}" in refusal(core, name, reason)
                assert core.read_namespaced_pod(name, NAMESPACE).status.phase == "Pending"
                break
            assert time.monotonic() < deadline, "a revoked key was still accepted"
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            attempt += 1
    finally:
        key_file.write_bytes(saved)
