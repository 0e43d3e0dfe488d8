"""A pod resized in place holds what kube-scheduler charges it (component-helpers' PodRequests with
status resources): per container the largest of its spec, what its status says it runs with and
what the kubelet allocated; the spec left out while the kubelet refuses the resize (Infeasible).
The side-by-side case is tests/test_review_sched_rules.py's ``resized/mine``.
"""

from __future__ import annotations

import copy
from typing import Any

from scheduler.live.podspec import pod_request
from scheduler.live.translate import pod_usage
from tests.support.schedworld import drive, node_json, pod_json
from tests.test_sched_cache import setup


def reported(pod: dict[str, Any], cpu: str, allocated: str | None = None, infeasible: bool = False) -> dict:
    """``pod`` with the status a kubelet writes while its container runs with ``cpu``."""
    pod = copy.deepcopy(pod)
    status = {"name": "app", "resources": {"requests": {"cpu": cpu}}}
    if allocated is not None:
        status["allocatedResources"] = {"cpu": allocated}
    pod["status"] = {"phase": "Running", "containerStatuses": [status]}
    if infeasible:
        pod["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    return pod


def test_a_bound_pod_holds_the_largest_of_its_spec_status_and_allocation() -> None:
    theirs = pod_json("theirs", cpu="500m", scheduler="default-scheduler", node="n1")
    assert pod_usage(reported(theirs, "1500m")).cpu_milli == 1500
    assert pod_usage(reported(theirs, "200m", allocated="700m")).cpu_milli == 700
    assert pod_usage(reported(theirs, "200m")).cpu_milli == 500
    # a refused resize: the spec (2) is not what it runs with
    bigger = pod_json("theirs", cpu="2", scheduler="default-scheduler", node="n1")
    assert pod_usage(reported(bigger, "500m", infeasible=True)).cpu_milli == 500
    # a pending pod has no status: its spec
    assert pod_request(pod_json("p", cpu="500m")).cpu_milli == 500


def test_an_unreadable_status_figure_is_left_out_not_the_pods_error() -> None:
    theirs = reported(pod_json("theirs", cpu="500m", scheduler="default-scheduler", node="n1"), "NaN")
    usage = pod_usage(theirs)
    assert usage.problem == "" and usage.cpu_milli == 500


def test_a_resize_seen_after_the_binding_is_charged() -> None:
    """The cache memoises a bound pod's booking: a status update reporting a larger running figure
    must book it again (it did not: the booking was keyed on the spec only)."""
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 0, cpu="2")])
    theirs = pod_json("theirs", cpu="500m", scheduler="default-scheduler", node="n1")
    world.put_pod(theirs)
    world.put_pod(pod_json("early", cpu="100m"))  # scheduled: the cache books theirs as it is then
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("early") == "n1"
    world.put_pod(reported(theirs, "1500m"))
    world.put_pod(pod_json("mine", cpu="1"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("mine") is None
    assert core.failed_events("mine")[0] == "0/1 nodes are available: 1 Insufficient cpu."
