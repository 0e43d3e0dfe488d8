"""The live scheduler's queue: kube-scheduler's order, per-pod backoff, parking, no polling."""

from __future__ import annotations

from scheduler.live.queue import SchedulingQueue
from tests.support.schedworld import Clock


def queue(initial: float = 1.0, maximum: float = 10.0) -> tuple[SchedulingQueue, Clock]:
    clock = Clock()
    return SchedulingQueue(initial, maximum, clock), clock


def drain(q: SchedulingQueue) -> list[str]:
    out = []
    while (uid := q.pop()) is not None:
        out.append(uid)
        q.remove(uid)
    return out


def test_order_is_priority_then_creation_then_name() -> None:
    q, _ = queue()
    q.add("late", 0, "2026-01-01T00:00:09Z", "ns/late")
    q.add("early", 0, "2026-01-01T00:00:01Z", "ns/early")
    q.add("urgent", 100, "2026-01-01T00:00:10Z", "ns/urgent")
    q.add("b", 0, "2026-01-01T00:00:05Z", "ns/b")
    q.add("a", 0, "2026-01-01T00:00:05Z", "ns/a")
    q.add("low", -5, "2026-01-01T00:00:00Z", "ns/low")
    assert drain(q) == ["urgent", "early", "a", "b", "late", "low"]


