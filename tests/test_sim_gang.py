"""The simulator's gang workloads: the pod list's gang columns, whole groups under ``--gang-mode gang``,
partial groups and the GPUs they hold idle under the one-by-one baseline, time to place, the report,
and a gang-free trace running exactly as before."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.core import PodRequest
from scheduler.core.policies import make_policy
from scheduler.core.schedule import Placement, schedule_one
from scheduler.sim import cli
from scheduler.sim.protocol import (
    GangStats,
    GangTracker,
    allocation_curve,
    arrival_order,
    arrivals,
    nearest_rank,
    run_once,
)
from scheduler.sim.runner import run_experiment
from scheduler.sim.trace import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    Gang,
    NodeSpec,
    TraceError,
    build_cluster,
    load_nodes,
    load_pods,
    load_workload,
)

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gang,gang_min"
NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,4,T4\nn1,64000,262144,4,T4\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text.strip() + "\n")
    return path


# --- the pod list's gang columns -------------------------------------------------------------


def test_gang_columns_make_groups_and_pods_stay_as_they_were(tmp_path: Path) -> None:
    pods = write(
        tmp_path / "p.csv",
        f"""
{HEADER}
a0,1000,100,2,1000, train ,2
x,1000,100,1,500,,
a1,1000,100,2,1000,train,2
a2,1000,100,2,1000,train,2
b0,1000,100,1,1000,solo,1
""",
    )
    workload = load_workload(pods)
    assert workload.gangs == (Gang("train", 2, ("a0", "a1", "a2")), Gang("solo", 1, ("b0",)))
    assert [p.name for p in workload.pods] == ["a0", "x", "a1", "a2", "b0"]
    assert load_pods(pods) == list(workload.pods)


def test_without_gang_min_a_group_needs_every_member_and_without_gang_there_are_none(tmp_path: Path) -> None:
    all_of = write(
        tmp_path / "all.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gang\na,1,1,1,1000,g\nb,1,1,1,1000,g\nc,1,1,0,0,",
    )
    assert load_workload(all_of).gangs == (Gang("g", 2, ("a", "b")),)
    plain = write(tmp_path / "plain.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,1000")
    assert load_workload(plain).gangs == ()
    assert load_workload(DEFAULT_PODS).gangs == ()


MALFORMED = {
    "a minimum that is not a number": (
        f"{HEADER}\na,1,1,1,1000,g,x\nb,1,1,1,1000,g,x",
        ":2: column gang_min",
    ),
    "a minimum of 0": (f"{HEADER}\na,1,1,1,1000,g,0", ":2: column gang_min: not a whole number"),
    "a negative minimum": (f"{HEADER}\na,1,1,1,1000,g,-1", ":2: column gang_min: not a whole number"),
    "a fractional minimum": (f"{HEADER}\na,1,1,1,1000,g,1.5", ":2: column gang_min: not a whole number"),
    "a float-looking minimum": (f"{HEADER}\na,1,1,1,1000,g,1.0", ":2: column gang_min: not a whole number"),
    "a non-ASCII digit": (f"{HEADER}\na,1,1,1,1000,g,\uff11", ":2: column gang_min: not a whole number"),
    "a minimum beyond the bound": (f"{HEADER}\na,1,1,1,1000,g,100001", ":2: column gang_min: not a whole"),
    "a minimum of 5000 digits": (
        f"{HEADER}\na,1,1,1,1000,g,{'9' * 5000}",
        ":2: column gang_min: not a whole",
    ),
    "an empty minimum on a member": (f"{HEADER}\na,1,1,1,1000,g,2\nb,1,1,1,1000,g,", ":3: gang 'g': column"),
    "a minimum on a pod in no gang": (f"{HEADER}\na,1,1,1,1000,,2", ":2: column gang_min is '2' but the pod"),
    "more minimum than members": (
        f"{HEADER}\nz,1,1,0,0,,\na,1,1,1,1000,g,3\nb,1,1,1,1000,g,3",
        ":3: gang 'g': gang_min 3 but the trace has 2 member(s)",
    ),
    "minimums that differ": (
        f"{HEADER}\na,1,1,1,1000,g,2\nb,1,1,1,1000,g,2\nc,1,1,1,1000,g,3",
        ":4: gang 'g': gang_min 3 differs from the 2 of its member on line 2",
    ),
    "a member listed twice": (
        f"{HEADER}\na,1,1,1,1000,g,1\na,1,1,1,1000,g,1",
        ":3: pod name 'a' of gang 'g' is also on line 2",
    ),
    "a member named like another pod": (
        f"{HEADER}\na,1,1,1,1000,,\nb,1,1,1,1000,g,1\na,1,1,1,1000,g,1",
        ":4: pod name 'a' of gang 'g' is also on line 2",
    ),
    "a name like a clone's": (
        f"{HEADER}\nb-clone-3,1,1,0,0,,\nb,1,1,1,1000,g,1",
        ":2: pod name 'b-clone-3' ends like a simulator clone's",
    ),
    "gang_min without gang": (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gang_min\na,1,1,1,1000,1",
        ": column gang_min without a gang column",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_gang_columns_are_a_trace_error_naming_the_line(case: str, tmp_path: Path) -> None:
    text, message = MALFORMED[case]
    path = write(tmp_path / "p.csv", text)
    with pytest.raises(TraceError) as caught:
        load_workload(path)
    assert message in str(caught.value) and str(path) in str(caught.value), str(caught.value)
    with pytest.raises(TraceError):
        load_pods(path)  # the plain loader checks the columns too


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_the_cli_refuses_a_malformed_gang_trace_in_one_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = write(tmp_path / "p.csv", MALFORMED[case][0])
    nodes = write(tmp_path / "n.csv", NODES_CSV)
    assert cli.main(["--nodes", str(nodes), "--pods", str(pods), "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kubegpu simulate: ") and MALFORMED[case][1] in err[0], err


# --- the arrival order -------------------------------------------------------------------------


def members(group: str, count: int, gpus: int, cpu: int = 1000) -> list[PodRequest]:
    return [PodRequest(f"{group}{i}", cpu_milli=cpu, gpu_count=gpus) for i in range(count)]


def gang(name: str, minimum: int, pods: Sequence[PodRequest]) -> Gang:
    return Gang(name, minimum, tuple(p.uid for p in pods))


def test_a_group_arrives_as_one_unit_and_its_clones_are_groups_of_clones() -> None:
    a, b = members("a", 3, 1), members("b", 2, 1)
    singles = [PodRequest(f"s{i}", cpu_milli=1, gpu_count=1, gpu_milli=500) for i in range(4)]
    pods = [*singles[:2], *a, *singles[2:], *b]
    gangs = [gang("A", 2, a), gang("B", 2, b)]
    for seed in range(10):
        order, groups = arrivals(pods, seed, 10_000, 1.3, gangs)
        names = [p.name for p in order]
        assert sum(p.total_gpu_milli for p in order) <= 13_000
        for g in groups:
            slots = [names.index(uid) for uid in g.members]  # names are uids here
            assert slots == list(range(slots[0], slots[0] + len(g.members)))  # together, in name order
            assert g.min_member == 2 and len(g.members) == (3 if g.name.startswith("A") else 2)
            assert g.name in ("A", "B") or g.name.split("-clone-")[1] == g.members[0].split("-clone-")[1]
        assert [g.name for g in groups[:2]] != ["A", "B"] or seed  # shuffled as units
        assert {g.name for g in groups} >= {"A", "B"} and len({p.uid for p in order}) == len(order)
        spread, spread_groups = arrivals(pods, seed, 10_000, 1.3, gangs, spread=True)
        assert spread_groups == groups and sorted(p.uid for p in spread) == sorted(p.uid for p in order)
        in_gang = {uid for g in groups for uid in g.members}
        assert [p for p in spread if p.uid not in in_gang] == [p for p in order if p.uid not in in_gang]
        assert [i for i, p in enumerate(spread) if p.uid in in_gang] == [
            i for i, p in enumerate(order) if p.uid in in_gang
        ]
    cut, cut_groups = arrivals(pods, 42, 2000, 1.0, gangs)  # above the target: whole units dropped
    kept = {p.uid for p in cut}
    assert all(set(g.members) <= kept for g in cut_groups)
    assert not any(set(g.members) & kept for g in gangs if g not in cut_groups)


def test_groups_that_do_not_match_the_pods_are_refused() -> None:
    pods = members("a", 2, 1)
    with pytest.raises(ValueError, match="member z is not among the pods"):
        arrivals(pods, 1, 1000, 0, [Gang("A", 1, ("a0", "z"))])
    with pytest.raises(ValueError, match="member a0 is in two groups"):
        arrivals(pods, 1, 1000, 0, [Gang("A", 1, ("a0",)), Gang("B", 1, ("a0", "a1"))])


def test_spread_deals_members_apart() -> None:
    pods = [*members("a", 4, 1), *members("b", 4, 1), *[PodRequest(f"s{i}", gpu_count=1) for i in range(8)]]
    gangs = [gang("A", 4, pods[:4]), gang("B", 4, pods[4:8])]
    moved = 0
    for seed in range(10):
        together = [p.name for p in arrivals(pods, seed, 100_000, 0, gangs)[0]]
        spread = [p.name for p in arrivals(pods, seed, 100_000, 0, gangs, spread=True)[0]]
        moved += together != spread
    assert moved >= 8


# --- whole or nothing, partial groups, idle GPUs -------------------------------------------------


def two_nodes() -> list[NodeSpec]:
    return [NodeSpec("n0", 64_000, 262_144, 4, "T4"), NodeSpec("n1", 64_000, 262_144, 4, "T4")]


def rival_groups() -> tuple[list[PodRequest], list[Gang]]:
    """Group A (3 x 2 GPUs) and group B (2 x 2 GPUs) on 8 GPUs: each fits alone, not both."""
    a, b = members("a", 3, 2), members("b", 2, 2)
    return [*a, *b], [gang("A", 3, a), gang("B", 2, b)]


@pytest.mark.parametrize("policy", ["fgd-reserve", "bestfit", "spread", "random", "topology"])
@pytest.mark.parametrize("arrival", ["together", "spread"])
def test_gang_mode_places_a_group_whole_or_not_at_all(policy: str, arrival: str) -> None:
    pods, gangs = rival_groups()
    for seed in range(12):
        run = run_once(
            two_nodes(), pods, policy, seed, 0, gangs=gangs, gang_mode="gang", gang_arrival=arrival
        )
        assert run.gangs is not None
        # the placed pods are exactly one group (3 or 2 members), never a part of the other
        assert (run.placed, run.allocated_milli) in ((3, 6000), (2, 4000)), (seed, run.placed)
        assert (run.gangs.groups, run.gangs.whole, run.gangs.partial, run.gangs.unplaced) == (2, 1, 0, 1)
        assert run.gangs.idle_milli_events == run.gangs.idle_milli_end == 0


def test_the_baseline_leaves_groups_partial_holding_gpus_the_gang_mode_does_not() -> None:
    pods, gangs = rival_groups()
    partial_runs = 0
    for seed in range(20):
        base = run_once(
            two_nodes(), pods, "bestfit", seed, 0, gangs=gangs, gang_mode="none", gang_arrival="spread"
        )
        whole = run_once(
            two_nodes(), pods, "bestfit", seed, 0, gangs=gangs, gang_mode="gang", gang_arrival="spread"
        )
        assert base.gangs is not None and whole.gangs is not None
        assert base.placed == 4 and base.allocated_milli == 8000  # one by one: every 2-GPU pod fits
        assert (whole.gangs.partial, whole.gangs.idle_milli_events) == (0, 0)
        if base.gangs.partial:
            partial_runs += 1
            # the group left partial holds its placed members' GPUs to the end
            assert base.gangs.partial == 1 and base.gangs.idle_milli_end in (2000, 4000)
            assert base.gangs.idle_milli_events >= base.gangs.idle_milli_end
    assert partial_runs >= 5


def test_idle_gpus_are_zero_in_gang_mode_on_random_workloads() -> None:
    """Whatever the groups, cluster and order, gang mode never holds a GPU for a group that is not whole."""
    rng = random.Random(7)
    for trial in range(15):
        nodes = [
            NodeSpec(f"n{i}", 32_000, 131_072, rng.choice([1, 2, 4, 8]), "V100M32")
            for i in range(rng.randint(1, 4))
        ]
        pods: list[PodRequest] = []
        gangs: list[Gang] = []
        for g in range(rng.randint(1, 5)):
            group = members(
                f"g{g}-", rng.randint(1, 4), rng.choice([1, 2, 4]), cpu=rng.choice([1000, 12_000])
            )
            pods += group
            gangs.append(gang(f"g{g}", rng.randint(1, len(group)), group))
        pods += [
            PodRequest(f"s{i}", cpu_milli=2000, gpu_count=1, gpu_milli=rng.choice([250, 500, 1000]))
            for i in range(rng.randint(0, 6))
        ]
        for mode in ("gang", "none"):
            run = run_once(
                nodes,
                pods,
                "fgd-reserve",
                trial,
                1.3,
                gangs=gangs,
                gang_mode=mode,
                gang_arrival=rng.choice(["together", "spread"]),
            )
            stats = run.gangs
            assert stats is not None and stats.groups == stats.whole + stats.partial + stats.unplaced
            if mode == "gang":
                assert (stats.partial, stats.idle_milli_events, stats.idle_milli_end) == (0, 0, 0)


def test_singleton_groups_run_as_plain_pods() -> None:
    """Groups of one member with minimum 1 take the planner's path but decide as ``schedule_one``."""
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    gangs = [Gang(f"g-{p.name}", 1, (p.uid,)) for p in pods[::3]]
    for seed in (42, 43):
        plain = run_once(nodes, pods, "fgd-reserve", seed)
        grouped = run_once(nodes, pods, "fgd-reserve", seed, gangs=gangs, gang_mode="gang")
        assert (grouped.curve, grouped.placed, grouped.allocated_milli) == (
            plain.curve,
            plain.placed,
            plain.allocated_milli,
        )
        assert grouped.gangs is not None and grouped.gangs.waits and set(grouped.gangs.waits) == {0}


