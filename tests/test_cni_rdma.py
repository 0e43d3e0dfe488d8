"""kubegpu-cni, the real executable, in a lab of network namespaces the test owns
(tests/support/cnilab.py): stand-in VF netdevs in a "host" namespace, a fake sysfs naming them,
pod namespaces; nothing touches the machine's own interfaces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.keys import OTHER_KEY
from tests.support.cnilab import NetLab, ip

pytestmark = pytest.mark.timeout(180)

ANNOTATION = "kubegpu.io/allocation"
RDMA_INTERFACES = "kubegpu.io/rdma-interfaces"
UID = "uid-1"  # the lab's default pod (default/train) has this UID in CNI_ARGS


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetLab]:
    net = NetLab(tmp_path)
    try:
        yield net
    finally:
        net.close()


def _alloc(lab: NetLab, vfs: list[tuple[str, int, int]], uid: str = UID, **kw: str) -> dict[str, str]:
    return {ANNOTATION: lab.annotation(uid, vfs, **kw), "other": "x"}


HOST_VFS = {"vfnet0", "vfnet1", "vfnet2", "vfnet3"}


def _untouched(lab: NetLab, pod: str) -> None:
    """Every stand-in VF is home under its name, the pod holds nothing, no record is left."""
    assert HOST_VFS <= set(lab.links())
    assert set(lab.links(pod)) == {"lo"}
    assert not list(lab.state.glob("*.json"))


def test_add_moves_names_limits_and_del_returns(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    before = lab.links()
    ann = _alloc(lab, [("mlx5_2", 1000, 2000), ("mlx5_5", 500, 0)])
    added = lab.cni("ADD", "c1", pod, annotations=ann)
    assert added.rc == 0, added.stderr
    assert added.doc is not None
    # chained: the primary network's interface and IP stay first, the VFs follow
    assert [i["name"] for i in added.doc["interfaces"]] == ["eth0", "rdma0", "rdma1"]
    assert added.doc["ips"] == [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 0}]
    assert added.doc["interfaces"][1] == {"name": "rdma0", "mac": before["vfnet0"], "sandbox": pod}
    inside = lab.links(pod)
    assert inside == {"lo": "00:00:00:00:00:00", "rdma0": before["vfnet0"], "rdma1": before["vfnet3"]}
    assert not {"vfnet0", "vfnet3"} & set(lab.links())
    assert {"vfnet1", "vfnet2"} <= set(lab.links())  # not allocated: untouched
    assert "rate 1Gbit ceil 2Gbit" in lab.tc_classes(pod, "rdma0")
    assert "rate 500Mbit ceil 10Tbit" in lab.tc_classes(pod, "rdma1")  # no maxMbps: uncapped

    checked = lab.cni("CHECK", "c1", pod, annotations=ann)
    assert checked.rc == 0, checked.stderr
    again = lab.cni("ADD", "c1", pod, annotations=ann)  # the runtime retried: same answer, no change
    assert again.rc == 0 and again.doc == added.doc, again.stderr
    assert lab.links(pod) == inside

    deleted = lab.cni("DEL", "c1", pod, annotations=ann)
    assert deleted.rc == 0 and deleted.doc is None, deleted.stderr
    assert lab.links() == before
    _untouched(lab, pod)
    assert lab.cni("DEL", "c1", pod).rc == 0  # idempotent
    gone = lab.cni("CHECK", "c1", pod, annotations=ann)
    assert gone.rc == 1 and gone.doc is not None and gone.doc["code"] == 105


def test_del_needs_neither_pod_nor_its_namespace(lab: NetLab) -> None:
    """The kernel hands a physical VF back to the host namespace (maybe as ``devN``) when the pod's
    namespace dies; DEL finds it through sysfs and restores its name. Stand-in netdevs would be
    destroyed with the namespace instead, so the test does the kernel's part: moves it out as
    dev7 and shows dev7 in the VF's sysfs net/ directory, then deletes the namespace."""
    pod = lab.pod_netns("p1")
    before = lab.links()
    ann = _alloc(lab, [("mlx5_2", 1000, 0), ("mlx5_3", 1000, 0)])
    assert lab.cni("ADD", "c1", pod, annotations=ann).rc == 0
    ip("-n", os.path.basename(pod), "link", "set", "rdma0", "netns", lab.host, "name", "dev7")
    (lab.pci["mlx5_2"] / "net" / "vfnet0").rename(lab.pci["mlx5_2"] / "net" / "dev7")
    lab.delete_netns(pod)  # rdma1 (a stand-in) dies with it, as a VF the kernel lost would be gone
    deleted = lab.cni("DEL", "c1", pod, pod=None)  # no pod, no annotations: the record suffices
    assert deleted.rc == 0, deleted.stderr
    assert lab.links()["vfnet0"] == before["vfnet0"]
    assert "dev7" not in lab.links()
    assert "cni.vf_not_found" in deleted.stderr and "mlx5_3" in deleted.stderr
    assert not list(lab.state.glob("*.json"))


