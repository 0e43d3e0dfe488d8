"""``ReserveThenAlign``'s keys kept per node state decide what the plain code decides.

Issue 26 (the default at most 1.3x FGD's run time on every shared trace): without a model balance,
``pick_tied`` reads one int per node state and request (``_fused_keys``: the share remainder's band
above the alignment's int, the node order added below and the reserve's penalty above), instead of
gathering the alignment and the remainders apart and adding them digit by digit. On random clusters
that change between looks (placements, releases, CPU booked past capacity, so alignment bands below
0), the node of the largest key is checked against ``schedule.pick`` over ``score`` then the node
order, with every digit exercised and the declines counted; a walk with digits that overlap is shown
to fail.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import policies
from scheduler.core.filters import run_filters
from scheduler.core.policies import ReserveThenAlign
from scheduler.core.request import PodRequest
from scheduler.core.schedule import pick
from tests.test_sched_fused_paths import WORKLOAD, cluster_of, tied_subsets

COUNTS = ("keys", "declined", "share", "penalty", "exact", "unknown states", "below 0 nodes")


CALLS = {"aligned_band": 0}


@pytest.fixture(autouse=True)
def _count_states_worked_out(monkeypatch: pytest.MonkeyPatch) -> None:
    real = policies.aligned_band

    def counted(*args: object) -> tuple[float, int]:
        CALLS["aligned_band"] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(policies, "aligned_band", counted)


def walk_keys(seed: int, steps: int, counts: dict[str, int], balance: float = 0.0) -> None:
    """``_fused_keys`` (and ``pick_tied``) of a tie-breaker without model balance (with one of bands
    ``balance`` when above 0: then ``pick_tied`` alone) over a changing cluster, against ``score`` then
    the node order."""
    rng = random.Random(seed)
    cluster = cluster_of(rng.randint(20, 50), rng)
    order = list(range(len(cluster)))
    rng.shuffle(order)
    cluster.set_tie_order(order)
    workload = rng.sample(WORKLOAD, rng.randint(10, len(WORKLOAD)))
    tie_break = ReserveThenAlign(
        0.2,
        keep=rng.choice((3, None)),
        waste_band=rng.choice((0, 1, 10, 10)),
        adaptive=rng.random() < 0.5,
        cpu_bound_exact=rng.random() < 0.5,
    )
    reserve = tie_break.reserve  # the adaptive reserve's parts of 2026-11-28 night, sometimes
    reserve.horizon, reserve.prior_weight = rng.choice(((1.0, 0.0), (2.0, 0.3)))
    reserve.by_need = rng.random() < 0.5
    tie_break.cpu_horizon = rng.choice((None, 10.0))  # the reserve's horizon while CPU binds, sometimes
    if balance:
        tie_break.balance = policies.ModelBalance(balance)
    tie_break.bind(cluster, workload, random.Random(0))
    for step, pod, _, sub in tied_subsets(cluster, rng, steps, tie_break.observe):
        expected = pick(sub, tie_break.score(pod, cluster, sub), random.Random(0), cluster.tie_rank)[0]
        step_of = tie_break._step()
        penalty = tie_break.reserve.scarce_breaks(pod, cluster, sub)
        worked_out = CALLS["aligned_band"]
        keys = tie_break._fused_keys(pod, cluster, sub, step_of, penalty)
        counts["unknown states"] += CALLS["aligned_band"] > worked_out
        counts["below 0 nodes"] += bool((cluster.cpu_free[sub] < 0).any())
        if keys is None:
            counts["declined"] += 1
        elif not balance:  # with a balance, the keys alone (no balance digit) need not pick the same
            assert int(sub[int(keys.argmax())]) == expected, (seed, step, pod.name)
            counts["keys"] += 1
            counts["share"] += bool(pod.is_share and tie_break.waste_band)
            counts["penalty"] += penalty is not None
            counts["exact"] += step_of == 0.0
        pos = tie_break.pick_tied(pod, cluster, sub)
        assert pos is None or int(sub[pos]) == expected, (seed, step, pod.name)


def test_the_keys_kept_per_state_decide_as_the_plain_code() -> None:
    counts = dict.fromkeys(COUNTS, 0)
    for seed in range(8):
        walk_keys(seed, 150, counts)
    # every digit, states worked out on the way, and declines (CPU past capacity) were exercised
    assert all(v > 0 for v in counts.values()), counts


def test_the_model_balance_is_one_more_digit_above_the_kept_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a model balance, ``pick_tied`` adds its bands above the keys kept per state
    (``_balance_above``) instead of taking the digits one by one, and picks what ``score`` then the
    node order pick; the walk checks every pick (``walk_keys``)."""
    above = {"fused": 0, "declined": 0, "digits": 0}
    real_above, real_digits = ReserveThenAlign._balance_above, ReserveThenAlign._pick_by_digits

    def counted_above(self: ReserveThenAlign, *args: object) -> bool:
        done = real_above(self, *args)  # type: ignore[arg-type]
        above["fused" if done else "declined"] += 1
        return done

    def counted_digits(self: ReserveThenAlign, *args: object) -> int | None:
        above["digits"] += 1
        return real_digits(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ReserveThenAlign, "_balance_above", counted_above)
    monkeypatch.setattr(ReserveThenAlign, "_pick_by_digits", counted_digits)
    counts = dict.fromkeys(COUNTS, 0)
    for seed in range(8):
        walk_keys(seed, 150, counts, balance=0.2)
    # the balance digit was added to kept keys; the digits remain for the keys declined (shares that
    # are not plain, CPU past capacity)
    assert above["fused"] > 0 and above["digits"] > 0, above


