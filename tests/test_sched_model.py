"""Model-based randomized test of the live scheduler's cache (issue 9, "How to prove it").

A seeded random walk over everything that can happen to a scheduler: pods created (whole GPUs,
shares, init-container GPUs, priorities), pods of other schedulers bound with GPU counts, pods
deleted; Binding answers (ok, 409, 5xx before or after the store, timeouts, lost connections,
403/429); watch events delivered late, in any interleaving of the two resources, or lost and
repaired by a relist; GPUs that vanish, come back or turn unhealthy; allocatable CPU and pods
that change; cordons and malformed inventories; read-backs that fail; scheduler restarts; and a
second replica taking over as leader while the first one's Bindings are still in flight.

After every step:
- no device is held by live pods' allocations beyond its capacity (the apiserver's truth);
- the leader's view books every device a live pod holds (so it can never hand one out again);
- no assumption without a pod, no booking without a pod or an assumption, the core's arrays
  match its node states (a share's fits from ``ClusterState.share_view`` included);
and at every settle point (API healthy, everything delivered, time passed) nothing is left
assumed and the leader's bookings equal what the bound pods' annotations say.

CI runs ``SEEDS`` x ``STEPS`` (a few thousand steps); ``make soak-scheduler`` sets
``KUBEGPU_SOAK_SEEDS`` / ``KUBEGPU_SOAK_STEPS`` for a long run.
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from crishim.advertiser import INVENTORY_ANNOTATION
from kubegpu import allocation as contract
from scheduler.core.constraints import pod_facts
from scheduler.core.request import MILLI, PodRequest
from scheduler.live.cache import is_bound
from scheduler.live.config import LeaderElection
from scheduler.live.scheduler import Scheduler
from tests.support.schedworld import (
    GPU_MEMORY_MIB,
    KEYS,
    Clock,
    FakeCore,
    Feed,
    Jobs,
    World,
    gpu_id,
    make_scheduler,
    node_json,
    pod_json,
)

SEEDS = int(os.environ.get("KUBEGPU_SOAK_SEEDS", "20"))
STEPS = int(os.environ.get("KUBEGPU_SOAK_STEPS", "500"))
FIRST_SEED = int(os.environ.get("KUBEGPU_SOAK_FIRST_SEED", "0"))

# share shapes whose fits the checks compare with each GPU's rule (the walk's own shares are 400 milli)
SHARE_SHAPES = (
    PodRequest("s400", gpu_count=1, gpu_milli=400),
    PodRequest("s-mem", gpu_count=1, gpu_memory_mib=GPU_MEMORY_MIB // 3),
)

BIND_OUTCOMES = [
    ("ok", 60),
    ("409", 3),
    ("500", 5),
    ("500-after-commit", 8),
    ("504-after-commit", 3),
    ("timeout-after-commit", 6),
    ("timeout", 5),
    ("connection", 5),
    ("403", 3),
    ("429", 2),
]


@dataclass
class Replica:
    scheduler: Scheduler
    jobs: Jobs
    core: FakeCore
    feed: Feed


@dataclass
class NodeModel:
    name: str
    gpus: list[tuple[str, bool]]  # listed GPUs (id, healthy), index order
    all_ids: list[str]
    cpu: str = "64"
    pods: str | None = "110"
    cordoned: bool = False
    malformed: bool = False

    def json(self) -> dict[str, Any]:
        node = node_json(self.name, list(self.gpus), cpu=self.cpu, pods=self.pods, cordoned=self.cordoned)
        if self.malformed:
            node["metadata"]["annotations"][INVENTORY_ANNOTATION] = "null"
        return node


@dataclass
class Model:
    seed: int
    rng: random.Random = field(init=False)
    world: World = field(default_factory=World)
    clock: Clock = field(default_factory=Clock)
    nodes: dict[str, NodeModel] = field(default_factory=dict)
    leader: Replica | None = None
    standby: Replica | None = None
    retiring: list[Jobs] = field(default_factory=list)  # a former leader's binder jobs still in flight
    fence_until: float = 0.0
    flaky_reads: bool = False
    counter: int = 0
    log: list[str] = field(default_factory=list)
    verified: dict[str, contract.Allocation] = field(default_factory=dict)
    outcomes: set[str] = field(default_factory=set)
    binds: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for index in range(self.rng.randint(2, 4)):
            name = f"n{index}"
            ids = [gpu_id(name, i) for i in range(self.rng.choice([2, 4, 8]))]
            self.nodes[name] = NodeModel(name, [(g, True) for g in ids], list(ids))
            self.world.put_node(self.nodes[name].json())
        self.leader = self.new_replica(leading=True)
        self.standby = self.new_replica(leading=False)

    # --- replicas ---------------------------------------------------------------------------

    def new_replica(self, leading: bool) -> Replica:
        overrides: dict[str, Any] = {"policy": self.rng.choice(["bestfit", "topology", "spread"])}
        if not leading:
            overrides["leader_election"] = LeaderElection(enabled=True)
        scheduler, jobs, core, _ = make_scheduler(self.world, clock=self.clock, seed=self.seed, **overrides)
        core.bind_outcome = self.bind_outcome
        core.read_error = self.read_error
        if not leading:
            scheduler.leading.clear()
        replica = Replica(scheduler, jobs, core, Feed(self.world, scheduler))
        replica.feed.relist()
        return replica

    def bind_outcome(self, namespace: str, name: str, body: dict[str, Any]) -> str:
        names, weights = zip(*BIND_OUTCOMES, strict=True)
        outcome = self.rng.choices(names, weights)[0]
        self.outcomes.add(outcome)
        self.binds += 1
        return outcome

    def read_error(self) -> Exception:
        raise ConnectionResetError("read back failed")

    # --- steps --------------------------------------------------------------------------------

    def step(self) -> None:
        actions = [
            (self.create_pod, 14),
            (self.create_foreign_pod, 2),
            (self.delete_pod, 11),
            (self.relabel_pod, 4),
            (self.terminate_pod, 2),
            (self.decide, 20),
            (self.run_job, 22),
            (self.deliver, 18),
            (self.relist, 3),
            (self.change_gpus, 4),
            (self.change_allocatable, 2),
            (self.toggle_node, 2),
            (self.advance, 8),
            (self.toggle_flaky_reads, 2),
            (self.restart, 1),
            (self.hand_over, 1),
        ]
        fns, weights = zip(*actions, strict=True)
        action = self.rng.choices(fns, weights)[0]
        self.log.append(action.__name__)
        action()

    def created(self) -> str:
        """A creation time that depends on the walk alone (pods are created in this order)."""
        return f"2026-01-01T{self.counter // 3600:02d}:{self.counter // 60 % 60:02d}:{self.counter % 60:02d}Z"

    def create_pod(self) -> None:
        self.counter += 1
        name = f"p{self.counter}"
        created = self.created()
        kind = self.rng.choice(["cpu", "whole", "whole", "whole", "share", "init"])
        cpu = self.rng.choice(["100m", "500m", "2", "8"])
        priority = self.rng.choice([None, 0, 100])
        if kind == "share":
            milli = {"kubegpu.io/gpu-milli": "400"}
            pod = pod_json(name, cpu=cpu, priority=priority, annotations=milli, created=created)
        elif kind == "init":
            init = [{"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
            pod = pod_json(name, 1, cpu=cpu, priority=priority, init=init, created=created)
        else:
            gpus = 0 if kind == "cpu" else self.rng.choice([1, 1, 2, 4])
            pod = pod_json(name, gpus, cpu=cpu, priority=priority, created=created)
        self.world.put_pod(pod)

    def create_foreign_pod(self) -> None:
        self.counter += 1
        node = self.rng.choice(list(self.nodes))
        gpus = self.rng.choice([0, 1, 2])
        created = self.created()
        name = f"f{self.counter}"
        pod = pod_json(name, gpus, cpu="1", scheduler="default-scheduler", node=node, created=created)
        self.world.put_pod(pod)

    def delete_pod(self) -> None:
        """Mostly bound pods (they free devices); sometimes one still waiting."""
        bound = sorted(u for u, p in self.world.pods.items() if is_bound(p))
        pending = sorted(u for u, p in self.world.pods.items() if not is_bound(p))
        choices = bound if bound and (not pending or self.rng.random() < 0.8) else pending
        if choices:
            self.world.delete_pod(self.rng.choice(choices))

    def relabel_pod(self) -> None:
        """Labels change on a pod, bound or waiting (placement rules read them)."""
        if self.world.pods:
            pod = copy.deepcopy(self.world.pods[self.rng.choice(sorted(self.world.pods))])
            labels = {"app": self.rng.choice(["a", "b"])} if self.rng.random() < 0.8 else {}
            pod["metadata"]["labels"] = labels
            self.world.put_pod(pod)

    def terminate_pod(self) -> None:
        """A bound pod starts terminating: it holds its devices until it is gone."""
        bound = sorted(u for u, p in self.world.pods.items() if is_bound(p))
        if bound:
            pod = copy.deepcopy(self.world.pods[self.rng.choice(bound)])
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self.world.put_pod(pod)

    def decide(self) -> None:
        assert self.leader is not None
        for _ in range(self.rng.randint(1, 3)):
            self.leader.scheduler.schedule_next(0)
            self.check_view_covers_world()

    def run_job(self) -> None:
        queues = [r.jobs for r in (self.leader, self.standby) if r is not None] + self.retiring
        queues = [q for q in queues if q.pending]
        if not queues:
            return
        jobs = self.rng.choice(queues)
        jobs.run(self.rng.randrange(len(jobs.pending)))
        self.retiring = [q for q in self.retiring if q.pending]
        assert not jobs.errors, jobs.errors

    def deliver(self) -> None:
        for replica in (self.leader, self.standby):
            if replica is not None and self.rng.random() < 0.8:
                resource = self.rng.choice(["nodes", "pods", "pods"])
                replica.feed.sync(resource, limit=self.rng.randint(1, 6))

    def relist(self) -> None:
        replica = self.rng.choice([r for r in (self.leader, self.standby) if r is not None])
        resource = self.rng.choice(["nodes", "pods"])
        replica.feed.skip(resource)  # the watch broke: what it would have said is lost
        replica.feed.relist(resource)

    def change_gpus(self) -> None:
        """A GPU vanishes, comes back or flips health (breakage heals more often than it happens)."""
        node = self.nodes[self.rng.choice(list(self.nodes))]
        listed = [g for g, _ in node.gpus]
        missing = [g for g in node.all_ids if g not in listed]
        sick = [i for i, (_, healthy) in enumerate(node.gpus) if not healthy]
        choice = self.rng.random()
        if missing and choice < 0.45:
            back = self.rng.choice(missing)
            health = dict(node.gpus)
            health[back] = True
            node.gpus = [(g, health[g]) for g in node.all_ids if g in health]
        elif sick and choice < 0.8:
            index = self.rng.choice(sick)
            node.gpus[index] = (node.gpus[index][0], True)
        elif listed and choice < 0.9:
            gone = self.rng.choice(listed)
            node.gpus = [(g, h) for g, h in node.gpus if g != gone]
        elif node.gpus:
            index = self.rng.randrange(len(node.gpus))
            node.gpus[index] = (node.gpus[index][0], False)
        self.world.put_node(node.json())

    def change_allocatable(self) -> None:
        node = self.nodes[self.rng.choice(list(self.nodes))]
        node.cpu = self.rng.choice(["2", "8", "64", "64"])
        node.pods = self.rng.choice([None, "3", "110", "110"])
        self.world.put_node(node.json())

    def toggle_node(self) -> None:
        """Cordon or break a node's inventory, or (more often) undo that."""
        broken = [n for n in self.nodes.values() if n.cordoned or n.malformed]
        if broken and self.rng.random() < 0.7:
            node = self.rng.choice(broken)
            node.cordoned = node.malformed = False
        else:
            node = self.nodes[self.rng.choice(list(self.nodes))]
            if self.rng.random() < 0.5:
                node.cordoned = True
            else:
                node.malformed = True
        self.world.put_node(node.json())

    def advance(self) -> None:
        seconds = self.rng.choice([0.5, 1, 3, 10, 40])
        if self.retiring and self.clock.now + seconds >= self.fence_until:
            # The protocol's premise: a former leader's Bindings land or die within the fence.
            for jobs in self.retiring:
                while jobs.pending:
                    jobs.run(self.rng.randrange(len(jobs.pending)))
            self.retiring = []
        self.clock.advance(seconds)

    def toggle_flaky_reads(self) -> None:
        self.flaky_reads = not self.flaky_reads
        for replica in (self.leader, self.standby):
            if replica is not None:
                replica.core.read_error = self.read_error if self.flaky_reads else None

    def restart(self) -> None:
        """The leader's process dies: each in-flight Binding was sent (and lands) or not. Its
        replacement elects itself leader (so it fences: a former leader may still be binding)."""
        assert self.leader is not None
        for fn, args in self.leader.jobs.pending:
            if getattr(fn, "__name__", "") == "_bind" and self.rng.random() < 0.5:
                fn(*args)  # sent before the process died
        self.leader.jobs.pending.clear()
        self.leader = self.new_replica(leading=False)
        self.leader.scheduler.became_leader()
        self.fence_until = self.clock.now + self.leader.scheduler.config.bind_timeout_seconds

    def hand_over(self) -> None:
        """The leader loses its lease; the standby takes over; a fresh standby starts."""
        assert self.leader is not None and self.standby is not None
        old = self.leader
        old.scheduler.leading.clear()  # it stops deciding; its Bindings in flight go on
        self.retiring.append(old.jobs)
        self.leader, self.standby = self.standby, None
        self.leader.scheduler.became_leader()
        self.fence_until = self.clock.now + self.leader.scheduler.config.bind_timeout_seconds
        self.standby = self.new_replica(leading=False)

    # --- invariants ---------------------------------------------------------------------------

    def world_holdings(self) -> dict[str, dict[str, int]]:
        """node -> device -> milli held by live pods' verified allocations."""
        held: dict[str, dict[str, int]] = {}
        for pod in self.world.pods.values():
            raw = pod["metadata"]["annotations"].get(contract.ANNOTATION)
            if not raw or not is_bound(pod):
                continue
            allocation = self.verified.get(raw)
            if allocation is None:
                allocation = self.verified[raw] = contract.verify(raw, KEYS)
            per_pod: dict[str, int] = {}
            for entry in allocation.containers.values():
                for device in entry.devices:
                    share = entry.shares.get(device)
                    milli = MILLI if share is None else share.milli
                    per_pod[device] = MILLI if entry.init or share is None else min(
                        MILLI, per_pod.get(device, 0) + milli
                    )
            node = held.setdefault(allocation.node, {})
            for device, milli in per_pod.items():
                node[device] = node.get(device, 0) + milli
        return held

    def check(self) -> None:
        over = {
            (n, d): m for n, devices in self.world_holdings().items() for d, m in devices.items() if m > MILLI
        }
        assert not over, f"devices held beyond capacity: {over}"
        for replica in (self.leader, self.standby):
            if replica is None:
                continue
            cache = replica.scheduler.cache
            assert not cache.check_consistency(), cache.check_consistency()
            # deciding never raised (the loop survives it, logging pod.decide_failed) and never
            # produced an allocation its own view refused
            assert replica.scheduler.metrics.attempts.labels("error")._value.get() == 0
            cluster = cache.cluster
            if cluster is not None and not cache.dirty:
                for i, node in enumerate(cluster.nodes):
                    for gpu in node.gpus:
                        booked = sum(
                            g.milli for a in node.allocations.values() for g in a.gpus if g.id == gpu.id
                        )
                        assert gpu.free_milli == MILLI - booked, (node.name, gpu.id)
                    assert cluster.cpu_free[i] == node.cpu_free
                    assert set(node.allocations) == {u for u, j in cluster.where.items() if j == i}
                for shape in SHARE_SHAPES:  # the memoised whole-array share rule, as each GPU says
                    fits = cluster.share_view(shape).fits
                    for i, node in enumerate(cluster.nodes):
                        for gpu in node.gpus:
                            assert bool(fits[i, gpu.index]) == gpu.fits_share(shape), (shape, node, gpu)
                self.check_placement(cache)

    @staticmethod
    def check_placement(cache: Any) -> None:
        """The placement view (kept up to date event by event) says of every pod what the pod
        as last seen says: its labels, namespace, whether it is terminating; and every bound pod
        or being bound to a node of the view is in it, and no other pod is."""
        view = cache.cluster.placement
        assert view is not None
        for uid, facts in view.index.facts.items():
            pod = cache.pods.get(uid)
            assert pod is not None, f"placement view holds a pod the cache does not know: {uid}"
            assert uid in cache.assumed or is_bound(pod), f"placement view holds a pod not placed: {uid}"
            seen = pod_facts(pod)
            assert (facts.namespace, dict(facts.labels), facts.terminating) == (
                seen.namespace,
                dict(seen.labels),
                seen.terminating,
            ), (uid, facts, seen)
        for uid, pod in cache.pods.items():
            if is_bound(pod) and pod["spec"]["nodeName"] in view.row:
                assert uid in view.index.facts, f"bound pod missing from the placement view: {uid}"
        for uid, assumed in cache.assumed.items():
            if assumed.alloc.node in view.row:
                assert uid in view.index.facts, f"assumed pod missing from the placement view: {uid}"

    def check_view_covers_world(self) -> None:
        """Right after a decision, the leader's view holds every device a live pod holds."""
        assert self.leader is not None
        scheduler = self.leader.scheduler
        cache = scheduler.cache
        if scheduler._fence is not None or self.retiring or cache.dirty or cache.cluster is None:
            return
        cluster = cache.cluster
        for node_name, devices in self.world_holdings().items():
            if node_name not in cluster.index:
                continue
            node = cluster.node(node_name)
            for device, milli in devices.items():
                gpu = node.gpu_by_id.get(device)
                if gpu is None:
                    continue  # not listed now: nobody can be given it
                assert MILLI - gpu.free_milli >= milli, (
                    f"{node_name}/{device}: live pods hold {milli}, the leader books {MILLI - gpu.free_milli}"
                )

    def settle(self) -> None:
        """Healthy API, everything delivered, time passing: nothing may stay assumed."""
        assert self.leader is not None
        self.flaky_reads = True
        self.toggle_flaky_reads()  # reads work again
        for jobs in self.retiring:
            jobs.run_all()
        self.retiring = []
        for _ in range(40):
            self.clock.advance(15)
            for replica in (self.leader, self.standby):
                if replica is None:
                    continue
                replica.feed.sync()
                while replica is self.leader and replica.scheduler.schedule_next(0):
                    self.check_view_covers_world()
                replica.jobs.run_all()
                replica.feed.sync()
            if not self.leader.scheduler.cache.assumed and not self.leader.jobs.pending:
                break
        self.check()
        scheduler = self.leader.scheduler
        assert not scheduler.cache.assumed, f"forever assumed: {list(scheduler.cache.assumed)}"
        cluster = scheduler.cache.view()
        truth = self.world_holdings()
        for node in cluster.nodes:
            booked: dict[str, int] = {}
            for alloc in node.allocations.values():
                for grant in alloc.gpus:
                    if grant.id in node.gpu_by_id:
                        booked[grant.id] = booked.get(grant.id, 0) + grant.milli
            held = {d: m for d, m in truth.get(node.name, {}).items() if d in node.gpu_by_id}
            assert booked == held, (node.name, booked, held)