# --- time to place -------------------------------------------------------------------------------


def test_nearest_rank_percentiles() -> None:
    assert nearest_rank([], 50) is None
    assert [nearest_rank([5, 1, 3, 2, 4], p) for p in (50, 90, 99, 100)] == [3, 5, 5, 5]
    assert nearest_rank(list(range(1, 101)), 90) == 90 and nearest_rank(list(range(1, 101)), 99) == 99
    assert nearest_rank([7], 1) == 7


def test_the_tracker_on_a_sequence_computed_by_hand() -> None:
    """Baseline events (A: min 2 of a1 a2; B: min 3 of b1 b2 b3), GPU milli placed:
    0: a1 placed 1000 (idle 1000)   1: b1 placed 500 (idle 1500)   2: a pod in no group (1500)
    3: a2 placed 1000: A whole after 3 events (idle 500)   4: b2 does not fit (500)   5: b3 placed 250 (750)
    idle summed: 1000 + 1500 + 1500 + 500 + 500 + 750 = 5750; B partial holding 750 at the end."""
    tracker = GangTracker([Gang("A", 2, ("a1", "a2")), Gang("B", 3, ("b1", "b2", "b3"))])
    events: list[tuple[str | None, int | None]] = [
        ("a1", 1000),
        ("b1", 500),
        (None, None),
        ("a2", 1000),
        ("b2", None),
        ("b3", 250),
    ]
    for k, (uid, milli) in enumerate(events):
        if uid is not None:
            group = tracker.of[uid]
            tracker.arrive(group, k)
            if milli is not None:
                tracker.place(group, k, milli)
        tracker.tick()
    stats = tracker.stats("none", "spread", 4000)
    assert (stats.groups, stats.whole, stats.partial, stats.unplaced) == (2, 1, 1, 0)
    assert (stats.idle_milli_events, stats.idle_milli_end, stats.events, stats.waits) == (5750, 750, 6, (3,))
    summary = stats.summary()
    assert summary["idle_gpu_events"] == 5.75 and summary["idle_gpus_at_end"] == 0.75
    assert summary["idle_pct_mean"] == round(5750 / (6 * 4000) * 100, 4)
    assert summary["time_to_place_events"] == {"p50": 3, "p90": 3, "p99": 3, "groups": 1}