def test_a_balance_digit_that_weighs_too_little_picks_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk with a balance can fail: a balance digit weighing one node order picks wrong somewhere."""
    real = ReserveThenAlign._balance_above

    def light(self: ReserveThenAlign, keys: np.ndarray, balance: np.ndarray, n: int) -> bool:
        done = real(self, keys.copy(), balance, n)
        if done:
            keys += balance.astype(np.int64)
        return done

    monkeypatch.setattr(ReserveThenAlign, "_balance_above", light)
    with pytest.raises(AssertionError):
        for seed in range(8):
            walk_keys(seed, 150, dict.fromkeys(COUNTS, 0), balance=0.2)


@pytest.mark.parametrize(("name", "value"), [("KEY_ALIGN_BITS", 1), ("KEY_PENALTY", 3)])
def test_the_walk_notices_digits_that_overlap(name: str, value: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk can fail: the remainder's band weighing 2 alignment ints, or the penalty 8 node
    orders, picks wrong somewhere."""
    monkeypatch.setattr(policies, name, value)
    with pytest.raises(AssertionError):
        for seed in range(8):
            walk_keys(seed, 150, dict.fromkeys(COUNTS, 0))


def test_keys_that_could_pass_an_int64_are_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    """A penalty weighing so much that the keys could pass an int64: they are not offered, and
    ``pick_tied`` takes the digits one by one (the node ``score`` then the node order pick)."""
    rng = random.Random(4)
    cluster = cluster_of(30, rng)
    cluster.set_tie_order(list(range(29, -1, -1)))
    tie_break = ReserveThenAlign(0.2, keep=3, waste_band=10)
    tie_break.bind(cluster, WORKLOAD, random.Random(0))
    pod = PodRequest("one", cpu_milli=8000, gpu_count=1)
    idx, _ = run_filters(pod, cluster, explain=False)
    assert tie_break._fused_keys(pod, cluster, idx, 0.2, None) is not None
    monkeypatch.setattr(policies, "KEY_PENALTY", 58)  # (shapes + 2) x 30 nodes x 2**58 > 2**62
    assert tie_break._fused_keys(pod, cluster, idx, 0.2, None) is None
    expected = pick(idx, tie_break.score(pod, cluster, idx), random.Random(0), cluster.tie_rank)[0]
    pos = tie_break.pick_tied(pod, cluster, idx)
    assert pos is not None and int(idx[pos]) == expected
