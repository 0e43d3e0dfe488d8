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


VARIANTS: dict[str, Callable[[], Policy]] = {
    # the default of issue 13: 3 hosts kept, no model balance, alignment always in bands of 0.2
    "fgd-reserve-13": lambda: P.fgd_reserve(keep=3, adaptive=False, balance=0.0, cpu_bound_exact=False),
    "adaptive-nofloor": lambda: P.fgd_reserve(keep=0, adaptive=True, balance=0.0, cpu_bound_exact=False),
    "adaptive": lambda: P.fgd_reserve(keep=3, adaptive=True, balance=0.0, cpu_bound_exact=False),
    "balance01": lambda: P.fgd_reserve(balance=0.1, cpu_bound_exact=False),
    "balance02": lambda: P.fgd_reserve(balance=0.2, cpu_bound_exact=False),
    "exact-align": exact_align,
}


def main(argv: list[str] | None = None) -> int:
    P.POLICIES.update(VARIANTS)  # worker processes are forked and inherit them
    bench = bench_module("simulate_openb.py", "simulate_openb_variants")
    bench.POLICIES.update(VARIANTS)
    return int(bench.main(argv))


if __name__ == "__main__":
    sys.exit(main())