def test_time_to_place_of_whole_groups_arriving_together() -> None:
    """Groups of 2..6 one-GPU members on 32 GPUs, all fitting: with ``together`` a group's members
    arrive one after another, so in gang mode a group of n waits n - 1 events (tried at its last
    member): waits 1, 2, 3, 4, 5 -> p50 3 (the 3rd of 5), p90 5 (the 5th: ceil(4.5)), p99 5. In the
    baseline a group of n with minimum 2 is whole at its 2nd member: every wait is 1."""
    nodes = [NodeSpec(f"n{i}", 64_000, 262_144, 8, "V100M32") for i in range(4)]
    pods: list[PodRequest] = []
    gangs: list[Gang] = []
    for n in range(2, 7):
        group = members(f"g{n}-", n, 1)
        pods += group
        gangs.append(gang(f"g{n}", n, group))
    for seed in (1, 2, 3):
        run = run_once(nodes, pods, "bestfit", seed, 0, gangs=gangs, gang_mode="gang")
        assert run.gangs is not None and sorted(run.gangs.waits) == [1, 2, 3, 4, 5]
        assert run.gangs.percentiles() == {"p50": 3, "p90": 5, "p99": 5}
        elastic = [replace(g, min_member=2) for g in gangs]
        base = run_once(nodes, pods, "bestfit", seed, 0, gangs=elastic, gang_mode="none")
        assert base.gangs is not None and base.gangs.waits == (1, 1, 1, 1, 1)
        # groups completed one by one still held their first member's GPU for one event each
        assert base.gangs.idle_milli_events == 5 * 1000 and base.gangs.idle_milli_end == 0


