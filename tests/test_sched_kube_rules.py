"""kube-scheduler's rules, side by side: the real kube-scheduler and `kubegpu scheduler` on one
real apiserver, each given an identical small world of fake nodes per case and the same pods,
must make the same decision (bound or not, the same node where the case determines it, and the
same reasons where a pod fits nowhere).

One apiserver, one kube-scheduler and one kubegpu scheduler serve every case (tests/support/
kuberules.py builds the worlds and reads the decisions); each case's check is its own test, so a
rule kubegpu gets wrong names itself. docs/scheduler.md ("Kubernetes' scheduling rules") lists
which of kube-scheduler's default plugins kubegpu applies and the case checking each.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from kubegpu.devenv.controlplane import ControlPlane
from tests.support.kuberules import (
    NODE_LABEL,
    UNSCHEDULABLE,
    Case,
    Decision,
    N,
    P,
    Worlds,
    compare,
    container,
    side_by_side,
    taint,
)

pytestmark = pytest.mark.apiserver

KUBE_SCHEDULER = "rules-kube-scheduler"
KUBEGPU = "rules-kubegpu"
GiB = 1 << 30
ZONE = "topology.kubernetes.io/zone"


def on(node: str, **spec: object) -> dict[str, object]:
    """A pod spec pinned (by nodeSelector) to the case's node ``node``."""
    return {"nodeSelector": {NODE_LABEL: node}, **spec}


def asks(requests: dict[str, str], limits: dict[str, str] | None = None, **spec: object) -> dict[str, object]:
    """A pod spec whose one container asks ``requests`` (and ``limits``)."""
    return {"containers": [container(requests=requests, limits=limits)], **spec}


def ports(*entries: tuple[int, str, str]) -> dict[str, object]:
    """A pod spec whose container takes these (hostPort, protocol, hostIP)."""
    table = [
        {"containerPort": port, "hostPort": port, "protocol": protocol, **({"hostIP": ip} if ip else {})}
        for port, protocol, ip in entries
    ]
    return {"containers": [container(ports=table)]}


def affinity(kind: str, required: list[dict[str, object]]) -> dict[str, object]:
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


def pod_term(key: str, app: str) -> dict[str, object]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}


def node_term(key: str, operator: str, values: list[str]) -> dict[str, object]:
    return {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": operator, "values": values}]}]
    }


# hugepages: requests equal to limits, with memory (the API server's rule)
HUGE_4M = ({"memory": "64Mi", "hugepages-2Mi": "4Mi"}, {"memory": "64Mi", "hugepages-2Mi": "4Mi"})
HUGE_16M = ({"memory": "64Mi", "hugepages-2Mi": "16Mi"}, {"memory": "64Mi", "hugepages-2Mi": "16Mi"})
UNSCHEDULABLE_TOLERATION = {
    "key": "node.kubernetes.io/unschedulable",
    "operator": "Exists",
    "effect": "NoSchedule",
}
SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
}