def run_model(seed: int, steps: int) -> Model:
    model = Model(seed)
    for index in range(steps):
        try:
            model.step()
            model.check()
            if index % 100 == 99:
                model.settle()
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, step {index} ({model.log[-8:]}): {error}") from error
    model.settle()
    return model


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_random_interleavings_never_double_book(seed: int) -> None:
    model = run_model(seed, STEPS)
    assert model.binds > 0  # the walk did bind pods (test_the_walk_reaches... checks how much)


def test_the_walk_reaches_every_kind_of_step() -> None:
    model = run_model(1000, 600)
    kinds = set(model.log)
    assert {"hand_over", "restart", "relist", "change_gpus", "run_job", "deliver"} <= kinds, kinds
    assert {"relabel_pod", "terminate_pod"} <= kinds, kinds
    assert {"ok", "500", "500-after-commit", "timeout-after-commit", "connection"} <= model.outcomes
    assert model.binds >= 30, model.binds


def test_copy_of_world_is_independent() -> None:
    """The model's checks read the world; the scheduler must never share its objects."""
    world = World()
    world.put_pod(pod_json("a"))
    snapshot = copy.deepcopy(world.pods)
    scheduler, _jobs, _core, _clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    scheduler.cache.pods["uid-a"]["spec"]["nodeName"] = "mutated"
    assert world.pods == snapshot
