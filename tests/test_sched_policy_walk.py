"""fgd-reserve and topology kept bound across the live usage patterns decide as policies bound afresh.

The per-node caches behind the default policies (``WholeNodeReserve``'s host table, the alignment's
free vectors, both following ``ClusterState.changed_since``; ``ShareSlots.least_mapped``; the plugins
``Policy.score`` leaves out) are checked here against what working everything out anew gives, on a
random walk of what the live scheduler, the extender, the gang planner and preemption do to a
cluster and its policy: pods assumed and forgotten (bind failures), pods booked as facts (other
schedulers', overbooking CPU and memory), live reports (GPUs out of placement, memory in use),
bursts of changes (past ``ONE_BY_ONE``, past a short change log), the policy bound again, the
cluster rebuilt (nodes removed, added, one swapped for another at the same index) and two clusters
taking turns with one policy. Nodes carry GPU models, known GPU memory, MPS, NVLink and RDMA NICs;
pods are shares (by milli, by memory, model-restricted, enforced), whole GPUs with topology wishes,
whole nodes, RDMA and CPU only. At every scheduling step the kept policy's scores (on the feasible
nodes and on a subset, sorted or not), its tie-breaker's and its choice are compared with a policy
bound anew to the same cluster and with one bound to a copy of the cluster built from scratch.
"""

from __future__ import annotations

import dataclasses
import pickle
import random

import numpy as np
import pytest

from devices.model import Device, DeviceKind, NodeInventory, Topology, pair
from scheduler.core import policies
from scheduler.core import state as state_module
from scheduler.core.filters import DEFAULT_FILTERS, run_filters
from scheduler.core.policies import ReserveThenAlign, WholeNodeReserve, make_policy
from scheduler.core.rdma import RdmaRequest
from scheduler.core.request import PodRequest, TopologyWish, Wish
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.scoring import Policy
from scheduler.core.state import Allocation, ClusterState, GpuGrant, LiveGpu, NodeState
from scheduler.live.cache import is_pending_for
from scheduler.live.podspec import GPU_MILLI_ANNOTATION
from tests.support.schedworld import Feed, World, make_scheduler, node_json, pod_json


def node(name: str, rng: random.Random) -> NodeState:
    """A node of 0 to 8 GPUs (models A and B, memory known or not, some MPS), NVLink on some, two
    RDMA PFs of three VFs on some."""
    gpus = rng.choice((0, 1, 2, 4, 8, 8, 8))
    model = rng.choice(("A", "A", "B"))
    memory = rng.choice((0, 40_960, 81_920))
    devices = [
        Device(
            f"{name}-g{i}",
            DeviceKind.GPU,
            i,
            model if i % 3 or rng.random() < 0.7 else "B",
            memory,
            i * 2 // max(gpus, 1),
            attributes={"sharing": "mps"} if rng.random() < 0.3 else {},
        )
        for i in range(gpus)
    ]
    nvlinks = {}
    if gpus >= 4 and rng.random() < 0.6:
        for a in range(gpus):
            for b in range(a + 1, gpus):
                if a // 2 == b // 2 or rng.random() < 0.3:
                    nvlinks[pair(f"{name}-g{a}", f"{name}-g{b}")] = rng.choice((1, 2, 4))
    nic_gpus = {}
    if gpus and rng.random() < 0.3:
        for p in range(2):
            pf = f"{name}-pf{p}"
            attributes = {"function": "pf", "rateGbps": "100", "sriovNumVfs": "3"}
            devices.append(
                Device(pf, DeviceKind.RDMA, len(devices), "CX7", numa_node=p, attributes=attributes)
            )
            for k in range(3):
                attributes = {"function": "vf", "parentDevice": pf, "rateGbps": "100"}
                devices.append(
                    Device(
                        f"{pf}-vf{k}", DeviceKind.RDMA, len(devices), "VF", numa_node=p, attributes=attributes
                    )
                )
            nic_gpus[pf] = tuple(f"{name}-g{g}" for g in range(gpus) if g % 2 == p)
    inventory = NodeInventory(tuple(devices), Topology(nvlinks=nvlinks, nic_gpus=nic_gpus))
    cpu = rng.choice((16_000, 64_000, 96_000, 128_000))
    return NodeState.from_inventory(name, cpu, rng.choice((65_536, 262_144, 524_288)), inventory)


