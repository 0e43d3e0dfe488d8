"""Review of the extender's ``choose`` verb (f778c49): where its one node is not the node
kubegpu's own scheduler would pick, as docs/extender.md ("Choosing or scoring") says it is.

In memory (tests/support/schedworld.py), as tests/test_sched_extender.py."""

from __future__ import annotations

import json
from typing import Any

from scheduler.live.extender import Extender
from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, plugins_group, pod_json

GPU_MILLI = "kubegpu.io/gpu-milli"


def args(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def share_pod(name: str, milli: str, scheduler: str) -> dict[str, Any]:
    pod = pod_json(name, 1, scheduler=scheduler, annotations={GPU_MILLI: milli})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    return pod


def test_choose_plans_for_a_pod_shape_the_policy_has_not_planned_for_as_the_scheduler_does() -> None:
    """``kubegpu extender`` (one cache, its pods those of default-scheduler), policy fgd. Twelve
    quarter and half shares are placed; then the first one-GPU pod arrives. kubegpu's own scheduler
    re-plans the policy for a shape it has not planned for (``Scheduler._decide``:
    ``request.shape() not in _planned_shapes`` -> ``_bind_policy``) before it picks; ``choose``
    does not, so it scores the pod against the old workload and answers another node than the
    one the scheduler itself binds the very same pod to (the rng's state is the same for both)."""
    world = World()
    for i in range(3):
        world.put_node(node_json(f"n{i}", 8))
    sched, jobs, _core, clock = make_scheduler(world, name="default-scheduler", policy="fgd", seed=10)
    feed = Feed(world, sched)
    feed.relist()
    shares = "250 250 500 500 500 250 250 500 500 250 250 500".split()
    for k, milli in enumerate(shares):
        world.put_pod(share_pod(f"s{k}", milli, "default-scheduler"))
    feed.sync()
    drive(sched, jobs, feed, clock)
    sched._view()  # the cache as the extender last used it: planned for the shares only
    world.put_pod(pod_json("new", 1, scheduler="default-scheduler"))
    feed.sync()

    state = sched.rng.getstate()
    _, answer = Extender(sched).handle("choose", args(world.pods["uid-new"], sorted(world.nodes)))
    sched.rng.setstate(state)  # the scheduler below draws what choose drew
    while sched.schedule_next(0):  # kubegpu's own decision for the same pod, same cluster
        pass
    jobs.run_all()
    feed.sync()
    own = world.node_of("new")
    assert own is not None
    assert answer["NodeNames"] == [own]


def nominated_world(n2_gpus: int, n2_full: bool = False) -> tuple[World, Any, Feed, dict[str, Any]]:
    """n1 (4 GPUs, free) and n2; kubegpu's preemptor ``high`` (priority 100, 4 GPUs) nominated to
    n1, and kube-scheduler's pod ``low`` (2 GPUs, priority 0); the scheduler serves both names."""
    world = World()
    world.put_node(node_json("n1", 4))
    world.put_node(node_json("n2", n2_gpus))
    if n2_full:
        world.put_pod(pod_json("full", n2_gpus, node="n2"))
    sched, _jobs, _core, _clock = make_scheduler(world, name="kubegpu")
    feed = Feed(world, sched)
    high = pod_json("high", 4, priority=100)
    high["status"]["nominatedNodeName"] = "n1"
    world.put_pod(high)
    low = pod_json("low", 2, scheduler="default-scheduler", priority=0)
    world.put_pod(low)
    return world, sched, feed, low


def test_choose_keeps_a_nominated_preemptors_room_as_the_scheduler_does() -> None:
    """extenderAddress mode: one replica schedules its own pods (schedulerName kubegpu) and serves
    kube-scheduler's. kubegpu's preemptor ``high`` (priority 100, 4 GPUs) was nominated to n1 and
    its victims are gone, so n1's 4 GPUs are free for it. kubegpu's own scheduler, deciding any pod
    of no higher priority, books that room for the preemptor first (``_reserve_nominated``), so a
    2-GPU pod goes to n2. ``choose`` does not: bestfit packs the 2-GPU pod of kube-scheduler onto
    n1, bind books it there, and the preemptor no longer fits the node it evicted pods for (it
    preempts again: the pod choose put there is lower priority, so it is the next victim)."""
    world, sched, feed, low = nominated_world(n2_gpus=8)
    twin = pod_json("twin", 2, priority=0)  # the same pod, kubegpu's own
    world.put_pod(twin)
    feed.relist()
    assert sched.nominated == {"uid-high": "n1"}
    sched._decide("uid-twin", sched.cache.pods["uid-twin"], sched._view())  # what kubegpu decides
    assert sched.cache.assumed["uid-twin"].alloc.node == "n2"
    sched.cache.release("uid-twin")  # undecided again: choose sees the same cluster

    extender = Extender(sched)
    _, answer = extender.handle("choose", args(low, ["n1", "n2"]))
    assert answer["NodeNames"] == ["n2"]
    # the filter-and-prioritize stanza likewise: n1's room is the preemptor's, so n1 fails the
    # filter and prioritize scores n2 alone (without the reservation bestfit ranked n1 first)
    _, answer = extender.handle("filter", args(low, ["n1", "n2"]))
    assert answer["NodeNames"] == ["n2"] and set(answer["FailedNodes"]) == {"n1"}, answer
    _, scores = extender.handle("prioritize", args(low, ["n1", "n2"]))
    assert [s["Host"] for s in scores] in ([], ["n2"]), scores


def test_choose_places_a_gangs_members_as_the_scheduler_plans_the_group() -> None:
    """A gang (a PodGroup of scheduling.x-k8s.io, minMember 2) of two 2-GPU pods; na1 (zone a) has
    2 GPUs free, nb1 (zone b) 8. kubegpu's own scheduler plans the group whole (docs/gang.md:
    the fewest nodes, then one topology domain): both on nb1. ``choose`` decides each member alone
    (``schedule_one``): bestfit packs the first onto na1 and the second onto nb1, so with the
    shipped stanza the gang is split over two nodes and two zones, not where kubegpu's scheduler
    puts it ("the same placement as with kubegpu as the scheduler", docs/extender.md). filter and
    prioritize never planned groups either; the claim is new with choose."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    def nodes() -> list[dict[str, Any]]:
        zone = "topology.kubernetes.io/zone"
        return [node_json("na1", 4, labels={zone: "a"}), node_json("nb1", 8, labels={zone: "b"})]

    group = plugins_group("g", 2)
    placed: dict[str, list[str | None]] = {}
    for who in ("kubegpu", "default-scheduler"):
        world = World()
        for node in nodes():
            world.put_node(node)
        world.put_pod(pod_json("busy", 2, node="na1"))
        world.put_group(PLUGINS_API, group)
        sched, jobs, _core, clock = make_scheduler(world, name=who)
        feed = Feed(world, sched)
        feed.relist()
        for name in ("a", "b"):
            world.put_pod(pod_json(name, 2, scheduler=who, labels={PLUGINS_LABEL: "g"}))
        feed.sync()
        if who == "kubegpu":
            drive(sched, jobs, feed, clock)
        else:  # kube-scheduler with the shipped stanza: choose, then bind there, a pod at a time
            extender = Extender(sched)
            for name in ("a", "b"):
                _, answer = extender.handle("choose", args(world.pods[f"uid-{name}"], ["na1", "nb1"]))
                (node,) = answer["NodeNames"]
                bind = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node}
                assert extender.handle("bind", json.dumps(bind).encode())[1] == {"Error": ""}
                feed.sync()
        placed[who] = [world.node_of("a"), world.node_of("b")]
    assert placed["kubegpu"] == ["nb1", "nb1"]
    assert placed["default-scheduler"] == placed["kubegpu"]


def test_the_nodes_form_answers_the_node_objects_kube_scheduler_sent() -> None:
    """Without ``nodeCacheCapable`` kube-scheduler sends whole Node objects (``Nodes``) and builds
    the NodeInfo it goes on with from the Node objects of the answer (k8s.io/kubernetes v1.37.2
    pkg/scheduler/extender.go, ``HTTPExtender.Filter``: ``nodeResult[i].SetNode(&result.Nodes.
    Items[i])``). kubegpu answers ``{"metadata": {"name": ...}}`` only, so with ``filter`` (more
    than one node left) kube-scheduler scores nodes with no labels, taints or allocatable: preferred
    node affinity, PreferNoSchedule taints and least-allocated all score every node alike (the
    "scored" alternative docs/extender.md offers loses the very scores it is for). With ``choose``
    one node is left and kube-scheduler reads only its name, so there it is harmless."""
    world = World()
    for name in ("n1", "n2"):
        world.put_node(node_json(name, 4, labels={"zone": name}))
    sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, sched)
    feed.relist()
    pod = pod_json("p", 1, scheduler="default-scheduler")
    world.put_pod(pod)
    feed.sync()
    sent = [world.nodes["n1"], world.nodes["n2"]]
    status, answer = Extender(sched).handle(
        "filter", json.dumps({"Pod": pod, "Nodes": {"items": sent}}).encode()
    )
    assert status == 200
    assert answer["Nodes"]["items"] == sent


def test_a_nominated_preemptors_room_is_not_offered_where_it_is_the_only_room() -> None:
    """As above, but n2 is full: only n1, the preemptor's room, could take the 2-GPU pod.
    kubegpu's own scheduler leaves the pod pending; ``choose`` then answers ``filter``'s answer,
    and ``filter`` passes n1 (it books no nominated pod), so kube-scheduler binds the pod there and
    the preemptor's room is gone. kube-scheduler's own filters count nominated pods of no lower
    priority as placed (``RunFilterPluginsWithNominatedPods``); for the devices it cannot count
    (which GPUs, shares, VFs) that is kubegpu's filter's job."""
    world, sched, feed, low = nominated_world(n2_gpus=4, n2_full=True)
    feed.relist()
    extender = Extender(sched)
    for verb in ("choose", "filter"):
        _, answer = extender.handle(verb, args(low, ["n1", "n2"]))
        assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == {"n1", "n2"}, verb
    # the preemptor itself is not kept out of its own room
    _, answer = extender.handle("filter", args(world.pods["uid-high"], ["n1", "n2"]))
    assert answer["NodeNames"] == ["n1"]


def gang_world(min_member: int, members: int, free_a: int) -> tuple[World, Any, Any, Extender]:
    """na1 (zone a, 4 GPUs, ``4 - free_a`` used) and nb1 (zone b, 4 GPUs); a PodGroup ``g`` of
    ``min_member`` with ``members`` 2-GPU pods pending for default-scheduler."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    world = World()
    zone = "topology.kubernetes.io/zone"
    world.put_node(node_json("na1", 4, labels={zone: "a"}))
    world.put_node(node_json("nb1", 4, labels={zone: "b"}))
    if free_a < 4:
        world.put_pod(pod_json("busy", 4 - free_a, node="na1"))
    world.put_group(PLUGINS_API, plugins_group("g", min_member))
    sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, sched)
    feed.relist()
    for i in range(members):
        world.put_pod(pod_json(f"m{i}", 2, scheduler="default-scheduler", labels={PLUGINS_LABEL: "g"}))
    feed.sync()
    return world, sched, feed, Extender(sched)


