"""Running the protocol for one policy over several seeds, and the result as a whole.

With ``bound=True`` each seed also gets the LP upper bound on the allocation at 100% and 130% arrived
(``scheduler.sim.bound``), computed from the same arrival order as the run. With gangs, each run also
has ``GangStats`` (``scheduler.sim.protocol``), and the experiment their merge over the seeds. When
some node has a utilisation value (the node list's ``gpu_util`` column), each seed is also run with
the values ignored (``blind_runs``), so the report can say what the readings changed: the share of
the GPU placed on hot nodes, and the allocation, with and without them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.request import PodRequest
from scheduler.sim.protocol import (
    HOT_THRESHOLD,
    INFLATION,
    GangStats,
    HotStats,
    LinkStats,
    RdmaStats,
    RunResult,
    run_once,
)
from scheduler.sim.trace import Gang, NodeSpec

BOUND_POINTS = (100, 130)

PROTOCOL_SEEDS = tuple(range(42, 52))  # the FGD paper's 10 seeds


@dataclass(frozen=True)
class Experiment:
    """All seeded runs of one policy on one cluster and workload."""

    policy: str
    runs: tuple[RunResult, ...]
    seconds: float
    bounds: Mapping[int, Mapping[int, float]] = field(default_factory=dict)  # seed -> point -> bound %
    blind_runs: tuple[RunResult, ...] = ()  # the same seeds with the utilisation values ignored
    utilization_weight: float = 0.0

    def bound_at(self, x: int) -> float:
        """Mean over the seeds of the allocation bound at ``x`` percent arrived (nan without bounds)."""
        values = [b[x] for b in self.bounds.values() if x in b]
        return statistics.fmean(values) if values else float("nan")

    def links(self) -> LinkStats:
        """Link quality of the multi-GPU pods over every run."""
        total = LinkStats()
        for r in self.runs:
            for name in ("pods", "score", "relative", "nvlink", "cross", "unknown"):
                setattr(total, name, getattr(total, name) + getattr(r.links, name))
        return total

    def gangs(self) -> GangStats | None:
        """The runs' gang statistics merged (counts summed, waits pooled); None without gangs."""
        stats = [r.gangs for r in self.runs if r.gangs is not None]
        return GangStats.merge(stats) if stats else None

    def hot(self, blind: bool = False) -> HotStats | None:
        """The hot-node figures over every run (or every blind run); None without utilisation values."""
        stats = [r.hot for r in (self.blind_runs if blind else self.runs) if r.hot is not None]
        return HotStats.merge(stats) if stats else None

    def rdma(self) -> RdmaStats | None:
        """The runs' RDMA counts merged (summed; the highest PF load); None when no pod asks for RDMA."""
        stats = [r.rdma for r in self.runs if r.rdma is not None]
        return RdmaStats.merge(stats) if stats else None

    def _values(self, x: int, blind: bool = False) -> list[float]:
        return [r.at(x) for r in (self.blind_runs if blind else self.runs) if not math.isnan(r.at(x))]

    def mean_at(self, x: int, blind: bool = False) -> float:
        values = self._values(x, blind)
        return statistics.fmean(values) if values else float("nan")

    def utilization_summary(self) -> dict[str, Any] | None:
        """The effect of the utilisation values (None without them): the hot nodes, and per way of
        running (``with_readings``, ``without_readings``) the hot shares and the mean allocation."""
        hot, blind = self.hot(), self.hot(blind=True)
        if hot is None or blind is None:
            return None
        doc: dict[str, Any] = {
            "weight": self.utilization_weight,
            "hot_threshold_pct": hot.threshold,
            "hot_nodes": hot.hot_nodes,
            "hot_gpu_pct": round(100.0 * hot.hot_gpus / hot.gpus, 2) if hot.gpus else 0.0,
        }
        for key, stats, is_blind in (("with_readings", hot, False), ("without_readings", blind, True)):
            doc[key] = {
                **stats.summary(),
                "mean_alloc_pct_at_100": _finite(self.mean_at(100, is_blind)),
                "mean_alloc_pct_at_130": _finite(self.mean_at(130, is_blind)),
            }
        return doc

    def spread_at(self, x: int) -> float:
        """Sample standard deviation over the seeds (0 for a single seed)."""
        values = self._values(x)
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def mean_curve(self) -> dict[int, float]:
        xs = sorted({x for r in self.runs for x in r.curve})
        return {x: round(self.mean_at(x), 2) for x in xs}

    def to_json(self) -> dict[str, Any]:
        runs = []
        for r in self.runs:
            run: dict[str, Any] = {
                "seed": r.seed,
                "alloc_pct_at_100": _finite(r.alloc_pct_at_100),
                "alloc_pct_at_130": _finite(r.alloc_pct_at_130),
                "curve": [[x, y] for x, y in sorted(r.curve.items())],
                "links": r.links.summary(),
            }
            if r.gangs is not None:
                run["gangs"] = r.gangs.summary()
            if r.hot is not None:
                run["hot"] = r.hot.summary()
            if r.rdma is not None:
                run["rdma"] = r.rdma.summary()
            for x, value in sorted(self.bounds.get(r.seed, {}).items()):
                run[f"bound_alloc_pct_at_{x}"] = round(value, 2)
            runs.append(run)
        doc: dict[str, Any] = {
            "policy": self.policy,
            "runs": runs,
            "mean_alloc_pct_at_100": _finite(self.mean_at(100)),
            "mean_alloc_pct_at_130": _finite(self.mean_at(130)),
            "links": self.links().summary(),
            "seconds": round(self.seconds, 3),
        }
        gangs = self.gangs()
        if gangs is not None:
            doc["gangs"] = gangs.summary()
        rdma = self.rdma()
        if rdma is not None:
            doc["rdma"] = rdma.summary()
        utilization = self.utilization_summary()
        if utilization is not None:
            doc["utilization"] = utilization
        if self.bounds:
            for x in BOUND_POINTS:
                bound = self.bound_at(x)
                doc[f"bound_alloc_pct_at_{x}"] = None if math.isnan(bound) else round(bound, 2)
        return doc