NVLINK = TopologyWish(nvlink=Wish.PREFER)
POOL = [
    PodRequest("cpu", cpu_milli=8000, memory_mib=4096),
    PodRequest("cpu-big", cpu_milli=40_000, memory_mib=100_000),
    PodRequest("s300", cpu_milli=2000, gpu_count=1, gpu_milli=300),
    PodRequest("s500", cpu_milli=4000, gpu_count=1, gpu_milli=500),
    PodRequest("s910", cpu_milli=1000, gpu_count=1, gpu_milli=910),
    PodRequest("smem", cpu_milli=1000, gpu_count=1, gpu_memory_mib=10_240),
    PodRequest("sA", cpu_milli=1000, gpu_count=1, gpu_milli=250, gpu_models=frozenset({"A"})),
    PodRequest("sB", cpu_milli=1000, gpu_count=1, gpu_milli=700, gpu_models=frozenset({"B"})),
    PodRequest("smps", cpu_milli=1000, gpu_count=1, gpu_milli=400, enforced_share=True),
    PodRequest("w1", cpu_milli=8000, memory_mib=8000, gpu_count=1),
    PodRequest("w2", cpu_milli=12_000, gpu_count=2),
    PodRequest("w2nv", cpu_milli=12_000, gpu_count=2, topology=NVLINK),
    PodRequest("w4nv", cpu_milli=30_000, memory_mib=20_000, gpu_count=4, topology=NVLINK),
    PodRequest("w4A", cpu_milli=30_000, gpu_count=4, gpu_models=frozenset({"A"})),
    PodRequest("w8", cpu_milli=8000, memory_mib=1000, gpu_count=8),
    PodRequest("w8big", cpu_milli=60_000, memory_mib=200_000, gpu_count=8),
    PodRequest("r1", cpu_milli=4000, gpu_count=1, rdma=RdmaRequest(1, 10_000)),
    PodRequest("r2", cpu_milli=4000, gpu_count=2, rdma=RdmaRequest(2, 20_000)),
]
WHOLE_NODE = [p for p in POOL if p.gpu_count == 8]


def aligned(pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float) -> np.ndarray:
    """``AlignmentScore.aligned`` as it was before its caches (1dd8eee), from the cluster alone."""
    cpu_inv = 1.0 / np.maximum(cluster.cpu_capacity, 1)[idx]
    gpu_inv = 1.0 / np.maximum(cluster.gpu_count * 1000, 1)[idx]
    free_cpu = cluster.cpu_free[idx] * cpu_inv
    free_gpu = cluster.gpu_free_total[idx] * gpu_inv
    want_cpu = pod.cpu_milli * cpu_inv
    want_gpu = pod.total_gpu_milli * gpu_inv
    norm = np.sqrt((free_cpu * free_cpu + free_gpu * free_gpu) * (want_cpu * want_cpu + want_gpu * want_gpu))
    dot = free_cpu * want_cpu + free_gpu * want_gpu
    cosine = np.divide(dot, norm, out=np.zeros(len(idx)), where=norm > 0)
    if step > 0:
        return np.floor(np.round(cosine, 6) / step)
    return np.round(cosine, 6)


def reserve_penalty(
    reserve: WholeNodeReserve, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
) -> np.ndarray:
    """``WholeNodeReserve.penalty`` as it was before its host table (1dd8eee): every node compared; with
    ``by_need`` a whole-node pod skips only the shapes whose hosts it needs (CPU and memory too)."""
    out = np.zeros(len(idx))
    take = 1 if pod.is_share else pod.gpu_count
    free = int(cluster.gpu_free_total.sum()) if reserve.adaptive else 0
    for k, (gpus, cpu, memory) in enumerate(reserve.shapes):
        own = not pod.is_share and pod.gpu_count >= gpus
        if reserve.by_need and pod.gpu_count and not pod.is_share:
            own = own and pod.cpu_milli >= cpu and pod.memory_mib >= memory
        if own:
            continue
        hosts = (cluster.gpu_full_free >= gpus) & (cluster.cpu_free >= cpu) & (cluster.mem_free >= memory)
        if int(np.count_nonzero(hosts)) > reserve.keep_for(k, free):
            continue
        after = (
            (cluster.gpu_full_free[idx] - take >= gpus)
            & (cluster.cpu_free[idx] - pod.cpu_milli >= cpu)
            & (cluster.mem_free[idx] - pod.memory_mib >= memory)
        )
        out += hosts[idx] & ~after
    return out


