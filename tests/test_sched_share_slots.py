"""``ClusterState.share_view`` (a share's fits, milli and remainders over whole
arrays, kept per share shape and refreshed row by row as nodes change) against each GPU's own rule,
over random walks of everything that changes a cluster.

The spec is ``GpuState.fits_share`` / ``GpuState.share_for`` read from the node states, GPU by GPU.
A seeded walk assumes policy decisions and
random shares, books facts (overbooked GPUs, GPUs the node does not list, shares beyond the free
memory), forgets pods, refuses conflicting assumptions, and rebuilds the cluster as the live scheduler
does (GPUs turning unhealthy, vanishing so the others are re-indexed, appearing, losing their known
memory, changing model or enforcement; every booking replayed). After every step, share shapes drawn
from a fixed pool (so the memo is asked again at the same and at a new generation) are checked on the
current cluster and on the one before the last rebuild, over random node subsets in any order: the
slots, the remainders, the per-node summaries, the GPU filter, and the share policies' scores beside
the same scores computed from slots worked out afresh from the spec. The callers' copies are
scribbled on after every answer, which must not change a later one, and what ``share_view`` hands
out is read-only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import pytest

from scheduler.core.allocate import allocate
from scheduler.core.filters import GpuFit
from scheduler.core.policies import ReserveThenAlign, ShareCompletionScore, make_policy
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import (
    Allocation,
    AllocationConflict,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    ShareSlots,
)

MODELS = ("A100", "H100", "T4")
MEMORIES = (0, 16_384, 40_960, 81_920)


def share_pool() -> list[PodRequest]:
    """Share shapes the walk asks about (a fixed pool: the same shape comes back often)."""
    pool = [
        PodRequest("m250", gpu_count=1, gpu_milli=250),
        PodRequest("m500", gpu_count=1, gpu_milli=500),
        PodRequest("m999", gpu_count=1, gpu_milli=999),
        PodRequest("m1", gpu_count=1, gpu_milli=1),
        PodRequest("m400-a100", gpu_count=1, gpu_milli=400, gpu_models=frozenset({"A100"})),
        PodRequest("m300-mps", gpu_count=1, gpu_milli=300, enforced_share=True),
        PodRequest("mem1", gpu_count=1, gpu_memory_mib=1),
        PodRequest("mem8g", gpu_count=1, gpu_memory_mib=8_192),
        PodRequest("mem20g", gpu_count=1, gpu_memory_mib=20_480),
        PodRequest("mem60g-h100", gpu_count=1, gpu_memory_mib=60_000, gpu_models=frozenset({"H100", "T4"})),
        PodRequest("mem4g-mps", gpu_count=1, gpu_memory_mib=4_096, enforced_share=True),
        PodRequest("both", gpu_count=1, gpu_milli=200, gpu_memory_mib=30_000),
    ]
    # shapes that differ from another in one of the fields share_view reads (the memo must tell
    # them apart), and one that differs only elsewhere (CPU, selector, name)
    pool += [
        PodRequest("m250-h100", gpu_count=1, gpu_milli=250, gpu_models=frozenset({"H100"})),
        PodRequest("m250-mps", gpu_count=1, gpu_milli=250, enforced_share=True),
        PodRequest("mem8g-a100", gpu_count=1, gpu_memory_mib=8_192, gpu_models=frozenset({"A100"})),
        PodRequest("mem8g-mps", gpu_count=1, gpu_memory_mib=8_192, enforced_share=True),
        PodRequest("m250-8g", gpu_count=1, gpu_milli=250, gpu_memory_mib=8_192),
        PodRequest("m250-cpu", cpu_milli=8_000, gpu_count=1, gpu_milli=250, node_selector={"z": "a"}),
    ]
    return pool


@dataclass
class GpuSpec:
    """One GPU as an inventory lists it (what a rebuild starts from)."""

    id: str
    model: str
    memory_mib: int
    healthy: bool = True
    enforced: bool = False


def reference_fits(pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The spec: ``fits_share`` and ``share_for``'s milli of every GPU slot of these nodes."""
    fits = np.zeros((len(idx), cluster.gpu_free.shape[1]), dtype=bool)
    take = np.zeros_like(fits, dtype=np.int64)
    for row, i in enumerate(idx.tolist()):
        for gpu in cluster.nodes[i].gpus:
            fits[row, gpu.index] = gpu.fits_share(pod)
            take[row, gpu.index] = gpu.share_for(pod)[0]
    return fits, take