def _finite(value: float) -> float | None:
    """A JSON number rounded to 2 decimals, or None (null) for a point the run never reached (NaN
    is not JSON: a run inflated to less than 130% has no value at 130)."""
    return None if math.isnan(value) else round(value, 2)


def parse_seeds(text: str) -> list[int]:
    """``42``, ``42-51`` or ``42,45,50-51`` -> the seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(v) for v in part.split("-", 1))
            if hi < lo:
                raise ValueError(f"empty seed range {part!r}")
            seeds.extend(range(lo, hi + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds


def run_experiment(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    policy: str,
    seeds: Sequence[int] = PROTOCOL_SEEDS,
    inflation: float = INFLATION,
    ties: str = "node-order",
    bound: bool = False,
    gangs: Sequence[Gang] = (),
    gang_mode: str = "gang",
    gang_arrival: str = "together",
    utilization_weight: float = 0.0,
    hot_threshold: float = HOT_THRESHOLD,
) -> Experiment:
    """Run the protocol once per seed (sequentially, on one core); with ``bound``, the LP bounds too
    (from the same arrival order, gangs included); with utilisation values on some node, once more
    per seed with them ignored (``Experiment.blind_runs``)."""
    start = time.perf_counter()

    def runs_of(readings: bool) -> tuple[RunResult, ...]:
        return tuple(
            run_once(
                nodes,
                pods,
                policy,
                seed,
                inflation,
                ties,
                gangs,
                gang_mode,
                gang_arrival,
                utilization_weight=utilization_weight,
                readings=readings,
                hot_threshold=hot_threshold,
            )
            for seed in seeds
        )

    runs = runs_of(True)
    blind = runs_of(False) if any(n.utilization is not None for n in nodes) else ()
    bounds: dict[int, dict[int, float]] = {}
    if bound:
        from scheduler.sim.bound import protocol_bounds

        for seed in seeds:
            found = protocol_bounds(
                nodes, pods, seed, inflation, BOUND_POINTS, gangs=gangs, spread=gang_arrival == "spread"
            )
            bounds[seed] = {x: b.bound_pct for x, b in found.items()}
    return Experiment(policy, runs, time.perf_counter() - start, bounds, blind, utilization_weight)