def test_time_to_place_with_spread_members_is_the_span_of_their_arrivals() -> None:
    nodes = [NodeSpec(f"n{i}", 64_000, 262_144, 8, "V100M32") for i in range(4)]
    pods = [
        *members("a", 3, 1),
        *members("b", 2, 2),
        *[PodRequest(f"s{i}", cpu_milli=10, gpu_count=1) for i in range(6)],
    ]
    gangs = [gang("A", 3, pods[:3]), gang("B", 2, pods[3:5])]
    for seed in range(5):
        order, _ = arrivals(pods, seed, 32_000, 0, gangs, spread=True)
        position = {p.uid: k for k, p in enumerate(order)}
        spans = sorted(
            max(position[u] for u in g.members) - min(position[u] for u in g.members) for g in gangs
        )
        run = run_once(nodes, pods, "bestfit", seed, 0, gangs=gangs, gang_arrival="spread")
        assert run.gangs is not None and sorted(run.gangs.waits) == spans


def test_stats_merge_over_runs() -> None:
    one = GangStats("gang", "together", 2, 1, 0, 1, 0, 0, 10, 8000, (3,))
    two = GangStats("gang", "together", 3, 2, 0, 1, 0, 0, 12, 8000, (1, 5))
    merged = GangStats.merge([one, two])
    assert (merged.groups, merged.whole, merged.unplaced, merged.events, merged.waits) == (
        5,
        3,
        2,
        22,
        (3, 1, 5),
    )
    assert merged.percentiles() == {"p50": 3, "p90": 5, "p99": 5}