def reference_remainders(pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
    """The free milli a share leaves per GPU, as a loop over the node states (-1 where it cannot go)."""
    out = np.full((len(idx), cluster.gpu_free.shape[1]), -1, dtype=np.int64)
    for row, i in enumerate(idx.tolist()):
        for g in cluster.nodes[i].gpus:
            if g.fits_share(pod):
                out[row, g.index] = g.free_milli - g.share_for(pod)[0]
    return out


def reference_view(cluster: ClusterState, pod: PodRequest) -> ShareSlots:
    """A ``ShareSlots`` worked out afresh from the spec for every node (nothing kept from before)."""
    idx = cluster.all_indices
    fits, take = reference_fits(pod, cluster, idx)
    return ShareSlots(
        fits, take, reference_remainders(pod, cluster, idx), cluster.version, cluster.generation
    )


@contextmanager
def spec_views() -> Iterator[None]:
    """The GPU filter and the share policies reading the spec's slots instead of ``share_view``'s
    slots kept row by row."""
    real_view = ClusterState.share_view
    ClusterState.share_view = reference_view  # type: ignore[method-assign]
    try:
        yield
    finally:
        ClusterState.share_view = real_view  # type: ignore[method-assign]


class Walk:
    """A seeded random walk over one cluster (replaced by each rebuild)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pool = share_pool()
        self.counter = 0
        self.specs: dict[str, list[GpuSpec]] = {}
        self.cpu: dict[str, int] = {}
        for n in range(self.rng.randint(1, 7)):
            name = f"n{n}"
            self.cpu[name] = self.rng.choice([4_000, 64_000])
            self.specs[name] = [self.new_gpu(name) for _ in range(self.rng.randint(0, 8))]
        self.cluster = self.build()
        self.previous: ClusterState | None = None
        self.policy = make_policy(self.rng.choice(["fgd-reserve", "topology", "bestfit", "fgd"]))
        self.completion = ShareCompletionScore(110)
        self.tie_break = ReserveThenAlign(0.2, None, 10)
        self.bind()
        self.log: list[str] = []

    def new_gpu(self, node: str) -> GpuSpec:
        self.counter += 1
        return GpuSpec(
            f"{node}-g{self.counter}",
            self.rng.choice(MODELS),
            self.rng.choice(MEMORIES),
            healthy=self.rng.random() > 0.15,
            enforced=self.rng.random() < 0.4,
        )

    def build(self) -> ClusterState:
        nodes = []
        for name, gpus in self.specs.items():
            states = [
                GpuState(i, g.id, g.model, g.memory_mib, healthy=g.healthy, share_enforced=g.enforced)
                for i, g in enumerate(gpus)
            ]
            nodes.append(NodeState(name, self.cpu[name], 512_000, states, labels={"z": "a"}))
        return ClusterState(nodes)

    def bind(self) -> None:
        workload = [*self.pool, PodRequest("w1", gpu_count=1), PodRequest("w8", gpu_count=8)]
        rng = random.Random(0)
        self.policy.bind(self.cluster, workload, rng)
        self.completion.bind(self.cluster, workload, rng)
        self.tie_break.bind(self.cluster, workload, rng)

    def uid(self) -> str:
        self.counter += 1
        return f"p{self.counter}"

    def random_pod(self) -> PodRequest:
        if self.rng.random() < 0.7:
            base = self.rng.choice(self.pool)
            return replace(base, name=self.uid(), uid="", cpu_milli=self.rng.choice([0, 0, 1_000, 8_000]))
        cpu = self.rng.choice([0, 1_000])
        return PodRequest(self.uid(), cpu_milli=cpu, gpu_count=self.rng.choice([1, 2, 4]))

    # --- steps ------------------------------------------------------------------------------------

    def step(self) -> None:
        actions = [
            (self.schedule, 8),
            (self.assume_share, 4),
            (self.book_fact, 3),
            (self.refused, 1),
            (self.forget, 4),
            (self.rebuild, 1),
        ]
        fns, weights = zip(*actions, strict=True)
        action = self.rng.choices(fns, weights)[0]
        self.log.append(action.__name__)
        action()

    def schedule(self) -> None:
        pod = self.random_pod()
        result = schedule_one(pod, self.cluster, self.policy, self.rng)
        if isinstance(result, Placement):
            self.cluster.assume(result.allocation)  # raises if the core placed a share without room
            if pod.is_share:
                grant = result.allocation.gpus[0]
                gpu = self.cluster.node(result.node).gpu_by_id[grant.id]
                assert (grant.milli, grant.memory_mib) == gpu.share_for(pod)
        elif pod.is_share and not pod.cpu_milli:
            fits, _ = reference_fits(pod, self.cluster, self.cluster.all_indices)
            assert not fits.any(), f"{pod} refused though a GPU fits it"

    def assume_share(self) -> None:
        """A share on a GPU the spec says fits (as a policy's choice would be)."""
        pod = replace(self.rng.choice(self.pool), name=self.uid(), uid="", cpu_milli=0)
        room = [(n, g.index) for n in self.cluster.nodes for g in n.gpus if g.fits_share(pod)]
        if not room:
            return
        node, index = self.rng.choice(room)
        alloc = allocate(pod, node, index)
        assert alloc is not None and alloc.gpus[0].index == index
        self.cluster.assume(alloc)

    def book_fact(self) -> None:
        """A bound pod's allocation, booked whatever the node's state (it may overbook)."""
        nodes = self.cluster.nodes
        node = self.rng.choice(nodes)
        kind = self.rng.random()
        if kind < 0.15 or not node.gpus:
            grants: tuple[GpuGrant, ...] = (GpuGrant(0, f"{node.name}-gone{self.counter}", 500, 1_000),)
        elif kind < 0.6:
            gpu = self.rng.choice(node.gpus)
            memory = self.rng.choice([0, 1_000, gpu.memory_mib // 2, gpu.memory_mib + 5_000])
            grants = (GpuGrant(gpu.index, gpu.id, self.rng.choice([100, 400, 700, 999]), memory),)
        else:
            picked = self.rng.sample(node.gpus, self.rng.randint(1, len(node.gpus)))
            grants = tuple(GpuGrant(g.index, g.id, MILLI, g.memory_mib) for g in picked)
        tag = "share-gpu" if grants[0].milli < MILLI else f"{len(grants)}-gpu"
        self.cluster.book(Allocation(node.name, self.uid(), gpus=grants, gpu_tag=tag))

    def refused(self) -> None:
        """Assumptions the cluster refuses change nothing (not even half of it)."""
        node = self.rng.choice(self.cluster.nodes)
        full = [g for g in node.gpus if g.free_milli < 100 or not g.healthy]
        grants = (GpuGrant(full[0].index, full[0].id, 100, 0),) if full else (GpuGrant(0, "nope", 100, 0),)
        with pytest.raises(AllocationConflict):
            self.cluster.assume(Allocation(node.name, self.uid(), gpus=grants))
        with pytest.raises(AllocationConflict):
            self.cluster.book(Allocation("no-such-node", self.uid(), gpus=grants))

    def forget(self) -> None:
        if self.cluster.where:
            self.cluster.forget(self.rng.choice(sorted(self.cluster.where)))

    def rebuild(self) -> None:
        """The live scheduler's rebuild: a fresh cluster from changed inventories, bookings replayed."""
        for name, gpus in self.specs.items():
            change = self.rng.random()
            if change < 0.2 and gpus:
                gpus.pop(self.rng.randrange(len(gpus)))  # vanished: the GPUs after it move down
            elif change < 0.35 and len(gpus) < 8:
                gpus.insert(self.rng.randint(0, len(gpus)), self.new_gpu(name))
            for gpu in gpus:
                if self.rng.random() < 0.15:
                    gpu.healthy = not gpu.healthy
                if self.rng.random() < 0.05:
                    gpu.memory_mib = self.rng.choice(MEMORIES)
                if self.rng.random() < 0.05:
                    gpu.enforced = not gpu.enforced
                if self.rng.random() < 0.05:
                    gpu.model = self.rng.choice(MODELS)
        allocations = [a for n in self.cluster.nodes for a in n.allocations.values()]
        self.rng.shuffle(allocations)
        self.previous = self.cluster
        self.cluster = self.build()
        for alloc in allocations:
            self.cluster.book(alloc)
        self.bind()

    # --- checks -----------------------------------------------------------------------------------

    def random_idx(self, cluster: ClusterState) -> np.ndarray:
        n = len(cluster)
        pick = self.rng.random()
        if pick < 0.4:
            return cluster.all_indices
        if pick < 0.8:
            return np.array(sorted(self.rng.sample(range(n), self.rng.randint(0, n))), dtype=np.int64)
        return np.array([self.rng.randrange(n) for _ in range(self.rng.randint(0, 2 * n))], dtype=np.int64)

    def check(self) -> None:
        clusters = [self.cluster] if self.previous is None else [self.cluster, self.previous]
        for _ in range(6):
            cluster = self.rng.choice(clusters)
            pod = self.rng.choice(self.pool)
            idx = self.random_idx(cluster)
            self.check_pod(pod, cluster, idx)

    def check_pod(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> None:
        where = (pod.name, [cluster.nodes[i] for i in idx.tolist()])
        want_fits, want_take = reference_fits(pod, cluster, idx)
        view = cluster.share_view(pod)
        fits = view.fits[idx]  # fancy indexing: the caller's own copies
        milli = view.milli if isinstance(view.milli, int) else view.milli[idx]
        assert fits.shape == want_fits.shape and (fits == want_fits).all(), where
        take = np.broadcast_to(milli, fits.shape)
        assert (take[want_fits] == want_take[want_fits]).all(), where
        left = view.left[idx]
        assert (left == reference_remainders(pod, cluster, idx)).all(), where
        assert (GpuFit().keep(pod, cluster, idx) == want_fits.any(axis=1)).all(), where
        spec_left = reference_remainders(pod, cluster, cluster.all_indices)
        least = np.where(spec_left >= 0, spec_left, MILLI + 1).min(axis=1)
        assert (view.least_left == least).all(), where
        waste = np.where(spec_left >= 0, self.tie_break.waste[np.clip(spec_left, 0, MILLI)], MILLI + 1).min(
            axis=1
        )
        assert (view.least_mapped(self.tie_break.waste, MILLI + 1) == waste).all(), where
        if len(idx):
            got = (self.completion.score(pod, cluster, idx), self.tie_break.score(pod, cluster, idx))
            with spec_views():
                want = (self.completion.score(pod, cluster, idx), self.tie_break.score(pod, cluster, idx))
            assert (got[0] == want[0]).all() and (got[1] == want[1]).all(), where
        # the callers own what they were given: scribbling on it changes no later answer
        fits[...] = ~fits
        left[...] = 7
        if isinstance(milli, np.ndarray):
            milli[...] = 1
        again = cluster.share_view(pod).fits[idx]
        assert (again == want_fits).all(), where
        # what share_view hands out is read-only: no caller can change the next pod's answer
        for array in (
            view.fits,
            view.left,
            view.least_left,
            view.least_mapped(self.tie_break.waste, MILLI + 1),
        ):
            with pytest.raises(ValueError, match="read-only"):
                array[...] = 0


def run_walk(seed: int, steps: int) -> Walk:
    walk = Walk(seed)
    for index in range(steps):
        try:
            walk.step()
            walk.check()
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, step {index} ({walk.log[-6:]}): {error}") from error
    return walk


@pytest.mark.parametrize("seed", range(12))
def test_share_slots_follow_every_change_of_the_cluster(seed: int) -> None:
    walk = run_walk(seed, 150)
    assert walk.cluster.where or walk.log.count("forget") > 0  # the walk did place and release pods


def test_the_walk_reaches_every_kind_of_step_and_overbooks() -> None:
    walk = Walk(99)
    overbooked = missing = False
    for _ in range(400):
        walk.step()
        walk.check()
        gpus = [g for n in walk.cluster.nodes for g in n.gpus]
        overbooked |= any(g.free_milli < 0 or (g.memory_mib and g.free_memory_mib < 0) for g in gpus)
        missing |= any(n.missing_gpus(a) for n in walk.cluster.nodes for a in n.allocations.values())
    assert {"schedule", "assume_share", "book_fact", "refused", "forget", "rebuild"} <= set(walk.log)
    assert overbooked and missing


def test_the_walk_notices_a_row_kept_past_its_nodes_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: with a node's ``version`` left as it was by its change (so ``share_view``
    keeps the row it worked out before), it finds a wrong fit or score."""
    sync = ClusterState._sync

    def sync_keeping_version(self: ClusterState, i: int) -> None:
        version = int(self.version[i])
        sync(self, i)
        self.version[i] = version

    monkeypatch.setattr(ClusterState, "_sync", sync_keeping_version)
    with pytest.raises(AssertionError):
        for seed in range(12):
            run_walk(seed, 150)


def test_the_walk_notices_a_summary_kept_past_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: with ``least_mapped`` refreshing none of its rows after the first answer,
    it finds a wrong tie-break."""
    real = ShareSlots.update

    def update_forgetting_summaries(self: ShareSlots, *args: object) -> None:
        real(self, *args)  # type: ignore[arg-type]
        for _, _, seen, _ in self._mapped.values():
            seen[:] = self.seen

    monkeypatch.setattr(ShareSlots, "update", update_forgetting_summaries)
    with pytest.raises(AssertionError):
        for seed in range(12):
            run_walk(seed, 150)


def test_share_shapes_beyond_the_limit_are_worked_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for two shapes, a third evicts the oldest; asked again, it is worked out afresh."""
    from scheduler.core import state

    monkeypatch.setattr(state, "MAX_SHARE_SHAPES", 2)
    walk = Walk(3)
    shapes = walk.pool[:3]
    views = [walk.cluster.share_view(pod) for pod in shapes]
    assert len(walk.cluster._share_views) == 2
    assert walk.cluster.share_view(shapes[2]) is views[2]
    again = walk.cluster.share_view(shapes[0])
    assert again is not views[0]
    idx = walk.cluster.all_indices
    assert (again.fits == reference_fits(shapes[0], walk.cluster, idx)[0]).all()


def test_the_walk_notices_an_answer_kept_past_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: with ``generation`` left as it was by every change (so ``share_view``
    answers for a cluster state that is gone), it finds a wrong fit."""
    sync = ClusterState._sync

    def sync_keeping_generation(self: ClusterState, i: int) -> None:
        generation = self.generation
        sync(self, i)
        self.generation = generation

    monkeypatch.setattr(ClusterState, "_sync", sync_keeping_generation)
    with pytest.raises(AssertionError):
        for seed in range(12):
            run_walk(seed, 150)