CASES = (
    # --- NodeResourcesFit ------------------------------------------------------------------------
    Case(
        "cpu",
        "NodeResourcesFit",
        (N("a", {"cpu": "2"}), N("b", {"cpu": "4"})),
        (
            P("fits-b", asks({"cpu": "3"}), expect="b"),
            P("too-big", asks({"cpu": "5"}), expect=UNSCHEDULABLE, reason="Insufficient cpu"),
        ),
    ),
    Case(
        "cpu-milli",
        "NodeResourcesFit",
        (N("a", {"cpu": "1500m"}),),
        (
            P("filler", asks({"cpu": "1"}), by="none", node="a", step=0),
            P("exact", asks({"cpu": "500m"}), expect="a"),
            P("over", asks({"cpu": "501m"}), expect=UNSCHEDULABLE, reason="Insufficient cpu"),
        ),
    ),
    Case(
        "mem-node-bytes",  # a node's memory is not rounded up to a whole MiB
        "NodeResourcesFit",
        (N("a", {"memory": str(GiB - 1)}),),
        (P("one-gib", asks({"memory": "1Gi"}), expect=UNSCHEDULABLE, reason="Insufficient memory"),),
    ),
    Case(
        "mem-pod-bytes",  # nor is each pod's: two pods of 512 MiB + 1 byte fit 1 GiB + 2 bytes
        "NodeResourcesFit",
        (N("a", {"memory": str(GiB + 2)}),),
        (
            P("filler", asks({"memory": str(GiB // 2 + 1)}), by="none", node="a", step=0),
            P("second", asks({"memory": str(GiB // 2 + 1)}), expect="a"),
        ),
    ),
    Case(
        "pods",
        "NodeResourcesFit",
        (N("full", {"pods": "2"}), N("room", {"pods": "3"})),
        (
            P("f1", on("full"), by="none", node="full", step=0),
            P("f2", on("full"), by="none", node="full", step=0),
            P("r1", on("room"), by="none", node="room", step=0),
            P("r2", on("room"), by="none", node="room", step=0),
            P("anywhere", expect="room"),
            P("on-full", on("full"), expect=UNSCHEDULABLE, reason="Too many pods"),
        ),
    ),
    Case(
        "ext-absent",
        "NodeResourcesFit",
        (N("a"),),
        (
            P(
                "foo",
                asks({"example.com/foo": "1"}, {"example.com/foo": "1"}),
                expect=UNSCHEDULABLE,
                reason="Insufficient example.com/foo",
            ),
        ),
    ),
    Case(
        "ext-present",
        "NodeResourcesFit",
        (N("a", {"example.com/foo": "2"}),),
        (
            P(
                "filler",
                asks({"example.com/foo": "1"}, {"example.com/foo": "1"}),
                by="none",
                node="a",
                step=0,
            ),
            P("second", asks({"example.com/foo": "1"}, {"example.com/foo": "1"}), expect="a"),
            P(
                "third",
                asks({"example.com/foo": "1"}, {"example.com/foo": "1"}),
                step=2,
                expect=UNSCHEDULABLE,
                reason="Insufficient example.com/foo",
            ),
        ),
    ),
    Case(
        "rdma",
        "NodeResourcesFit",
        (N("a", nics=1),),
        (
            P("first", asks({"kubegpu.io/rdma": "1"}, {"kubegpu.io/rdma": "1"}), expect="a"),
            P(
                "second",
                asks({"kubegpu.io/rdma": "1"}, {"kubegpu.io/rdma": "1"}),
                step=2,
                expect=UNSCHEDULABLE,
                reason="Insufficient kubegpu.io/rdma",
            ),
        ),
    ),
    Case(  # the pod's request by the init-container rule: the larger of the init container and the apps
        "rdma-init",
        "NodeResourcesFit",
        (N("a", nics=2),),
        (
            P(
                "init-two",
                asks(
                    {"kubegpu.io/rdma": "1"},
                    {"kubegpu.io/rdma": "1"},
                    initContainers=[container("init", {"kubegpu.io/rdma": "2"}, {"kubegpu.io/rdma": "2"})],
                ),
                expect="a",
            ),
            P(
                "one-more",
                asks({"kubegpu.io/rdma": "1"}, {"kubegpu.io/rdma": "1"}),
                step=2,
                expect=UNSCHEDULABLE,
                reason="Insufficient kubegpu.io/rdma",
            ),
        ),
    ),
    Case(
        "ephemeral",
        "NodeResourcesFit",
        (N("a", {"ephemeral-storage": "10Gi"}),),
        (
            P("small", asks({"ephemeral-storage": "5Gi"}), expect="a"),
            P(
                "big",
                asks({"ephemeral-storage": "20Gi"}),
                expect=UNSCHEDULABLE,
                reason="Insufficient ephemeral-storage",
            ),
        ),
    ),
    Case(
        "hugepages",
        "NodeResourcesFit",
        (N("a", {"hugepages-2Mi": "8Mi"}),),
        (
            P("small", asks(*HUGE_4M), expect="a"),
            P("big", asks(*HUGE_16M), expect=UNSCHEDULABLE, reason="Insufficient hugepages-2Mi"),
        ),
    ),
    Case(
        "pod-level",  # spec.resources: the pod's own figures, not its containers' sum
        "NodeResourcesFit",
        (N("a", {"cpu": "2"}),),
        (
            P("fits", asks({"cpu": "500m"}, resources={"requests": {"cpu": "1500m"}}), expect="a"),
            P(
                "too-big",
                asks({"cpu": "500m"}, resources={"requests": {"cpu": "3"}}),
                expect=UNSCHEDULABLE,
                reason="Insufficient cpu",
            ),
        ),
    ),
    Case(
        "init-sidecar",
        "NodeResourcesFit",
        (N("a", {"cpu": "2"}),),
        (
            P(
                "init-big",
                asks({"cpu": "1"}, initContainers=[container("init", {"cpu": "3"})]),
                expect=UNSCHEDULABLE,
                reason="Insufficient cpu",
            ),
            P(
                "sidecar-sum",
                asks(
                    {"cpu": "1500m"}, initContainers=[container("side", {"cpu": "1"}, restartPolicy="Always")]
                ),
                expect=UNSCHEDULABLE,
                reason="Insufficient cpu",
            ),
            P(
                "init-after-sidecar",
                asks(
                    {"cpu": "100m"},
                    initContainers=[
                        container("side", {"cpu": "1"}, restartPolicy="Always"),
                        container("init", {"cpu": "1500m"}),
                    ],
                ),
                expect=UNSCHEDULABLE,
                reason="Insufficient cpu",
            ),
            P(
                "sidecar-fits",
                asks(
                    {"cpu": "1"}, initContainers=[container("side", {"cpu": "500m"}, restartPolicy="Always")]
                ),
                expect="a",
            ),
        ),
    ),
    Case(
        "limits",  # requests count; limits only where there are no requests
        "NodeResourcesFit",
        (N("a", {"cpu": "2"}),),
        (
            P("requests-1-limits-3", asks({"cpu": "1"}, {"cpu": "3"}), expect="a"),
            P("limits-3", asks({}, {"cpu": "3"}), expect=UNSCHEDULABLE, reason="Insufficient cpu"),
        ),
    ),
    Case(
        "gpu",
        "NodeResourcesFit",
        (N("a", gpus=4),),
        (
            P("two", asks({"cpu": "100m"}, {"nvidia.com/gpu": "2"}), expect="a"),
            P(
                "eight",
                asks({"cpu": "100m"}, {"nvidia.com/gpu": "8"}),
                expect=UNSCHEDULABLE,
                reason="Insufficient nvidia.com/gpu",
            ),
        ),
    ),
    Case(
        "charged-cpu",  # a pod the other scheduler bound holds its CPU
        "NodeResourcesFit",
        (N("a", {"cpu": "2"}),),
        (
            P("theirs", asks({"cpu": "1500m"}), by="other"),
            P("mine", asks({"cpu": "1"}), step=2, expect=UNSCHEDULABLE, reason="Insufficient cpu"),
        ),
    ),
    Case(
        "charged-gpu",
        "NodeResourcesFit",
        (N("a", gpus=2),),
        (
            P("theirs", asks({"cpu": "100m"}, {"nvidia.com/gpu": "2"}), by="other"),
            P(
                "mine",
                asks({"cpu": "100m"}, {"nvidia.com/gpu": "1"}),
                step=2,
                expect=UNSCHEDULABLE,
                reason="Insufficient nvidia.com/gpu",
            ),
        ),
    ),
    # --- NodePorts --------------------------------------------------------------------------------
    Case(
        "ports-same",
        "NodePorts",
        (N("a"),),
        (
            P("first", ports((8080, "TCP", "")), expect="a"),
            P(
                "second",
                ports((8080, "TCP", "")),
                step=2,
                expect=UNSCHEDULABLE,
                reason="node(s) didn't have free ports for the requested pod ports",
            ),
        ),
    ),
    Case(
        "ports-protocol",
        "NodePorts",
        (N("a"),),
        (
            P("tcp", ports((8080, "TCP", "")), expect="a"),
            P("udp", ports((8080, "UDP", "")), step=2, expect="a"),
        ),
    ),
    Case(
        "ports-host-ip",
        "NodePorts",
        (N("a"),),
        (
            P("ip1", ports((8080, "TCP", "10.0.0.1")), expect="a"),
            P("ip2", ports((8080, "TCP", "10.0.0.2")), step=2, expect="a"),
            P(
                "any-ip",
                ports((8080, "TCP", "")),
                step=3,
                expect=UNSCHEDULABLE,
                reason="node(s) didn't have free ports for the requested pod ports",
            ),
        ),
    ),
    # --- NodeUnschedulable ------------------------------------------------------------------------
    Case(
        "cordon",
        "NodeUnschedulable",
        (N("a", cordoned=True),),
        (
            P("plain", expect=UNSCHEDULABLE, reason="node(s) were unschedulable"),
            P("tolerating", {"tolerations": [UNSCHEDULABLE_TOLERATION]}, expect="a"),
        ),
    ),
    # --- TaintToleration --------------------------------------------------------------------------
    Case(
        "taints",
        "TaintToleration",
        (
            N("hard", taints=(taint("dedicated", "x"),)),
            N("soft", taints=(taint("soft", "", "PreferNoSchedule"),)),
            N("exec", taints=(taint("evict", "y", "NoExecute"),)),
        ),
        (
            P("plain-hard", on("hard"), expect=UNSCHEDULABLE, reason="untolerated taint"),
            P(
                "tolerant-hard",
                on("hard", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "x"}]),
                expect="hard",
            ),
            P("plain-soft", on("soft"), expect="soft"),
            P("plain-exec", on("exec"), expect=UNSCHEDULABLE, reason="untolerated taint"),
            P(
                "wrong-effect",
                on("exec", tolerations=[{"key": "evict", "operator": "Exists", "effect": "NoSchedule"}]),
                expect=UNSCHEDULABLE,
                reason="untolerated taint",
            ),
        ),
    ),
    # --- NodeAffinity -----------------------------------------------------------------------------
    Case(
        "node-affinity",
        "NodeAffinity",
        (N("a", labels={ZONE: "a", "gen": "3"}), N("b", labels={ZONE: "b", "gen": "5"})),
        (
            P("selector", {"nodeSelector": {ZONE: "b"}}, expect="b"),
            P("gt", affinity("nodeAffinity", node_term("gen", "Gt", ["4"])), expect="b"),
            P("not-in", affinity("nodeAffinity", node_term(ZONE, "NotIn", ["a"])), expect="b"),
            P(
                "nowhere",
                affinity("nodeAffinity", node_term(ZONE, "In", ["c"])),
                expect=UNSCHEDULABLE,
                reason="node(s) didn't match Pod's node affinity/selector",
            ),
        ),
    ),
    # --- InterPodAffinity -------------------------------------------------------------------------
    Case(
        "interpod",
        "InterPodAffinity",
        (N("a"), N("b")),
        (
            P("db", on("a"), labels={"app": "db"}, by="none", node="a", step=0),
            P(
                "loner",
                {**on("b"), **affinity("podAntiAffinity", [pod_term("kubernetes.io/hostname", "web")])},
                labels={"app": "batch"},
                by="none",
                node="b",
                step=0,
            ),
            P("near-db", affinity("podAffinity", [pod_term("kubernetes.io/hostname", "db")]), expect="a"),
            P(
                "away-from-db",
                affinity("podAntiAffinity", [pod_term("kubernetes.io/hostname", "db")]),
                expect="b",
            ),
            P("web", labels={"app": "web"}, expect="a"),
            P(
                "near-ghost",
                affinity("podAffinity", [pod_term("kubernetes.io/hostname", "ghost")]),
                expect=UNSCHEDULABLE,
                reason="node(s) didn't match pod affinity rules",
            ),
        ),
    ),
    # --- PodTopologySpread ------------------------------------------------------------------------
    Case(
        "spread",
        "PodTopologySpread",
        (N("a", labels={ZONE: "a"}), N("b", labels={ZONE: "b"}), N("c")),
        (
            P("w1", on("a"), labels={"app": "web"}, by="none", node="a", step=0),
            P("w2", on("a"), labels={"app": "web"}, by="none", node="a", step=0),
            P("even", SPREAD, labels={"app": "web"}, expect="b"),
            P(
                "no-zone",
                on("c", **SPREAD),
                labels={"app": "web"},
                expect=UNSCHEDULABLE,
                reason="node(s) didn't match pod topology spread constraints",
            ),
        ),
    ),
)


@pytest.fixture(scope="module")
def decisions(
    control_plane: ControlPlane, admin_api: k8s.ApiClient
) -> Iterator[dict[tuple[str, str, str], Decision | None]]:
    """Every case's worlds built, both schedulers started on them, every step submitted and decided."""
    core = k8s.CoreV1Api(admin_api)
    worlds = Worlds(core, CASES, {"ks": KUBE_SCHEDULER, "kg": KUBEGPU})
    worlds.create()
    with side_by_side(control_plane, admin_api, worlds, KUBE_SCHEDULER, KUBEGPU) as decided:
        yield decided


CHECKS = [(case, pod) for case in CASES for pod in case.pods if pod.by == "self"]


@pytest.mark.parametrize(("case", "pod"), CHECKS, ids=[f"{c.rule}-{c.name}-{p.name}" for c, p in CHECKS])
def test_kubegpu_decides_as_kube_scheduler(
    decisions: dict[tuple[str, str, str], Decision | None], case: Case, pod: P
) -> None:
    ks = decisions.get((case.name, "ks", pod.name))
    kg = decisions.get((case.name, "kg", pod.name))
    assert compare(case, pod, ks, kg) == []


def test_every_pod_a_case_starts_from_is_bound(
    decisions: dict[tuple[str, str, str], Decision | None],
) -> None:
    """The pods a case starts from (bound by nobody, or by the other scheduler) are bound in both
    worlds: otherwise the case would compare the two schedulers on a world it did not mean."""
    starts = {
        (case.name, world, pod.name): decisions.get((case.name, world, pod.name))
        for case in CASES
        for pod in case.pods
        if pod.by != "self"
        for world in ("ks", "kg")
    }
    assert {key: d for key, d in starts.items() if d is None or d.node is None} == {}