def test_concurrent_adds_never_take_one_vf_twice(lab: NetLab) -> None:
    """Four pods whose (signed, so only a scheduler bug could make them) allocations name the same
    VF start at once: one gets it, the others fail cleanly and hold nothing."""
    pods = [lab.pod_netns(f"p{k}") for k in range(4)]
    procs = [
        lab.start(
            "ADD",
            f"c{k}",
            pods[k],
            pod=("default", f"p{k}", f"uid-{k}"),
            annotations=_alloc(lab, [("mlx5_2", 100, 0), ("mlx5_4", 100, 0)], uid=f"uid-{k}"),
        )
        for k in range(4)
    ]
    runs = [lab.finish(p) for p in procs]
    winners = [k for k, r in enumerate(runs) if r.rc == 0]
    assert len(winners) == 1, [r.stderr[-400:] for r in runs]
    for k, run in enumerate(runs):
        if k in winners:
            assert set(lab.links(pods[k])) == {"lo", "rdma0", "rdma1"}
        else:
            assert run.doc is not None and run.doc["code"] in (102, 103), run.doc
            assert set(lab.links(pods[k])) == {"lo"}
    assert [p.name for p in lab.state.glob("*.json")] == [f"c{winners[0]}.json"]


def test_pod_without_rdma_allocation_passes_through(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    prev = lab.config()["prevResult"]
    for passed in ({"other": "x"}, {}):
        run = lab.cni("ADD", "c1", pod, annotations=passed)
        assert run.rc == 0 and run.doc == prev, run.stderr
    not_k8s = lab.cni("ADD", "c1", pod, pod=None)  # no K8S_POD_* in CNI_ARGS: no pod, no allocation
    assert not_k8s.rc == 0 and not_k8s.doc == prev
    assert lab.cni("CHECK", "c1", pod, annotations={}).rc == 0
    assert lab.cni("DEL", "c1", pod).rc == 0
    _untouched(lab, pod)


def test_a_pod_asking_for_interfaces_without_them_in_its_allocation_is_refused(lab: NetLab) -> None:
    from kubegpu.allocation import Allocation, ContainerAllocation, sign
    from tests.fixtures.keys import KEY, KEY_ID

    pod = lab.pod_netns("p1")
    gpus_only = sign(Allocation("node-a", UID, {"app": ContainerAllocation(("GPU-1",))}), KEY_ID, KEY)
    for passed, why in (
        ({RDMA_INTERFACES: "2"}, "carries no kubegpu allocation"),
        ({RDMA_INTERFACES: "two"}, "carries no kubegpu allocation"),  # unreadable: asks all the same
        ({RDMA_INTERFACES: "1", ANNOTATION: gpus_only}, "its allocation holds none"),
    ):
        run = lab.cni("ADD", "c1", pod, annotations=passed)
        assert run.rc == 1 and run.doc is not None, run.stderr
        assert run.doc["code"] == 106, run.doc
        assert "default/train" in run.doc["msg"] and RDMA_INTERFACES in run.doc["msg"], run.doc
        assert why in run.doc["msg"], run.doc
        _untouched(lab, pod)
    prev = lab.config()["prevResult"]
    for passed in (
        {RDMA_INTERFACES: "0"},
        {RDMA_INTERFACES: "0", ANNOTATION: gpus_only},
        {RDMA_INTERFACES: " 00\t"},  # none, as the scheduler reads it (it placed the pod so)
        {RDMA_INTERFACES: "0 ", ANNOTATION: gpus_only},
    ):
        run = lab.cni("ADD", "c1", pod, annotations=passed)  # asks for none: passes through
        assert run.rc == 0 and run.doc == prev, run.stderr
    _untouched(lab, pod)


@pytest.mark.parametrize(
    "case",
    ["tampered", "unknown-key", "other-node", "other-uid", "unsigned"],
)
def test_bad_allocation_is_refused(lab: NetLab, case: str) -> None:
    pod = lab.pod_netns("p1")
    value = lab.annotation(UID, [("mlx5_2", 1000, 0)])
    if case == "tampered":
        value = value.replace('"minMbps":1000', '"minMbps":100')
    elif case == "unknown-key":
        doc = json.loads(value)
        from kubegpu.allocation import Allocation, RdmaInterface, sign

        value = sign(
            Allocation("node-a", UID, {}, (RdmaInterface("mlx5_2", "mlx5_0", 1000),)), doc["keyId"], OTHER_KEY
        )
    elif case == "other-node":
        value = lab.annotation(UID, [("mlx5_2", 1000, 0)], node="node-b")
    elif case == "other-uid":
        value = lab.annotation("uid-9", [("mlx5_2", 1000, 0)])
    else:
        doc = json.loads(value)
        del doc["signature"]
        value = json.dumps(doc)
    run = lab.cni("ADD", "c1", pod, annotations={ANNOTATION: value})
    assert run.rc == 1 and run.doc is not None, run.stderr
    assert run.doc["code"] == 100 and run.doc["cniVersion"] == "1.1.0"
    assert "default/train" in run.doc["msg"]
    _untouched(lab, pod)


def test_vanished_vf_fails_before_anything_moves(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    ann = _alloc(lab, [("mlx5_2", 1000, 0), ("mlx5_3", 1000, 0)])
    os.unlink(lab.root / "sys/class/infiniband/mlx5_3")  # gone from sysfs since scheduling
    run = lab.cni("ADD", "c1", pod, annotations=ann)
    assert run.rc == 1 and run.doc is not None and run.doc["code"] == 102, run.stderr
    assert "mlx5_3" in run.doc["msg"]
    _untouched(lab, pod)


def test_vf_whose_netdev_is_gone_fails_before_anything_moves(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    ip("-n", lab.host, "link", "del", "vfnet1")  # in sysfs still, its netdev gone
    run = lab.cni("ADD", "c1", pod, annotations=_alloc(lab, [("mlx5_2", 1, 0), ("mlx5_3", 1, 0)]))
    assert run.rc == 1 and run.doc is not None and run.doc["code"] == 102, run.stderr
    assert "vfnet1" in run.doc["msg"]
    assert "vfnet0" in lab.links() and set(lab.links(pod)) == {"lo"}


def test_failure_half_way_rolls_back(lab: NetLab) -> None:
    """The second VF cannot take its name in the pod (taken): the first is moved back."""
    pod = lab.pod_netns("p1")
    lab.add_netdev("rdma1", netns=os.path.basename(pod))
    before = lab.links()
    run = lab.cni("ADD", "c1", pod, annotations=_alloc(lab, [("mlx5_2", 1, 0), ("mlx5_3", 1, 0)]))
    assert run.rc == 1 and run.doc is not None and run.doc["code"] == 104, run.stderr
    assert "already has an interface called rdma1" in run.doc["msg"] and "rolled back" in run.doc["msg"]
    assert lab.links() == before
    assert set(lab.links(pod)) == {"lo", "rdma1"}
    assert not list(lab.state.glob("*.json"))


def test_vf_rate_on_a_device_without_vfs_fails_and_rolls_back(lab: NetLab) -> None:
    """``vf-rate`` (the real SR-IOV path) sets IFLA_VF_RATE on the PF; the stand-in PF has no VFs,
    so the kernel refuses it: a CNI error, and the VF goes home."""
    pod = lab.pod_netns("p1")
    before = lab.links()
    conf = lab.config(bandwidth="vf-rate")
    run = lab.cni("ADD", "c1", pod, annotations=_alloc(lab, [("mlx5_2", 1000, 2000)]), config=conf)
    assert run.rc == 1 and run.doc is not None and run.doc["code"] == 104, run.stderr
    assert "VF 0 of pfnet0" in run.doc["msg"] and "rolled back" in run.doc["msg"]
    assert lab.links() == before
    _untouched(lab, pod)


def test_default_max_rate_caps_and_an_unknown_unit_is_refused(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    ann = _alloc(lab, [("mlx5_2", 1000, 0)])
    bad = lab.cni("ADD", "c1", pod, annotations=ann, config=lab.config(defaultMaxRate="25Gbit"))
    assert bad.rc == 1 and bad.doc is not None and bad.doc["code"] == 7, bad.stderr
    assert "defaultMaxRate" in bad.doc["msg"] and "Gbps or Mbps" in bad.doc["msg"]
    _untouched(lab, pod)
    good = lab.cni("ADD", "c1", pod, annotations=ann, config=lab.config(defaultMaxRate="25Gbps"))
    assert good.rc == 0, good.stderr
    assert "rate 1Gbit ceil 25Gbit" in lab.tc_classes(pod, "rdma0")


def test_gc_releases_attachments_the_runtime_no_longer_has(lab: NetLab) -> None:
    pods = [lab.pod_netns("p1"), lab.pod_netns("p2")]
    assert lab.cni("ADD", "c1", pods[0], annotations=_alloc(lab, [("mlx5_2", 1, 0)])).rc == 0
    other = _alloc(lab, [("mlx5_3", 1, 0)], uid="uid-2")
    assert lab.cni("ADD", "c2", pods[1], pod=("default", "p2", "uid-2"), annotations=other).rc == 0
    keep = [{"containerID": "c2", "ifname": "eth0"}]
    run = lab.cni("GC", config=lab.config(**{"cni.dev/valid-attachments": keep}))
    assert run.rc == 0, run.stderr
    assert "vfnet0" in lab.links() and set(lab.links(pods[0])) == {"lo"}
    assert set(lab.links(pods[1])) == {"lo", "rdma0"}
    missing = lab.cni("GC")
    assert missing.rc == 1 and missing.doc is not None and missing.doc["code"] == 7


def test_protocol_errors(lab: NetLab) -> None:
    pod = lab.pod_netns("p1")
    version = lab.cni("VERSION", config={"cniVersion": "1.1.0"})
    assert version.rc == 0 and version.doc == {"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}
    old = lab.cni("ADD", "c1", pod, annotations={}, config=lab.config(cniVersion="0.4.0"))
    assert old.rc == 1 and old.doc is not None and old.doc["code"] == 1
    no_id = lab.cni("ADD", "", pod, annotations={})
    assert no_id.rc == 1 and no_id.doc is not None and no_id.doc["code"] == 4
    control = lab.cni("ADD", "c1", pod, annotations=_alloc(lab, [("mlx5_2", 1, 0)]))
    assert control.rc == 0  # the same call with annotations works
    assert lab.cni("DEL", "c1", pod).rc == 0
    blind = lab.cni("ADD", "c1", pod)  # the runtime passed no annotations, no kubeconfig configured
    assert blind.rc == 1 and blind.doc is not None and blind.doc["code"] == 7
    assert "io.kubernetes.cri.pod-annotations" in blind.doc["msg"]
    status = lab.cni("STATUS")
    assert status.rc == 0 and status.doc is None, status.stderr
    (lab.tmp / "afile").write_text("")
    broken = lab.cni("STATUS", config=lab.config(stateDir=str(lab.tmp / "afile" / "state")))
    assert broken.rc == 1 and broken.doc is not None and broken.doc["code"] == 50
    _untouched(lab, pod)


def test_a_held_lock_makes_add_try_again_later(lab: NetLab) -> None:
    import fcntl

    pod = lab.pod_netns("p1")
    lab.state.mkdir(mode=0o700)
    with open(lab.state / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = lab.cni(
            "ADD",
            "c1",
            pod,
            annotations=_alloc(lab, [("mlx5_2", 1, 0)]),
            config=lab.config(lockTimeoutSeconds=0.5),
        )
    assert run.rc == 1 and run.doc is not None and run.doc["code"] == 11, run.stderr
    _untouched(lab, pod)
    assert lab.cni("ADD", "c1", pod, annotations=_alloc(lab, [("mlx5_2", 1, 0)])).rc == 0


@pytest.mark.apiserver
def test_annotations_and_uid_from_the_api(
    lab: NetLab, control_plane: Any, admin_api: Any, kube_namespace: str, tmp_path: Path
) -> None:
    """The runtime passed no annotations (or no K8S_POD_UID): the plugin reads the pod from a
    real kube-apiserver with the configured kubeconfig."""
    from urllib.parse import urlsplit

    import yaml
    from kubernetes import client as k8s

    from tests.support.cnilab import Forwarder

    core = k8s.CoreV1Api(admin_api)
    body = {"metadata": {"name": "train"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    uid = core.create_namespaced_pod(kube_namespace, body).metadata.uid
    value = lab.annotation(uid, [("mlx5_2", 1000, 0)])
    core.patch_namespaced_pod("train", kube_namespace, {"metadata": {"annotations": {ANNOTATION: value}}})
    url = urlsplit(control_plane.url)
    forward = Forwarder(lab, (url.hostname, url.port))
    try:
        kubeconfig = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{forward.port}"
        path = tmp_path / "node.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        path.chmod(0o600)
        conf = lab.config(kubeconfig=str(path))
        pod = lab.pod_netns("p1")
        run = lab.cni("ADD", "c1", pod, pod=(kube_namespace, "train", uid), config=conf)
        assert run.rc == 0, run.stderr
        assert set(lab.links(pod)) == {"lo", "rdma0"}
        # annotations from the runtime but no K8S_POD_UID: the UID comes from the API
        again = lab.cni(
            "ADD", "c1", pod, pod=(kube_namespace, "train", ""), config=conf, annotations={ANNOTATION: value}
        )
        assert again.rc == 0 and again.doc == run.doc, again.stderr
        wrong = lab.cni("ADD", "c2", pod, pod=(kube_namespace, "train", "uid-other"), config=conf)
        assert wrong.rc == 1 and wrong.doc is not None and wrong.doc["code"] == 101, wrong.stderr
        missing = lab.cni("ADD", "c3", pod, pod=(kube_namespace, "nope", ""), config=conf)
        assert missing.rc == 1 and missing.doc is not None and missing.doc["code"] == 101
        assert "404" in missing.doc["msg"]
        assert lab.cni("DEL", "c1", pod, config=conf).rc == 0
        _untouched(lab, pod)
    finally:
        forward.close()


def test_default_max_rate_below_the_allocated_minimum_never_caps_it_below(lab: NetLab) -> None:
    """The scheduler reserved 2 Gbit/s for the VF on its PF; a node's defaultMaxRate of 500 Mbit/s
    (a cap for VFs whose allocation gives none) must not cap it below that minimum: the pod gets
    what was reserved for it (before, the cap went under the minimum: a tc class whose ceil is below
    its rate, and under vf-rate a min_tx_rate above max_tx_rate, which the kernel refuses, so such
    a pod never started)."""
    pod = lab.pod_netns("p1")
    ann = _alloc(lab, [("mlx5_2", 2000, 0), ("mlx5_3", 100, 0)])
    run = lab.cni("ADD", "c1", pod, annotations=ann, config=lab.config(defaultMaxRate="500Mbps"))
    assert run.rc == 0, run.stderr
    assert "rate 2Gbit ceil 2Gbit" in lab.tc_classes(pod, "rdma0")
    assert "rate 100Mbit ceil 500Mbit" in lab.tc_classes(pod, "rdma1")
    record = json.loads((lab.state / "c1.json").read_text())
    assert [(a["min_mbps"], a["max_mbps"]) for a in record["attachments"]] == [(2000, 2000), (100, 500)]
    checked = lab.cni("CHECK", "c1", pod, annotations=ann, config=lab.config(defaultMaxRate="500Mbps"))
    assert checked.rc == 0, checked.stderr


def test_add_into_the_hosts_own_namespace_is_refused(lab: NetLab) -> None:
    """CNI_NETNS naming the namespace the plugin runs in (the host's: ``/proc/self/ns/net``, or a
    bind mount of it): the VFs would only be renamed in the host and reported attached (before,
    ADD answered success with rdma0 left in the host). Refused, nothing moved."""
    ann = _alloc(lab, [("mlx5_2", 1000, 0)])
    for netns in ("/proc/self/ns/net", f"/run/netns/{lab.host}"):
        run = lab.cni("ADD", "c1", netns, annotations=ann)
        assert run.rc == 1 and run.doc is not None and run.doc["code"] == 4, (netns, run.stderr)
        assert "the host's own network namespace" in run.doc["msg"], run.doc
        assert HOST_VFS <= set(lab.links()) and "rdma0" not in lab.links()
        assert not list(lab.state.glob("*.json"))
    prev = lab.config()["prevResult"]
    run = lab.cni("ADD", "c1", "/proc/self/ns/net", annotations={})  # no VFs: nothing to move
    assert run.rc == 0 and run.doc == prev, run.stderr


def test_a_malformed_prev_result_is_a_decode_error(lab: NetLab) -> None:
    """The previous plugin's result is passed on with the VFs appended; one that is not an object,
    or whose interfaces are not a list, is code 6 (before: a list of characters passed on, or
    code 199, an internal error)."""
    pod = lab.pod_netns("p1")
    for prev, what in (
        ({"cniVersion": "1.1.0", "interfaces": "eth0"}, "prevResult.interfaces is not a list"),
        ({"cniVersion": "1.1.0", "interfaces": 5}, "prevResult.interfaces is not a list"),
        ([{"interfaces": []}], "prevResult is not a JSON object"),
    ):
        for passed in ({}, _alloc(lab, [("mlx5_2", 1000, 0)])):
            run = lab.cni("ADD", "c1", pod, annotations=passed, config=lab.config(prevResult=prev))
            assert run.rc == 1 and run.doc is not None and run.doc["code"] == 6, (prev, run.doc)
            assert run.doc["msg"] == what
    _untouched(lab, pod)
    bare = lab.config()
    del bare["prevResult"]
    run = lab.cni("ADD", "c1", pod, annotations={}, config=bare)  # none given: nothing to pass on
    assert run.rc == 0 and run.doc == {"cniVersion": "1.1.0", "interfaces": []}, run.stderr
