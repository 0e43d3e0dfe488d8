"""The model balance as one more digit above the fused keys decides what the digits one by one decide.

Review of c021f53 (``ReserveThenAlign._balance_above``, ``ModelFree``): on random clusters of several
GPU models (nodes of one model, of two, and without GPUs) that change between looks,

- ``ModelFree.of`` (free GPU milli per model set, kept from ``ClusterState.changed_since``) is checked
  against ``np.bincount`` after every step: single changes, bursts past ``ONE_BY_ONE``, a change log
  made short so that it overflows, two clusters of the same nodes looked at in turn;
- ``pick_tied`` with a model balance of bands from very fine (many bands, so a weight near the int64
  guard) to coarse (every band 0), restricted pods observed, the reserve's penalty on, is checked
  against ``_pick_by_digits`` and against ``score`` then ``schedule.pick``, with the balance's bands
  checked against the vector code (``reference_balance``).

A balance digit that weighs too little is shown to make the walk fail.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import policies, state
from scheduler.core.policies import ModelFree, ReserveThenAlign
from scheduler.core.schedule import pick
from scheduler.core.state import ClusterState, GpuState, NodeState
from tests.test_sched_fused_paths import WORKLOAD, bits, random_change, reference_balance, tied_subsets


def mixed_cluster(n: int, seed: int) -> ClusterState:
    """``n`` nodes of 0, 2, 4 or 8 GPUs of model A, B or C, some with GPUs of two models; built from
    ``seed`` alone, so two calls give clusters of the same nodes."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        count = rng.choice((0, 2, 4, 8, 8))
        models = rng.choice(("A", "A", "B", "C", "AB", "BC"))
        gpus = [GpuState(g, f"n{i}-g{g}", models[g % len(models)]) for g in range(count)]
        nodes.append(NodeState(f"n{i}", rng.choice((32_000, 64_000, 128_000)), 512_000, gpus))
    return ClusterState(nodes)


def free_by_bincount(codes: np.ndarray, size: int, cluster: ClusterState) -> list[int]:
    """The old way: the free GPU milli per model set summed over every node as floats."""
    sums = np.bincount(codes, weights=cluster.gpu_free_total.astype(float), minlength=size)
    return [int(v) for v in sums]


def walk_model_free(seed: int, steps: int) -> dict[str, int]:
    """``ModelFree`` over a changing pair of clusters of the same nodes, against ``np.bincount``."""
    rng = random.Random(seed)
    n = rng.randint(5, 40)
    built = rng.randrange(1 << 30)
    clusters = [mixed_cluster(n, built), mixed_cluster(n, built)]
    codes = clusters[0].model_code
    assert bits(codes) == bits(clusters[1].model_code)
    size = int(codes.max()) + 1
    tracker = ModelFree(codes, size)
    seen = {"one by one": 0, "afresh": 0, "swapped": 0}
    now = 0
    for step in range(steps):
        if rng.random() < 0.1:
            now = 1 - now
            seen["swapped"] += 1
        cluster = clusters[now]
        burst = rng.choice((0, 1, 1, 2, 5, policies.ONE_BY_ONE, policies.ONE_BY_ONE + 1, 60))
        for k in range(burst):
            random_change(cluster, rng, step * 1000 + k)
        rows = cluster.changed_since(tracker.generation) if tracker.cluster is cluster else None
        seen["one by one" if rows is not None and len(rows) <= policies.ONE_BY_ONE else "afresh"] += 1
        got = list(tracker.of(cluster))
        assert got == free_by_bincount(codes, size, cluster), (seed, step)
        assert list(tracker.of(cluster)) == got  # a second look without changes
    return seen