def nodes_copy(nodes: list[NodeState]) -> list[NodeState]:
    """Independent copies of ``nodes`` with everything booked on them (a pickle round trip)."""
    return pickle.loads(pickle.dumps(nodes))


class Walk:
    """One policy kept bound (as the live scheduler keeps it) over a cluster that changes."""

    def __init__(self, seed: int, name: str) -> None:
        self.rng = random.Random(seed)
        self.name = name
        self.weight = self.rng.choice((0.0, 0.0, 0.5))  # the live utilisation term, sometimes
        self.cluster = ClusterState([node(f"n{i}", self.rng) for i in range(self.rng.randint(8, 24))])
        if self.rng.random() < 0.5:  # the simulator's node order; else ties at random
            order = list(range(len(self.cluster)))
            self.rng.shuffle(order)
            self.cluster.set_tie_order(order)
        self.workload = self.new_workload()
        self.policy = make_policy(name, self.weight)
        self.policy.bind(self.cluster, self.workload, random.Random(0))
        self.observed: list[PodRequest] = []  # arrivals since the last bind (adaptive reserve)
        self.other: ClusterState | None = None  # a second cluster taking turns with the first
        self.plugins_follow = True  # False after an unbound switch: only the tie-breaker is compared
        self.checked = self.placed = 0
        self.k = 0

    def new_workload(self) -> list[PodRequest]:
        pods = [self.rng.choice(POOL) for _ in range(self.rng.randint(0, 30))]
        return pods + self.rng.choice((WHOLE_NODE, WHOLE_NODE, WHOLE_NODE[:1], WHOLE_NODE[1:], []))

    def bind(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.policy.bind(cluster, self.workload, random.Random(0))
        self.observed = []
        self.plugins_follow = True

    def fresh(self, cluster: ClusterState) -> Policy:
        policy = make_policy(self.name, self.weight)
        policy.bind(cluster, self.workload, random.Random(0))
        for pod in self.observed:
            policy.observe(pod)
        return policy

    def copy(self) -> ClusterState:
        """The cluster built anew from copies of its nodes (no cache carried over)."""
        cluster = ClusterState(nodes_copy(self.cluster.nodes))
        rank = self.cluster.tie_rank
        cluster.tie_rank = None if rank is None else rank.copy()
        return cluster

    # --- what happens to the cluster -----------------------------------------------------------------

    def step(self) -> None:
        self.k += 1
        op = self.rng.random()
        if op < 0.40:
            self.schedule()
        elif op < 0.47:
            self.burst(self.rng.choice((5, 33, 40, 100)))
        elif op < 0.55 and self.cluster.where:
            self.cluster.forget(self.rng.choice(sorted(self.cluster.where)))
        elif op < 0.65:
            self.book_fact()
        elif op < 0.75:
            self.live_report()
        elif op < 0.80:
            self.workload = self.new_workload()
            self.bind(self.cluster)
        elif op < 0.87:
            self.rebuild()
        elif self.other is not None:
            self.switch()

    def schedule(self) -> None:
        pod = dataclasses.replace(self.rng.choice(POOL), name=f"p{self.k}", uid=f"p{self.k}")
        self.policy.observe(pod)
        self.observed.append(pod)
        self.compare(pod)
        result = schedule_one(pod, self.cluster, self.policy, random.Random(self.k))
        if isinstance(result, Placement) and self.rng.random() < 0.9:
            self.cluster.assume(result.allocation)
            self.placed += 1
            if self.rng.random() < 0.15:  # the Binding failed: forgotten at once
                self.cluster.forget(result.allocation.pod_uid)

    def burst(self, changes: int) -> None:
        for j in range(changes):
            if self.cluster.where and self.rng.random() < 0.4:
                self.cluster.forget(self.rng.choice(sorted(self.cluster.where)))
            else:
                name = self.cluster.nodes[self.rng.randrange(len(self.cluster))].name
                cpu, memory = self.rng.choice((0, 1000, 20_000)), self.rng.choice((0, 50_000))
                self.cluster.book(Allocation(name, f"b{self.k}-{j}", cpu_milli=cpu, memory_mib=memory))

    def book_fact(self) -> None:
        """A pod another scheduler bound: whole GPUs or a share, CPU and memory maybe overbooked."""
        at = self.cluster.nodes[self.rng.randrange(len(self.cluster))]
        free = [g for g in at.gpus if g.free_milli == 1000 and g.healthy]
        grants: tuple[GpuGrant, ...] = ()
        if free and self.rng.random() < 0.5:
            grants = tuple(GpuGrant(g.index, g.id) for g in free[: self.rng.randint(1, len(free))])
        elif at.gpus and self.rng.random() < 0.5:
            g = self.rng.choice(at.gpus)
            if g.free_milli >= 100:
                grants = (GpuGrant(g.index, g.id, self.rng.randrange(100, g.free_milli + 1, 100)),)
        cpu, memory = self.rng.choice((0, 1000, 8000, 40_000, 90_000)), self.rng.choice((0, 4096, 300_000))
        self.cluster.book(Allocation(at.name, f"f{self.k}", cpu_milli=cpu, memory_mib=memory, gpus=grants))

    def live_report(self) -> None:
        at = self.cluster.nodes[self.rng.randrange(len(self.cluster))]
        readings = {}
        for g in at.gpus:
            r, busy = self.rng.random(), self.rng.random() * 100
            if r < 0.15:
                readings[g.id] = LiveGpu(utilization=busy, unfit="XID 79")
            elif r < 0.5:
                readings[g.id] = LiveGpu(utilization=busy, memory_used_mib=self.rng.choice((0, 1000, 30_000)))
            elif r < 0.8:
                readings[g.id] = LiveGpu(utilization=busy)
        self.cluster.set_live(at.name, readings)

    def rebuild(self) -> None:
        """The live cache's rebuild: a new ClusterState of the nodes as they are, a node gone, one
        new, or one swapped for another at the same index; bound as ``_bind_policy`` does, or (same
        nodes) left for an unbound switch back and forth."""
        nodes = nodes_copy(self.cluster.nodes)
        r = self.rng.random()
        if r < 0.25 and len(nodes) > 3:
            del nodes[self.rng.randrange(len(nodes))]
        elif r < 0.5:
            nodes.insert(self.rng.randrange(len(nodes) + 1), node(f"x{self.k}", self.rng))
        elif r < 0.75 and len(nodes) > 3:
            nodes[self.rng.randrange(len(nodes))] = node(f"y{self.k}", self.rng)
        rebuilt = ClusterState(nodes)
        same = r >= 0.75
        if same and self.cluster.tie_rank is not None:
            rebuilt.tie_rank = self.cluster.tie_rank.copy()
        self.other = self.cluster
        if same and self.rng.random() < 0.5:
            self.cluster = rebuilt  # the same nodes, the policy not bound again
            self.plugins_follow = False
        else:
            self.bind(rebuilt)

    def switch(self) -> None:
        """Two clusters take turns with one policy, bound again only when their nodes differ."""
        assert self.other is not None
        before, self.cluster, self.other = self.cluster, self.other, self.cluster
        same = [n.name for n in before.nodes] == [n.name for n in self.cluster.nodes]
        if not same or self.rng.random() < 0.3:
            self.bind(self.cluster)
        else:
            self.plugins_follow = False

    # --- the comparison ------------------------------------------------------------------------------

    def compare(self, pod: PodRequest) -> None:
        cluster = self.cluster
        idx, _ = run_filters(pod, cluster, DEFAULT_FILTERS, False)
        if not len(idx):
            return
        subset = self.rng.sample(idx.tolist(), max(1, len(idx) // self.rng.choice((1, 2, 3))))
        if self.rng.random() < 0.7:
            subset.sort()
        sub = np.array(subset, dtype=np.int64)
        tie_break = self.policy.tie_break
        assert tie_break is not None
        kept = {
            "tie-break": tie_break.score(pod, cluster, idx),
            "tie-break subset": tie_break.score(pod, cluster, sub),
        }
        total = np.zeros(len(idx))  # Policy.score as it was: every plugin's weighted score summed
        for plugin, weight in self.policy.plugins:
            part = plugin.score(pod, cluster, idx)
            total += weight * part
            if not plugin.applies(pod):  # Policy.score leaves it out: it must be 0 everywhere
                assert not part.any(), f"{plugin.name} applies to {pod.name}"
        if self.plugins_follow:
            assert np.array_equal(self.policy.score(pod, cluster, idx), total)
        assert isinstance(tie_break, ReserveThenAlign)
        for step in (0.0, tie_break.step):  # against the formulas worked out from scratch
            assert np.array_equal(
                tie_break.aligned(pod, cluster, sub, step), aligned(pod, cluster, sub, step)
            )
        penalty = tie_break.reserve.penalty(pod, cluster, sub)
        assert penalty.tolist() == reserve_penalty(tie_break.reserve, pod, cluster, sub).tolist()
        table = tie_break.reserve._table  # just refreshed: its free GPU milli is the cluster's
        if table is not None:
            assert table.free_milli == int(cluster.gpu_free_total.sum())
        if self.plugins_follow:
            kept["scores"] = self.policy.score(pod, cluster, idx)
            kept["scores subset"] = self.policy.score(pod, cluster, sub)
            kept["choice"] = self.choice(self.policy, pod, cluster)
        rebuilt = self.copy()
        for where, policy, on in (("same cluster", self.fresh(cluster), cluster), ("rebuilt", None, rebuilt)):
            policy = policy or self.fresh(on)
            assert policy.tie_break is not None
            fresh = {
                "tie-break": policy.tie_break.score(pod, on, idx),
                "tie-break subset": policy.tie_break.score(pod, on, sub),
                "scores": policy.score(pod, on, idx),
                "scores subset": policy.score(pod, on, sub),
                "choice": self.choice(policy, pod, on),
            }
            for what, got in kept.items():
                want = fresh[what]
                same = got == want if what == "choice" else np.array_equal(got, want)
                assert same, f"{self.name} {pod.name} {what} ({where}): kept {got}, fresh {want}"
        self.checked += 1

    def choice(self, policy: Policy, pod: PodRequest, cluster: ClusterState) -> tuple:
        result = schedule_one(pod, cluster, policy, random.Random(self.k))
        if not isinstance(result, Placement):
            return ()
        alloc = result.allocation
        return (result.node, alloc.gpus, alloc.rdma, result.score)


@pytest.mark.parametrize(
    ("name", "change_log", "one_by_one"),
    [
        ("fgd-reserve", None, None),
        ("topology", None, None),
        ("fgd-reserve", 3, 1000),
        ("topology", 3, None),
        ("topology", None, 0),
    ],
)
def test_kept_policy_decides_as_a_fresh_one_through_live_patterns(
    name: str, change_log: int | None, one_by_one: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random walks (seeds 0..2 per case), with the change log shortened (3: it overflows every
    few changes) and the node-by-node refresh off (0) or always on (1000)."""
    if change_log is not None:
        monkeypatch.setattr(state_module, "CHANGE_LOG", change_log)
    if one_by_one is not None:
        monkeypatch.setattr(policies, "ONE_BY_ONE", one_by_one)
    checked = placed = 0
    for seed in range(3):
        walk = Walk(seed, name)
        for _ in range(70):
            walk.step()
        checked += walk.checked
        placed += walk.placed
    assert checked > 40 and placed > 25  # the walks scheduled, placed and compared


@pytest.mark.parametrize("change_log", [1, 2, 3, 5])
def test_changed_since_at_the_edge_of_the_log(change_log: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generation back to the oldest the log holds gives exactly the nodes changed since, and the
    one before it None, whatever the log's length between trims (``CHANGE_LOG`` to twice it)."""
    monkeypatch.setattr(state_module, "CHANGE_LOG", change_log)
    rng = random.Random(change_log)
    cluster = ClusterState([node(f"n{i}", rng) for i in range(6)])
    history: list[int] = []  # the node of every change since the cluster was built
    start = cluster.generation
    for k in range(6 * change_log + 4):
        i = rng.randrange(len(cluster))
        cluster.book(Allocation(cluster.nodes[i].name, f"e{k}", cpu_milli=1))
        history.append(i)
        remembered = [g for g in range(start, cluster.generation + 1) if cluster.changed_since(g) is not None]
        assert remembered == list(range(cluster.generation - len(remembered) + 1, cluster.generation + 1))
        assert len(remembered) - 1 >= min(change_log, len(history))  # at least CHANGE_LOG changes back
        for g in remembered:
            assert cluster.changed_since(g) == history[g - start :]


# --- the live scheduler ---------------------------------------------------------------------------------


class Watched:
    """A live scheduler (tests/support/schedworld.py) whose policy is compared, after every step it
    takes, with one bound anew to the cluster and workload it was last bound to."""

    def __init__(self, policy: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.world = World()
        for i in range(10):
            self.world.put_node(
                node_json(f"n{i}", gpus=self.rng.choice((2, 4, 8, 8)), cpu=self.rng.choice(("32", "96")))
            )
        self.scheduler, self.jobs, self.core, self.clock = make_scheduler(
            self.world, policy=policy, seed=seed
        )
        self.core.bind_outcome = lambda ns, name, body: "ok" if self.rng.random() < 0.8 else "500"
        self.feed = Feed(self.world, self.scheduler)
        self.bound: tuple[ClusterState, list[PodRequest]] | None = None
        original = self.scheduler._bind_policy

        def bind_policy(cluster: ClusterState) -> None:  # what the policy was last bound to
            original(cluster)
            self.bound = (cluster, self.scheduler._workload())

        self.scheduler._bind_policy = bind_policy  # type: ignore[method-assign]
        self.feed.relist()
        self.compared = 0
        self.k = 0

    def event(self) -> None:
        """A pod of ours or another scheduler's arrives or goes; a node is cordoned, changes its GPUs,
        goes or comes back."""
        self.k += 1
        r, world = self.rng.random(), self.world
        if r < 0.45:
            gpus = self.rng.choice((0, 1, 1, 2, 4, 8))
            annotations = (
                {GPU_MILLI_ANNOTATION: str(self.rng.choice((200, 500)))}
                if gpus == 1 and self.rng.random() < 0.5
                else {}
            )
            world.put_pod(
                pod_json(f"p{self.k}", gpus, cpu=self.rng.choice(("1", "8", "30")), annotations=annotations)
            )
        elif r < 0.6 and world.nodes:
            name = self.rng.choice(sorted(world.nodes))
            world.put_pod(
                pod_json(f"o{self.k}", self.rng.choice((0, 1)), scheduler="other", node=name, cpu="20")
            )
        elif r < 0.75 and world.pods:
            world.delete_pod(self.rng.choice(sorted(world.pods)))
        elif r < 0.85 and world.nodes:
            name = self.rng.choice(sorted(world.nodes))
            cordoned = self.rng.random() < 0.5
            world.put_node(node_json(name, gpus=self.rng.choice((2, 4, 8)), cpu="64", cordoned=cordoned))
        elif r < 0.89 and len(world.nodes) > 4:
            world.delete_node(self.rng.choice(sorted(world.nodes)))
        else:
            world.put_node(node_json(f"m{self.k}", gpus=self.rng.choice((4, 8))))

    def run(self, events: int) -> None:
        for _ in range(events):
            self.event()
            self.feed.sync()
            while self.scheduler.schedule_next(0):
                self.compare()
            self.jobs.run_all()
            self.feed.sync()
            self.compare()
            self.clock.advance(self.rng.choice((0, 61)))

    def compare(self) -> None:
        scheduler, cache = self.scheduler, self.scheduler.cache
        if self.bound is None or cache.dirty or cache.cluster is not self.bound[0]:
            return  # the next decision rebuilds the view and binds the policy to it
        cluster, workload = self.bound
        fresh = make_policy(scheduler.config.policy, scheduler.config.utilization_weight)
        fresh.bind(cluster, workload, random.Random(0))
        kept = scheduler.policy
        assert kept.tie_break is not None and fresh.tie_break is not None
        for uid, pod in sorted(cache.pods.items()):
            request = scheduler._request(uid, pod)
            if (
                uid in cache.assumed
                or not is_pending_for(pod, "kubegpu")
                or not isinstance(request, PodRequest)
            ):
                continue
            idx, _ = run_filters(request, cluster, DEFAULT_FILTERS, False)
            if not len(idx):
                continue
            sub = np.array(sorted(self.rng.sample(idx.tolist(), max(1, len(idx) // 2))), dtype=np.int64)
            for part in (idx, sub):  # the scheduler's nodes, and the few an extender's verb names
                assert np.array_equal(kept.score(request, cluster, part), fresh.score(request, cluster, part))
                got = kept.tie_break.score(request, cluster, part)
                assert np.array_equal(got, fresh.tie_break.score(request, cluster, part)), request.name
            self.compared += 1


@pytest.mark.parametrize("policy", ["topology", "fgd-reserve"])
def test_live_scheduler_policy_scores_as_a_fresh_one(policy: str) -> None:
    compared = 0
    for seed in range(2):
        watched = Watched(policy, seed)
        watched.run(100)
        assert not watched.world.double_booked()
        compared += watched.compared
    assert compared > 60
