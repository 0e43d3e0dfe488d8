"""bench/placement_variants.py, issue 26's share-remainder variants: they adapt to the share sizes seen
so far, and only to those."""

from __future__ import annotations

import numpy as np

from scheduler.core import policies as P
from scheduler.core.request import PodRequest
from tests.support.benchscript import bench_module

variants = bench_module("placement_variants.py", "placement_variants_share")


def share(milli: int, uid: str) -> PodRequest:
    return PodRequest(uid=uid, name=uid, cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=milli)


def test_the_table_of_the_sizes_seen_is_the_cores_table_of_a_workload_of_those_sizes() -> None:
    pods = [share(m, f"p{i}") for i, m in enumerate([810] * 30 + [160] * 10 + [470] * 20 + [50])]
    sizes = variants.seen_sizes({810: 30, 160: 10, 470: 20, 50: 1}, min_share=0.05)
    assert sizes == (160, 470, 810)  # 50 is under 5% of the shares
    assert np.array_equal(variants.waste_table_of(sizes), P.share_waste_table(pods, min_share=0.05))
    assert variants.waste_table_of(sizes)[190] == 30  # an 810's remainder: only a 160 fills it


def test_the_completion_threshold_follows_the_arrivals_after_the_warm_up() -> None:
    plugin = variants.SeenCompletion()
    plugin.sizes = variants.ShareSizes()
    assert plugin.below == P.COMPLETE_BELOW
    for i in range(variants.SEEN_WARM_UP - 1):
        plugin.observe(share(160 if i % 2 else 810, f"a{i}"))
    assert plugin.below == P.COMPLETE_BELOW  # not warm yet
    plugin.observe(share(810, "last"))
    assert plugin.below == 160 and plugin.by_left[159] > 1.0 and plugin.by_left[160] == 0.0
    plugin.observe(PodRequest(uid="w", name="w", cpu_milli=1000, memory_mib=1, gpu_count=1))  # no share
    assert plugin.sizes.arrived == variants.SEEN_WARM_UP