def test_model_free_is_the_bincount_after_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ModelFree`` against ``np.bincount`` over random walks, with a change log short enough to
    overflow between looks (bursts of 60 changes past 2 x 16)."""
    monkeypatch.setattr(state, "CHANGE_LOG", 16)
    seen = dict.fromkeys(("one by one", "afresh", "swapped"), 0)
    for seed in range(12):
        for key, value in walk_model_free(seed, 120).items():
            seen[key] += value
    assert all(v > 0 for v in seen.values()), seen


def walk_balance(seed: int, steps: int, counts: dict[str, int]) -> None:
    """``pick_tied`` with a model balance against ``_pick_by_digits`` and ``score`` then the node order."""
    rng = random.Random(seed)
    cluster = mixed_cluster(rng.randint(3, 50), rng.randrange(1 << 30))
    order = list(range(len(cluster)))
    rng.shuffle(order)
    cluster.set_tie_order(order)
    workload = rng.sample(WORKLOAD, rng.randint(10, len(WORKLOAD)))
    band = rng.choice((1e-9, 1e-6, 0.001, 0.05, 0.2, 0.2, 1.0, 5.0))
    tie_break = ReserveThenAlign(
        0.2,
        keep=rng.choice((3, None)),
        waste_band=rng.choice((0, 1, 10, 10)),
        adaptive=rng.random() < 0.5,
        cpu_bound_exact=rng.random() < 0.5,
        balance=band,
    )
    tie_break.reserve.by_need = rng.random() < 0.5
    tie_break.bind(cluster, workload, random.Random(0))
    assert tie_break.balance is not None
    for step, pod, _, sub in tied_subsets(cluster, rng, steps, tie_break.observe):
        expected = pick(sub, tie_break.score(pod, cluster, sub), random.Random(0), cluster.tie_rank)[0]
        step_of, horizon = tie_break._step_and_horizon()
        penalty = tie_break.reserve.scarce_breaks(pod, cluster, sub, horizon)
        balance = tie_break.balance.bands(pod, cluster, sub)
        if balance is not None:
            assert bits(balance) == bits(reference_balance(tie_break.balance, cluster, sub)), (seed, step)
            counts["balance"] += 1
            counts["balance above 0"] += bool((balance > 0).any())
            counts["penalty"] += penalty is not None
        digits = tie_break._pick_by_digits(
            pod, cluster, sub, step_of, tie_break._remainders(pod, cluster, sub), penalty, balance
        )
        assert digits is None or int(sub[digits]) == expected, (seed, step, pod.name, band)
        pos = tie_break.pick_tied(pod, cluster, sub)
        assert pos is None or int(sub[pos]) == expected, (seed, step, pod.name, band)
        if balance is not None and pos is not None:
            counts["picked with balance"] += 1
            counts["digits declined, pick_tied did not"] += digits is None


SEEDS = 40
BALANCE_COUNTS = ("balance", "balance above 0", "penalty", "picked with balance")


def test_the_balance_digit_picks_what_the_digits_pick() -> None:
    counts = dict.fromkeys((*BALANCE_COUNTS, "digits declined, pick_tied did not"), 0)
    for seed in range(SEEDS):
        walk_balance(seed, 150, counts)
    assert all(counts[k] > 0 for k in BALANCE_COUNTS), counts


@pytest.mark.parametrize("shift", [policies.KEY_PENALTY, policies.KEY_PENALTY - 2, 0])
def test_the_balance_walk_notices_a_light_balance_digit(shift: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: a balance digit weighing ``n << shift`` (one penalty; the remainder band's
    span; one alignment int) instead of ``(shapes + 2) x (n << KEY_PENALTY)`` picks wrong somewhere (a
    penalty, a remainder band or the alignment outweighs it). Not noticed: ``(shapes + 1) x (n <<
    KEY_PENALTY)``, which is wrong only on a node with every shape's penalty."""
    real = ReserveThenAlign._balance_above

    def light(self: ReserveThenAlign, keys: np.ndarray, balance: np.ndarray, n: int) -> bool:
        done = real(self, keys.copy(), balance, n)
        if done:
            keys += (n << shift) * balance.astype(np.int64)
        return done

    monkeypatch.setattr(ReserveThenAlign, "_balance_above", light)
    with pytest.raises(AssertionError):
        for seed in range(SEEDS):
            walk_balance(seed, 150, dict.fromkeys((*BALANCE_COUNTS, "digits declined, pick_tied did not"), 0))