def choose_and_bind(
    world: World, feed: Feed, extender: Extender, name: str, names: list[str]
) -> dict[str, Any]:
    """kube-scheduler's cycle with the shipped stanza for one pod: choose, then bind on the one
    node answered (if one)."""
    _, answer = extender.handle("choose", args(world.pods[f"uid-{name}"], names))
    if len(answer["NodeNames"]) == 1:
        (node,) = answer["NodeNames"]
        bind = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node}
        assert extender.handle("bind", json.dumps(bind).encode())[1] == {"Error": ""}
        feed.sync()
    return answer


def test_a_gang_that_cannot_fit_whole_is_not_placed_member_by_member() -> None:
    """Three 2-GPU members, minMember 3, 4 free GPUs in all (2 on each node): each alone fits,
    the group does not. ``choose`` fails every candidate with the group's reason for each member,
    so none is bound (kubegpu's own scheduler places none either); with too few members created
    it says the group waits for the others."""
    world, sched, feed, extender = gang_world(3, 3, free_a=2)
    world.put_pod(pod_json("busy-b", 2, node="nb1"))
    feed.sync()
    for name in ("m0", "m1", "m2"):
        answer = choose_and_bind(world, feed, extender, name, ["na1", "nb1"])
        assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == {"na1", "nb1"}, answer
        assert (
            "pod group ns/g" in answer["FailedNodes"]["na1"]
            and "minimum members fit" in answer["FailedNodes"]["na1"]
        )
    assert all(world.node_of(f"m{i}") is None for i in range(3))
    world, sched, feed, extender = gang_world(3, 2, free_a=4)
    answer = choose_and_bind(world, feed, extender, "m0", ["na1", "nb1"])
    assert answer["NodeNames"] == [] and "2 of its 3 minimum members" in answer["FailedNodes"]["nb1"], answer


