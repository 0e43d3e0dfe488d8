"""Running the protocol for one policy over several seeds, and the result as a whole."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.request import PodRequest
from scheduler.sim.protocol import INFLATION, RunResult, run_once
from scheduler.sim.trace import NodeSpec

PROTOCOL_SEEDS = tuple(range(42, 52))  # the FGD paper's 10 seeds


@dataclass(frozen=True)
class Experiment:
    """All seeded runs of one policy on one cluster and workload."""

    policy: str
    runs: tuple[RunResult, ...]
    seconds: float

    def _values(self, x: int) -> list[float]:
        return [r.at(x) for r in self.runs if not math.isnan(r.at(x))]

    def mean_at(self, x: int) -> float:
        values = self._values(x)
        return statistics.fmean(values) if values else float("nan")

    def spread_at(self, x: int) -> float:
        """Sample standard deviation over the seeds (0 for a single seed)."""
        values = self._values(x)
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def mean_curve(self) -> dict[int, float]:
        xs = sorted({x for r in self.runs for x in r.curve})
        return {x: round(self.mean_at(x), 2) for x in xs}

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "runs": [
                {
                    "seed": r.seed,
                    "alloc_pct_at_100": r.alloc_pct_at_100,
                    "alloc_pct_at_130": r.alloc_pct_at_130,
                    "curve": [[x, y] for x, y in sorted(r.curve.items())],
                }
                for r in self.runs
            ],
            "mean_alloc_pct_at_100": round(self.mean_at(100), 2),
            "mean_alloc_pct_at_130": round(self.mean_at(130), 2),
            "seconds": round(self.seconds, 3),
        }


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
) -> Experiment:
    """Run the protocol once per seed (sequentially, on one core)."""
    start = time.perf_counter()
    runs = tuple(run_once(nodes, pods, policy, seed, inflation, ties) for seed in seeds)
    return Experiment(policy, runs, time.perf_counter() - start)
