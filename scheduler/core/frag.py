"""GPU fragmentation of a node against a workload (the measure behind FGD).

The FGD paper (Weng et al., USENIX ATC'23) measures how much of a node's free GPU capacity a typical
pod could NOT use. For one typical pod t (cpu_t, gpu_milli m_t, gpu_count k_t) and a node with free
GPU milli ``L`` (one value per GPU) and free CPU ``c``:

- if the node can host t (CPU fits, model allowed, and k_t GPUs each with at least m_t free),
  the fragment is the free milli on the GPUs that cannot take t (those with less than m_t free);
- otherwise (and for CPU-only typical pods) all of the node's free GPU milli is fragment.

The node's fragmentation is the frequency-weighted sum over the typical pods, which are the most
common request shapes (CPU, GPU milli, GPU count, models; memory is not part of the measure) that
make up 95% of the workload's pods, their frequencies renormalised to 1.

Evaluation is fast: the GPU part depends only on the sorted free-milli tuple ``L`` and the node's
models, the CPU part only on which typical pods' CPU fits. Sorting the GPU typical pods by CPU, the
fragmentation is ``sum(L) - P_L[j]`` where ``j`` is the number of typical pods whose CPU fits
(a bisect) and ``P_L`` the prefix sums of ``f_t * (sum(L) - fragment_t(L))`` over the hostable ones;
``P_L`` is memoised per (models, L).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.core.request import MILLI, PodRequest

TYPICAL_COVERAGE = 0.95
MAX_PREFIXES = 500_000  # memoised P_L (cleared when full)


@dataclass(frozen=True)
class TypicalPod:
    """One request shape of the workload and its frequency among the typical pods."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only pods
    gpu_count: int
    models: frozenset[str]
    freq: float


def _shape_key(pod: PodRequest) -> tuple[int, int, int, frozenset[str]]:
    if pod.gpu_count == 0:
        return (pod.cpu_milli, 0, 0, pod.gpu_models)
    return (pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_models)


def typical_pods(workload: Iterable[PodRequest], coverage: float = TYPICAL_COVERAGE) -> list[TypicalPod]:
    """The most frequent request shapes covering ``coverage`` of the pods, frequencies summing to 1.

    Shapes are ranked by count, ties by (CPU, GPU milli, GPU count) descending, and taken until
    their cumulative count reaches ``coverage`` of all pods (the FGD simulator's rule).
    """
    counts = Counter(_shape_key(p) for p in workload)
    if not counts:
        return []
    total = sum(counts.values())
    ranked = sorted(
        counts.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], sorted(kv[0][3])), reverse=True
    )
    chosen: list[tuple[tuple[int, int, int, frozenset[str]], int]] = []
    cum = 0
    for key, n in ranked:
        if cum >= coverage * total:
            break
        chosen.append((key, n))
        cum += n
    return [TypicalPod(k[0], k[1], k[2], k[3], n / cum) for k, n in chosen]


class FragModel:
    """Fragmentation of node states against a fixed set of typical pods (memoised)."""

    def __init__(self, typical: Sequence[TypicalPod]) -> None:
        self.typical = list(typical)
        gpu_types = sorted((t for t in self.typical if t.gpu_count > 0), key=lambda t: t.cpu_milli)
        self.cpu_sorted = [t.cpu_milli for t in gpu_types]
        self.demands = [(t.gpu_milli, t.gpu_count, t.models, t.freq) for t in gpu_types]
        self._prefix: dict[tuple[frozenset[str], tuple[int, ...]], list[float]] = {}

    def prefix(self, models: frozenset[str], free: tuple[int, ...]) -> list[float]:
        """``P_L``: prefix sums (by typical-pod CPU) of the non-fragment part of ``free``."""
        key = (models, free)
        p = self._prefix.get(key)
        if p is None:
            total = sum(free)
            p = [0.0]
            acc = 0.0
            seen: dict[tuple[int, int], float] = {}
            for milli, count, allowed, freq in self.demands:
                if allowed and not (allowed & models):
                    p.append(acc)
                    continue
                usable = seen.get((milli, count))
                if usable is None:
                    n_fit = 0
                    small = 0
                    for f in free:
                        if f >= milli:
                            n_fit += 1
                        else:
                            small += f
                    usable = float(total - small) if n_fit >= count else 0.0
                    seen[(milli, count)] = usable
                acc += freq * usable
                p.append(acc)
            if len(self._prefix) >= MAX_PREFIXES:
                self._prefix.clear()
            self._prefix[key] = p
        return p

    def frag(self, models: frozenset[str], free: tuple[int, ...], cpu_free: int) -> float:
        """Expected fragment (milli-GPU) of a node with GPU free milli ``free`` and ``cpu_free``."""
        return self.frag_at(models, free, bisect.bisect_right(self.cpu_sorted, cpu_free))

    def frag_at(self, models: frozenset[str], free: tuple[int, ...], cpu_fits: int) -> float:
        """``frag`` when the CPU of the first ``cpu_fits`` GPU typical pods (by CPU) fits."""
        return sum(free) - self.prefix(models, free)[cpu_fits]


def after_share(free: tuple[int, ...], value: int, milli: int) -> tuple[int, ...]:
    """``free`` (sorted descending) after a share of ``milli`` on one GPU with ``value`` free."""
    j = free.index(value)
    rest = free[:j] + free[j + 1 :]
    new = value - milli
    k = 0
    while k < len(rest) and rest[k] > new:
        k += 1
    return rest[:k] + (new,) + rest[k:]


def after_whole(free: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``free`` (sorted descending) after ``count`` whole GPUs (the leading ``MILLI`` values) are taken."""
    n = 0
    while n < count and n < len(free) and free[n] == MILLI:
        n += 1
    return free[n:] + (0,) * n