@pytest.mark.parametrize("fault", ["stale past the log", "seen not kept"])
def test_the_model_free_walk_notices_a_tracker_that_goes_stale(
    fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk can fail: a tracker that keeps its sums when the change log no longer reaches back
    (it should sum afresh), or that does not keep each node's free milli as last seen."""
    real = ModelFree.of

    def faulty(self: ModelFree, cluster: ClusterState) -> list[int]:
        if fault == "stale past the log":
            if self.cluster is cluster and cluster.changed_since(self.generation) is None:
                return self.totals
            return real(self, cluster)
        before, same = list(self.seen), self.cluster is cluster
        out = real(self, cluster)
        if same:
            self.seen[:] = before
        return out

    monkeypatch.setattr(state, "CHANGE_LOG", 16)
    monkeypatch.setattr(ModelFree, "of", faulty)
    with pytest.raises(AssertionError):
        for seed in range(12):
            walk_model_free(seed, 120)


@pytest.mark.parametrize("shapes", [0, 1, 3, 7])
def test_the_balance_digit_at_the_ends_of_the_keys_span(shapes: int) -> None:
    """``_balance_above`` on keys at both ends of ``_fused_keys``' span (every shape's penalty, the
    largest remainder band, alignment ints near 0 and ``KEY_ALIGN``), for node counts up to the int64
    guard and bands up to the largest it takes: the largest key is the largest (band, key) pair, and
    where it declines the sums could pass an int64."""
    rng = random.Random(shapes)
    tie_break = ReserveThenAlign(0.2, balance=0.2)
    tie_break.reserve.shapes = [(8, 0, 0)] * shapes
    guard = (1 << 62) // ((shapes + 2) << policies.KEY_PENALTY)
    for n in (2, 50, 10_000, guard // 3, guard - 1, guard):
        weight = (shapes + 2) * (n << policies.KEY_PENALTY)
        if weight >= 1 << 62:
            continue  # _fused_keys declines these
        top_band = ((1 << 62) - 1) // weight - 1  # the largest with (top + 1) x weight below 1 << 62
        low = -(policies.KEY_REMAINDER - 1) * policies.KEY_ALIGN * n - shapes * (n << policies.KEY_PENALTY)
        high = (policies.KEY_ALIGN - 1) * n + n - 1
        for _ in range(50):
            keys = [rng.choice((low, low + 1, high, high - 1, rng.randint(low, high))) for _ in range(6)]
            bands = [
                float(rng.choice((0, top_band, max(top_band - 1, 0), rng.randint(0, top_band)))) for _ in keys
            ]
            got = np.array(keys, dtype=np.int64)
            assert tie_break._balance_above(got, np.array(bands), n), (n, bands)
            best = max(range(len(keys)), key=lambda i: (bands[i], keys[i], -i))
            assert int(got.argmax()) == best, (n, keys, bands)
        got = np.array([high, low], dtype=np.int64)
        assert not tie_break._balance_above(got, np.array([float(top_band + 1), 0.0]), n)
        assert got.tolist() == [high, low]  # declined: untouched
        assert not tie_break._balance_above(got, np.array([1.0, -1.0]), n)
    assert not tie_break._balance_above(np.zeros(0, dtype=np.int64), np.zeros(0), 5)


def test_a_balance_band_too_fine_for_a_float_is_refused_or_works() -> None:
    """Defect (before and after c021f53): a band so small that the free share over it is past the
    largest float (5e-324) passes ``balance > 0``, then ``score`` and ``pick_tied`` raise
    OverflowError (``math.floor(inf)`` in ``ModelBalance.model_bands``; before, ``int(inf)`` in
    ``_pick_by_digits``). Either the tie-breaker refuses such a band when made (ValueError) or it
    scores and breaks ties with it."""
    try:
        tie_break = ReserveThenAlign(0.2, keep=3, waste_band=10, adaptive=True, balance=5e-324)
    except ValueError:
        return
    rng = random.Random(1)
    cluster = mixed_cluster(20, 5)
    cluster.set_tie_order(list(range(len(cluster))))
    tie_break.bind(cluster, WORKLOAD, random.Random(0))
    for _, pod, _, sub in tied_subsets(cluster, rng, 60, tie_break.observe):
        expected = pick(sub, tie_break.score(pod, cluster, sub), random.Random(0), cluster.tie_rank)[0]
        pos = tie_break.pick_tied(pod, cluster, sub)
        assert pos is None or int(sub[pos]) == expected