# --- a gang-free trace runs exactly as before ----------------------------------------------------


def reference_order(
    pods: Sequence[PodRequest], seed: int, capacity: int, inflation: float
) -> list[PodRequest]:
    """The arrival order as the protocol defined it before gangs (shuffle, clone or cut pod by pod)."""
    rng = random.Random(seed)
    base = sorted(pods, key=lambda p: p.name)
    order = list(base)
    rng.shuffle(order)
    target = inflation * capacity
    total = sum(p.total_gpu_milli for p in order)
    if inflation == 0:
        return order
    if total > target:
        while total > target and order:
            total -= order.pop(rng.randrange(len(order))).total_gpu_milli
        return order
    clone = 0
    while True:
        pod = base[rng.randrange(len(base))]
        if total + pod.total_gpu_milli > target:
            return order
        order.append(replace(pod, name=f"{pod.name}-clone-{clone}", uid=f"{pod.uid}-clone-{clone}"))
        total += pod.total_gpu_milli
        clone += 1


def reference_run(
    nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], policy_name: str, seed: int
) -> tuple:
    """The protocol's pod-by-pod loop as it was before gangs: (curve, placed, allocated milli)."""
    cluster = build_cluster(nodes)
    cluster.set_tie_order(random.Random(seed + 1_000_003).sample(range(len(cluster)), len(cluster)))
    capacity = cluster.total_gpus() * 1000
    rng = random.Random(seed ^ 0x5EED5EED)
    policy = make_policy(policy_name)
    policy.bind(cluster, pods, rng)
    arrived, allocated, arr, used, placed = [], [], 0, 0, 0
    for pod in reference_order(pods, seed, capacity, 1.3):
        arr += pod.total_gpu_milli
        result = schedule_one(pod, cluster, policy, rng, explain=False)
        if isinstance(result, Placement):
            cluster.assume(result.allocation)
            used += result.allocation.gpu_milli
            placed += 1
        arrived.append(arr)
        allocated.append(used)
    import numpy as np

    return allocation_curve(np.array(arrived), np.array(allocated), capacity), placed, used


