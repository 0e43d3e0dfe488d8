"""Churn soak: GPU pods created and deleted through a real node while its parts restart at random.

Pods of 1, 2 or 4 whole GPUs or a 250/500-milli share are created, run, checked (each container's
log shows exactly its allocation) and deleted, a few at a time, while kubelet, the shim (SIGKILL)
and the kubegpu scheduler are restarted at random moments. Along the way the invariant checker
(tests/support/invariants.py) compares what the API and containerd say: no device is ever held
past 1000 milli. At the end every pod that was not deleted runs (none lost), containerd holds
exactly what the API grants, and after the last delete nothing holds a device. The shim is not
restarted in the last third, so its memory at the start and the end of that stretch can be compared.

CI runs a short version (``KUBEGPU_SOAK_PODS``, default 40); ``make soak`` runs 300 pods.
``KUBEGPU_SOAK_SEED`` replays a run (the seed is printed).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.fixtures.localcluster import KubeNode
from tests.support.invariants import look, problems
from tests.support.nodepods import allocation_of, check_view, container, pod, read_view, running

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]

PODS = int(os.environ.get("KUBEGPU_SOAK_PODS", "40"))
SEED = int(os.environ.get("KUBEGPU_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))
LIVE = 6  # pods alive at once
RESTART_EVERY = 12  # pods created per restart (at least 3 restarts: each kind once)
SHAPES = [("gpus", 1), ("gpus", 1), ("gpus", 2), ("gpus", 4), ("milli", 250), ("milli", 500)]
# What the shim's RSS may grow over the quiet last third (a leak of ~1 KiB per pod would show
# over 300 pods only; the short CI run checks the mechanism).
RSS_GROWTH_LIMIT_KIB = 16 * 1024
POD_TIMEOUT = 180.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def gpu_pod(name: str, shape: tuple[str, int], node: KubeNode) -> dict:
    kind, amount = shape
    if kind == "gpus":
        return pod(name, [container("app", amount)], node.selector)
    return pod(name, [container("app")], node.selector, annotations={"kubegpu.io/gpu-milli": str(amount)})


def test_churn_soak(gpu_node: KubeNode, node_namespace: str) -> None:
    rng = random.Random(SEED)
    print(f"soak: {PODS} pods, seed {SEED} (KUBEGPU_SOAK_SEED to replay)")
    core, ns, node, cluster = gpu_node.core, node_namespace, gpu_node.node, gpu_node.cluster
    keys = cluster.node_keys
    assert node.containerd is not None
    endpoint = node.containerd.endpoint
    created: dict[str, float] = {}  # name -> creation time, for pods not yet seen running
    live: set[str] = set()  # seen running and checked
    deleted = 0
    restarts: list[str] = []
    quiet_from = PODS * 2 // 3
    rss_start: int | None = None

    def check_running(name: str, found: k8s.V1Pod) -> None:
        allocation = allocation_of(found, keys)
        check_view(read_view(core, ns, name, "app"), gpu_node.name, allocation, "app")

    # restart points before the quiet stretch, cycling through every kind in a random order
    kinds = ["kubelet", "shim", "scheduler"]
    rng.shuffle(kinds)
    points = sorted(rng.sample(range(1, quiet_from), min(quiet_from - 1, max(3, PODS // RESTART_EVERY))))
    plan = {point: kinds[i % len(kinds)] for i, point in enumerate(points)}

    def restart(what: str) -> None:
        if what == "kubelet":
            node.restart_kubelet()
        elif what == "shim":
            node.restart_shim(kill=True)
        else:
            cluster.restart_scheduler()
        restarts.append(what)

    made = 0
    while made < PODS or created:
        # create up to LIVE pods
        while made < PODS and len(created) + len(live) < LIVE:
            name = f"soak-{made}"
            core.create_namespaced_pod(ns, gpu_pod(name, rng.choice(SHAPES), gpu_node))
            created[name] = time.monotonic()
            made += 1
            if made in plan:
                restart(plan[made])
            if made == quiet_from and node.shim is not None and node.shim.process is not None:
                rss_start = rss_kib(node.shim.process.pid)
        # see which pods run; check them
        for name in list(created):
            found = core.read_namespaced_pod(name, ns)
            if running(found):
                check_running(name, found)
                live.add(name)
                del created[name]
            elif time.monotonic() - created[name] > POD_TIMEOUT:
                raise AssertionError(f"pod {name} lost: not running {POD_TIMEOUT}s after creation: "
                                     f"{found.status}")
        # the invariant, under churn
        found_problems = problems(look(core, gpu_node.name, keys, endpoint))
        assert found_problems == [], found_problems
        # delete some running pods
        for name in sorted(live):
            if rng.random() < 0.5 or made >= PODS:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=1)
                live.discard(name)
                deleted += 1
        time.sleep(0.2)

    # settle: every deletion finished, nothing holds a device any more
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(ns).items and time.monotonic() < deadline:
        time.sleep(0.5)
    assert core.list_namespaced_pod(ns).items == []
    view = look(core, gpu_node.name, keys, endpoint)
    assert problems(view, settled=True) == []
    assert view.live == [], f"containerd still runs device holders: {view.live}"
    print(f"soak: {made} pods created, {deleted} deleted, restarts {restarts}")

    # the shim's ledger holds nothing: a pod taking every GPU starts at once
    core.create_namespaced_pod(ns, gpu_pod("all", ("gpus", 8), gpu_node))
    deadline = time.monotonic() + 90
    while not running(found := core.read_namespaced_pod("all", ns)):
        assert time.monotonic() < deadline, found.status
        time.sleep(0.3)
    check_running("all", found)
    if rss_start is not None and node.shim is not None and node.shim.process is not None:
        rss_end = rss_kib(node.shim.process.pid)
        print(f"soak: shim RSS {rss_start} KiB at pod {quiet_from}, {rss_end} KiB at the end")
        assert rss_end - rss_start < RSS_GROWTH_LIMIT_KIB
