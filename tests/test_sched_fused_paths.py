"""The fused and per-state paths behind fgd-reserve's speed decide what the straightforward code decides.

Issue 26 (the default at most 1.3x FGD's run time) replaced per-pod vector passes by values kept per
node state and by one int key per tied node; each is checked here against the plain computation on
random clusters that change between looks (placements, releases, CPU booked past capacity):

- ``round_like_numpy`` and ``aligned_band`` (Python) against ``np.round`` and the vector cosine, to
  the last bit;
- ``AlignmentScore.aligned`` (kept per node state and request) against the vector formula;
- ``ReserveThenAlign.pick_tied`` (one int key: model balance, penalty, share remainder, alignment,
  node order as digits) against ``schedule.pick`` over ``score``, every digit and the fallback for
  bands below 0 exercised;
- ``ShareCompletionScore`` and the share remainders kept per GPU state (``GpuStateValues``), and the
  completion's GPU choice from ``gpu_rows``, against ``ClusterState.share_view`` and the GPU loop;
- ``ShareSlots.update_row`` (a few changed rows in Python) against a view worked out afresh;
- ``Policy.best_scores`` (later plugins scored only where the first can still reach the best) and
  ``schedule_one`` against the full ``Policy.score`` then ``pick``, a plugin breaking its bounds
  included.

A walk that would let a wrong path through is shown to fail (``test_the_walk_notices_...``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from scheduler.core import policies
from scheduler.core.filters import run_filters
from scheduler.core.policies import (
    AlignmentScore,
    FGDScore,
    ReserveThenAlign,
    ShareCompletionScore,
    aligned_band,
    make_policy,
    node_side,
    round_like_numpy,
)
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.schedule import Placement, pick, schedule_one
from scheduler.core.scoring import Policy, ScorePlugin
from scheduler.core.state import Allocation, ClusterState, GpuGrant, GpuState, NodeState, ShareSlots

WORKLOAD = [
    PodRequest("whole", cpu_milli=8000, memory_mib=1000, gpu_count=8),
    PodRequest("whole-big", cpu_milli=60_000, memory_mib=1000, gpu_count=8),
    *[PodRequest(f"s{i}", cpu_milli=2000, gpu_count=1, gpu_milli=(300, 500, 250)[i % 3]) for i in range(24)],
    *[PodRequest(f"g{i}", cpu_milli=4000, gpu_count=2) for i in range(10)],
    *[PodRequest(f"c{i}", cpu_milli=16_000) for i in range(6)],
]
PODS = [
    PodRequest("share", cpu_milli=2000, gpu_count=1, gpu_milli=300),
    PodRequest("share-half", cpu_milli=1000, gpu_count=1, gpu_milli=500),
    PodRequest("share-big", cpu_milli=1000, gpu_count=1, gpu_milli=900),
    PodRequest("share-A", cpu_milli=1000, gpu_count=1, gpu_milli=250, gpu_models=frozenset({"A"})),
    PodRequest("one", cpu_milli=8000, gpu_count=1),
    PodRequest("one-B", cpu_milli=8000, gpu_count=1, gpu_models=frozenset({"B"})),
    PodRequest("four", cpu_milli=30_000, memory_mib=2048, gpu_count=4),
    PodRequest("cpu", cpu_milli=16_000),
    PodRequest("cpu-heavy", cpu_milli=90_000),
]


def cluster_of(n: int, rng: random.Random) -> ClusterState:
    """``n`` nodes of 0, 2, 4 or 8 GPUs of model A or B (no GPU memory known: shares by milli are
    plain), various CPU."""
    nodes = []
    for i in range(n):
        gpus = rng.choice((0, 2, 4, 8, 8, 8))
        model = rng.choice("AAB")
        cpu = rng.choice((32_000, 64_000, 96_000, 128_000))
        nodes.append(
            NodeState(f"n{i}", cpu, 512_000, [GpuState(g, f"n{i}-g{g}", model) for g in range(gpus)])
        )
    return ClusterState(nodes)


def random_change(cluster: ClusterState, rng: random.Random, k: int) -> None:
    """A random pod booked on a random node (whole GPUs, a share or CPU only; CPU may go past
    capacity), or one booked before released."""
    if cluster.where and rng.random() < 0.3:
        cluster.forget(rng.choice(sorted(cluster.where)))
        return
    i = rng.randrange(len(cluster))
    node = cluster.nodes[i]
    free = [g for g in node.gpus if g.free_milli == MILLI]
    grants: tuple[GpuGrant, ...] = ()
    if free and rng.random() < 0.5:
        grants = tuple(GpuGrant(g.index, g.id) for g in free[: rng.randint(1, len(free))])
    elif node.gpus and rng.random() < 0.6:
        g = rng.choice(node.gpus)
        if g.free_milli >= 50:
            grants = (GpuGrant(g.index, g.id, rng.randrange(50, g.free_milli + 1, 50)),)
    cpu = rng.choice((0, 1000, 8000, 40_000, 100_000 if rng.random() < 0.1 else 0))
    cluster.book(Allocation(node.name, f"p{k}", cpu_milli=cpu, memory_mib=rng.choice((0, 4096)), gpus=grants))


def reference_balance(balance: policies.ModelBalance, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
    """``ModelBalance.bands`` (for a pod it applies to) worked out as the vector code did before the
    free GPU milli per model set was kept (``ModelFree``): a sum over every node."""
    weights = cluster.gpu_free_total.astype(float)
    free = np.bincount(balance.codes, weights=weights, minlength=len(balance.sets))
    share = np.divide(free, balance.capacity, out=np.ones_like(free), where=balance.capacity > 0)
    share = np.where(balance.restricted, share, 1.0)
    return np.floor(share[balance.codes[idx]] / balance.band)


def reference_aligned(pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float) -> np.ndarray:
    """``AlignmentScore.aligned`` worked out as the vector code did before it was kept per state."""
    return plain_aligned(pod, cluster, idx, step, 6)


def bits(values: np.ndarray) -> list[str]:
    return [float(v).hex() for v in values]


def test_rounding_is_numpys_to_the_last_bit() -> None:
    rng = random.Random(3)
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5e-6, -2.5e-6, 1e-7, -1e-7, 0.9999995, -0.4e-6]
    for _ in range(20_000):
        decimals = rng.choice((0, 1, 3, 6, 9))
        values.append((rng.randrange(-(10**7), 10**7) + 0.5) / 10**decimals)  # halves, then not exact
        values.append(rng.uniform(-1, 1))
        values.append(rng.randrange(-(10**6), 10**6) / 10**6 + rng.choice((0.0, 1e-13, -1e-13, 5e-7)))
    for x in values:
        for decimals in (0, 1, 3, 6, 9):
            rounded, whole = round_like_numpy(x, decimals)
            assert rounded.hex() == float(np.round(np.array([x]), decimals)[0]).hex(), (x, decimals)
            assert whole == int(np.rint(x * 10.0**decimals))


@pytest.mark.parametrize("step", [0.0, 0.2, 0.15])
def test_aligned_band_is_the_vector_cosine_to_the_last_bit(step: float) -> None:
    """Per node (CPU past capacity, no GPUs, idle and full nodes included) and request, the value and
    the int (its band, or the cosine in millionths) against the vector formula."""
    rng = random.Random(11)
    cluster = cluster_of(60, rng)
    for k in range(600):
        random_change(cluster, rng, k)
    assert (cluster.cpu_free < 0).any() and (cluster.gpu_count == 0).any()
    idx = cluster.all_indices
    for cpu, gpu in ((2000, 300), (8000, MILLI), (16_000, 0), (0, 4 * MILLI), (0, 0), (90_000, 250)):
        pod = PodRequest("p", cpu_milli=cpu, gpu_count=1 if gpu else 0, gpu_milli=gpu if gpu < MILLI else 0)
        if gpu >= MILLI:
            pod = PodRequest("p", cpu_milli=cpu, gpu_count=gpu // MILLI)
        want = reference_aligned(pod, cluster, idx, step)
        got = []
        for i in idx.tolist():
            state = (
                cluster.cpu_capacity.item(i),
                cluster.gpu_count.item(i),
                cluster.cpu_free.item(i),
                cluster.gpu_free_total.item(i),
            )
            value, whole = aligned_band(node_side(state), pod.cpu_milli, pod.total_gpu_milli, step, 6)
            got.append(value)
            assert whole == (int(value) if step > 0 else round(value * 1e6))
        assert bits(np.array(got)) == bits(want)


def tied_subsets(
    cluster: ClusterState, rng: random.Random, steps: int, observe: Callable[[PodRequest], None]
) -> Iterator[tuple[int, PodRequest, np.ndarray, np.ndarray]]:
    """A random walk's (step, pod, its feasible nodes, nodes to break a tie among): before each pod
    some random changes to ``cluster``; the pod is ``observe``d; the nodes to break a tie among are
    two thirds of the feasible ones, or of all (CPU past capacity: alignment bands below 0),
    sometimes not ascending. Pods that fit fewer than two nodes are skipped."""
    for step in range(steps):
        for k in range(rng.choice((0, 1, 1, 3, 40))):
            random_change(cluster, rng, step * 1000 + k)
        pod = rng.choice(PODS)
        observe(pod)
        idx, _ = run_filters(pod, cluster, explain=False)
        if len(idx) < 2:
            continue
        pool = idx.tolist() if rng.random() < 0.7 else list(range(len(cluster)))
        sub = np.array(sorted(rng.sample(pool, max(2, len(pool) * 2 // 3))), dtype=np.int64)
        if rng.random() < 0.3:
            sub = sub[::-1].copy()  # not ascending
        yield step, pod, idx, sub


def walk_policies(seed: int, steps: int, counts: dict[str, int]) -> None:
    """fgd-reserve's tie-breaker and the policy over a changing cluster, against the plain code."""
    rng = random.Random(seed)
    cluster = cluster_of(rng.randint(20, 50), rng)
    order = list(range(len(cluster)))
    rng.shuffle(order)
    cluster.set_tie_order(order)
    workload = rng.sample(WORKLOAD, rng.randint(10, len(WORKLOAD)))
    tie_break = ReserveThenAlign(
        0.2,
        keep=rng.choice((3, None)),
        waste_band=rng.choice((0, 10, 10)),
        adaptive=rng.random() < 0.5,
        balance=rng.choice((0.0, 0.2, 0.2)),
        cpu_bound_exact=rng.random() < 0.5,
    )
    reserve = tie_break.reserve  # the adaptive reserve's parts of 2026-11-28 night, sometimes
    reserve.horizon, reserve.prior_weight = rng.choice(((1.0, 0.0), (2.0, 0.3)))
    reserve.by_need = rng.random() < 0.5
    tie_break.cpu_horizon = rng.choice((None, 10.0))  # the reserve's horizon while CPU binds, sometimes
    fgd_step = rng.choice((3, 8))  # FGD's bands: topology's and fgd-reserve's
    policy = Policy(
        "fused",
        ((ShareCompletionScore(110), 1000.0), (FGDScore(step=fgd_step, whole_node_typical=False), 1.0)),
        tie_break=tie_break,
    )
    policy.bind(cluster, workload, random.Random(0))
    plain = AlignmentScore(step=0.2)
    plain.bind(cluster, workload, random.Random(0))
    for step, pod, idx, sub in tied_subsets(cluster, rng, steps, policy.observe):
        for s in (0.0, 0.2):
            assert bits(plain.aligned(pod, cluster, sub, s)) == bits(reference_aligned(pod, cluster, sub, s))
        # the tie-breaker's one key against its scores then the node order
        step_of, waste, penalty, balance = tie_break._terms(pod, cluster, sub)
        if balance is not None:  # the free milli per model set, kept from the changes, as summed afresh
            assert tie_break.balance is not None
            assert bits(balance) == bits(reference_balance(tie_break.balance, cluster, sub)), (seed, step)
        expected = pick(sub, tie_break.score(pod, cluster, sub), random.Random(0), cluster.tie_rank)[0]
        pos = tie_break.pick_tied(pod, cluster, sub)
        if pos is None:
            counts["fallback"] += 1
        else:
            assert int(sub[pos]) == expected, (seed, step, pod.name)
            counts["waste"] += waste is not None
            counts["penalty"] += penalty is not None
            counts["balance"] += balance is not None
            counts["exact"] += step_of == 0.0
            counts["bands only"] += waste is None and penalty is None and balance is None
        # share completion and remainders per GPU state against the share view
        if pod.is_share and pod.gpu_milli and not pod.gpu_models:
            view = cluster.share_view(pod)
            completion = policy.plugins[0][0]
            assert (
                completion.score(pod, cluster, sub).tolist()
                == completion.by_left[view.least_left[sub]].tolist()
            )
            if waste is not None:
                assert waste.tolist() == view.least_mapped(tie_break.waste, MILLI + 1)[sub].tolist()
            for i in sub[:5].tolist():
                best = None
                for g in cluster.nodes[i].gpus:
                    if g.fits_share(pod) and g.free_milli - pod.gpu_milli < 110:
                        if best is None or g.free_milli - pod.gpu_milli < best[0]:
                            best = (g.free_milli - pod.gpu_milli, g.index)
                assert completion.share_gpu(pod, cluster, i) == (best[1] if best else None)
            counts["shares"] += 1
        # the policy: best scores on fewer nodes, and the whole decision, against score then pick
        kept, scores = policy.best_scores(pod, cluster, idx)
        full = policy.score(pod, cluster, idx)
        top = full.max()
        assert scores.max() == top
        assert kept[scores == top].tolist() == idx[full == top].tolist()
        assert full[np.isin(idx, kept)].tolist() == scores.tolist()
        counts["narrowed"] += len(kept) < len(idx)
        tied = idx[full == top]
        if len(tied) > 1:
            node = pick(tied, tie_break.score(pod, cluster, tied), random.Random(0), cluster.tie_rank)[0]
        else:
            node = int(tied[0])
        got = schedule_one(pod, cluster, policy, random.Random(0), explain=False)
        assert isinstance(got, Placement)
        assert (got.node, got.score, got.feasible) == (cluster.nodes[node].name, float(top), len(idx))
        counts["decisions"] += 1