@pytest.mark.parametrize("policy", ["fgd-reserve", "bestfit", "random"])
def test_a_gang_free_trace_gives_exactly_the_results_of_before(policy: str) -> None:
    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    capacity = sum(n.gpus for n in nodes) * 1000
    for seed in (42, 47):
        assert arrival_order(pods, seed, capacity, 1.3) == reference_order(pods, seed, capacity, 1.3)
        expected = reference_run(nodes, pods, policy, seed)
        for mode in ("gang", "none"):
            for arrival in ("together", "spread"):
                run = run_once(nodes, pods, policy, seed, gang_mode=mode, gang_arrival=arrival)
                assert (run.curve, run.placed, run.allocated_milli) == expected
                assert run.gangs is None
    doc = run_experiment(nodes, pods, policy, seeds=[42], gang_mode="none").to_json()
    assert "gangs" not in doc and "gangs" not in doc["runs"][0]


# --- the report and the CLI end to end -----------------------------------------------------------


GANG_PODS = f"""
{HEADER}
a0,4000,8192,2,1000,A,3
a1,4000,8192,2,1000,A,3
a2,4000,8192,2,1000,A,3
b0,4000,8192,2,1000,B,2
b1,4000,8192,2,1000,B,2
s0,1000,1024,0,0,,
"""


def test_cli_end_to_end_reports_groups_in_both_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write(tmp_path / "nodes.csv", NODES_CSV)
    pods = write(tmp_path / "pods.csv", GANG_PODS)
    common = [
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--seeds",
        "1-6",
        "--inflation",
        "0",
        "--policy",
        "bestfit",
    ]
    assert cli.main([*common, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["gangs"]
    assert (total["mode"], total["arrival"], total["groups"], total["whole"], total["partial"]) == (
        "gang",
        "together",
        12,
        6,
        0,
    )
    assert total["idle_gpu_events"] == 0 and total["idle_gpus_at_end"] == 0 and total["idle_pct_mean"] == 0
    assert total["time_to_place_events"]["groups"] == 6
    assert set(total["time_to_place_events"]) == {"p50", "p90", "p99", "groups"}
    assert all(r["gangs"]["groups"] == 2 and r["gangs"]["whole"] == 1 for r in doc["runs"])

    assert cli.main([*common, "--json", "--gang-mode", "none", "--gang-arrival", "spread"]) == 0
    base = json.loads(capsys.readouterr().out)["gangs"]
    assert (base["mode"], base["arrival"], base["groups"]) == ("none", "spread", 12)
    assert base["partial"] >= 1 and base["idle_gpus_at_end"] > 0 and base["idle_gpu_events"] > 0
    assert base["whole"] + base["partial"] + base["unplaced"] == 12

    assert cli.main([*common, "--gang-mode", "none"]) == 0
    out = capsys.readouterr().out
    assert "6 pods (2 pod groups) from pods.csv" in out
    assert "gang workloads: mode none" in out and "idle GPU x events" in out and "time to place" in out
    assert any(line.split()[:1] == ["all"] for line in out.splitlines())
    assert cli.main([*common, "--gang-mode", "both"]) == 2  # argparse refuses it


def test_the_report_of_a_gang_free_trace_has_no_gang_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "42"]) == 0
    out = capsys.readouterr().out
    assert "gang" not in out and "pod group" not in out


def test_the_bound_of_a_gang_run_follows_its_arrival_order_and_stays_above_it() -> None:
    """``--bound`` with gangs: the LP sees the run's own arrival order (groups as units, spread or
    not), and no gang run allocates more than it at 100% and 130% arrived."""
    from scheduler.sim.bound import arrived_by, protocol_bounds

    nodes, pods = load_nodes(DEFAULT_NODES), load_pods(DEFAULT_PODS)
    gpu_pods = [p for p in pods if p.gpu_count]
    gangs = [gang(f"g{i}", 3, gpu_pods[i : i + 4]) for i in range(0, 80, 4)]
    for arrival in ("together", "spread"):
        run = run_once(nodes, pods, "fgd-reserve", 42, gangs=gangs, gang_arrival=arrival)
        bounds = protocol_bounds(nodes, pods, 42, 1.3, gangs=gangs, spread=arrival == "spread")
        assert set(bounds) == {100, 130}
        order, _ = arrivals(pods, 42, run.capacity_milli, 1.3, gangs, arrival == "spread")
        assert order != arrival_order(pods, 42, run.capacity_milli, 1.3)
        for x, bound in bounds.items():
            assert run.at(x) <= bound.bound_pct + 1e-6, (arrival, x)
            counted = arrived_by(order, run.capacity_milli, x)
            assert bound.arrived_milli == sum(p.total_gpu_milli for p in counted), (arrival, x)