def test_a_gang_chosen_member_by_member_lands_as_planned_whole() -> None:
    """minMember 2, two 2-GPU members, na1 with 2 free GPUs, nb1 with 4: planned whole, both on
    nb1 (the fewest nodes); the second member, chosen after the first is bound, follows it there,
    and each one's candidates may be a part of the nodes (kube-scheduler's sampling)."""
    world, sched, feed, extender = gang_world(2, 2, free_a=2)
    assert choose_and_bind(world, feed, extender, "m0", ["na1", "nb1"])["NodeNames"] == ["nb1"]
    assert choose_and_bind(world, feed, extender, "m1", ["nb1", "na1"])["NodeNames"] == ["nb1"]
    assert world.node_of("m0") == world.node_of("m1") == "nb1" and not world.double_booked()


def test_a_gang_of_kube_schedulers_pods_is_chosen_in_extender_address_mode() -> None:
    """Failed before 6ef8fe9 (review23b).
    the recommended deployment, ``extenderAddress`` in kubegpu's scheduler
    config (docs/extender.md "Running it"): one Scheduler named ``kubegpu`` also answers
    kube-scheduler's calls. Its cache keeps only the pods pending for ``kubegpu`` (and bound ones),
    so ``_group_requests`` finds none of the gang's other members pending for default-scheduler:
    the group has "1 of its 2 minimum members" for every member's ``choose``, every candidate
    fails for every member, none is ever bound: the gang is stuck for good, though both members fit
    on nb1 (and ``kubegpu extender --scheduler-name default-scheduler`` places them)."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    world = World()
    zone = "topology.kubernetes.io/zone"
    world.put_node(node_json("na1", 4, labels={zone: "a"}))
    world.put_node(node_json("nb1", 4, labels={zone: "b"}))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    sched, _jobs, _core, _clock = make_scheduler(world, name="kubegpu")
    feed = Feed(world, sched)
    feed.relist()
    for i in range(2):
        world.put_pod(pod_json(f"m{i}", 2, scheduler="default-scheduler", labels={PLUGINS_LABEL: "g"}))
    feed.sync()
    extender = Extender(sched)
    for name in ("m0", "m1"):
        answer = choose_and_bind(world, feed, extender, name, ["na1", "nb1"])
        assert answer["NodeNames"], answer
    assert world.node_of("m0") is not None and world.node_of("m1") is not None
    assert not world.double_booked()


def test_a_gang_whose_members_kube_scheduler_sends_different_nodes_is_chosen() -> None:
    """Failed before 6ef8fe9 (review23b).
    kube-scheduler sends each member only the nodes that pass its own filters
    for that member (node selector, affinity, taints, its count of nvidia.com/gpu) and, in a large
    cluster, only a sample of them. ``_choose_in_group`` plans every member of the group over the
    candidates of the member being chosen. A gang of two members with different node selectors
    (pool a, pool b; minMember 2): m0 is sent na only, m1 nb only; neither candidate list holds the
    whole group, so every candidate of every member fails with "only 1 of its 2 minimum members
    fit together", for good, though kubegpu's own scheduler places the group (m0 on na, m1 on nb)."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    placed: dict[str, list[str | None]] = {}
    for who in ("kubegpu", "default-scheduler"):
        world = World()
        world.put_node(node_json("na", 4, labels={"pool": "a"}))
        world.put_node(node_json("nb", 4, labels={"pool": "b"}))
        world.put_group(PLUGINS_API, plugins_group("g", 2))
        sched, jobs, _core, clock = make_scheduler(world, name=who)
        feed = Feed(world, sched)
        feed.relist()
        for name, pool in (("m0", "a"), ("m1", "b")):
            pod = pod_json(name, 2, scheduler=who, labels={PLUGINS_LABEL: "g"})
            pod["spec"]["nodeSelector"] = {"pool": pool}
            world.put_pod(pod)
        feed.sync()
        if who == "kubegpu":
            drive(sched, jobs, feed, clock)
        else:  # kube-scheduler: each member's candidates pass its node selector
            extender = Extender(sched)
            for _ in range(2):  # tried again after failing (nothing changes in between)
                for name, sent in (("m0", ["na"]), ("m1", ["nb"])):
                    if world.node_of(name) is None:
                        choose_and_bind(world, feed, extender, name, sent)
        placed[who] = [world.node_of("m0"), world.node_of("m1")]
    assert placed["kubegpu"] == ["na", "nb"]
    assert placed["default-scheduler"] == placed["kubegpu"]


