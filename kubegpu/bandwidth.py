"""The bandwidth notation of RDMA interfaces, shared by everything that reads or writes it.

``kubegpu.io/rdma-bandwidth`` (docs/scheduler.md, "RDMA interfaces"), the simulator's
``rdma_bandwidth`` and ``nics`` columns and kubegpu-cni's ``defaultMaxRate`` all spell a figure
as ASCII digits and ``Gbps`` (up to three decimals) or ``Mbps`` (whole), and a range as two figures
joined by ``-``. Values are Mbit/s, at most ``MAX_MBPS``, the bound the signed allocation's
``minMbps``/``maxMbps`` keep too (docs/allocation.md). Pure; the standard library only.
"""

from __future__ import annotations

import re
from typing import Any

MAX_MBPS = 10_000_000  # 10 Tbit/s, beyond any one interface
MBPS_PER_GBPS = 1000

_FIGURE = r"([0-9]+)(?:\.([0-9]{1,3}))?[ \t]*(Gbps|Mbps)"
_BANDWIDTH = re.compile(rf"[ \t]*{_FIGURE}[ \t]*(?:-[ \t]*{_FIGURE}[ \t]*)?")
_DIGITS = 8  # whole digits read: beyond them a figure is far above MAX_MBPS anyway


def _mbps(whole: str, fraction: str | None, unit: str, text: str) -> int:
    whole = whole.lstrip("0") or "0"
    if len(whole) > _DIGITS:
        return MAX_MBPS + 1
    if unit == "Mbps":
        if fraction is not None:
            raise ValueError(f"{text!r}: Mbit/s are whole numbers")
        return int(whole)
    return int(whole) * MBPS_PER_GBPS + int((fraction or "").ljust(3, "0"))


def parse_bandwidth(text: Any) -> tuple[int, int]:
    """``"100Gbps"`` -> (100000, 0); ``"25Gbps-50Gbps"`` -> (25000, 50000): (min, max) in Mbit/s.

    A figure is ASCII digits (``Gbps`` up to three decimals, ``Mbps`` whole) and a unit, ``Gbps`` or
    ``Mbps``, exactly so spelled; a range is two such figures joined by ``-``, minimum first.
    Raises ValueError naming what is wrong (another unit, a sign, other digits, min above max,
    beyond ``MAX_MBPS``).
    """
    match = _BANDWIDTH.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"{str(text)[:64]!r} is not a bandwidth such as 25Gbps, 500Mbps or 25Gbps-50Gbps"
            " (units Gbps or Mbps, decimal digits 0-9)"
        )
    low = _mbps(match.group(1), match.group(2), match.group(3), text)
    high = _mbps(match.group(4), match.group(5), match.group(6), text) if match.group(4) else 0
    if low > MAX_MBPS or high > MAX_MBPS:
        raise ValueError(f"{text.strip()!r} is above {MAX_MBPS // MBPS_PER_GBPS} Gbps")
    if match.group(4) and (high == 0 or low > high):
        raise ValueError(f"{text.strip()!r}: the maximum must be above 0 and at least the minimum")
    return low, high


def format_mbps(mbps: int) -> str:
    """``100000`` -> ``100Gbps``; ``2500`` -> ``2.5Gbps``; ``300`` -> ``300Mbps``."""
    if mbps % MBPS_PER_GBPS == 0 or mbps > MBPS_PER_GBPS:
        whole, rest = divmod(mbps, MBPS_PER_GBPS)
        return f"{whole}.{rest:03d}".rstrip("0").rstrip(".") + "Gbps"
    return f"{mbps}Mbps"
