"""The variants of ``fgd-reserve`` measured for issue 26, by name, run through bench/simulate_openb.py.

    OPENB_TRACES=../shared/traces/openb .venv/bin/python bench/placement_variants.py \\
        --mixes tuning --jobs 2 --policies fgd,fgd-reserve-13,adaptive,fgd-reserve

Every argument is bench/simulate_openb.py's; the names below are added to its policies (docs/performance.md
says which data chose what). The variants are ``scheduler.core.policies.fgd_reserve`` with other
parameters, or its tie-breaker with the alignment always exact (``exact-align``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.core import policies as P  # noqa: E402
from scheduler.core.scoring import Policy  # noqa: E402
from tests.support.benchscript import bench_module  # noqa: E402


def exact_align() -> Policy:
    """fgd-reserve with the alignment never banded (as with CPU the scarcer resource, always)."""
    policy = P.fgd_reserve()
    assert isinstance(policy.tie_break, P.ReserveThenAlign)
    policy.tie_break.step = 0.0
    return policy


def topology_over(**parts: Any) -> Callable[[], Policy]:
    """The live default ``topology`` (its topology and NIC nearness scores) over ``fgd_reserve(**parts)``
    instead of its fixed base: the adaptive parts of issue 26 tried under random ties (``--ties random``)."""

    def make() -> Policy:
        base = P.fgd_reserve(**parts)
        plugins = ((P.TopologyScore(), 1000.0), (P.NicNearnessScore(), 1000.0), *base.plugins)
        return Policy("topology", plugins, "topology over a variant of fgd-reserve", tie_break=base.tie_break)

    return make


VARIANTS: dict[str, Callable[[], Policy]] = {
    # the default of issue 13: 3 hosts kept, no model balance, alignment always in bands of 0.2
    "fgd-reserve-13": lambda: P.fgd_reserve(keep=3, adaptive=False, balance=0.0, cpu_bound_exact=False),
    "adaptive-nofloor": lambda: P.fgd_reserve(keep=0, adaptive=True, balance=0.0, cpu_bound_exact=False),
    "adaptive": lambda: P.fgd_reserve(keep=3, adaptive=True, balance=0.0, cpu_bound_exact=False),
    "balance01": lambda: P.fgd_reserve(balance=0.1, cpu_bound_exact=False),
    "balance02": lambda: P.fgd_reserve(balance=0.2, cpu_bound_exact=False),
    "exact-align": exact_align,
    # the live default with the parts of fgd-reserve it leaves out (keep=None: hosts in proportion)
    "topo-adaptive": topology_over(keep=None, adaptive=True, balance=0.2, cpu_bound_exact=True),
    "topo-balance": topology_over(keep=None, adaptive=False, balance=0.2, cpu_bound_exact=False),
    "topo-adaptive-only": topology_over(keep=None, adaptive=True, balance=0.0, cpu_bound_exact=False),
    "topo-cpu": topology_over(keep=None, adaptive=False, balance=0.0, cpu_bound_exact=True),
}


def main(argv: list[str] | None = None) -> int:
    P.POLICIES.update(VARIANTS)  # worker processes are forked and inherit them
    bench = bench_module("simulate_openb.py", "simulate_openb_variants")
    bench.POLICIES.update(VARIANTS)
    return int(bench.main(argv))


if __name__ == "__main__":
    sys.exit(main())