def test_a_member_whose_pod_group_is_not_seen_yet_is_not_placed_alone() -> None:
    """Failed before 6ef8fe9 (review23b).
    a member created before its PodGroup (a job's controller or ``kubectl
    apply`` may create the pods first). kubegpu's own scheduler waits for the group to exist
    (``_decide_member``: "waiting for pod group ... to exist"; an invalid PodGroup likewise), as
    scheduler-plugins' coscheduling does; ``choose`` finds no GroupSpec and decides the member
    alone (``schedule_one``): bestfit packs m0 onto na1 (2 GPUs free), bind places it there, and
    once the PodGroup (minMember 2) appears m1 can only go to nb1: the gang is split over two
    zones, where kubegpu's scheduler puts both on nb1."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    zone = "topology.kubernetes.io/zone"
    group = plugins_group("g", 2)
    placed: dict[str, list[str | None]] = {}
    for who in ("kubegpu", "default-scheduler"):
        world = World()
        world.put_node(node_json("na1", 4, labels={zone: "a"}))
        world.put_node(node_json("nb1", 4, labels={zone: "b"}))
        world.put_pod(pod_json("busy", 2, node="na1"))
        sched, jobs, _core, clock = make_scheduler(world, name=who)
        feed = Feed(world, sched)
        feed.relist()
        for name in ("m0", "m1"):
            world.put_pod(pod_json(name, 2, scheduler=who, labels={PLUGINS_LABEL: "g"}))
        feed.sync()
        extender = Extender(sched)
        if who == "kubegpu":
            drive(sched, jobs, feed, clock)
        else:  # kube-scheduler tries m0 before the PodGroup is seen
            choose_and_bind(world, feed, extender, "m0", ["na1", "nb1"])
        world.put_group(PLUGINS_API, group)
        feed.sync()
        if who == "kubegpu":
            drive(sched, jobs, feed, clock)
        else:
            for name in ("m0", "m1"):
                if world.node_of(name) is None:
                    choose_and_bind(world, feed, extender, name, ["na1", "nb1"])
        placed[who] = [world.node_of("m0"), world.node_of("m1")]
    assert placed["kubegpu"] == ["nb1", "nb1"]
    assert placed["default-scheduler"] == placed["kubegpu"]


def full_nodes_gang(n2_pod: str, n2_priority: int) -> tuple[World, Feed, Extender]:
    """n1 and n2 of 4 GPUs, each full: ``low`` (priority 0) on n1, ``n2_pod`` on n2; a PodGroup
    ``g`` (minMember 2) of two 4-GPU members of priority 100 pending for default-scheduler."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    world = World()
    world.put_node(node_json("n1", 4))
    world.put_node(node_json("n2", 4))
    world.put_pod(pod_json("low", 4, node="n1", priority=0))
    world.put_pod(pod_json(n2_pod, 4, node="n2", priority=n2_priority))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, sched)
    feed.relist()
    for name in ("m0", "m1"):
        labels = {PLUGINS_LABEL: "g"}
        world.put_pod(pod_json(name, 4, scheduler="default-scheduler", priority=100, labels=labels))
    feed.sync()
    return world, feed, Extender(sched)