COUNTS = ("fallback", "waste", "penalty", "balance", "exact", "bands only", "shares", "narrowed", "decisions")


def test_fused_paths_decide_as_the_plain_code() -> None:
    counts = dict.fromkeys(COUNTS, 0)
    for seed in range(6):
        walk_policies(seed, 120, counts)
    # every digit of the key, the fallback (bands below 0) and the narrowing were exercised
    assert all(v > 0 for v in counts.values()), counts


def test_the_walk_notices_a_key_without_the_terms_above_the_alignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk can fail: a key of the alignment and the node order alone picks wrong somewhere."""

    def bands_only(
        self: ReserveThenAlign, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
    ) -> int | None:
        found = self.aligned_keys(pod, cluster, idx, self._terms(pod, cluster, idx)[0])
        return None if found is None else int(found[0].argmax())

    monkeypatch.setattr(ReserveThenAlign, "pick_tied", bands_only)
    with pytest.raises(AssertionError):
        for seed in range(6):
            walk_policies(seed, 120, dict.fromkeys(COUNTS, 0))


class _Fixed(ScorePlugin):
    """Given scores per node; ``bounds`` as promised (kept or not)."""

    def __init__(self, values: np.ndarray, bounds: tuple[float, float] | None = None) -> None:
        self.values = values
        self.promised = bounds

    def bounds(self) -> tuple[float, float] | None:
        return self.promised

    def score(self, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return self.values[idx]


@pytest.mark.parametrize("liar", [False, True])
def test_best_scores_are_the_best_of_score(liar: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``best_scores`` keeps every node that ties for the best of ``score``, with its value; it
    narrows when it can, and scores every node when a plugin broke its bounds on a node it kept."""
    rng = random.Random(5)
    cluster = cluster_of(40, rng)
    pod = PodRequest("p", cpu_milli=1000)
    full_scores = {"n": 0}
    real_score = Policy.score

    def counted(self: Policy, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        full_scores["n"] += 1
        return real_score(self, pod, cluster, idx)

    monkeypatch.setattr(Policy, "score", counted)
    narrowed = 0
    for k in range(300):
        coarse = np.array([float(rng.randrange(4)) for _ in range(40)])
        fine = np.array([float(rng.randint(0, 5)) for _ in range(40)])
        if liar:  # far below the promised least on some nodes
            fine = np.where(np.array([rng.random() < 0.3 for _ in range(40)]), -500.0, fine)
        policy = Policy("t", ((_Fixed(coarse), 10.0), (_Fixed(fine, (0.0, 5.0)), 1.0)))
        idx = np.array(sorted(rng.sample(range(40), rng.randint(2, 40))), dtype=np.int64)
        full = real_score(policy, pod, cluster, idx)
        kept, scores = policy.best_scores(pod, cluster, idx)
        top = full.max()
        assert scores.max() == top, k
        assert kept[scores == top].tolist() == idx[full == top].tolist(), k
        assert full[np.isin(idx, kept)].tolist() == scores.tolist(), k
        narrowed += len(kept) < len(idx)
    assert narrowed > 0
    assert (full_scores["n"] > 0) == liar  # the check after narrowing caught the broken bounds


def test_share_rows_taken_one_by_one_are_the_fresh_ones() -> None:
    """``share_view`` after a few changes (``ShareSlots.update_row``) and after many (the vector
    update), with ``least_mapped`` kept, against a view of the same nodes worked out afresh."""
    rng = random.Random(9)
    cluster = cluster_of(30, rng)
    table = policies.share_waste_table(WORKLOAD)
    rows = {"n": 0}
    real = ShareSlots.update_row

    def counted(self: ShareSlots, *args: object) -> None:
        rows["n"] += 1
        real(self, *args)  # type: ignore[arg-type]

    ShareSlots.update_row = counted  # type: ignore[method-assign]
    try:
        pods = [p for p in PODS if p.is_share and not p.gpu_models]
        for step in range(200):
            for k in range(rng.choice((1, 1, 2, 3, 20))):
                random_change(cluster, rng, step * 100 + k)
            pod = rng.choice(pods)
            view = cluster.share_view(pod)
            mapped = view.least_mapped(table, MILLI + 1)
            fresh = ClusterState(cluster.nodes).share_view(pod)
            assert (view.fits == fresh.fits).all() and (view.left == fresh.left).all()
            assert view.least_left.tolist() == fresh.least_left.tolist()
            assert mapped.tolist() == fresh.least_mapped(table, MILLI + 1).tolist()
    finally:
        ShareSlots.update_row = real  # type: ignore[method-assign]
    assert rows["n"] > 0


def test_the_default_policy_is_made_of_these_parts() -> None:
    """What the tests above check is what fgd-reserve runs."""
    policy = make_policy("fgd-reserve")
    assert isinstance(policy.tie_break, ReserveThenAlign)
    assert [type(p) for p, _ in policy.plugins] == [ShareCompletionScore, policies.ModelGuard, FGDScore]
    assert policy.plugins[2][0].bounds() == (0.0, 33.0)  # FGD in bands of 3 points


def plain_aligned(
    pod: PodRequest, cluster: ClusterState, idx: np.ndarray, step: float, decimals: int
) -> np.ndarray:
    """The alignment as the vector code worked it out, with any ``decimals`` (``np.round``'s,
    negative ones included)."""
    cpu_inv = 1.0 / np.maximum(cluster.cpu_capacity, 1)[idx]
    gpu_inv = 1.0 / np.maximum(cluster.gpu_count * MILLI, 1)[idx]
    free_cpu = cluster.cpu_free[idx] * cpu_inv
    free_gpu = cluster.gpu_free_total[idx] * gpu_inv
    want_cpu = pod.cpu_milli * cpu_inv
    want_gpu = pod.total_gpu_milli * gpu_inv
    norm = np.sqrt((free_cpu * free_cpu + free_gpu * free_gpu) * (want_cpu * want_cpu + want_gpu * want_gpu))
    dot = free_cpu * want_cpu + free_gpu * want_gpu
    with np.errstate(over="ignore", invalid="ignore"):  # a step near 0, 309 decimals and more
        rounded = np.round(np.divide(dot, norm, out=np.zeros(len(idx)), where=norm > 0), decimals)
        return np.floor(rounded / step) if step > 0 else rounded


def test_rounding_to_negative_decimals_is_numpys() -> None:
    """``np.round`` with ``decimals`` below 0 divides by ``10**-decimals``, rounds and multiplies back;
    ``round_like_numpy`` and an ``AlignmentScore(decimals=-1)`` (whose cosines then round to 0) do the
    same, to the last bit."""
    rng = random.Random(21)
    values = [0.0, -0.0, 0.7, -0.3, 5.0, 15.0, 25.0, -25.0, 0.49, 0.5, 1.0]
    values += [rng.uniform(-1000, 1000) for _ in range(5000)] + [
        rng.randrange(-2000, 2000) * 5.0 for _ in range(500)
    ]
    for x in values:
        for decimals in (-1, -2, -3):
            rounded, whole = round_like_numpy(x, decimals)
            assert rounded.hex() == float(np.round(np.array([x]), decimals)[0]).hex(), (x, decimals)
            assert whole == int(np.rint(x / 10.0**-decimals)), (x, decimals)
    with np.errstate(invalid="ignore"):
        for x in values[:50]:
            for decimals in (309, 400, -309, -400):
                rounded, _ = round_like_numpy(x, decimals)
                assert rounded.hex() == float(np.round(np.array([x]), decimals)[0]).hex(), (x, decimals)
    cluster = cluster_of(40, rng)
    for k in range(200):
        random_change(cluster, rng, k)
    idx = cluster.all_indices
    for pod in PODS:
        for step in (0.0, 0.2):
            plugin = AlignmentScore(decimals=-1, step=step)
            plugin.bind(cluster, WORKLOAD, rng)
            assert bits(plugin.aligned(pod, cluster, idx, step)) == bits(
                plain_aligned(pod, cluster, idx, step, -1)
            )


def test_alignment_bands_of_a_step_near_zero() -> None:
    """A step so small that the bands pass what an int64 holds (or infinity), or a cosine kept to 19
    and more decimals: ``aligned`` gives numpy's floats (it raised ``OverflowError``), and ``pick_tied``
    the node ``pick`` takes over ``score`` (the int keys overflowed into another node at 1e-17 on 200
    nodes), or leaves the pick to the caller."""
    nodes = [
        NodeState(f"n{i}", 64_000, 512_000, [GpuState(g, f"n{i}-g{g}", "A") for g in range(8)])
        for i in range(200)
    ]
    cluster = ClusterState(nodes)
    for i in range(200):
        grants = tuple(GpuGrant(g, f"n{i}-g{g}") for g in range(i % 8))
        cluster.book(Allocation(f"n{i}", f"x{i}", cpu_milli=(i * 7919) % 64_000, gpus=grants))
    cluster.set_tie_order(list(range(200)))
    pod = PodRequest("p", cpu_milli=30_000, gpu_count=1)
    idx = cluster.all_indices
    for decimals in (18, 19, 25, 308, 309, 400):  # past an int64 from 19 on, NaN (numpy) from 309 on
        plugin = AlignmentScore(decimals=decimals)
        plugin.bind(cluster, (), random.Random(0))
        assert bits(plugin.score(pod, cluster, idx)) == bits(plain_aligned(pod, cluster, idx, 0.0, decimals))
    for step in (1e-12, 1e-16, 1e-17, 1e-300, 5e-324):
        plugin = AlignmentScore(step=step)
        plugin.bind(cluster, (), random.Random(0))
        scores = plugin.score(pod, cluster, idx)
        assert bits(scores) == bits(plain_aligned(pod, cluster, idx, step, 6)), step
        expected, _ = pick(idx, scores, random.Random(0), cluster.tie_rank)
        pos = plugin.pick_tied(pod, cluster, idx)
        assert pos is None or int(idx[pos]) == expected, step
        tie_break = ReserveThenAlign(step, 3, 10, True, 0.2, False)
        tie_break.reserve.horizon, tie_break.reserve.prior_weight, tie_break.reserve.by_need = 2.0, 0.3, True
        tie_break.bind(cluster, WORKLOAD, random.Random(0))
        pos = tie_break.pick_tied(pod, cluster, idx)
        with np.errstate(invalid="ignore", over="ignore"):
            scores = tie_break.score(pod, cluster, idx)
        if np.isfinite(scores).all():  # infinite bands: the plain code's sums are NaN (no answer to match)
            expected, _ = pick(idx, scores, random.Random(0), cluster.tie_rank)
            assert pos is None or int(idx[pos]) == expected, step


def test_best_scores_of_sums_too_large_for_exact_floats() -> None:
    """First scores near 2**59 (a float step of 128): a node two steps below the best, left out by
    ``best_scores``, sums with the others' scores (within their bounds) to the best itself; ``score``
    ties it with the best node, so ``best_scores`` must keep it."""
    top = float(2**59 + 1024)
    cluster = cluster_of(2, random.Random(1))
    pod = PodRequest("p", cpu_milli=1000)
    policy = Policy(
        "huge",
        (
            (_Fixed(np.array([top, top - 256.0])), 1.0),
            (_Fixed(np.array([0.0, 68.0]), (0.0, 100.0)), 1.0),
            (_Fixed(np.array([0.0, 65.0]), (0.0, 65.0)), 1.0),
            (_Fixed(np.array([0.0, 3.0]), (0.0, 3.0)), 1.0),
        ),
    )
    idx = cluster.all_indices
    full = policy.score(pod, cluster, idx)
    assert full[0] == full[1]  # the case: a tie in score
    kept, scores = policy.best_scores(pod, cluster, idx)
    assert kept[scores == scores.max()].tolist() == idx[full == full.max()].tolist() == [0, 1]
    cluster.set_tie_order([1, 0])
    placed = schedule_one(pod, cluster, policy, random.Random(0), explain=False)
    assert isinstance(placed, Placement) and placed.node == "n1"


@pytest.mark.parametrize("step", [-3, -1, 0.5, 7])
def test_best_scores_with_fgd_in_other_steps(step: float) -> None:
    """FGD in bands of a negative step scores 100 // step .. 0 (it promised 0 .. 100 // step, and
    ``best_scores`` then kept no node and raised ``ValueError``); a promise whose least is above its
    largest is no promise. The best nodes and score are ``score``'s for any step."""
    rng = random.Random(17)
    cluster = cluster_of(30, rng)
    for k in range(120):
        random_change(cluster, rng, k)
    cluster.set_tie_order(list(range(30)))
    fgd = FGDScore(step=step)  # type: ignore[arg-type]
    low, high = fgd.bounds() or (0.0, 0.0)
    assert low <= high
    policy = Policy("p", ((ShareCompletionScore(110), 1000.0), (fgd, 1.0)))
    policy.bind(cluster, WORKLOAD, random.Random(0))
    liar = Policy("q", ((ShareCompletionScore(110), 1000.0), (_Fixed(np.zeros(30), (5.0, -5.0)), 1.0)))
    for pod in PODS[:4]:
        idx, _ = run_filters(pod, cluster, explain=False)
        for p in (policy, liar):
            full = p.score(pod, cluster, idx)
            kept, scores = p.best_scores(pod, cluster, idx)
            assert kept[scores == full.max()].tolist() == idx[full == full.max()].tolist()
            assert all(low <= s <= high for s in fgd.score(pod, cluster, idx))