def test_backoff_doubles_up_to_the_maximum_and_keeps_through_a_bind() -> None:
    q, clock = queue(initial=1.0, maximum=5.0)
    assert [q.backoff_seconds(n) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    q.add("p", 0, "", "p")
    assert q.pop() == "p"
    q.hold("p")  # being bound: in no queue, attempts kept
    assert q.where("p") == "held" and q.wait_seconds() is None
    q.requeue("p", 0, "", "p")  # the bind was not stored
    assert q.attempts("p") == 1 and q.where("p") == "backoff"
    assert q.pop() is None and q.wait_seconds() == 1.0
    clock.advance(1.0)
    assert q.pop() == "p"
    q.requeue("p", 0, "", "p")
    assert q.attempts("p") == 2 and q.ready_at("p") == clock.now + 2.0
    clock.advance(1.5)
    assert q.wait_seconds() == 0.5


def test_parked_pods_wait_for_a_change_then_for_their_backoff() -> None:
    q, clock = queue(initial=4.0)
    q.add("p", 0, "", "p")
    q.add("bad", 0, "", "bad")
    assert q.pop() == "bad"
    q.park("bad", until_pod_changes=True)
    assert q.pop() == "p"
    q.park("p")
    assert q.counts == {"active": 0, "backoff": 0, "parked": 2} and q.wait_seconds() is None
    assert q.move_all() == 1  # not the invalid one
    assert q.where("p") == "backoff" and q.where("bad") == "parked"
    clock.advance(4.0)
    assert q.pop() == "p"
    q.update("bad", 0, "", "bad")  # the invalid pod changed (its backoff has passed meanwhile)
    assert q.where("bad") == "active" and q.pop() == "bad"
    assert q.counts == {"active": 0, "backoff": 0, "parked": 0}


def test_updates_reorder_and_removal_forgets() -> None:
    q, _ = queue()
    q.add("x", 0, "2026-01-01T00:00:02Z", "x")
    q.add("y", 0, "2026-01-01T00:00:01Z", "y")
    q.update("x", 10, "2026-01-01T00:00:02Z", "x")
    q.add("x", 0, "2026-01-01T00:00:02Z", "x")  # adding a known pod changes nothing
    assert len(q) == 2 and "x" in q and sorted(q.uids()) == ["x", "y"]
    q.remove("y")
    assert "y" not in q and q.where("y") is None and q.attempts("y") == 0
    assert drain(q) == ["x"]
    q.add("z", 0, "", "z")
    q.clear()
    assert len(q) == 0 and q.pop() is None and q.counts == {"active": 0, "backoff": 0, "parked": 0}
    q.park("unknown")
    q.hold("unknown")
    assert "unknown" not in q


def test_a_pod_that_changes_while_queued_keeps_its_priority_order() -> None:
    q, clock = queue()
    q.add("low", 0, "2026-01-01T00:00:01Z", "ns/low")
    q.add("high", 100, "2026-01-01T00:00:05Z", "ns/high")
    q.add("negative", -10, "2026-01-01T00:00:00Z", "ns/negative")
    q.update("high", 100, "2026-01-01T00:00:05Z", "ns/high")  # e.g. a label changed
    q.update("negative", -10, "2026-01-01T00:00:00Z", "ns/negative")
    assert drain(q) == ["high", "low", "negative"]
    # A parked pod that changes goes back in its priority's place, ahead of lower ones.
    q.add("low", 0, "2026-01-01T00:00:01Z", "ns/low")
    q.add("high", 100, "2026-01-01T00:00:05Z", "ns/high")
    assert q.pop() == "high"
    q.park("high", until_pod_changes=True)
    q.update("high", 100, "2026-01-01T00:00:05Z", "ns/high")
    assert q.where("high") == "backoff"  # it failed once: it backs off first (1 s)
    clock.advance(1.0)
    assert drain(q) == ["high", "low"]


def test_an_update_moves_a_pod_by_its_new_priority() -> None:
    q, _ = queue()
    for uid, priority, created in (("a", 5, "01"), ("b", 10, "02"), ("c", 0, "03")):
        q.add(uid, priority, f"2026-01-01T00:00:{created}Z", f"ns/{uid}")
    q.update("c", 20, "2026-01-01T00:00:03Z", "ns/c")  # raised above everyone
    q.update("b", -1, "2026-01-01T00:00:02Z", "ns/b")  # lowered below everyone
    assert drain(q) == ["c", "a", "b"]


def test_a_pod_requeued_after_it_was_forgotten_backs_off_in_its_priority_place() -> None:
    # A relist dropped the pod while its Binding was in flight; the Binding then was not stored.
    q, clock = queue(initial=1.0)
    q.add("low", 0, "2026-01-01T00:00:01Z", "ns/low")
    q.requeue("high", 100, "2026-01-01T00:00:05Z", "ns/high")
    assert q.where("high") == "backoff" and q.attempts("high") == 1
    clock.advance(1.0)
    assert drain(q) == ["high", "low"]


def test_being_tried_is_in_no_queue_and_a_ready_pod_means_no_wait() -> None:
    q, _ = queue()
    q.add("p", 0, "", "p")
    q.add("other", 0, "", "q")
    assert q.wait_seconds() == 0.0
    assert q.pop() == "p" and q.where("p") == "" and "p" in q
    assert q.counts == {"active": 1, "backoff": 0, "parked": 0}


def test_stale_backoff_entries_neither_release_a_pod_early_nor_hide_the_next_one() -> None:
    q, clock = queue(initial=1.0, maximum=60.0)
    for uid in ("p", "gone", "q"):
        q.add(uid, 0, "", uid)
        assert q.pop() == uid
    q.requeue("p", 0, "", "p")  # ready at 1
    q.requeue("gone", 0, "", "gone")  # ready at 1, then forgotten
    q.remove("gone")
    clock.advance(0.5)
    q.requeue("p", 0, "", "p")  # failed again: ready at 0.5 + 2; its entry for 1 is stale
    q.requeue("q", 0, "", "q")  # ready at 1.5
    assert q.wait_seconds() == 1.0  # q's, not p's stale 0.5 nor the forgotten pod's
    clock.advance(0.5)  # t = 1: only stale entries are due
    assert q.pop() is None and q.where("p") == "backoff"
    assert q.wait_seconds() == 0.5
    clock.advance(0.5)  # t = 1.5: q
    assert q.pop() == "q" and q.pop() is None
    assert q.wait_seconds() == 1.0  # p at 2.5


def test_a_stale_backoff_entry_coming_due_releases_nothing() -> None:
    q, clock = queue(initial=1.0, maximum=60.0)
    q.add("p", 0, "", "p")
    assert q.pop() == "p"
    q.requeue("p", 0, "", "p")  # ready at 1
    clock.advance(0.5)
    q.requeue("p", 0, "", "p")  # failed again before that: ready at 0.5 + 2
    clock.advance(0.5)  # t = 1: the first entry comes due, but it is stale
    assert q.pop() is None and q.where("p") == "backoff"
    assert q.counts == {"active": 0, "backoff": 1, "parked": 0}
    clock.advance(1.5)
    assert q.pop() == "p"


def test_backoffs_expiring_together_all_become_active() -> None:
    q, clock = queue(initial=1.0)
    for uid in ("a", "b", "c"):
        q.add(uid, 0, "", uid)
        assert q.pop() == uid
        q.requeue(uid, 0, "", uid)
    q.remove("a")  # a stale entry ahead of the others
    clock.advance(1.0)
    assert q.wait_seconds() == 0.0
    assert q.counts == {"active": 2, "backoff": 0, "parked": 0}
    assert drain(q) == ["b", "c"]


def test_move_all_counts_the_pods_it_released() -> None:
    q, _ = queue()
    for uid in ("a", "b", "c"):
        q.add(uid, 0, "", uid)
    for uid in ("a", "b", "c"):
        assert q.pop() == uid
        q.park(uid, until_pod_changes=uid == "c")
    assert q.move_all() == 2
    assert q.move_all() == 0