def test_no_pod_is_evicted_for_a_gang_member_whose_group_cannot_fit_whole_even_so() -> None:
    """Failed before 5e3b6e1 (review23b).
    ``choose`` fails every candidate of a gang member with the group's reason
    as resolvable (``FailedNodes``), so kube-scheduler's preemption runs for the member alone and
    asks ``preempt``, which judges the member alone (``extender_victims``). minMember 2, two 4-GPU
    members of priority 100; n1 holds a 4-GPU pod of priority 0, n2 one of priority 1000: evicting
    the first frees room for one member, never for the group. kubegpu's own scheduler evicts no
    one for such a group (``group_preemption``: None when it does not fit even with every
    candidate gone); ``preempt`` keeps n1 with its victim, kube-scheduler evicts it, and the gang
    still cannot run."""
    world, feed, extender = full_nodes_gang(n2_pod="high", n2_priority=1000)
    answer = choose_and_bind(world, feed, extender, "m0", ["n1", "n2"])
    assert answer["NodeNames"] == [] and "minimum members fit" in answer["FailedNodes"]["n1"], answer
    # kube-scheduler's DefaultPreemption: evicting ``low`` lets m0 (alone) fit n1
    body = {"Pod": world.pods["uid-m0"], "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-low"}]}}}
    status, kept = extender.handle("preempt", json.dumps(body).encode())
    assert status == 200, kept
    assert not kept["NodeNameToMetaVictims"], kept


