"""The invariant checker of the end-to-end tests and the soak (tests/support/invariants.py) on made-up
views: it must flag every double allocation and stray holding, and nothing else."""

from __future__ import annotations

from tests.support.invariants import Holding, NodeView, problems

API = {"uid-a": {"app": {"GPU-1": 500}}, "uid-b": {"app": {"GPU-1": 500}, "side": {"GPU-2": 1000}}}
NAMES = {"uid-a": "ns/a", "uid-b": "ns/b"}


def view(*live: Holding, running: set[str] | None = None) -> NodeView:
    return NodeView(api=API, names=NAMES, running_gpu_pods=running or set(), live=list(live))


def test_shares_that_fit_and_attempts_of_one_container_are_fine() -> None:
    retried = [Holding("uid-a", "app", {"GPU-1": 500}, "c1", "CONTAINER_CREATED", 0),
               Holding("uid-a", "app", {"GPU-1": 500}, "c2", "CONTAINER_RUNNING", 1)]
    assert problems(view(*retried, Holding("uid-b", "app", {"GPU-1": 500}, "c3"))) == []


def test_a_device_held_past_1000_milli_is_a_double_allocation() -> None:
    found = problems(view(Holding("uid-a", "app", {"GPU-1": 500}, "c1"),
                          Holding("uid-b", "app", {"GPU-1": 500}, "c2"),
                          Holding("uid-b", "side", {"GPU-1": 1000}, "c3")))
    assert len(found) == 2
    assert "ns/b/side holds {'GPU-1': 1000}" in found[0]
    assert found[1].startswith("device GPU-1 held 2000 milli (> 1000) by ns/a/app attempt 0 (c1")


def test_settled_views_have_no_strays_and_no_lost_pods() -> None:
    stray = Holding("uid-gone", "app", {"GPU-3": 1000}, "c9")
    assert problems(view(stray)) == []  # under churn: a deleted pod's container may still stop
    assert problems(view(stray), settled=True) == [
        "containerd runs app of pod uid-gone, which the API no longer has"]
    assert problems(view(running={"uid-a"}), settled=True) == [
        "ns/a runs per the API but containerd has no container of it"]