def test_a_gang_member_preempts_where_its_group_fits_whole_once_the_victims_are_gone() -> None:
    """As above, but n2's pod is of priority 0 too: with both proposed victims gone the group fits
    whole, so ``preempt`` keeps the proposals for the member (kube-scheduler evicts on one node per
    member; the other member preempts on its own turn)."""
    world, feed, extender = full_nodes_gang(n2_pod="low2", n2_priority=0)
    victims = {"n1": {"Pods": [{"UID": "uid-low"}]}, "n2": {"Pods": [{"UID": "uid-low2"}]}}
    body = {"Pod": world.pods["uid-m0"], "NodeNameToMetaVictims": victims}
    status, kept = extender.handle("preempt", json.dumps(body).encode())
    assert status == 200, kept
    assert sorted(kept["NodeNameToMetaVictims"]) == ["n1", "n2"], kept


def test_a_member_asked_about_before_kubegpus_watch_delivers_it_is_planned_with_its_group() -> None:
    """Failed before 9617bdb (review23b).
    kube-scheduler and kubegpu watch pods apart, so kube-scheduler may ask
    about a new pod before kubegpu's watch delivers it. ``choose`` looks its group up in the group
    book (``groups.of``, fed by that watch) rather than in the pod it is sent, so a member not
    delivered yet is decided alone: of three 2-GPU members (minMember 3, 4 GPUs free in all, 2 on
    each node), which cannot fit whole, the last one created is placed on its own."""
    world, sched, feed, extender = gang_world(3, 2, free_a=2)
    world.put_pod(pod_json("busy-b", 2, node="nb1"))
    feed.sync()
    labels = {"scheduling.x-k8s.io/pod-group": "g"}
    world.put_pod(pod_json("m2", 2, scheduler="default-scheduler", labels=labels))
    _, answer = extender.handle("choose", args(world.pods["uid-m2"], ["na1", "nb1"]))  # not synced yet
    assert answer["NodeNames"] == [] and "pod group ns/g" in answer["FailedNodes"]["na1"], answer


def test_a_whole_node_gang_chosen_member_by_member_stays_in_one_zone() -> None:
    """Two 8-GPU members (minMember 2); zone a has two idle 8-GPU nodes, zone b three. The plan
    puts both in b (the larger zone). Once m0 is bound on b1, the zones have as many free GPUs and
    m1 needs a new node in either: with c0ec0ef's planner (fewest nodes, then the larger domain,
    ties in name order) m1 went to a1 with every policy, splitting the gang over two zones; the
    fewest domains the group spans now decides first (checked by swapping c0ec0ef's gang.py back)."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    zone = "topology.kubernetes.io/zone"
    world = World()
    for name in ("a1", "a2", "b1", "b2", "b3"):
        world.put_node(node_json(name, 8, labels={zone: name[0]}))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, sched)
    feed.relist()
    for name in ("m0", "m1"):
        world.put_pod(pod_json(name, 8, scheduler="default-scheduler", labels={PLUGINS_LABEL: "g"}))
    feed.sync()
    extender = Extender(sched)
    for name in ("m0", "m1"):
        choose_and_bind(world, feed, extender, name, sorted(world.nodes))
    zones = {str(world.node_of(name))[0] for name in ("m0", "m1")}
    assert zones == {"b"}, [world.node_of(name) for name in ("m0", "m1")]


def test_members_chosen_before_either_binds_are_told_nodes_of_one_plan() -> None:
    """Failed before ee3439b (review23b).
    kube-scheduler runs the next member's ``choose`` while the last one's
    bind is in flight (or holds every member at Permit under its own gang scheduling), so kubegpu
    plans the group again with the first member still pending. Two 600-milli shares (minMember 2;
    kube-scheduler counts no share, so it sends every node for both) and three one-GPU nodes: the
    plans break the policy's ties with the scheduler's shared rng, so the second plan may put the
    members the other way round, and for seeds 1, 6, 8, 10, 12 (bestfit) both are told the same
    node, where they do not fit together: one bind is refused and retried. Plans of one group that
    nothing changed between should tell its members the nodes of one plan."""
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    for seed in (1, 6, 8, 10, 12):
        world = World()
        for name in ("n1", "n2", "n3"):
            world.put_node(node_json(name, 1))
        world.put_group(PLUGINS_API, plugins_group("g", 2))
        sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler", seed=seed)
        feed = Feed(world, sched)
        feed.relist()
        for name in ("m0", "m1"):
            pod = share_pod(name, "600", "default-scheduler")
            pod["metadata"]["labels"] = {PLUGINS_LABEL: "g"}
            world.put_pod(pod)
        feed.sync()
        extender = Extender(sched)
        told = []
        for name in ("m0", "m1"):  # neither bound yet
            _, answer = extender.handle("choose", args(world.pods[f"uid-{name}"], ["n1", "n2", "n3"]))
            told += answer["NodeNames"]
        assert len(told) == 2 and told[0] != told[1], (seed, told)
